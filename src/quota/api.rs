//! Queue objects with Kueue's field names (camelCase), as plain serde types.
//!
//! A Kueue manifest ports by changing its `apiVersion` to `tessera.io/v1alpha1`. These types
//! carry no Kubernetes client dependency; they derive `JsonSchema` (plain schemars) so the
//! controller can wrap the `*Spec` structs in kube's `CustomResource` derive
//! (`src/controller/crd.rs`) without a second model. Tessera extensions are marked as such.

use super::quantity::Quantity;
use crate::vgpu::charge::charged;
use crate::vgpu::request::{ResourceNames, DEFAULT_PREFIX};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::LazyLock;

/// The CRD group and version of every Tessera queue object.
pub const API_VERSION: &str = "tessera.io/v1alpha1";

/// Standard object metadata (the subset the quota engine reads).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// In `tessera plan` files: an offset from the scenario start (`90s`, `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
}

/// A Kubernetes taint, as carried by a ResourceFlavor's `nodeTaints`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub effect: String,
}

/// A Kubernetes toleration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` (default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

impl Toleration {
    /// Whether this toleration tolerates `taint` (Kubernetes matching rules).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if let Some(effect) = &self.effect {
            if !effect.is_empty() && effect != &taint.effect {
                return false;
            }
        }
        let exists = self.operator.as_deref() == Some("Exists");
        match &self.key {
            None => exists,
            Some(k) if k.is_empty() => exists,
            Some(k) if k != &taint.key => false,
            Some(_) if exists => true,
            Some(_) => self.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        }
    }
}

/// `ResourceFlavor`: a variant of a resource (for GPUs: one per model), tied to nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavor {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ResourceFlavorSpec,
}

/// Spec of a [`ResourceFlavor`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_taints: Vec<Taint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// `ClusterQueue`: a pool of quota per flavor, with borrowing and preemption rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueue {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterQueueSpec,
}

/// Spec of a [`ClusterQueue`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueSpec {
    #[serde(default)]
    pub resource_groups: Vec<ResourceGroup>,
    /// Kueue v1beta1 also spells it `cohort`; both are accepted.
    #[serde(default, alias = "cohort", skip_serializing_if = "Option::is_none")]
    pub cohort_name: Option<String>,
    #[serde(default)]
    pub queueing_strategy: QueueingStrategy,
    #[serde(default)]
    pub preemption: ClusterQueuePreemption,
    #[serde(default)]
    pub flavor_fungibility: FlavorFungibility,
    /// `None` (absent) admits no namespace, as in Kueue; `{}` admits all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default)]
    pub stop_policy: StopPolicy,
}

/// A set of resources that share the same ordered list of flavors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    pub covered_resources: Vec<String>,
    pub flavors: Vec<FlavorQuotas>,
}

/// The quotas of one flavor inside a resource group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuotas {
    pub name: String,
    pub resources: Vec<ResourceQuota>,
}

/// Quota of one resource in one flavor.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    pub name: String,
    pub nominal_quota: Quantity,
    /// Most this queue may use above its nominal quota; absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Quantity>,
    /// Most of the nominal quota other queues may borrow; absent: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Quantity>,
}

/// How pending workloads of a queue are ordered and retried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum QueueingStrategy {
    /// A head that does not fit blocks the workloads behind it.
    StrictFIFO,
    /// Workloads that fit go ahead of older ones that do not.
    #[default]
    BestEffortFIFO,
}

/// Preemption rules of a [`ClusterQueue`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueuePreemption {
    #[serde(default)]
    pub reclaim_within_cohort: ReclaimPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_within_cohort: Option<BorrowWithinCohort>,
    #[serde(default)]
    pub within_cluster_queue: WithinClusterQueuePolicy,
    /// Tessera extension: workloads of this queue run at least this long (`10m`) before
    /// any preemptor may evict them. Absent: no minimum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_runtime: Option<String>,
}

/// `reclaimWithinCohort`: may a workload preempt borrowers in other queues of the cohort.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReclaimPolicy {
    #[default]
    Never,
    LowerPriority,
    Any,
}

/// `withinClusterQueue`: may a workload preempt others in its own queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WithinClusterQueuePolicy {
    #[default]
    Never,
    LowerPriority,
    LowerOrNewerEqualPriority,
}

/// `borrowWithinCohort`: preemption in the cohort by a workload that needs to borrow.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BorrowWithinCohort {
    #[serde(default)]
    pub policy: BorrowWithinCohortPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority_threshold: Option<i32>,
}

