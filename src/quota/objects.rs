//! Kubernetes objects as workloads: the labels and annotations Tessera reads from a pod,
//! a pod group or a batch Job (queue, priority class, pod group and its counts, runtime,
//! checkpoints) and the [`WorkloadInfo`] they make. Pure and shared: `tessera plan`'s file
//! reader ([`super::scenario`]) and the controller's reader of live objects both call it,
//! so a plan file and a cluster read the same pod the same way.

use super::api::{ObjectMeta, PodSpec, PodTemplateSpec, Workload};
use super::error::{Error, Result};
use super::model::{PodSetInfo, WorkloadInfo};
use super::quantity::{parse_duration, Time};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Labels naming the LocalQueue, ours first.
pub const QUEUE_LABELS: [&str; 2] = ["tessera.io/queue-name", "kueue.x-k8s.io/queue-name"];

/// Labels naming the WorkloadPriorityClass, ours first.
pub const PRIORITY_LABELS: [&str; 2] =
    ["tessera.io/priority-class", "kueue.x-k8s.io/priority-class"];

pub const RUNTIME_ANNOTATION: &str = "tessera.io/runtime";

pub const CHECKPOINT_INTERVAL_ANNOTATION: &str = "tessera.io/checkpoint-interval";

pub const LAST_CHECKPOINT_ANNOTATION: &str = "tessera.io/last-checkpoint";

pub const PODS_READY_ANNOTATION: &str = "tessera.io/pods-ready-after";

pub(super) const POD_GROUP_LABELS: [&str; 2] =
    ["tessera.io/pod-group-name", "kueue.x-k8s.io/pod-group-name"];

/// Labels naming a pod group, ours first.
pub const POD_GROUP_LABEL_KEYS: [&str; 2] = POD_GROUP_LABELS;

pub(super) const POD_GROUP_COUNT: [&str; 2] = [
    "tessera.io/pod-group-total-count",
    "kueue.x-k8s.io/pod-group-total-count",
];

pub(super) const JOB_MIN_PARALLELISM: &str = "kueue.x-k8s.io/job-min-parallelism";

/// Partial admission of a pod group: the fewest pods it may run with (Kueue has no
/// such annotation for plain pod groups; Jobs use `job-min-parallelism`).
pub const POD_GROUP_MIN_COUNT: &str = "tessera.io/pod-group-min-count";

/// `batch/v1` Job (the subset that matters).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Job {
    pub(super) metadata: ObjectMeta,
    pub(super) spec: JobSpec,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JobSpec {
    #[serde(default)]
    pub(super) parallelism: Option<u32>,
    #[serde(default)]
    pub(super) completions: Option<u32>,
    pub(super) template: PodTemplateSpec,
}

/// `v1` Pod.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct Pod {
    pub(super) metadata: ObjectMeta,
    pub(super) spec: PodSpec,
}

pub(super) fn first_label<'a>(map: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| map.get(*k).map(String::as_str))
}

pub(super) fn annotation_time(meta: &ObjectMeta, key: &str) -> Result<Option<Time>> {
    meta.annotations
        .get(key)
        .map(|v| {
            parse_duration(v).map_err(|e| Error::Invalid {
                kind: "Workload",
                name: meta.name.clone(),
                field: format!("metadata.annotations.{key}"),
                why: e.to_string(),
            })
        })
        .transpose()
}

pub(super) fn common(meta: &ObjectMeta, queue: String, at: Option<Time>) -> Result<WorkloadInfo> {
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let mut w = WorkloadInfo::new(&format!("{ns}/{}", meta.name), &queue);
    w.creation = at.unwrap_or(0);
    w.explicit_creation = at.is_some();
    w.runtime = annotation_time(meta, RUNTIME_ANNOTATION)?;
    w.checkpoint_interval = annotation_time(meta, CHECKPOINT_INTERVAL_ANNOTATION)?;
    w.last_checkpoint = annotation_time(meta, LAST_CHECKPOINT_ANNOTATION)?;
    w.pods_ready_after = match meta
        .annotations
        .get(PODS_READY_ANNOTATION)
        .map(String::as_str)
    {
        Some("never") => None,
        Some(_) => annotation_time(meta, PODS_READY_ANNOTATION)?,
        None => Some(0),
    };
    Ok(w)
}

pub(super) fn pod_set(name: &str, count: u32, min: Option<u32>, spec: &PodSpec) -> PodSetInfo {
    PodSetInfo {
        name: name.to_string(),
        count,
        min_count: min,
        requests: spec.effective_requests(),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        claim_templates: spec
            .resource_claims
            .iter()
            .filter_map(|c| c.resource_claim_template_name.clone())
            .collect(),
    }
}

