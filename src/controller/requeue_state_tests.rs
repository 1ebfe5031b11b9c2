//! Table tests of the pure decision with requeue state ConfigMaps: a timed-out pod group
//! gets its state written before its eviction, recreated pods wait out the backoff the
//! state holds (and stay deactivated past the limit), state no longer needed is
//! forgotten, and corrupt entries are reported and ignored.

use super::decide::{decide, Action, Plan, Snapshot};
use super::lease::Millis;
use super::pods_ready::{next_count, Requeue};
use super::requeue_book::MIN_TTL;
use super::requeue_state::{Entry, CONFIGMAP_NAME};
use super::time::rfc3339;
use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
use crate::quota::WaitForPodsReady;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// 12:01:00, a minute after the pods' creation.
const NOW: Millis = 1_795_003_260_000;

fn pods_ready() -> WaitForPodsReady {
    WaitForPodsReady {
        timeout: 60_000,
        backoff_base: 10_000,
        backoff_max: 100_000,
        backoff_limit_count: Some(2),
        requeue_by_eviction_time: true,
        block_admission: false,
    }
}

/// A snapshot at `now` with 4 GPUs of quota, `waitForPodsReady` and these objects.
fn snapshot(now: Millis, pods: Vec<Value>, states: Vec<Value>) -> Snapshot {
    let mut cq = cluster_queue("cq")
        .quota("h100", "nvidia.com/gpu", 4)
        .build();
    cq.spec.namespace_selector = Some(Default::default());
    Snapshot {
        now,
        flavors: vec![flavor("h100")],
        cluster_queues: vec![cq],
        local_queues: vec![local_queue("team", "lq", "cq")],
        namespaces: vec![("team".into(), Default::default())],
        pods,
        requeue_states: states,
        pods_ready: Some(pods_ready()),
        ..Default::default()
    }
}

/// Builder of a pod of group `g` (2 pods), one GPU.
struct PodB(Value);

