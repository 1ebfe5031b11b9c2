//! `waitForPodsReady` on a live cluster, as Kueue does it: an admitted workload whose
//! pods are not all Ready within `timeout` of its admission is evicted
//! (`PodsReadyTimeout`) and requeued after an exponential backoff
//! (`backoffBaseSeconds * 2^(n-1)`, capped at `backoffMaxSeconds`); after
//! `backoffLimitCount` requeues it is deactivated.
//!
//! The state lives on the object, so a restarted controller continues it:
//! `tessera.io/pods-ready-at` (written once when all pods were first Ready; the timeout no
//! longer applies), `tessera.io/requeue-count` and `tessera.io/evicted-at` (on a Job
//! suspended for the timeout, on the pods of a timed-out pod or pod group before they
//! are evicted through the Eviction API, and on the serving owner of a replica). Pods
//! are gone after their eviction, so their workload's state is read from every object
//! that still carries it ([`latest`]): its own pods, a pod group's evicted members while
//! they terminate, and the replica's owner (Deployment, ReplicaSet or StatefulSet),
//! which outlives its pods: the replacement replicas it creates wait out the backoff,
//! and past `backoffLimitCount` stay gated as `Deactivated` (remove the annotations
//! from the owner to start over). Pod groups and pods without a serving owner have no
//! such object: their state is kept on their `Workload` record
//! ([`super::requeue_state`]), written before their pods are evicted (a failed write
//! defers the eviction to the next pass) and forgotten once the workload is Ready or
//! finished, or with the record when none of its pods existed for the state's TTL.
//!
//! A timeout is counted once per admission: state recorded at or after the workload's
//! admission already counts it (a pass whose eviction failed after the state was
//! written retries without counting again).
//!
//! `blockAdmission` is the engine's (Kueue's sequential admission): the pass gives the
//! engine `waitForPodsReady` only then, and tells it which restored workloads are Ready
//! (`engine_readiness`); while one is not, every queue is held (`WaitingForPodsReady`),
//! and a workload admitted in a pass holds the rest of that pass. The timeout and the
//! requeue backoff stay the controller's (above), so the engine's own timers never act.

use super::model::{Action, ObjKind, ObjRef, Plan, Snapshot};
pub(crate) use super::readiness::{
    hold, latest, next_count, timed_out, Hold, Requeue, EVICTED_AT_ANNOTATION,
    PODS_READY_AT_ANNOTATION, REQUEUE_COUNT_ANNOTATION,
};
use super::requeue_book::{self, Book, Entry, Forget};
use super::time::Millis;
use super::workload_record::OwnerRef;
use super::workloads::{done_pod_workload_key, Live, State};
use crate::quota::{EngineConfig, Time, WaitForPodsReady, WorkloadInfo};
use std::collections::{BTreeMap, BTreeSet};

/// Eviction reason, as in Kueue.
pub const PODS_READY_TIMEOUT: &str = "PodsReadyTimeout";

/// The object that carries a timed-out pod workload's requeue state beyond its pods:
/// its serving owner, if any (a Job carries its own).
pub(super) fn requeue_carrier(l: &Live) -> Option<ObjRef> {
    let o = l.serving.as_ref()?;
    Some(ObjRef {
        kind: o.kind.into(),
        namespace: o.namespace.clone(),
        name: o.name.clone(),
    })
}

/// When `l` was created or, after a pods-ready timeout, requeued (what Kueue's ready
/// wait runs from).
pub(super) fn queued_at(l: &Live) -> Millis {
    let created = l.info.as_ref().map_or(0, |i| i.creation);
    l.requeue.map_or(created, |r| created.max(r.evicted_at))
}

/// Whether `l`'s requeue state is kept on its record alone: a pod group or a pod
/// without a serving owner (a Job and a serving owner carry their own).
pub(super) fn state_kept_on_record(l: &Live) -> bool {
    l.serving.is_none() && l.objects.first().is_some_and(|o| o.kind == ObjKind::Pod)
}

