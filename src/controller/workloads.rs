//! Live objects as workloads: gated pods, pod groups, serving replicas and batch Jobs
//! read from a [`Snapshot`] into the engine's [`WorkloadInfo`], with their state
//! (waiting, running, terminating), the objects to act on and what was recorded on them.

use super::claims::ClaimIndex;
use super::model::{ObjKind, ObjRef, Snapshot};
use super::readiness::{self, Requeue};
use super::serving::{Owner, ServingIndex};
use super::time::{millis, Millis};
use super::{
    ADMISSION_GATE, ADMITTED_AT_ANNOTATION, ADMITTED_COUNT_ANNOTATION, CONDITION_TYPE,
    PENDING_MESSAGE_ANNOTATION, PENDING_REASON_ANNOTATION, PRIORITY_ANNOTATION,
};
use crate::quota::objects::{
    merge_live_pod_group, pod_set_of, set_group_min_count, workload_from_live_job,
    workload_from_live_pod, LivePod, LAST_CHECKPOINT_ANNOTATION, POD_GROUP_MIN_COUNT,
};
use crate::quota::WorkloadInfo;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Gated pods / suspended Job: waiting for admission.
    Waiting,
    /// Ungated pods / unsuspended Job: admitted.
    Running,
    /// Evicted, still holding its resources (pods being deleted, suspended Job with
    /// active pods).
    Terminating,
}

#[derive(Debug)]
pub(super) struct Live {
    pub(super) key: String,
    pub(super) info: Option<WorkloadInfo>,
    /// Why the workload cannot be built (shown as its pending reason).
    pub(super) invalid: Option<(String, String)>,
    pub(super) state: State,
    pub(super) objects: Vec<ObjRef>,
    /// Pods still gated (to ungate on admission, also after a restart mid-way).
    pub(super) gated: Vec<ObjRef>,
    /// A partially admitted pod group: how many of its pods were admitted, and its
    /// gated pods beyond that (to delete).
    pub(super) admitted_count: Option<u32>,
    pub(super) excess: Vec<ObjRef>,
    pub(super) graces: Vec<i64>,
    pub(super) admitted_at: Millis,
    /// The reason and message last written on its first object.
    pub(super) recorded: Option<(String, String)>,
    /// The Deployment / ReplicaSet / StatefulSet this replica belongs to.
    pub(super) serving: Option<Owner>,
    /// All its pods are Ready now / were recorded Ready once.
    pub(super) ready: bool,
    pub(super) ready_recorded: bool,
    /// Evicted for pods-ready timeouts before (the Job, its pods, or a replica's owner).
    pub(super) requeue: Option<Requeue>,
    /// A pod group of several pod sets: each pod's pod set (by pod name), so each pod
    /// gets its own pod set's flavors on admission. Empty for one pod set.
    pub(super) pod_sets: BTreeMap<String, String>,
    /// A running or terminating workload: the ClusterQueue its `Workload` record says
    /// admitted it (`status.admission.clusterQueue`), where it stays booked when its
    /// LocalQueue is gone.
    pub(super) admitted_by: Option<String>,
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

fn obj_ref(kind: ObjKind, v: &Value) -> ObjRef {
    ObjRef {
        kind,
        namespace: str_at(v, "/metadata/namespace")
            .unwrap_or("default")
            .to_string(),
        name: str_at(v, "/metadata/name").unwrap_or("").to_string(),
    }
}

/// The value of annotation `key` of object `v`.
pub(super) fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v["metadata"]["annotations"][key].as_str()
}

/// The key of the workload pod `pod` is part of (`None`: it is none of a queue's).
pub(super) fn pod_workload_key(pod: &Value) -> Option<String> {
    if pod_done(pod) {
        return None;
    }
    pod_key(pod)
}