pub(super) fn grace(spec: &PodSpec) -> Time {
    spec.termination_grace_period_seconds
        .unwrap_or(0)
        .saturating_mul(1000)
}

pub(super) fn from_workload(w: &Workload, at: Option<Time>) -> Result<WorkloadInfo> {
    let mut info = common(&w.metadata, w.spec.queue_name.clone(), at)?;
    info.priority = w.spec.priority;
    info.priority_class = w.spec.priority_class_name.clone();
    info.pod_sets = w
        .spec
        .pod_sets
        .iter()
        .map(|ps| pod_set(&ps.name, ps.count, ps.min_count, &ps.template.spec))
        .collect();
    info.grace_period = w
        .spec
        .pod_sets
        .iter()
        .map(|ps| grace(&ps.template.spec))
        .max()
        .unwrap_or(0);
    Ok(info)
}

pub(super) fn from_pods(
    meta: &ObjectMeta,
    spec: &PodSpec,
    name: &str,
    count: u32,
    min: Option<u32>,
    at: Option<Time>,
) -> Result<WorkloadInfo> {
    let queue = first_label(&meta.labels, &QUEUE_LABELS)
        .unwrap_or("")
        .to_string();
    let mut info = common(meta, queue, at)?;
    info.priority_class = first_label(&meta.labels, &PRIORITY_LABELS).map(str::to_string);
    info.pod_sets = vec![pod_set(name, count, min, spec)];
    info.grace_period = grace(spec);
    Ok(info)
}

/// Whether two pods' pod sets are one: same requests, node selector and tolerations.
fn same_shape(a: &PodSetInfo, b: &PodSetInfo) -> bool {
    a.requests == b.requests && a.node_selector == b.node_selector && a.tolerations == b.tolerations
}

/// The pod set of `group` (as [`merge_live_pod_group`] made it) that member `pod` is in.
pub fn pod_set_of<'a>(group: &'a WorkloadInfo, pod: &WorkloadInfo) -> Option<&'a str> {
    let own = pod.pod_sets.first()?;
    group
        .pod_sets
        .iter()
        .find(|p| same_shape(p, own))
        .map(|p| p.name.as_str())
}

/// A pod group becomes one workload; identical pods share a pod set.
pub(super) fn merge_group(group: &str, members: Vec<WorkloadInfo>) -> WorkloadInfo {
    let mut out = members[0].clone();
    out.name = group.to_string();
    out.pod_sets.clear();
    for m in &members {
        out.creation = out.creation.min(m.creation);
        out.runtime = out.runtime.max(m.runtime);
        out.grace_period = out.grace_period.max(m.grace_period);
        for ps in &m.pod_sets {
            match out.pod_sets.iter_mut().find(|p| same_shape(p, ps)) {
                Some(p) => p.count += ps.count,
                None => {
                    let mut p = ps.clone();
                    p.name = format!("role-{}", out.pod_sets.len());
                    out.pod_sets.push(p);
                }
            }
        }
    }
    out
}

/// A pod group's total count (`pod-group-total-count`, ours or Kueue's) and partial
/// admission floor ([`POD_GROUP_MIN_COUNT`]) from a member's annotations; `Err` names
/// the annotation and what is wrong with it.
pub fn pod_group_counts(
    annotations: &BTreeMap<String, String>,
) -> std::result::Result<(u32, Option<u32>), (&'static str, String)> {
    let total_key = POD_GROUP_COUNT[1];
    let total = first_label(annotations, &POD_GROUP_COUNT)
        .ok_or((total_key, "a pod group needs its total count".to_string()))?
        .parse::<u32>()
        .map_err(|_| (total_key, "not a number".to_string()))?;
    if total == 0 {
        return Err((total_key, "must be at least 1".into()));
    }
    let min = annotations
        .get(POD_GROUP_MIN_COUNT)
        .map(|v| {
            let min = v
                .parse::<u32>()
                .map_err(|_| (POD_GROUP_MIN_COUNT, format!("{v:?} is not a number")))?;
            if min == 0 || min > total {
                return Err((
                    POD_GROUP_MIN_COUNT,
                    format!("{min} is not between 1 and the group's total count {total}"),
                ));
            }
            Ok(min)
        })
        .transpose()?;
    Ok((total, min))
}

/// Sets a merged pod group's partial admission floor. Only a group whose pods are all
/// alike (one pod set) can run with fewer: which pods to leave out of a group of
/// several shapes is not the controller's to guess.
pub fn set_group_min_count(
    w: &mut WorkloadInfo,
    min: Option<u32>,
) -> std::result::Result<(), String> {
    let Some(min) = min else { return Ok(()) };
    match w.pod_sets.as_mut_slice() {
        [only] => {
            only.min_count = Some(min.min(only.count));
            Ok(())
        }
        sets => Err(format!(
            "partial admission needs the group's pods alike (same requests, node selector and tolerations); they come in {} shapes",
            sets.len()
        )),
    }
}

