//! Table tests of the pure decision with requeue states on Workload records: a timed-out pod group
//! gets its state written before its eviction, recreated pods wait out the backoff the
//! state holds (and stay deactivated past the limit), state no longer needed is
//! forgotten (cleared, or deleted with the record), and unreadable states are reported
//! and ignored.

use super::decide::{decide, Action, Plan, Snapshot};
use super::lease::Millis;
use super::pods_ready::{next_count, Requeue};
use super::requeue_book::{seen, Forget, MIN_TTL};
use super::requeue_state::Entry;
use super::time::rfc3339;
use super::workload_record::{OwnerRef, KEY_ANNOTATION};
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
fn snapshot(now: Millis, pods: Vec<Value>, records: Vec<Value>) -> Snapshot {
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
        records,
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

/// Group `g`'s record holding requeue state `state`.
fn state_record(state: Value) -> Value {
    json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Workload",
           "metadata": {"name": "group-g", "namespace": "team",
                        "annotations": {KEY_ANNOTATION: "team/group-g"}},
           "spec": {"queueName": "lq"}, "status": {"requeueState": state}})
}

fn state_json(count: u32, evicted_at: Millis) -> Value {
    json!({"count": count, "evictedAt": rfc3339(evicted_at)})
}

fn state_actions(plan: &Plan) -> Vec<(Vec<Entry>, BTreeMap<String, Forget>)> {
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
    let record = state_record(state_json(1, NOW));
    let plan = decide(&snapshot(NOW + 1_000, pods, vec![record]));
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
        let record = state_record(state_json(count, evicted));
        let plan = decide(&snapshot(now, group(|p| p), vec![record]));
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
    let record = state_record(state_json(1, NOW));
    let ttl_over = NOW + MIN_TTL;
    let pods = || {
        Some(
            ["g-0", "g-1"]
                .map(|name| OwnerRef {
                    kind: "Pod",
                    name: name.into(),
                })
                .to_vec(),
        )
    };
    // (case, pods, now, forgotten: None, or the record's owners after (None: deleted))
    type Owners = Option<Vec<OwnerRef>>;
    let cases: Vec<(&str, Vec<Value>, Millis, Option<Owners>)> = vec![
        (
            "running and Ready",
            group(|p| p.admitted(NOW + 20_000).ready()),
            NOW + 30_000,
            Some(pods()),
        ),
        (
            "running, not Ready yet",
            group(|p| p.admitted(NOW + 20_000)),
            NOW + 30_000,
            None,
        ),
        (
            "finished",
            group(|p| p.admitted(NOW + 20_000).phase("Succeeded")),
            NOW + 30_000,
            Some(pods()),
        ),
        ("no pods within the TTL", vec![], ttl_over - 1, None),
        ("no pods past the TTL", vec![], ttl_over, Some(None)),
        (
            "recreated and waiting past the TTL",
            group(|p| p),
            ttl_over + 1,
            None,
        ),
    ];
    for (case, pods, now, forgotten) in cases {
        let plan = decide(&snapshot(now, pods, vec![record.clone()]));
        let forgets: Vec<BTreeMap<String, Forget>> =
            state_actions(&plan).into_iter().map(|(_, f)| f).collect();
        let want: Vec<BTreeMap<String, Forget>> = forgotten
            .into_iter()
            .map(|owners| {
                let f = Forget {
                    seen: seen(&record),
                    owners,
                };
                [("group-g".to_string(), f)].into()
            })
            .collect();
        assert_eq!(forgets, want, "{case}");
    }
}

#[test]
fn unreadable_states_are_reported_and_ignored() {
    let record = state_record(json!({"count": 3, "evictedAt": "soon"}));
    let plan = decide(&snapshot(NOW, group(|p| p), vec![record.clone()]));
    assert!(admitted(&plan), "the unreadable state holds nothing back");
    assert_eq!(plan.problems.len(), 1, "{:?}", plan.problems);
    assert!(plan.problems[0].contains("Workload team/group-g: status.requeueState"));
    // Forgotten with their workload's Ready, like a valid state.
    let pods = group(|p| p.admitted(NOW).ready());
    let plan = decide(&snapshot(NOW + 1_000, pods, vec![record.clone()]));
    assert_eq!(state_actions(&plan)[0].1.len(), 1);
    // And with the record at once when no pod is left: no TTL can be read from it.
    let plan = decide(&snapshot(NOW + 1_000, vec![], vec![record]));
    assert_eq!(state_actions(&plan)[0].1["group-g"].owners, None);
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