/// `waitForPodsReady` over a pass's workloads: reads the records' requeue states into
/// the workloads whose state they keep, records workloads whose pods became Ready,
/// evicts those admitted longer than the timeout without it (they keep their quota while
/// their pods terminate, like preemption victims) and forgets state no longer needed.
/// The state writes come first in the plan: an eviction follows its state.
pub(super) fn timeouts(cfg: &WaitForPodsReady, s: &Snapshot, lives: &mut [Live], plan: &mut Plan) {
    let now = s.now;
    let book = requeue_book::read(&s.records);
    plan.problems.extend(book.problems().cloned());
    for l in lives.iter_mut().filter(|l| state_kept_on_record(l)) {
        l.requeue = latest(l.requeue, book.requeue(&l.key));
    }
    let mut set: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    let mut actions = Vec::new();
    for l in lives.iter_mut() {
        if l.state != State::Running || l.info.is_none() || l.ready_recorded {
            continue;
        }
        let Some(first) = l.objects.first().cloned() else {
            continue;
        };
        if l.ready {
            actions.push(Action::PodsReady {
                workload: l.key.clone(),
                object: first,
                queued_at: queued_at(l),
                admitted_at: l.admitted_at,
            });
        } else if timed_out(cfg, l.admitted_at, now) {
            l.state = State::Terminating;
            actions.push(timeout_eviction(l, now, &mut set));
        }
    }
    // States to forget (none to look for without states: the usual pass).
    let forget = if book.entries.is_empty() {
        BTreeMap::new()
    } else {
        let live: BTreeMap<&str, &Live> = lives.iter().map(|l| (l.key.as_str(), l)).collect();
        let mut finished: BTreeMap<String, Vec<OwnerRef>> = BTreeMap::new();
        for p in &s.pods {
            if let Some(wk) = done_pod_workload_key(p) {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                finished.entry(wk).or_default().push(pod_owner(name));
            }
        }
        forgotten(
            cfg,
            now,
            &book,
            |k| live.get(k).copied(),
            |k| finished.get(k).cloned(),
        )
    };
    plan.actions.extend(state_actions(set, forget));
    plan.actions.extend(actions);
}

/// The eviction of running workload `l` for a pods-ready timeout at `now`; the requeue
/// state to write before it goes into `set` when its record alone keeps it.
pub(super) fn timeout_eviction(
    l: &Live,
    now: Millis,
    set: &mut BTreeMap<String, Vec<Entry>>,
) -> Action {
    let count = next_count(l.requeue, l.admitted_at);
    if state_kept_on_record(l) {
        if let Some((ns, _)) = l.key.split_once('/') {
            set.entry(ns.to_string()).or_default().push(Entry {
                workload: l.key.clone(),
                requeue: Requeue {
                    count,
                    evicted_at: now,
                },
            });
        }
    }
    let mut objects: Vec<(ObjRef, i64)> = l
        .objects
        .iter()
        .cloned()
        .zip(l.graces.iter().copied())
        .collect();
    objects.extend(requeue_carrier(l).map(|o| (o, 0)));
    Action::Evict {
        workload: l.key.clone(),
        objects,
        reason: PODS_READY_TIMEOUT.into(),
        by: String::new(),
        requeue: Some(count),
    }
}

/// The state writes of a pass, one per namespace with states to set or forget.
pub(super) fn state_actions(
    mut set: BTreeMap<String, Vec<Entry>>,
    mut forget: BTreeMap<String, BTreeMap<String, Forget>>,
) -> Vec<Action> {
    let namespaces: BTreeSet<String> = set.keys().chain(forget.keys()).cloned().collect();
    namespaces
        .into_iter()
        .map(|namespace| Action::RequeueState {
            set: set.remove(&namespace).unwrap_or_default(),
            forget: forget.remove(&namespace).unwrap_or_default(),
            namespace,
        })
        .collect()
}

/// A pod as a record's owner.
pub(super) fn pod_owner(name: &str) -> OwnerRef {
    OwnerRef {
        kind: "Pod",
        name: name.to_string(),
    }
}

/// The states no longer needed, per namespace (record name → how it goes): of workloads
/// running with all pods Ready (now or once) and of finished workloads (`finished` gives
/// their pods: only `Succeeded` / `Failed` ones left), cleared, the record belonging to
/// the pods again; of workloads without any pod for the state's TTL after their
/// eviction (at once for an unreadable state), deleted with the record. `live` finds a
/// workload of the pass by key. Cost: the states.
pub(super) fn forgotten<'a>(
    cfg: &WaitForPodsReady,
    now: Millis,
    book: &Book,
    live: impl Fn(&str) -> Option<&'a Live>,
    finished: impl Fn(&str) -> Option<Vec<OwnerRef>>,
) -> BTreeMap<String, BTreeMap<String, Forget>> {
    let mut out: BTreeMap<String, BTreeMap<String, Forget>> = BTreeMap::new();
    let ttl = requeue_book::ttl(cfg);
    for (key, stored) in &book.entries {
        let owners = match live(key) {
            Some(l) if l.state == State::Running && (l.ready || l.ready_recorded) => {
                let pods = l.objects.iter().filter(|o| o.kind == ObjKind::Pod);
                Some(pods.map(|o| pod_owner(&o.name)).collect())
            }
            Some(_) => continue,
            None => match finished(key) {
                Some(mut pods) => {
                    pods.sort_by(|a, b| a.name.cmp(&b.name));
                    Some(pods)
                }
                None if stored
                    .requeue
                    .is_some_and(|r| now < r.evicted_at.saturating_add(ttl)) =>
                {
                    continue
                }
                None => None,
            },
        };
        out.entry(stored.namespace.clone()).or_default().insert(
            stored.name.clone(),
            Forget {
                seen: stored.seen.clone(),
                owners,
            },
        );
    }
    out
}

