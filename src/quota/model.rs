//! Validated engine-side shapes: a workload as the engine sees it, and a compiled
//! ClusterQueue (its quotas resolved to dense `(flavor, resource)` ids).

use super::api::{
    ClusterQueue, ClusterQueuePreemption, FlavorFungibility, LabelSelector, QueueingStrategy,
    StopPolicy, Toleration,
};
use super::error::{Error, Result};
use super::quantity::{parse_duration, Quantity, Time};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Index of a ClusterQueue inside an engine.
pub type CqId = usize;
/// Index of a workload inside an engine.
pub type WlId = usize;
/// Dense id of a `(flavor, resource)` pair.
pub type FrId = usize;
/// Dense id of a LocalQueue `(namespace, name)` a workload was submitted to.
pub type LqId = usize;

/// The reserved resource counting pods, as in Kueue.
pub const PODS: &str = "pods";

/// A workload as the engine sees it. Built from Workloads, Jobs, Pods, pod groups and
/// serving replicas by the scenario reader (or, later, the controller).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadInfo {
    pub namespace: String,
    pub name: String,
    /// The LocalQueue (in `namespace`) the workload was submitted to.
    pub queue_name: String,
    pub priority_class: Option<String>,
    /// Explicit priority; wins over `priority_class` when both are set.
    pub priority: Option<i32>,
    /// Creation time: the FIFO key among equal priorities.
    pub creation: Time,
    pub pod_sets: Vec<PodSetInfo>,
    /// How long the workload runs once admitted; `None` runs until removed.
    pub runtime: Option<Time>,
    /// `tessera.io/checkpoint-interval`.
    pub checkpoint_interval: Option<Time>,
    /// `tessera.io/last-checkpoint` (same time base as the engine).
    pub last_checkpoint: Option<Time>,
    /// Time from admission until all pods are ready; `None`: they never get ready.
    pub pods_ready_after: Option<Time>,
    /// How long victims keep their quota after an eviction (the pods' grace period).
    pub grace_period: Time,
    /// Whether `creation` was given (else the time of submission is used).
    pub explicit_creation: bool,
    /// Until then the workload may be admitted into free quota but may not preempt: an
    /// autoscaler's new replicas wait for their demand to persist before they take
    /// GPUs from training (`docs/autoscale.md`, "Coupled with quota").
    pub preempt_not_before: Option<Time>,
}

/// A pod set: `count` identical pods with per-pod `requests`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PodSetInfo {
    pub name: String,
    pub count: u32,
    pub min_count: Option<u32>,
    pub requests: BTreeMap<String, Quantity>,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// DRA ResourceClaimTemplates the pods reference (resolved to requests by the reader).
    pub claim_templates: Vec<String>,
}

impl WorkloadInfo {
    /// A workload `namespace/name` for LocalQueue `queue` with no pod sets yet.
    pub fn new(key: &str, queue: &str) -> Self {
        let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
        WorkloadInfo {
            namespace: namespace.to_string(),
            name: name.to_string(),
            queue_name: queue.to_string(),
            priority_class: None,
            priority: None,
            creation: 0,
            pod_sets: Vec::new(),
            runtime: None,
            checkpoint_interval: None,
            last_checkpoint: None,
            pods_ready_after: Some(0),
            grace_period: 0,
            explicit_creation: false,
            preempt_not_before: None,
        }
    }

    /// Adds a pod set of `count` pods, each requesting `requests` (whole units).
    pub fn pod_set(mut self, name: &str, count: u32, requests: &[(&str, i64)]) -> Self {
        self.pod_sets.push(PodSetInfo {
            name: name.to_string(),
            count,
            requests: requests
                .iter()
                .map(|(r, n)| (r.to_string(), Quantity::units(*n)))
                .collect(),
            ..Default::default()
        });
        self
    }

    /// Sets `minCount` on the last pod set (partial admission).
    pub fn min_count(mut self, min: u32) -> Self {
        if let Some(ps) = self.pod_sets.last_mut() {
            ps.min_count = Some(min);
        }
        self
    }

    pub fn priority(mut self, p: i32) -> Self {
        self.priority = Some(p);
        self
    }

    pub fn created(mut self, t: Time) -> Self {
        self.creation = t;
        self.explicit_creation = true;
        self
    }

    pub fn runtime(mut self, t: Time) -> Self {
        self.runtime = Some(t);
        self
    }

    pub fn checkpoint_interval(mut self, t: Time) -> Self {
        self.checkpoint_interval = Some(t);
        self
    }