/// Policy of [`BorrowWithinCohort`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum BorrowWithinCohortPolicy {
    #[default]
    Never,
    LowerPriority,
}

/// How flavors are tried when the first one needs borrowing or preemption.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorFungibility {
    #[serde(default)]
    pub when_can_borrow: WhenCanBorrow,
    #[serde(default)]
    pub when_can_preempt: WhenCanPreempt,
}

/// `flavorFungibility.whenCanBorrow`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WhenCanBorrow {
    #[default]
    Borrow,
    TryNextFlavor,
}

/// `flavorFungibility.whenCanPreempt`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum WhenCanPreempt {
    Preempt,
    #[default]
    TryNextFlavor,
}

/// `stopPolicy`: pause admission (`Hold`) or pause and evict (`HoldAndDrain`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StopPolicy {
    #[default]
    None,
    Hold,
    HoldAndDrain,
}

/// A Kubernetes label selector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One expression of a [`LabelSelector`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector (unknown operators match nothing).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let have = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => have.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => have.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => have.is_some(),
                    "DoesNotExist" => have.is_none(),
                    _ => false,
                }
            })
    }
}

/// `LocalQueue`: a namespaced name users put on their jobs, pointing at a ClusterQueue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalQueue {
    pub metadata: ObjectMeta,
    pub spec: LocalQueueSpec,
}

/// Spec of a [`LocalQueue`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalQueueSpec {
    pub cluster_queue: String,
}

/// `WorkloadPriorityClass`: a named priority for queueing and preemption only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPriorityClass {
    pub metadata: ObjectMeta,
    pub value: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `Workload`: the unit of admission, a gang of pod sets admitted all together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    pub metadata: ObjectMeta,
    pub spec: WorkloadSpec,
}

/// Spec of a [`Workload`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default)]
    pub queue_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    pub pod_sets: Vec<PodSet>,
}

/// A group of identical pods inside a workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    #[serde(default = "default_pod_set_name")]
    pub name: String,
    pub count: u32,
    /// Partial admission: the fewest pods this pod set may run with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<u32>,
    pub template: PodTemplateSpec,
}

fn default_pod_set_name() -> String {
    "main".to_string()
}

/// A pod template (the subset that matters for quota).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    #[serde(default)]
    pub spec: PodSpec,
}

/// A pod spec (the subset that matters for quota).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_claims: Vec<PodResourceClaim>,
}

/// A container's name and resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: ResourceRequirements,
}

/// Requests and limits of a container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
}

/// A pod's reference to a DRA ResourceClaimTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResourceClaim {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claim_template_name: Option<String>,
}

