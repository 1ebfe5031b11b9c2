//! The `Workload` record (`tessera.io/v1alpha1`, Kueue's field names): one object per
//! workload (pod, pod group, Job, serving replica) that says what the controller decided
//! about it: its queue and pod sets, the admission (ClusterQueue, flavor per resource,
//! count), conditions (`QuotaReserved`, `Admitted`, `Evicted`, `PodsReady`, `Requeued`),
//! the pending reason with the queue position, and the requeue state. `kubectl get
//! workloads` shows queue, admission and position.
//!
//! Pure, a leaf: a pass's actions become [`Update`]s (`super::record_updates`); [`Update::apply`] merges one
//! into the stored status the way `meta.SetStatusCondition` does (a condition's
//! `lastTransitionTime` moves only when its status changes), so writing the same update
//! twice changes nothing and an update is written only when it changes the record.
//! `super::workload_writer` does the API calls.
//!
//! ```text
//! Plan.actions ─► updates(engine, lives) ─► Plan.records ─► writer: GET/cache ─► apply ─► POST / PUT / PUT status
//! ```
//! Differences from Kueue's Workload: `spec.podSets[].requests` (per-pod requests, as the
//! engine reads them) stands in for the pod template; `status.positionInClusterQueue` is
//! the place the pending message names (exact for a queue's first places, a range
//! further back, as in the message).

use super::readiness::{hold, latest, Hold, Requeue};
use super::time::{millis, rfc3339};
use crate::quota::{WaitForPodsReady, WorkloadInfo};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The annotation holding the workload's key on its record (the name is derived from it).
pub const KEY_ANNOTATION: &str = "tessera.io/workload-key";

/// The workload key record `v` belongs to and the place in its ClusterQueue its status
/// shows (`status.positionInClusterQueue`), when it shows one.
pub fn recorded_place(v: &Value) -> Option<(&str, &str)> {
    let key = v["metadata"]["annotations"][KEY_ANNOTATION].as_str()?;
    let place = v["status"]["positionInClusterQueue"].as_str()?;
    Some((key, place))
}

/// The workload key record `v` belongs to and the ClusterQueue its admission names
/// (`status.admission.clusterQueue`), when it is admitted.
pub fn recorded_admission(v: &Value) -> Option<(&str, &str)> {
    let key = v["metadata"]["annotations"][KEY_ANNOTATION].as_str()?;
    let cq = v["status"]["admission"]["clusterQueue"].as_str()?;
    Some((key, cq))
}

/// The longest record name written (a DNS subdomain may have 253 characters).
const MAX_NAME: usize = 253;

/// `spec` of a Workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// The LocalQueue, in the workload's namespace.
    pub queue_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The priority the workload is queued with (explicit, or its class's value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
}

/// A pod set: `count` pods with the same per-pod `requests`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    pub name: String,
    pub count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<u32>,
    /// Per pod, as quantities (`"2"`, `"10Gi"`).
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

/// `status` of a Workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_state: Option<RequeueState>,
    /// Where a pending workload waits in its ClusterQueue (`"3"`, `"11-20"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_in_cluster_queue: Option<String>,
}

/// Where the workload holds quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    pub cluster_queue: String,
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

/// One pod set's flavors (resource → ResourceFlavor) and admitted pod count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    pub name: String,
    #[serde(default)]
    pub flavors: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// A `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `"True"` or `"False"`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339; moves only when `status` changes.
    #[serde(default)]
    pub last_transition_time: String,
}

/// Kueue's `requeueState`: pods-ready timeouts so far and when the backoff ends, and
/// (Tessera's) when the last timeout evicted the workload: the backoff and, for a pod
/// group or a lone pod, how long the record outlives its pods run from it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequeueState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_at: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_at: Option<String>,
}

impl RequeueState {
    /// State `r` as written: with `requeueAt` while `cfg`'s backoff holds the workload.
    pub fn of(r: Requeue, cfg: Option<&WaitForPodsReady>) -> RequeueState {
        let requeue_at = cfg.and_then(|cfg| match hold(cfg, r, r.evicted_at) {
            Some(Hold::Backoff(until)) => Some(rfc3339(until)),
            _ => None,
        });
        RequeueState {
            count: Some(r.count),
            requeue_at,
            evicted_at: Some(rfc3339(r.evicted_at)),
        }
    }

    /// The state as a pass reads it; `None` without a count or a readable `evictedAt`
    /// (a record written by a version before `evictedAt` counts as never requeued).
    pub fn requeue(&self) -> Option<Requeue> {
        Some(Requeue {
            count: self.count?,
            evicted_at: self.evicted_at.as_deref().and_then(millis)?,
        })
    }
}

