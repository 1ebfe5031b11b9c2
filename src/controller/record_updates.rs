//! The [`Update`]s of the `Workload` records ([`super::workload_record`]) that a pass's
//! actions make: admitted (admission, `QuotaReserved`/`Admitted`), evicted (`Evicted`,
//! requeue state), pending (reason, message, position), pods ready. Pure.

use super::model::{Action, ObjKind, ObjRef};
use super::readiness::Requeue;
use super::time::Millis;
use super::workload_record::{
    condition, record_name, spec_of, Admission, OwnerRef, PodSetAssignment, RequeueState, Set,
    Update,
};
use super::workloads::Live;
use crate::quota::events::place_in_message;
use crate::quota::{Engine, WaitForPodsReady};

/// What a pass needs besides its actions to write the records.
pub(super) struct Context<'a> {
    pub(super) engine: &'a Engine,
    pub(super) pods_ready: Option<&'a WaitForPodsReady>,
    pub(super) now: Millis,
}

/// The record updates of the workloads `actions` name, in action order (one per
/// workload and action; an eviction and a pending reason of one pass both apply).
pub(super) fn updates<'a>(
    cx: &Context<'_>,
    actions: &[Action],
    live: impl Fn(&str) -> Option<&'a Live>,
) -> Vec<Update> {
    actions
        .iter()
        .filter_map(|a| update_for(cx, a, &live))
        .collect()
}

fn base<'a>(
    cx: &Context<'_>,
    key: &str,
    owners: Vec<OwnerRef>,
    live: &impl Fn(&str) -> Option<&'a Live>,
) -> Update {
    // From the objects as read (not from the engine, which may still hold an earlier
    // reading): a pass decided from scratch writes the same.
    let spec = live(key)
        .and_then(|l| l.info.as_ref())
        .map(|info| spec_of(info, cx.engine.priority_of(info)));
    let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
    Update {
        owners,
        spec,
        ..Update::blank(key, namespace, &record_name(key))
    }
}

fn owners_of(objects: impl IntoIterator<Item = ObjRef>) -> Vec<OwnerRef> {
    // A serving owner is only annotated; the record belongs to the replica's pods.
    objects
        .into_iter()
        .filter_map(|o| {
            let kind = match o.kind {
                ObjKind::Pod => "Pod",
                ObjKind::Job => "Job",
                _ => return None,
            };
            Some(OwnerRef { kind, name: o.name })
        })
        .collect()
}

fn requeue_state(cx: &Context<'_>, r: Requeue) -> RequeueState {
    RequeueState::of(r, cx.pods_ready)
}

fn update_for<'a>(
    cx: &Context<'_>,
    a: &Action,
    live: &impl Fn(&str) -> Option<&'a Live>,
) -> Option<Update> {
    match a {
        Action::Admit {
            workload,
            objects,
            partial,
            ..
        } => {
            let mut u = base(cx, workload, owners_of(objects.iter().cloned()), live);
            let cq = cx.engine.cluster_queue_of(workload).unwrap_or_default();
            let assignments = match cx.engine.admission_of(workload) {
                Some((flavors, _, counts)) => flavors
                    .into_iter()
                    .zip(counts.into_iter().map(Some).chain(std::iter::repeat(None)))
                    .map(|((name, flavors), count)| PodSetAssignment {
                        name,
                        flavors,
                        count: partial.or(count),
                    })
                    .collect(),
                None => Vec::new(),
            };
            u.admission = Some(Some(Admission {
                cluster_queue: cq.to_string(),
                pod_set_assignments: assignments,
            }));
            let reserved = format!("Quota reserved in ClusterQueue {cq}");
            u.conditions = vec![
                Set::Always(condition("QuotaReserved", true, "QuotaReserved", reserved)),
                Set::Always(condition(
                    "Admitted",
                    true,
                    "Admitted",
                    "The workload is admitted",
                )),
                Set::IfPresent(condition("Evicted", false, "Admitted", "Admitted again")),
                Set::IfPresent(condition("Requeued", true, "Admitted", "Admitted again")),
            ];
            u.position = Some(None);
            Some(u)
        }
        Action::Evict {
            workload,
            objects,
            reason,
            by,
            requeue,
        } => {
            let mut u = base(
                cx,
                workload,
                owners_of(objects.iter().map(|(o, _)| o.clone())),
                live,
            );
            let message = match by.is_empty() {
                true => format!("Evicted: {reason}"),
                false => format!("Preempted by {by}"),
            };
            u.admission = Some(None);
            u.conditions = vec![
                Set::Always(condition("Evicted", true, reason, message.clone())),
                Set::Always(condition(
                    "QuotaReserved",
                    false,
                    "Evicted",
                    message.clone(),
                )),
                Set::Always(condition("Admitted", false, "Evicted", message)),
                Set::IfPresent(condition("PodsReady", false, "Evicted", "")),
            ];
            if let Some(count) = requeue {
                // Evicted again each pass until its objects change: the eviction time
                // is the one recorded for this count, once there is one.
                let recorded = live(workload).and_then(|l| l.requeue);
                let r = match recorded {
                    Some(r) if r.count == *count => r,
                    _ => Requeue {
                        count: *count,
                        evicted_at: cx.now,
                    },
                };
                u.requeue_state = Some(Some(requeue_state(cx, r)));
                u.conditions.push(Set::Always(condition(
                    "Requeued",
                    false,
                    reason,
                    "Waiting for its backoff to end",
                )));
            }
            Some(u)
        }
        Action::Pending {
            workload,
            objects,
            reason,
            message,
            ..
        } => {
            let mut u = base(cx, workload, owners_of(objects.iter().cloned()), live);
            u.admission = Some(None);
            u.conditions = vec![
                Set::Always(condition("QuotaReserved", false, reason, message.clone())),
                Set::Always(condition("Admitted", false, "Pending", message.clone())),
            ];
            u.position = Some(place_in_message(message).map(String::from));
            if let Some(r) = live(workload).and_then(|l| l.requeue) {
                u.requeue_state = Some(Some(requeue_state(cx, r)));
            }
            Some(u)
        }
        Action::PodsReady {
            workload, object, ..
        } => {
            let mut u = base(cx, workload, owners_of([object.clone()]), live);
            u.conditions = vec![Set::Always(condition(
                "PodsReady",
                true,
                "PodsReady",
                "All pods are ready",
            ))];
            Some(u)
        }
        Action::Replicas { .. } | Action::RequeueState { .. } => None,
    }
}