/// The key of the workload live pod `pod` is part of, as [`collect`] keys it: a replica
/// of a serving owner in `serving` is a workload of its own named after the owner.
/// Only a replica's pod is parsed (a pod that does not parse keeps its pod key).
pub(super) fn live_pod_workload_key(pod: &Value, serving: &ServingIndex) -> Option<String> {
    let key = pod_workload_key(pod)?;
    let Some(owner) = serving.owner_of(pod) else {
        return Some(key);
    };
    match workload_from_live_pod(pod) {
        Ok(LivePod::Single(_)) => {
            let r = obj_ref(ObjKind::Pod, pod);
            Some(format!("{}/{}", r.namespace, owner.replica_name(&r.name)))
        }
        _ => Some(key),
    }
}

/// The key of the workload finished pod `pod` (`Succeeded` or `Failed`) was part of.
pub(super) fn done_pod_workload_key(pod: &Value) -> Option<String> {
    if !pod_done(pod) {
        return None;
    }
    pod_key(pod)
}

/// The key of the workload `pod` belongs to by its own labels (a group's, or its own), `None` for
/// a pod that names no queue or belongs to a Job.
pub(super) fn pod_key(pod: &Value) -> Option<String> {
    if !names_queue(pod) || owned_by_job(pod) {
        return None;
    }
    let r = obj_ref(ObjKind::Pod, pod);
    let group = crate::quota::objects::POD_GROUP_LABEL_KEYS
        .iter()
        .find_map(|k| pod["metadata"]["labels"][*k].as_str());
    Some(match group {
        Some(g) => format!("{}/group-{g}", r.namespace),
        None => format!("{}/pod-{}", r.namespace, r.name),
    })
}

/// The workload key of the Job `name` in `namespace`.
pub(super) fn job_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/job-{name}")
}

/// The key of the workload Job `job` is (`None`: it is none of a queue's).
pub(super) fn job_workload_key(job: &Value) -> Option<String> {
    if !names_queue(job) || job_done(job) {
        return None;
    }
    let r = obj_ref(ObjKind::Job, job);
    Some(job_key(&r.namespace, &r.name))
}

fn names_queue(v: &Value) -> bool {
    crate::quota::objects::QUEUE_LABELS
        .iter()
        .any(|k| v["metadata"]["labels"][*k].is_string())
}

/// Whether `pod` still carries Tessera's admission gate.
pub(super) fn is_gated(pod: &Value) -> bool {
    pod["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| g.iter().any(|x| x["name"] == ADMISSION_GATE))
}

fn owned_by_job(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|r| {
            r.iter()
                .any(|o| o["kind"] == "Job" && o["apiVersion"] == "batch/v1")
        })
}

/// Whether `pod` ran to its end (`Succeeded` or `Failed`).
pub(super) fn pod_done(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

fn job_done(job: &Value) -> bool {
    job["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter().any(|x| {
            matches!(x["type"].as_str(), Some("Complete" | "Failed")) && x["status"] == "True"
        })
    })
}

fn recorded_pod(pod: &Value) -> Option<(String, String)> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == CONDITION_TYPE && c["status"] == "False")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
}

fn recorded_job(job: &Value) -> Option<(String, String)> {
    Some((
        annotation(job, PENDING_REASON_ANNOTATION)?.to_string(),
        annotation(job, PENDING_MESSAGE_ANNOTATION)
            .unwrap_or("")
            .to_string(),
    ))
}

/// How long the engine holds an evicted workload's quota: until its objects are gone.
/// The controller sees that happen (the pods deleted, the Job's active pods at zero)
/// and takes the workload out then, so the engine's own grace timer must never fire:
/// it would free the quota while the pods still run, and make every pass after an
/// eviction "timer due" for nothing.
pub(super) const HELD_UNTIL_GONE: Millis = 10 * 365 * 24 * 3600 * 1000;