/// The engine's settings for a pass: `waitForPodsReady` only with `blockAdmission`, and
/// queue places ranged beyond the first few (`Positions::Ranged`).
pub fn engine_config(cfg: Option<&WaitForPodsReady>) -> EngineConfig {
    EngineConfig {
        wait_for_pods_ready: cfg.filter(|c| c.block_admission).cloned(),
        // Every change of a message is a write to the API server.
        positions: crate::quota::events::Positions::Ranged,
        ..EngineConfig::default()
    }
}

/// With `blockAdmission`, what the engine is told of `l`'s readiness: ready now (its
/// pods are Ready or were once, or it is being evicted and no longer counts, as an
/// evicted workload is no longer admitted in Kueue) or not ready (its pods are gated or
/// starting). Without it `info` is left as it is.
pub(super) fn engine_readiness(cfg: Option<&WaitForPodsReady>, l: &Live, info: &mut WorkloadInfo) {
    if !cfg.is_some_and(|c| c.block_admission) {
        return;
    }
    let ready = match l.state {
        State::Running => l.ready || l.ready_recorded,
        State::Terminating => true,
        State::Waiting => false,
    };
    info.pods_ready_after = ready.then_some(0 as Time);
}

#[cfg(test)]
mod tests {
    use super::super::readiness::{job_ready, pod_ready, requeue_state};
    use super::*;
    use serde_json::json;

    #[test]
    fn readiness_backoff_and_deactivation() {
        let cfg = WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 25_000,
            backoff_limit_count: Some(3),
            requeue_by_eviction_time: true,
            block_admission: false,
        };
        let r = |count| Requeue {
            count,
            evicted_at: 1_000,
        };
        // (case, requeue count, now, hold)
        let cases = [
            (
                "first requeue waits the base",
                1,
                10_999,
                Some(Hold::Backoff(11_000)),
            ),
            ("first requeue over", 1, 11_000, None),
            ("doubles", 2, 5_000, Some(Hold::Backoff(21_000))),
            ("capped", 3, 5_000, Some(Hold::Backoff(26_000))),
            ("limit exceeded", 4, 1_000_000, Some(Hold::Deactivated)),
            ("never requeued", 0, 0, None),
        ];
        for (name, count, now, want) in cases {
            assert_eq!(hold(&cfg, r(count), now), want, "{name}");
        }
        assert!(!timed_out(&cfg, 1_000, 60_999));
        assert!(timed_out(&cfg, 1_000, 61_000));
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(pod_ready(&ready) && !pod_ready(&not_ready) && !pod_ready(&json!({})));
        let job = |ready: u64, succeeded: u64| json!({"spec": {"parallelism": 3}, "status": {"ready": ready, "succeeded": succeeded}});
        assert!(job_ready(&job(2, 1)) && !job_ready(&job(2, 0)));
        let evicted = json!({"metadata": {"annotations": {
            "tessera.io/requeue-count": "2", "tessera.io/evicted-at": "2026-11-18T12:00:00Z"}}});
        assert_eq!(requeue_state(&evicted).map(|r| r.count), Some(2));
        assert_eq!(requeue_state(&json!({})), None);
        // (a, b, the later) over pods and owners: more requeues win, then the later eviction.
        let at = |count, evicted_at| Some(Requeue { count, evicted_at });
        let later = [
            (None, None, None),
            (at(1, 5), None, at(1, 5)),
            (None, at(1, 5), at(1, 5)),
            (at(2, 5), at(1, 9), at(2, 5)),
            (at(1, 5), at(1, 9), at(1, 9)),
        ];
        for (a, b, want) in later {
            assert_eq!(latest(a, b), want, "{a:?} {b:?}");
        }
    }
}