    pub fn last_checkpoint(mut self, t: Time) -> Self {
        self.last_checkpoint = Some(t);
        self
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |field: &str, why: &str| Error::Invalid {
            kind: "Workload",
            name: self.key(),
            field: field.to_string(),
            why: why.to_string(),
        };
        if self.pod_sets.is_empty() {
            return Err(invalid("spec.podSets", "at least one pod set is required"));
        }
        let mut names = BTreeSet::new();
        for (i, ps) in self.pod_sets.iter().enumerate() {
            if !names.insert(ps.name.as_str()) {
                return Err(invalid(
                    &format!("spec.podSets[{i}].name"),
                    "duplicate name",
                ));
            }
            if let Some(min) = ps.min_count {
                if min > ps.count {
                    return Err(invalid(
                        &format!("spec.podSets[{i}].minCount"),
                        "must not exceed count",
                    ));
                }
            }
            if let Some((r, _)) = ps.requests.iter().find(|(_, q)| q.0 < 0) {
                return Err(invalid(
                    &format!("spec.podSets[{i}].requests.{r}"),
                    "must not be negative",
                ));
            }
        }
        Ok(())
    }
}

/// Nominal quota and limits of one `(flavor, resource)` in one queue, in milli-units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub nominal: i64,
    pub borrowing: Option<i64>,
    pub lending: Option<i64>,
}

impl Limits {
    /// Part of the nominal quota that other queues can never borrow.
    pub fn guaranteed(&self) -> i64 {
        self.lending.map_or(0, |l| (self.nominal - l).max(0))
    }

    /// Part of the nominal quota lent to the cohort.
    pub fn lendable(&self) -> i64 {
        self.nominal - self.guaranteed()
    }
}

/// One flavor of a resource group, its resources resolved to ids.
#[derive(Clone, Debug)]
pub(crate) struct FlavorSlot {
    pub flavor: String,
    /// `(resource, fr)` in `coveredResources` order.
    pub resources: Vec<(String, FrId)>,
}

/// A resource group: covered resources and flavors in preference order.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub covered: Vec<String>,
    pub flavors: Vec<FlavorSlot>,
}

/// A validated ClusterQueue.
#[derive(Clone, Debug)]
pub(crate) struct CqSpec {
    pub name: String,
    pub cohort: Option<String>,
    pub groups: Vec<Group>,
    pub limits: HashMap<FrId, Limits>,
    pub strategy: QueueingStrategy,
    pub preemption: ClusterQueuePreemption,
    pub min_runtime: Time,
    pub fungibility: FlavorFungibility,
    pub namespace_selector: Option<LabelSelector>,
    pub stop: StopPolicy,
}

impl CqSpec {
    /// The group covering `resource`, if any.
    pub fn group_of(&self, resource: &str) -> Option<usize> {
        self.groups
            .iter()
            .position(|g| g.covered.iter().any(|r| r == resource))
    }

    /// Whether any preemption is possible from this queue.
    pub fn can_preempt(&self) -> bool {
        use super::api::{BorrowWithinCohortPolicy, ReclaimPolicy, WithinClusterQueuePolicy};
        self.preemption.within_cluster_queue != WithinClusterQueuePolicy::Never
            || self.preemption.reclaim_within_cohort != ReclaimPolicy::Never
            || self
                .preemption
                .borrow_within_cohort
                .as_ref()
                .is_some_and(|b| b.policy != BorrowWithinCohortPolicy::Never)
    }