/// Live-object details the plan format does not carry: creation time, priority fixed
/// by the webhook, last checkpoint as a wall-clock stamp, and [`HELD_UNTIL_GONE`] as
/// the grace period (the engine never admits a preemptor in the same pass as its
/// victims leave, nor frees their quota on a timer).
fn finish_info(info: &mut WorkloadInfo, object: &Value, created: Millis) {
    info.creation = created;
    info.explicit_creation = true;
    info.runtime = None;
    info.pods_ready_after = Some(0);
    if let Some(p) = annotation(object, PRIORITY_ANNOTATION).and_then(|p| p.parse().ok()) {
        info.priority = Some(p);
    }
    info.last_checkpoint = annotation(object, LAST_CHECKPOINT_ANNOTATION).and_then(millis);
    info.grace_period = HELD_UNTIL_GONE;
}

fn grace_seconds(pod: &Value) -> i64 {
    pod["spec"]["terminationGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(30)
}

fn created(v: &Value) -> Millis {
    str_at(v, "/metadata/creationTimestamp")
        .and_then(millis)
        .unwrap_or(0)
}

fn admitted_at(v: &Value) -> Option<Millis> {
    annotation(v, ADMITTED_AT_ANNOTATION).and_then(millis)
}

/// Pods of one group with their workload each.
type Members<'a> = Vec<(&'a Value, WorkloadInfo)>;

/// The pods of one group read so far: the largest total and partial admission floor
/// any of them names, and the members.
#[derive(Default)]
struct Group<'a> {
    total: u32,
    min: Option<u32>,
    members: Members<'a>,
}

/// Splits a running, partially admitted group (`admitted` pods, recorded on its
/// ungated pods) into the members that make up its admission — the ungated pods and,
/// by name, the gated ones still to ungate — and the gated pods beyond (to delete).
/// Gated pods already being deleted belong to neither.
fn split_partial(mut members: Members, admitted: u32) -> (Members, Vec<ObjRef>) {
    members.sort_by(|a, b| str_at(a.0, "/metadata/name").cmp(&str_at(b.0, "/metadata/name")));
    let ungated = members.iter().filter(|(p, _)| !is_gated(p)).count() as u32;
    let mut to_ungate = admitted.saturating_sub(ungated);
    let mut kept = Vec::new();
    let mut excess = Vec::new();
    for (pod, info) in members {
        let deleting = !pod["metadata"]["deletionTimestamp"].is_null();
        if !is_gated(pod) {
            kept.push((pod, info));
        } else if deleting {
            // Left out already, on its way.
        } else if to_ungate > 0 {
            to_ungate -= 1;
            kept.push((pod, info));
        } else {
            excess.push(obj_ref(ObjKind::Pod, pod));
        }
    }
    (kept, excess)
}

/// Charges the pod's DRA claims to `info`; `Err` is its pending reason and message.
fn charge_claims(
    claims: &ClaimIndex,
    info: &mut WorkloadInfo,
    pod_spec: &Value,
) -> Option<(String, String)> {
    claims.charge(info, pod_spec).err()
}