/// A Pod or Job a record belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRef {
    /// `"Pod"` or `"Job"`.
    pub kind: &'static str,
    pub name: String,
}

/// How an update treats one condition.
#[derive(Clone, Debug, PartialEq)]
pub enum Set {
    /// Always written.
    Always(Condition),
    /// Written only when the record already has a condition of this type (a past
    /// eviction is marked over; a workload never evicted gets no `Evicted` condition).
    IfPresent(Condition),
}

/// What one pass says about one workload's record.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// The workload's key (`namespace/…`).
    pub key: String,
    pub namespace: String,
    /// The record's name ([`record_name`]).
    pub name: String,
    /// The objects the workload is made of (the record's owners: deleted with them).
    pub owners: Vec<OwnerRef>,
    /// `None` when the workload could not be read (an invalid one): a new record gets an
    /// empty spec, a stored one keeps its own.
    pub spec: Option<WorkloadSpec>,
    /// `Some(x)`: set the admission to `x`; `None`: leave it.
    pub admission: Option<Option<Admission>>,
    pub conditions: Vec<Set>,
    /// `Some(x)`: set the requeue state to `x`; `None`: leave it.
    pub requeue_state: Option<Option<RequeueState>>,
    /// `Some(x)`: set the position to `x`; `None`: leave it.
    pub position: Option<Option<String>>,
}

impl Update {
    /// An update of record `name` in `namespace` (workload `key`) that changes nothing
    /// yet: no owners, no spec, every field left as stored.
    pub fn blank(key: &str, namespace: &str, name: &str) -> Update {
        Update {
            key: key.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            owners: Vec::new(),
            spec: None,
            admission: None,
            conditions: Vec::new(),
            requeue_state: None,
            position: None,
        }
    }

    /// The stored status with this update applied at `now` (RFC 3339).
    pub fn apply(&self, stored: &WorkloadStatus, now: &str) -> WorkloadStatus {
        let mut out = stored.clone();
        if let Some(a) = &self.admission {
            out.admission = a.clone();
        }
        if let Some(r) = &self.requeue_state {
            // Never back: a state older than the stored one (another writer's, a pass
            // that read before it) leaves the stored one.
            let new = r.as_ref().and_then(RequeueState::requeue);
            let old = stored
                .requeue_state
                .as_ref()
                .and_then(RequeueState::requeue);
            let older = new.is_some() && new != old && latest(new, old) == old;
            if !older {
                out.requeue_state = r.clone();
            }
        }
        if let Some(p) = &self.position {
            out.position_in_cluster_queue = p.clone();
        }
        for set in &self.conditions {
            let (c, only_if_present) = match set {
                Set::Always(c) => (c, false),
                Set::IfPresent(c) => (c, true),
            };
            match out.conditions.iter_mut().find(|s| s.type_ == c.type_) {
                Some(s) => {
                    let moved = s.status != c.status;
                    let at = if moved || s.last_transition_time.is_empty() {
                        now.to_string()
                    } else {
                        s.last_transition_time.clone()
                    };
                    *s = Condition {
                        last_transition_time: at,
                        ..c.clone()
                    };
                }
                None if !only_if_present => out.conditions.push(Condition {
                    last_transition_time: now.to_string(),
                    ..c.clone()
                }),
                None => {}
            }
        }
        out
    }
}

pub fn condition(type_: &str, status: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        last_transition_time: String::new(),
    }
}