    /// Validates a ClusterQueue and resolves `(flavor, resource)` pairs with `intern`.
    pub fn compile(cq: &ClusterQueue, mut intern: impl FnMut(&str, &str) -> FrId) -> Result<Self> {
        let name = cq.metadata.name.clone();
        let invalid = |field: String, why: &str| Error::Invalid {
            kind: "ClusterQueue",
            name: name.clone(),
            field,
            why: why.to_string(),
        };
        if name.is_empty() {
            return Err(invalid("metadata.name".into(), "must not be empty"));
        }
        let spec = &cq.spec;
        let cohort = spec.cohort_name.clone().filter(|c| !c.is_empty());
        let mut seen_resources = BTreeSet::new();
        let mut seen_flavors = BTreeSet::new();
        let mut groups = Vec::new();
        let mut limits = HashMap::new();
        for (gi, g) in spec.resource_groups.iter().enumerate() {
            let gpath = format!("spec.resourceGroups[{gi}]");
            if g.covered_resources.is_empty() {
                return Err(invalid(
                    format!("{gpath}.coveredResources"),
                    "must not be empty",
                ));
            }
            for r in &g.covered_resources {
                if !seen_resources.insert(r.clone()) {
                    return Err(invalid(
                        format!("{gpath}.coveredResources"),
                        &format!("resource {r:?} is covered by more than one group"),
                    ));
                }
            }
            if g.flavors.is_empty() {
                return Err(invalid(format!("{gpath}.flavors"), "must not be empty"));
            }
            let mut slots = Vec::new();
            for (fi, f) in g.flavors.iter().enumerate() {
                let fpath = format!("{gpath}.flavors[{fi}]");
                if !seen_flavors.insert(f.name.clone()) {
                    return Err(invalid(
                        format!("{fpath}.name"),
                        &format!("flavor {:?} appears in more than one place", f.name),
                    ));
                }
                let listed: Vec<&str> = f.resources.iter().map(|r| r.name.as_str()).collect();
                let covered: Vec<&str> = g.covered_resources.iter().map(String::as_str).collect();
                if listed != covered {
                    return Err(invalid(
                        format!("{fpath}.resources"),
                        "must list exactly the coveredResources, in the same order",
                    ));
                }
                let mut resources = Vec::new();
                for (ri, rq) in f.resources.iter().enumerate() {
                    let rpath = format!("{fpath}.resources[{ri}]");
                    let nominal = rq.nominal_quota.0;
                    if nominal < 0 {
                        return Err(invalid(
                            format!("{rpath}.nominalQuota"),
                            "must not be negative",
                        ));
                    }
                    let borrowing = rq.borrowing_limit.map(|q| q.0);
                    let lending = rq.lending_limit.map(|q| q.0);
                    if borrowing.is_some() && cohort.is_none() {
                        return Err(invalid(
                            format!("{rpath}.borrowingLimit"),
                            "needs cohortName: a queue outside a cohort cannot borrow",
                        ));
                    }
                    if borrowing.is_some_and(|b| b < 0) {
                        return Err(invalid(
                            format!("{rpath}.borrowingLimit"),
                            "must not be negative",
                        ));
                    }
                    if let Some(l) = lending {
                        if cohort.is_none() {
                            return Err(invalid(
                                format!("{rpath}.lendingLimit"),
                                "needs cohortName: a queue outside a cohort cannot lend",
                            ));
                        }
                        if l < 0 || l > nominal {
                            return Err(invalid(
                                format!("{rpath}.lendingLimit"),
                                "must be between 0 and nominalQuota",
                            ));
                        }
                    }
                    let fr = intern(&f.name, &rq.name);
                    limits.insert(
                        fr,
                        Limits {
                            nominal,
                            borrowing,
                            lending,
                        },
                    );
                    resources.push((rq.name.clone(), fr));
                }
                slots.push(FlavorSlot {
                    flavor: f.name.clone(),
                    resources,
                });
            }
            groups.push(Group {
                covered: g.covered_resources.clone(),
                flavors: slots,
            });
        }
        let min_runtime = match &spec.preemption.minimum_runtime {
            Some(d) => parse_duration(d)
                .map_err(|e| invalid("spec.preemption.minimumRuntime".into(), &e.to_string()))?,
            None => 0,
        };
        Ok(CqSpec {
            name: name.clone(),
            cohort,
            groups,
            limits,
            strategy: spec.queueing_strategy,
            preemption: spec.preemption.clone(),
            min_runtime,
            fungibility: spec.flavor_fungibility.clone(),
            namespace_selector: spec.namespace_selector.clone(),
            stop: spec.stop_policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> Result<CqSpec> {
        let cq: ClusterQueue = serde_saphyr::from_str(yaml).unwrap();
        let mut ids: HashMap<(String, String), FrId> = HashMap::new();
        CqSpec::compile(&cq, |f, r| {
            let n = ids.len();
            *ids.entry((f.to_string(), r.to_string())).or_insert(n)
        })
    }

    #[test]
    fn invalid_queues_name_the_field() {
        let cases = [
            (
                "metadata: {name: q}\nspec: {resourceGroups: [{coveredResources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: 1, borrowingLimit: 1}]}]}]}",
                "borrowingLimit",
            ),
            (
                "metadata: {name: q}\nspec: {cohortName: c, resourceGroups: [{coveredResources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: 1, lendingLimit: 2}]}]}]}",
                "lendingLimit",
            ),
            (
                "metadata: {name: q}\nspec: {resourceGroups: [{coveredResources: [gpu, cpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: 1}]}]}]}",
                "resources",
            ),
            (
                "metadata: {name: q}\nspec: {resourceGroups: [{coveredResources: [gpu], flavors: [{name: a, resources: [{name: gpu, nominalQuota: 1}]}]}, {coveredResources: [gpu], flavors: [{name: b, resources: [{name: gpu, nominalQuota: 1}]}]}]}",
                "coveredResources",
            ),
            (
                "metadata: {name: q}\nspec: {preemption: {minimumRuntime: soon}}",
                "minimumRuntime",
            ),
        ];
        for (yaml, field) in cases {
            let err = compile(yaml).unwrap_err().to_string();
            assert!(err.contains(field), "{err} should name {field}");
        }
    }

    #[test]
    fn limits_split_guaranteed_and_lendable() {
        let l = Limits {
            nominal: 12,
            borrowing: None,
            lending: Some(1),
        };
        assert_eq!((l.guaranteed(), l.lendable()), (11, 1));
        let all = Limits { lending: None, ..l };
        assert_eq!((all.guaranteed(), all.lendable()), (0, 12));
    }
}