impl PodB {
    fn member(name: &str) -> PodB {
        PodB(json!({"metadata": {"name": name, "namespace": "team",
            "creationTimestamp": "2026-11-18T12:00:00Z",
            "labels": {"tessera.io/queue-name": "lq", "tessera.io/pod-group-name": "g"},
            "annotations": {"tessera.io/pod-group-total-count": "2"}},
            "spec": {"schedulingGates": [{"name": "tessera.io/admission"}],
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    }

    /// Ungated and admitted at `at`.
    fn admitted(mut self, at: Millis) -> PodB {
        self.0["spec"]
            .as_object_mut()
            .unwrap()
            .remove("schedulingGates");
        self.0["metadata"]["annotations"]["tessera.io/admitted-at"] = json!(rfc3339(at));
        self
    }

    fn ready(mut self) -> PodB {
        self.0["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        self
    }

    fn phase(mut self, phase: &str) -> PodB {
        self.0["status"]["phase"] = json!(phase);
        self
    }
}

fn group(build: impl Fn(PodB) -> PodB) -> Vec<Value> {
    ["g-0", "g-1"]
        .map(|n| build(PodB::member(n)).0)
        .into_iter()
        .collect()
}

fn state_cm(entries: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": CONFIGMAP_NAME, "namespace": "team"}, "data": data})
}

fn entry_json(count: u32, evicted_at: Millis) -> String {
    json!({"workload": "team/group-g", "count": count, "evictedAt": rfc3339(evicted_at)})
        .to_string()
}

fn state_actions(plan: &Plan) -> Vec<(Vec<Entry>, BTreeMap<String, String>)> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::RequeueState { set, forget, .. } => Some((set.clone(), forget.clone())),
            _ => None,
        })
        .collect()
}

fn pending(plan: &Plan) -> Option<(String, String)> {
    plan.actions.iter().find_map(|a| match a {
        Action::Pending {
            reason, message, ..
        } => Some((reason.clone(), message.clone())),
        _ => None,
    })
}

fn admitted(plan: &Plan) -> bool {
    plan.actions
        .iter()
        .any(|a| matches!(a, Action::Admit { .. }))
}

#[test]
fn a_timed_out_group_writes_its_state_before_its_eviction() {
    let pods = group(|p| p.admitted(NOW - 60_000));
    let plan = decide(&snapshot(NOW, pods, vec![]));
    let kinds: Vec<&str> = plan
        .actions
        .iter()
        .map(|a| match a {
            Action::RequeueState { .. } => "state",
            Action::Evict { .. } => "evict",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["state", "evict"]);
    let want = Entry {
        workload: "team/group-g".into(),
        requeue: Requeue {
            count: 1,
            evicted_at: NOW,
        },
    };
    assert_eq!(state_actions(&plan), [(vec![want], BTreeMap::new())]);
    let Some(Action::Evict { requeue, .. }) = plan.actions.last() else {
        panic!("{:?}", plan.actions)
    };
    assert_eq!(*requeue, Some(1));

    // The state was written but the eviction failed: retried without counting again.
    let pods = group(|p| p.admitted(NOW - 60_000));
    let cm = state_cm(&[("group-g", &entry_json(1, NOW))]);
    let plan = decide(&snapshot(NOW + 1_000, pods, vec![cm]));
    let (set, _) = &state_actions(&plan)[0];
    assert_eq!(set[0].requeue.count, 1);
}

#[test]
fn recreated_pods_wait_out_the_backoff_the_state_holds() {
    let evicted = NOW;
    // (requeues recorded, now, pending reason or None when admitted, message words)
    let cases = [
        (
            1,
            evicted + 9_999,
            Some("Backoff"),
            "requeued at 2026-11-18T12:01:10Z",
        ),
        (1, evicted + 10_000, None, ""),
        (
            2,
            evicted + 19_999,
            Some("Backoff"),
            "requeued at 2026-11-18T12:01:20Z",
        ),
        (
            3,
            evicted + 10_000_000,
            Some("Deactivated"),
            "after 2 requeues",
        ),
    ];
    for (count, now, reason, words) in cases {
        let cm = state_cm(&[("group-g", &entry_json(count, evicted))]);
        let plan = decide(&snapshot(now, group(|p| p), vec![cm]));
        match reason {
            Some(r) => {
                let (got, message) = pending(&plan).expect("a pending reason");
                assert_eq!(got, r, "{count} at {now}");
                assert!(message.contains(words), "{message}");
                assert!(!admitted(&plan));
            }
            None => assert!(admitted(&plan), "{count} at {now}: {:?}", plan.actions),
        }
        assert!(
            state_actions(&plan).is_empty(),
            "a waiting group keeps its state"
        );
    }
}

#[test]
fn state_no_longer_needed_is_forgotten() {
    let raw = entry_json(1, NOW);
    let ttl_over = NOW + MIN_TTL;
    // (case, pods, now, forgotten)
    let cases: Vec<(&str, Vec<Value>, Millis, bool)> = vec![
        (
            "running and Ready",
            group(|p| p.admitted(NOW + 20_000).ready()),
            NOW + 30_000,
            true,
        ),
        (
            "running, not Ready yet",
            group(|p| p.admitted(NOW + 20_000)),
            NOW + 30_000,
            false,
        ),
        (
            "finished",
            group(|p| p.admitted(NOW + 20_000).phase("Succeeded")),
            NOW + 30_000,
            true,
        ),
        ("no pods within the TTL", vec![], ttl_over - 1, false),
        ("no pods past the TTL", vec![], ttl_over, true),
        (
            "recreated and waiting past the TTL",
            group(|p| p),
            ttl_over + 1,
            false,
        ),
    ];
    for (case, pods, now, forgotten) in cases {
        let cm = state_cm(&[("group-g", &raw)]);
        let plan = decide(&snapshot(now, pods, vec![cm]));
        let forgets: Vec<BTreeMap<String, String>> =
            state_actions(&plan).into_iter().map(|(_, f)| f).collect();
        let want = if forgotten {
            vec![[("group-g".to_string(), raw.clone())].into()]
        } else {
            vec![]
        };
        assert_eq!(forgets, want, "{case}");
    }
}

#[test]
fn corrupt_entries_are_reported_and_ignored() {
    let cm = state_cm(&[("group-g", "{\"count\": 3"), ("pod-x", "[]")]);
    let plan = decide(&snapshot(NOW, group(|p| p), vec![cm]));
    assert!(admitted(&plan), "the corrupt state holds nothing back");
    assert_eq!(plan.problems.len(), 2, "{:?}", plan.problems);
    assert!(plan.problems[0].contains("team/tessera-requeue-state, entry \"group-g\""));
    // Forgotten with their workload's Ready, like a valid entry.
    let cm = state_cm(&[("group-g", "{\"count\": 3")]);
    let pods = group(|p| p.admitted(NOW).ready());
    let plan = decide(&snapshot(NOW + 1_000, pods, vec![cm]));
    assert_eq!(state_actions(&plan)[0].1.len(), 1);
}

#[test]
fn a_timeout_counts_once_per_admission() {
    let at = |count, evicted_at| Some(Requeue { count, evicted_at });
    // (recorded, admitted at, next count)
    let cases = [
        (None, 100, 1),
        (at(1, 50), 100, 2),
        (at(1, 100), 100, 1),
        (at(2, 150), 100, 2),
    ];
    for (recorded, admitted_at, want) in cases {
        assert_eq!(next_count(recorded, admitted_at), want, "{recorded:?}");
    }
}