/// A live Pod read by the controller: a workload of its own, or one member of a group.
#[derive(Clone, Debug, PartialEq)]
pub enum LivePod {
    Single(WorkloadInfo),
    GroupMember {
        group: String,
        total: u32,
        /// The group's partial admission floor ([`POD_GROUP_MIN_COUNT`]).
        min: Option<u32>,
        pod: WorkloadInfo,
    },
}

/// Annotations that only mean something in a plan (simulated runtime and readiness, an
/// offset checkpoint time); a live object's own clock decides those.
const PLAN_ONLY_ANNOTATIONS: [&str; 3] = [
    RUNTIME_ANNOTATION,
    PODS_READY_ANNOTATION,
    LAST_CHECKPOINT_ANNOTATION,
];

/// Reads a live object (JSON from the API server) into the plan's shape. The pod
/// template's own metadata is not needed for quota and is dropped (it has no name).
fn live<T: for<'de> Deserialize<'de>>(kind: &'static str, object: &serde_json::Value) -> Result<T> {
    let mut object = object.clone();
    if let Some(spec) = object.get_mut("spec").and_then(|s| s.as_object_mut()) {
        if let Some(t) = spec.get_mut("template").and_then(|t| t.as_object_mut()) {
            t.remove("metadata");
        }
    }
    if let Some(a) = object
        .pointer_mut("/metadata/annotations")
        .and_then(|a| a.as_object_mut())
    {
        for k in PLAN_ONLY_ANNOTATIONS {
            a.remove(k);
        }
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("")
        .to_string();
    serde_path_to_error::deserialize(object).map_err(|e| Error::Invalid {
        kind,
        name,
        field: e.path().to_string(),
        why: e.inner().to_string(),
    })
}

/// A live Pod as a workload, the way a plan reads a `Pod` document (queue and priority
/// labels, requests, pod-group label and total-count annotation). Creation time is 0:
/// the caller sets it from the object's own timestamp.
pub fn workload_from_live_pod(pod: &serde_json::Value) -> Result<LivePod> {
    let p: Pod = live("Pod", pod)?;
    let info = from_pods(&p.metadata, &p.spec, "main", 1, None, None)?;
    let Some(group) = first_label(&p.metadata.labels, &POD_GROUP_LABELS) else {
        return Ok(LivePod::Single(info));
    };
    let (total, min) =
        pod_group_counts(&p.metadata.annotations).map_err(|(field, why)| Error::Invalid {
            kind: "Pod",
            name: p.metadata.name.clone(),
            field: format!("metadata.annotations.{field}"),
            why,
        })?;
    Ok(LivePod::GroupMember {
        group: group.to_string(),
        total,
        min,
        pod: info,
    })
}

/// A live batch Job as a workload: one pod set of `min(parallelism, completions)` pods,
/// partial admission from `kueue.x-k8s.io/job-min-parallelism`.
pub fn workload_from_live_job(job: &serde_json::Value) -> Result<WorkloadInfo> {
    let j: Job = live("Job", job)?;
    let (count, min) = job_pod_counts(&j).map_err(|()| Error::Invalid {
        kind: "Job",
        name: j.metadata.name.clone(),
        field: format!("metadata.annotations.{JOB_MIN_PARALLELISM}"),
        why: "not a number".into(),
    })?;
    from_pods(&j.metadata, &j.spec.template.spec, "main", count, min, None)
}

/// A Job's pod count, `min(parallelism, completions)` (1 when unset), and its partial
/// admission floor from `kueue.x-k8s.io/job-min-parallelism`; `Err` when that annotation
/// is not a number.
pub(super) fn job_pod_counts(j: &Job) -> std::result::Result<(u32, Option<u32>), ()> {
    let count = match (j.spec.parallelism, j.spec.completions) {
        (Some(p), Some(c)) => p.min(c),
        (Some(p), None) => p,
        (None, _) => 1,
    };
    let min = j
        .metadata
        .annotations
        .get(JOB_MIN_PARALLELISM)
        .map(|v| v.parse::<u32>().map_err(|_| ()))
        .transpose()?;
    Ok((count, min))
}

/// The members of a pod group as one workload (identical pods share a pod set).
pub fn merge_live_pod_group(group: &str, members: Vec<WorkloadInfo>) -> Option<WorkloadInfo> {
    if members.is_empty() {
        return None;
    }
    Some(merge_group(group, members))
}