pub(super) fn collect(s: &Snapshot, serving: &ServingIndex, claims: &ClaimIndex) -> Vec<Live> {
    let mut out = Vec::new();
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let mut bad_groups: BTreeMap<String, (Vec<&Value>, String)> = BTreeMap::new();
    for pod in &s.pods {
        if !names_queue(pod) || owned_by_job(pod) || pod_done(pod) {
            continue;
        }
        let r = obj_ref(ObjKind::Pod, pod);
        match workload_from_live_pod(pod) {
            Ok(LivePod::Single(mut info)) => {
                finish_info(&mut info, pod, created(pod));
                let owner = serving.owner_of(pod);
                info.name = match &owner {
                    Some(o) => o.replica_name(&r.name),
                    None => format!("pod-{}", r.name),
                };
                // A replica an InferenceScaler's scale-up added waits for its demand
                // to persist before it may preempt (the scaler's anti-flap window).
                let owned = owner.as_ref().and_then(|o| serving.object(o));
                info.preempt_not_before =
                    owned.and_then(|o| super::serving::preempt_not_before(o, info.creation));
                let key = info.key();
                let bad_claims = charge_claims(claims, &mut info, &pod["spec"]);
                let mut l = live_of_pods(key, Some(info), &[pod], None);
                if bad_claims.is_some() {
                    l.info = None;
                    l.invalid = bad_claims;
                }
                // A replica's owner outlives its pods: it carries their requeue state.
                l.requeue = readiness::latest(l.requeue, owned.and_then(readiness::requeue_state));
                l.serving = owner;
                out.push(l);
            }
            Ok(LivePod::GroupMember {
                group,
                total,
                min,
                pod: mut info,
            }) => {
                finish_info(&mut info, pod, created(pod));
                if let Some((reason, why)) = charge_claims(claims, &mut info, &pod["spec"]) {
                    let key = format!("{}/group-{group}", r.namespace);
                    let entry = bad_groups
                        .entry(key)
                        .or_insert((Vec::new(), format!("{reason}: {why}")));
                    entry.0.push(pod);
                    continue;
                }
                let key = format!("{}/group-{group}", r.namespace);
                let e = groups.entry(key).or_default();
                e.total = e.total.max(total);
                e.min = e.min.max(min);
                e.members.push((pod, info));
            }
            Err(e) => {
                let group = crate::quota::objects::POD_GROUP_LABEL_KEYS
                    .iter()
                    .find_map(|k| pod["metadata"]["labels"][*k].as_str());
                match group {
                    Some(g) => {
                        let key = format!("{}/group-{g}", r.namespace);
                        let entry = bad_groups.entry(key).or_insert((Vec::new(), e.to_string()));
                        entry.0.push(pod);
                    }
                    None => {
                        let key = format!("{}/pod-{}", r.namespace, r.name);
                        out.push(live_of_pods(key, None, &[pod], Some(e.to_string())));
                    }
                }
            }
        }
    }
    for (key, (pods, why)) in bad_groups {
        groups.remove(&key);
        out.push(live_of_pods(key, None, &pods, Some(why)));
    }
    for (key, g) in groups {
        let Group {
            total,
            min,
            members,
        } = g;
        let ungated: Vec<&Value> = members
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !is_gated(p))
            .collect();
        let n = members.len() as u32;
        if ungated.is_empty() && n < total {
            let pods: Vec<&Value> = members.iter().map(|(p, _)| *p).collect();
            let why = format!("{n} of {total} pods of the group exist");
            let mut l = live_of_pods(key, None, &pods, None);
            l.invalid = Some(("PodGroupIncomplete".into(), why));
            out.push(l);
            continue;
        }
        let admitted_count = ungated
            .iter()
            .filter_map(|p| {
                annotation(p, ADMITTED_COUNT_ANNOTATION)?
                    .parse::<u32>()
                    .ok()
            })
            .max();
        let (members, excess) = match admitted_count {
            Some(k) => split_partial(members, k),
            None => (members, Vec::new()),
        };
        let pods: Vec<&Value> = members.iter().map(|(p, _)| *p).collect();
        let group = key
            .split_once('/')
            .map_or(key.as_str(), |(_, g)| g)
            .to_string();
        let (names, infos): (Vec<String>, Vec<WorkloadInfo>) = members
            .into_iter()
            .map(|(p, i)| (str_at(p, "/metadata/name").unwrap_or("").to_string(), i))
            .unzip();
        let mut info = merge_live_pod_group(&group, infos.clone());
        let pod_sets: BTreeMap<String, String> = match &info {
            Some(merged) if merged.pod_sets.len() > 1 => names
                .into_iter()
                .zip(&infos)
                .filter_map(|(n, i)| Some((n, pod_set_of(merged, i)?.to_string())))
                .collect(),
            _ => BTreeMap::new(),
        };
        let mut invalid = None;
        if let Some(i) = info.as_mut() {
            i.name = group;
            match set_group_min_count(i, min) {
                Err(why) if ungated.is_empty() => {
                    invalid = Some(format!("annotation {POD_GROUP_MIN_COUNT}: {why}"));
                }
                // A running group's floor mattered for its admission only; the flavors'
                // node labels written on admission can split it into shapes.
                _ => {}
            }
        }
        if invalid.is_some() {
            info = None;
        }
        let mut l = live_of_pods(key, info, &pods, invalid);
        l.admitted_count = admitted_count;
        l.excess = excess;
        l.pod_sets = pod_sets;
        out.push(l);
    }
    for job in &s.jobs {
        if !names_queue(job) || job_done(job) {
            continue;
        }
        let r = obj_ref(ObjKind::Job, job);
        let key = job_key(&r.namespace, &r.name);
        let suspended = job["spec"]["suspend"] == true;
        let active = job["status"]["active"].as_i64().unwrap_or(0);
        let state = match (suspended, active) {
            (false, _) => State::Running,
            (true, 0) => State::Waiting,
            (true, _) => State::Terminating,
        };
        let (info, invalid) = match workload_from_live_job(job) {
            Ok(mut info) => {
                finish_info(&mut info, job, created(job));
                info.name = format!("job-{}", r.name);
                match charge_claims(claims, &mut info, &job["spec"]["template"]["spec"]) {
                    None => (Some(info), None),
                    Some(bad) => (None, Some(bad)),
                }
            }
            Err(e) => (None, Some(("Invalid".to_string(), e.to_string()))),
        };
        out.push(Live {
            key,
            info,
            invalid,
            state,
            objects: vec![r],
            gated: Vec::new(),
            admitted_count: None,
            excess: Vec::new(),
            graces: vec![0],
            admitted_at: admitted_at(job).unwrap_or_else(|| created(job)),
            recorded: recorded_job(job),
            serving: None,
            ready: readiness::job_ready(job),
            ready_recorded: readiness::ready_recorded(job),
            requeue: readiness::requeue_state(job),
            pod_sets: BTreeMap::new(),
            admitted_by: None,
        });
    }
    for l in out.iter_mut().filter(|l| l.state != State::Waiting) {
        l.admitted_by = s.admitted_by.get(&l.key).cloned();
    }
    out
}