/// The record name of workload `key` (`namespace/name-part`): the part after the
/// namespace when it is a valid DNS subdomain of at most 253 characters, else that part
/// made valid (lowercased, other characters as `-`, shortened) with a hash of the key
/// appended, so two keys never share a name.
pub fn record_name(key: &str) -> String {
    let part = key.split_once('/').map_or(key, |(_, p)| p);
    if is_dns_subdomain(part) {
        return part.to_string();
    }
    let mut clean: String = part
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    clean.truncate(MAX_NAME - 9);
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = fnv1a(key.as_bytes());
    match clean.is_empty() {
        true => format!("wl-{hash:08x}"),
        false => format!("{clean}-{hash:08x}"),
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// 32-bit FNV-1a: a short, stable hash (not for security).
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The spec of a workload read as `info`, queued with `priority` (`None`: its class is
/// not known).
pub fn spec_of(info: &WorkloadInfo, priority: Option<i32>) -> WorkloadSpec {
    WorkloadSpec {
        queue_name: info.queue_name.clone(),
        priority_class_name: info.priority_class.clone(),
        priority,
        pod_sets: info
            .pod_sets
            .iter()
            .map(|ps| PodSet {
                name: ps.name.clone(),
                count: ps.count,
                min_count: ps.min_count,
                requests: ps
                    .requests
                    .iter()
                    .map(|(r, q)| (r.clone(), q.to_string()))
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::events::place_in_message;

    fn pending(msg: &str) -> Update {
        Update {
            key: "team/job-a".into(),
            namespace: "team".into(),
            name: "job-a".into(),
            owners: vec![],
            spec: None,
            admission: Some(None),
            conditions: vec![Set::Always(condition(
                "QuotaReserved",
                false,
                "Pending",
                msg,
            ))],
            requeue_state: None,
            position: Some(place_in_message(msg).map(String::from)),
        }
    }

    #[test]
    fn names_are_the_key_or_a_valid_name_with_a_hash() {
        assert_eq!(record_name("team/job-train"), "job-train");
        assert_eq!(
            record_name("team/deployment-web.web-abc"),
            "deployment-web.web-abc"
        );
        let odd = record_name("team/group-My_Group");
        assert!(odd.starts_with("group-my-group-"), "{odd}");
        assert!(is_dns_subdomain(&odd));
        assert_ne!(odd, record_name("team/group-my-group"));
        assert_ne!(record_name("team/group-A"), record_name("team/group-a_"));
        let long = record_name(&format!("team/pod-{}", "x".repeat(400)));
        assert!(long.len() <= MAX_NAME && is_dns_subdomain(&long), "{long}");
        assert!(is_dns_subdomain(&record_name("team/__")));
    }

    #[test]
    fn a_condition_moves_its_time_only_when_its_status_changes() {
        let first = pending("queued (position 3 in its ClusterQueue)")
            .apply(&WorkloadStatus::default(), "t1");
        assert_eq!(first.position_in_cluster_queue.as_deref(), Some("3"));
        assert_eq!(first.conditions[0].last_transition_time, "t1");
        let later = pending("queued (position 11-20 in its ClusterQueue)").apply(&first, "t2");
        assert_eq!(later.position_in_cluster_queue.as_deref(), Some("11-20"));
        assert_eq!(later.conditions[0].last_transition_time, "t1");
        assert_eq!(later.conditions.len(), 1);
        let same = pending("queued (position 11-20 in its ClusterQueue)").apply(&later, "t3");
        assert_eq!(same, later, "the same update twice changes nothing");
        let mut admitted = pending("");
        admitted.conditions = vec![Set::Always(condition(
            "QuotaReserved",
            true,
            "QuotaReserved",
            "",
        ))];
        let moved = admitted.apply(&later, "t4");
        assert_eq!(moved.conditions[0].last_transition_time, "t4");
        assert_eq!(moved.position_in_cluster_queue, None);
    }

    #[test]
    fn if_present_conditions_touch_only_records_that_have_them() {
        let mut u = pending("");
        u.conditions = vec![Set::IfPresent(condition("Evicted", false, "Admitted", ""))];
        assert!(u
            .apply(&WorkloadStatus::default(), "t")
            .conditions
            .is_empty());
        let evicted = WorkloadStatus {
            conditions: vec![Condition {
                last_transition_time: "t0".into(),
                ..condition("Evicted", true, "Preempted", "")
            }],
            ..Default::default()
        };
        let after = u.apply(&evicted, "t1");
        assert_eq!(after.conditions[0].status, "False");
        assert_eq!(after.conditions[0].last_transition_time, "t1");
    }

    #[test]
    fn a_status_round_trips_with_kueues_field_names() {
        let s = WorkloadStatus {
            admission: Some(Admission {
                cluster_queue: "cq".into(),
                pod_set_assignments: vec![PodSetAssignment {
                    name: "main".into(),
                    flavors: [("nvidia.com/gpu".to_string(), "h100".to_string())].into(),
                    count: Some(2),
                }],
            }),
            requeue_state: Some(RequeueState {
                count: Some(1),
                requeue_at: Some("2026-01-01T00:00:00Z".into()),
                evicted_at: Some("2025-12-31T23:59:50Z".into()),
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(v["admission"]["clusterQueue"], "cq");
        assert_eq!(
            v["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"],
            "h100"
        );
        assert_eq!(v["requeueState"]["requeueAt"], "2026-01-01T00:00:00Z");
        let back: WorkloadStatus = serde_json::from_value(v).unwrap_or_default();
        assert_eq!(back, s);
    }
}