impl PodSpec {
    /// Effective per-pod requests: the larger of the sum over containers and the largest
    /// init container, per resource (Kubernetes rules). Extended resources without a
    /// request take their limit. HAMi-style vGPU shares (`nvidia.com/gpumem`,
    /// `gpumem-percentage`, `gpucores`) are charged per vGPU times the count
    /// ([`crate::vgpu::charge`]), and an init container's shares are added, not maxed:
    /// the node's vGPU books hold them for the pod's life.
    pub fn effective_requests(&self) -> BTreeMap<String, Quantity> {
        static NAMES: LazyLock<ResourceNames> =
            LazyLock::new(|| ResourceNames::new(DEFAULT_PREFIX));
        fn requests_of(c: &Container) -> BTreeMap<String, Quantity> {
            let mut out = c.resources.requests.clone();
            for (k, v) in &c.resources.limits {
                out.entry(k.clone()).or_insert(*v);
            }
            charged(out, &NAMES)
        }
        let shares = NAMES.share_names();
        let mut sum: BTreeMap<String, Quantity> = BTreeMap::new();
        for c in &self.containers {
            for (k, v) in requests_of(c) {
                let e = sum.entry(k).or_default();
                e.0 = e.0.saturating_add(v.0);
            }
        }
        let mut init: BTreeMap<String, Quantity> = BTreeMap::new();
        for c in &self.init_containers {
            for (k, v) in requests_of(c) {
                if shares.contains(&k.as_str()) {
                    let e = sum.entry(k).or_default();
                    e.0 = e.0.saturating_add(v.0);
                } else {
                    let e = init.entry(k).or_default();
                    e.0 = e.0.max(v.0);
                }
            }
        }
        for (k, v) in init {
            let e = sum.entry(k).or_default();
            e.0 = e.0.max(v.0);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kueue_cluster_queue_manifest_deserializes() {
        let yaml = r#"
metadata: {name: team-a}
spec:
  cohort: research
  namespaceSelector: {}
  queueingStrategy: StrictFIFO
  resourceGroups:
  - coveredResources: ["cpu", "nvidia.com/gpu"]
    flavors:
    - name: h100
      resources:
      - {name: cpu, nominalQuota: 96}
      - {name: nvidia.com/gpu, nominalQuota: 8, borrowingLimit: 4, lendingLimit: 2}
  preemption:
    reclaimWithinCohort: Any
    withinClusterQueue: LowerOrNewerEqualPriority
    borrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 100}
  flavorFungibility: {whenCanBorrow: TryNextFlavor, whenCanPreempt: Preempt}
  stopPolicy: Hold
"#;
        let cq: ClusterQueue = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(cq.spec.cohort_name.as_deref(), Some("research"));
        assert_eq!(cq.spec.queueing_strategy, QueueingStrategy::StrictFIFO);
        let gpu = &cq.spec.resource_groups[0].flavors[0].resources[1];
        assert_eq!(gpu.borrowing_limit, Some(Quantity::units(4)));
        assert_eq!(gpu.lending_limit, Some(Quantity::units(2)));
        assert_eq!(cq.spec.preemption.reclaim_within_cohort, ReclaimPolicy::Any);
        assert_eq!(
            cq.spec.flavor_fungibility.when_can_preempt,
            WhenCanPreempt::Preempt
        );
        assert_eq!(cq.spec.stop_policy, StopPolicy::Hold);
        // Round trip keeps Kueue's camelCase names.
        let json = serde_json::to_value(&cq).unwrap();
        assert!(json["spec"]["resourceGroups"][0]["coveredResources"].is_array());
        assert_eq!(json["spec"]["cohortName"], "research");
    }

    #[test]
    fn tolerations_follow_kubernetes_rules() {
        let taint = Taint {
            key: "gpu".into(),
            value: Some("h100".into()),
            effect: "NoSchedule".into(),
        };
        let eq = Toleration {
            key: Some("gpu".into()),
            value: Some("h100".into()),
            ..Default::default()
        };
        let exists = Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        let other = Toleration {
            key: Some("gpu".into()),
            value: Some("a100".into()),
            ..Default::default()
        };
        let wrong_effect = Toleration {
            effect: Some("NoExecute".into()),
            ..exists.clone()
        };
        assert!(eq.tolerates(&taint));
        assert!(exists.tolerates(&taint));
        assert!(!other.tolerates(&taint));
        assert!(!wrong_effect.tolerates(&taint));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        let sel = |yaml: &str| serde_saphyr::from_str::<LabelSelector>(yaml).unwrap();
        assert!(sel("{}").matches(&labels));
        assert!(sel("matchLabels: {team: a}").matches(&labels));
        assert!(!sel("matchLabels: {team: b}").matches(&labels));
        assert!(
            sel("matchExpressions: [{key: team, operator: In, values: [a, b]}]").matches(&labels)
        );
        assert!(!sel("matchExpressions: [{key: team, operator: DoesNotExist}]").matches(&labels));
    }

    #[test]
    fn effective_requests_take_max_of_init_and_sum() {
        let spec: PodSpec = serde_saphyr::from_str(
            r#"
containers:
- resources: {requests: {cpu: 1, nvidia.com/gpu: 1}}
- resources: {requests: {cpu: 500m}, limits: {nvidia.com/gpu: 1}}
initContainers:
- resources: {requests: {cpu: 4}}
"#,
        )
        .unwrap();
        let req = spec.effective_requests();
        assert_eq!(req["cpu"], Quantity(4000));
        assert_eq!(req["nvidia.com/gpu"], Quantity::units(2));
    }

    #[test]
    fn vgpu_shares_are_charged_per_vgpu_and_init_shares_added() {
        let spec: PodSpec = serde_saphyr::from_str(
            r#"
containers:
- resources: {limits: {nvidia.com/gpu: 2, nvidia.com/gpumem: 10240, nvidia.com/gpucores: 30}}
- resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 50}}
initContainers:
- resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 2048, nvidia.com/gpucores: 10}}
"#,
        )
        .unwrap();
        let req = spec.effective_requests();
        assert_eq!(req["nvidia.com/gpu"], Quantity::units(3));
        assert_eq!(
            req["nvidia.com/gpumem"],
            Quantity::units(2 * 10_240 + 2_048)
        );
        assert_eq!(req["nvidia.com/gpucores"], Quantity::units(2 * 30 + 10));
        assert_eq!(req["nvidia.com/gpumem-percentage"], Quantity::units(50));
    }
}