fn live_of_pods(
    key: String,
    info: Option<WorkloadInfo>,
    pods: &[&Value],
    invalid: Option<String>,
) -> Live {
    let mut pods: Vec<&Value> = pods.to_vec();
    pods.sort_by_key(|p| str_at(p, "/metadata/name").unwrap_or("").to_string());
    let terminating = |p: &Value| !p["metadata"]["deletionTimestamp"].is_null();
    let ungated: Vec<&&Value> = pods.iter().filter(|p| !is_gated(p)).collect();
    let state = if ungated.is_empty() {
        State::Waiting
    } else if ungated.iter().all(|p| terminating(p)) {
        State::Terminating
    } else {
        State::Running
    };
    Live {
        key,
        info,
        invalid: invalid.map(|w| ("Invalid".to_string(), w)),
        state,
        objects: pods.iter().map(|p| obj_ref(ObjKind::Pod, p)).collect(),
        gated: pods
            .iter()
            .filter(|p| is_gated(p) && !terminating(p))
            .map(|p| obj_ref(ObjKind::Pod, p))
            .collect(),
        admitted_count: None,
        excess: Vec::new(),
        graces: pods.iter().map(|p| grace_seconds(p)).collect(),
        admitted_at: pods
            .iter()
            .filter_map(|p| admitted_at(p))
            .min()
            .unwrap_or_else(|| pods.iter().map(|p| created(p)).min().unwrap_or(0)),
        recorded: pods.first().and_then(|p| recorded_pod(p)),
        serving: None,
        ready: !ungated.is_empty()
            && ungated
                .iter()
                .filter(|p| !terminating(p))
                .all(|p| readiness::pod_ready(p)),
        ready_recorded: pods.iter().any(|p| readiness::ready_recorded(p)),
        requeue: pods
            .iter()
            .map(|p| readiness::requeue_state(p))
            .fold(None, readiness::latest),
        pod_sets: BTreeMap::new(),
        admitted_by: None,
    }
}
