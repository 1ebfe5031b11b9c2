//! What the controller's metrics show of one pass, pure: the gauges from the books a
//! [`Plan`] carries ([`Plan::queues`]), and the counter increments from the actions the
//! reconciler applied (each admission, eviction and preemption counted once: a plan
//! entry that failed to write is decided again by the next pass and counted then).
//! Names, labels and label values are Kueue's (`kueue_` → `tessera_`); the registry
//! that holds them is [`super::metrics`].

use super::model::{Action, Plan};
use super::time::Millis;
use crate::quota::{LocalQueueGauges, QueueGauges};

/// Kueue's buckets for its wait-time histograms, in seconds: 1, then 2.5 doubling
/// (2.5 … 10240, 14 in all).
pub fn wait_buckets() -> impl Iterator<Item = f64> {
    std::iter::once(1.0).chain((0..13).map(|i| 2.5 * f64::from(1u32 << i)))
}

/// Kueue's `evicted_workloads_total` reason of a workload evicted for a preemption.
pub const EVICTED_PREEMPTED: &str = "Preempted";

/// What one pass adds to the counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Increments {
    /// Per admission: its ClusterQueue and how long it waited (seconds, from its
    /// creation or requeue to `now`).
    pub admitted: Vec<(String, f64)>,
    /// Per eviction: the evicted workload's ClusterQueue and Kueue's reason
    /// (`Preempted`, `PodsReadyTimeout`, `ClusterQueueStopped`).
    pub evicted: Vec<(String, String)>,
    /// Per preemption: the preempting workload's ClusterQueue and the preemption's
    /// reason (`InClusterQueue`, `InCohortReclamation`, `InCohortFairSharing`,
    /// `InCohortReclaimWhileBorrowing`).
    pub preempted: Vec<(String, String)>,
    /// Per admission: its LocalQueue `(namespace, name)` and its wait, as `admitted`.
    pub lq_admitted: Vec<((String, String), f64)>,
    /// Per eviction: the evicted workload's LocalQueue and the reason, as `evicted`.
    pub lq_evicted: Vec<((String, String), String)>,
    /// Per workload whose pods all became Ready (`waitForPodsReady`): its queues and
    /// how long that took (seconds) since its creation or requeue and since its admission.
    pub ready: Vec<Ready>,
}

/// A workload's pods all Ready, for Kueue's ready-wait histograms.
#[derive(Clone, Debug, PartialEq)]
pub struct Ready {
    pub cluster_queue: String,
    pub local_queue: (String, String),
    /// Since its creation or requeue (`ready_wait_time_seconds`).
    pub since_queued: f64,
    /// Since its admission (`admitted_until_ready_wait_time_seconds`).
    pub since_admitted: f64,
}

/// The increments of `plan` once the reconciler applied the actions at the indices
/// `done` at time `now`: an `Admit` counts when the engine admitted its workload in this
/// pass (not one finishing an earlier admission); an `Evict` counts with its reason,
/// and as a preemption of the preemptor's queue when it has one; a `PodsReady` gives
/// its waits.
pub fn increments(plan: &Plan, done: &[usize], now: Millis) -> Increments {
    let mut out = Increments::default();
    for &i in done {
        match plan.actions.get(i) {
            Some(Action::Admit { workload, .. }) => {
                if let Some(s) = plan.subjects.get(workload).filter(|s| s.admitted_now) {
                    let waited = now.saturating_sub(s.created) as f64 / 1000.0;
                    out.admitted.push((s.cluster_queue.clone(), waited));
                    out.lq_admitted.push((s.local_queue.clone(), waited));
                }
            }
            Some(Action::Evict {
                workload,
                reason,
                by,
                ..
            }) => {
                let Some(victim) = plan.subjects.get(workload) else {
                    continue;
                };
                let why = if by.is_empty() {
                    reason.clone()
                } else {
                    EVICTED_PREEMPTED.to_string()
                };
                out.evicted
                    .push((victim.cluster_queue.clone(), why.clone()));
                out.lq_evicted.push((victim.local_queue.clone(), why));
                if by.is_empty() {
                    continue;
                }
                let preempting = plan
                    .subjects
                    .get(by)
                    .map_or_else(|| victim.cluster_queue.clone(), |p| p.cluster_queue.clone());
                out.preempted.push((preempting, reason.clone()));
            }
            Some(Action::PodsReady {
                workload,
                queued_at,
                admitted_at,
                ..
            }) => {
                if let Some(s) = plan.subjects.get(workload) {
                    let secs = |from: Millis| now.saturating_sub(from) as f64 / 1000.0;
                    out.ready.push(Ready {
                        cluster_queue: s.cluster_queue.clone(),
                        local_queue: s.local_queue.clone(),
                        since_queued: secs(*queued_at),
                        since_admitted: secs(*admitted_at),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Kueue's `admission_attempts_total` result of a pass: `success` when it admitted a
/// workload, `inadmissible` when workloads wait and none was admitted, none when nothing
/// waits (no attempt was made).
pub fn attempt_result(queues: &[QueueGauges], inc: &Increments) -> Option<&'static str> {
    if !inc.admitted.is_empty() {
        Some("success")
    } else if queues.iter().any(|q| q.active + q.inadmissible > 0) {
        Some("inadmissible")
    } else {
        None
    }
}

/// One ClusterQueue's `(flavor, resource)` row of the quota gauges, in the resource's
/// units (GPUs, cores, bytes: milli-units / 1000).
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaRow {
    pub cohort: String,
    pub cluster_queue: String,
    pub flavor: String,
    pub resource: String,
    pub usage: f64,
    pub reservation: f64,
    pub nominal: f64,
    /// `None`: no limit (no series).
    pub borrowing_limit: Option<f64>,
    pub lending_limit: Option<f64>,
}

/// One LocalQueue's `(flavor, resource)` row, in the resource's units.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalQuotaRow {
    pub namespace: String,
    pub name: String,
    pub flavor: String,
    pub resource: String,
    pub usage: f64,
    pub reservation: f64,
}

/// Every gauge of one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gauges {
    /// `(cluster_queue, status, workloads)`: status `active` or `inadmissible`.
    pub pending: Vec<(String, &'static str, i64)>,
    /// `(cluster_queue, status, 0 or 1)` for each of `pending`, `active`, `terminating`.
    pub status: Vec<(String, &'static str, i64)>,
    /// `(cluster_queue, admitted workloads)`.
    pub admitted_active: Vec<(String, i64)>,
    pub quota: Vec<QuotaRow>,
    /// `((namespace, name), status, workloads)`: status `active` or `inadmissible`.
    pub lq_pending: Vec<((String, String), &'static str, i64)>,
    /// `((namespace, name), active, 0 or 1)` for each of `True`, `False`, `Unknown`.
    pub lq_status: Vec<((String, String), &'static str, i64)>,
    /// `((namespace, name), admitted workloads)`.
    pub lq_admitted_active: Vec<((String, String), i64)>,
    pub lq_quota: Vec<LocalQuotaRow>,
}

/// Kueue's `local_queue_status` values: its LocalQueue's `Active` condition.
pub const LOCAL_QUEUE_STATUSES: [&str; 3] = ["True", "False", "Unknown"];

/// Kueue's `cluster_queue_status` values (a deleted ClusterQueue leaves the books at
/// once: `terminating` is always 0 here).
pub const QUEUE_STATUSES: [&str; 3] = ["pending", "active", "terminating"];

/// The gauges of the ClusterQueues' books `queues` and the LocalQueues' `locals`.
pub fn gauges(queues: &[QueueGauges], locals: &[LocalQueueGauges]) -> Gauges {
    let units = |m: i64| m as f64 / 1000.0;
    let mut out = Gauges::default();
    for l in locals {
        let id = (l.namespace.clone(), l.name.clone());
        out.lq_pending.push((id.clone(), "active", l.active as i64));
        out.lq_pending
            .push((id.clone(), "inadmissible", l.inadmissible as i64));
        // Its `Active` condition: True while its ClusterQueue exists and is active.
        let active = if l.cluster_queue_active {
            "True"
        } else {
            "False"
        };
        for s in LOCAL_QUEUE_STATUSES {
            out.lq_status.push((id.clone(), s, i64::from(s == active)));
        }
        out.lq_admitted_active.push((id, l.admitted as i64));
        for r in &l.resources {
            out.lq_quota.push(LocalQuotaRow {
                namespace: l.namespace.clone(),
                name: l.name.clone(),
                flavor: r.flavor.clone(),
                resource: r.resource.clone(),
                usage: units(r.usage),
                reservation: units(r.reservation),
            });
        }
    }
    for q in queues {
        out.admitted_active
            .push((q.name.clone(), q.admitted as i64));
        out.pending
            .push((q.name.clone(), "active", q.active as i64));
        out.pending
            .push((q.name.clone(), "inadmissible", q.inadmissible as i64));
        for s in QUEUE_STATUSES {
            out.status
                .push((q.name.clone(), s, i64::from(s == q.status.as_str())));
        }
        for r in &q.resources {
            out.quota.push(QuotaRow {
                cohort: q.cohort.clone(),
                cluster_queue: q.name.clone(),
                flavor: r.flavor.clone(),
                resource: r.resource.clone(),
                usage: units(r.usage),
                reservation: units(r.reservation),
                nominal: units(r.nominal),
                borrowing_limit: r.borrowing_limit.map(units),
                lending_limit: r.lending_limit.map(units),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::{decide, Snapshot};
    use crate::quota::api::WithinClusterQueuePolicy;
    use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
    use serde_json::{json, Value};

    /// 2026-11-18T12:01:00Z: a minute after the pods below were created.
    const NOW: u64 = 1_795_003_260_000;

    /// A pod of queue `lq` asking for `gpus`, created at 12:00; gated unless `running`.
    fn pod(name: &str, lq: &str, gpus: i64, running: bool) -> Value {
        let gates = if running {
            json!([])
        } else {
            json!([{"name": "tessera.io/admission"}])
        };
        json!({"metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                            "labels": {"tessera.io/queue-name": lq}},
               "spec": {"schedulingGates": gates,
                        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
    }

    /// ClusterQueues `a` (4 GPUs, may borrow 2, lends 1) and `b` (2 GPUs) in cohort
    /// `pool`, flavor h100; LocalQueues `la` and `lb`.
    fn snapshot(pods: Vec<Value>) -> Snapshot {
        let mut a = cluster_queue("a")
            .cohort("pool")
            .quota("h100", "nvidia.com/gpu", 4)
            .build();
        let rq = &mut a.spec.resource_groups[0].flavors[0].resources[0];
        rq.borrowing_limit = Some(crate::quota::Quantity::units(2));
        rq.lending_limit = Some(crate::quota::Quantity::units(1));
        let b = cluster_queue("b")
            .cohort("pool")
            .quota("h100", "nvidia.com/gpu", 2)
            .build();
        Snapshot {
            now: NOW,
            flavors: vec![flavor("h100")],
            cluster_queues: vec![a, b],
            local_queues: vec![
                local_queue("team", "la", "a"),
                local_queue("team", "lb", "b"),
            ],
            namespaces: vec![("team".into(), Default::default())],
            pods,
            ..Default::default()
        }
    }

    fn all(plan: &Plan) -> Vec<usize> {
        (0..plan.actions.len()).collect()
    }

    #[test]
    fn waiting_workloads_are_active_until_tried_then_inadmissible() {
        // a runs 3 of its 4 GPUs and lends 1: y (5) was tried and is parked. b runs 2 of
        // its 2; z1 (2) would need 2 more but may borrow only 1: it heads b's StrictFIFO
        // queue and blocks z2 (1) behind it. Both stay active: as in Kueue, a StrictFIFO
        // head that does not fit stays in the queue (and z2 was never tried).
        let mut s = snapshot(vec![
            pod("run", "la", 3, true),
            pod("y", "la", 5, false),
            pod("runb", "lb", 2, true),
            pod("z1", "lb", 2, false),
            pod("z2", "lb", 1, false),
        ]);
        s.cluster_queues[1].spec.queueing_strategy =
            crate::quota::api::QueueingStrategy::StrictFIFO;
        let plan = decide(&s);
        let g = gauges(&plan.queues, &plan.local_queues);
        assert_eq!(
            g.pending,
            vec![
                ("a".to_string(), "active", 0),
                ("a".to_string(), "inadmissible", 1),
                ("b".to_string(), "active", 2),
                ("b".to_string(), "inadmissible", 0),
            ],
            "{:?}",
            plan.queues
        );
        assert_eq!(
            g.status
                .iter()
                .filter(|(_, _, v)| *v == 1)
                .map(|(q, s, _)| (q.as_str(), *s))
                .collect::<Vec<_>>(),
            vec![("a", "active"), ("b", "active")]
        );
        assert_eq!(
            attempt_result(&plan.queues, &increments(&plan, &all(&plan), NOW)),
            Some("inadmissible")
        );
    }

    #[test]
    fn quota_rows_carry_usage_nominal_and_limits_per_flavor_and_resource() {
        let plan = decide(&snapshot(vec![pod("run", "la", 5, true)]));
        let g = gauges(&plan.queues, &plan.local_queues);
        let a = g
            .quota
            .iter()
            .find(|r| r.cluster_queue == "a")
            .expect("a's row");
        assert_eq!(
            a,
            &QuotaRow {
                cohort: "pool".into(),
                cluster_queue: "a".into(),
                flavor: "h100".into(),
                resource: "nvidia.com/gpu".into(),
                usage: 5.0,
                reservation: 5.0,
                nominal: 4.0,
                borrowing_limit: Some(2.0),
                lending_limit: Some(1.0),
            }
        );
        let b = g
            .quota
            .iter()
            .find(|r| r.cluster_queue == "b")
            .expect("b's row");
        assert_eq!(
            (b.usage, b.nominal, b.borrowing_limit, b.lending_limit),
            (0.0, 2.0, None, None)
        );
        // Nothing waits: no admission attempt.
        assert_eq!(attempt_result(&plan.queues, &Increments::default()), None);
    }

    #[test]
    fn an_admission_counts_once_with_its_wait_and_only_when_applied() {
        let plan = decide(&snapshot(vec![pod("new", "la", 2, false)]));
        assert!(
            matches!(plan.actions[..], [Action::Admit { .. }]),
            "{:?}",
            plan.actions
        );
        let inc = increments(&plan, &all(&plan), NOW);
        assert_eq!(inc.admitted, vec![("a".to_string(), 60.0)]);
        assert_eq!(attempt_result(&plan.queues, &inc), Some("success"));
        // The write failed: nothing counted (the next pass decides it again).
        assert_eq!(increments(&plan, &[], NOW), Increments::default());
        // Finishing an admission begun before a restart is no new admission.
        let mut finishing = plan.clone();
        for s in finishing.subjects.values_mut() {
            s.admitted_now = false;
        }
        assert!(increments(&finishing, &all(&finishing), NOW)
            .admitted
            .is_empty());
    }

    #[test]
    fn a_preemption_counts_as_an_eviction_and_under_the_preemptors_queue() {
        // b reclaims its nominal quota from a, which borrows it.
        let mut s = snapshot(vec![
            pod("borrower", "la", 6, true),
            pod("owner", "lb", 2, false),
        ]);
        s.cluster_queues[1].spec.preemption.reclaim_within_cohort =
            crate::quota::api::ReclaimPolicy::Any;
        let plan = decide(&s);
        let inc = increments(&plan, &all(&plan), NOW);
        assert_eq!(
            inc.evicted,
            vec![("a".to_string(), "Preempted".to_string())],
            "{:?}",
            plan.actions
        );
        assert_eq!(
            inc.preempted,
            vec![("b".to_string(), "InCohortReclamation".to_string())]
        );
        // The eviction counts under the victim's LocalQueue too.
        assert_eq!(
            inc.lq_evicted,
            vec![(
                ("team".to_string(), "la".to_string()),
                "Preempted".to_string()
            )]
        );
        // In one queue, by priority.
        let mut low = pod("low", "la", 4, true);
        low["spec"]["terminationGracePeriodSeconds"] = json!(30);
        let mut high = pod("high", "la", 4, false);
        high["metadata"]["annotations"] = json!({"tessera.io/priority": "100"});
        let mut s = snapshot(vec![low, high]);
        s.cluster_queues[0].spec.preemption.within_cluster_queue =
            WithinClusterQueuePolicy::LowerPriority;
        s.cluster_queues[0].spec.cohort_name = None;
        s.cluster_queues[0].spec.resource_groups[0].flavors[0].resources[0].borrowing_limit = None;
        s.cluster_queues[0].spec.resource_groups[0].flavors[0].resources[0].lending_limit = None;
        let plan = decide(&s);
        let inc = increments(&plan, &all(&plan), NOW);
        assert_eq!(
            inc.preempted,
            vec![("a".to_string(), "InClusterQueue".to_string())]
        );
        // The victim terminates (30 s grace): it still uses its quota.
        let a = gauges(&plan.queues, &plan.local_queues)
            .quota
            .into_iter()
            .find(|r| r.cluster_queue == "a");
        assert_eq!(a.map(|r| r.usage), Some(4.0));
    }

    #[test]
    fn a_pods_ready_timeout_is_counted_under_its_own_reason() {
        let plan = Plan {
            actions: vec![Action::Evict {
                workload: "team/pod-x".into(),
                objects: Vec::new(),
                reason: "PodsReadyTimeout".into(),
                by: String::new(),
                requeue: Some(1),
            }],
            subjects: [(
                "team/pod-x".to_string(),
                crate::controller::model::Subject {
                    cluster_queue: "a".into(),
                    local_queue: ("team".into(), "la".into()),
                    created: 0,
                    admitted_now: false,
                },
            )]
            .into(),
            ..Plan::default()
        };
        let inc = increments(&plan, &[0], NOW);
        assert_eq!(
            inc.evicted,
            vec![("a".to_string(), "PodsReadyTimeout".to_string())]
        );
        assert!(inc.preempted.is_empty());
    }

    #[test]
    fn pods_ready_gives_its_waits_since_queued_and_since_admitted_once_recorded() {
        let plan = Plan {
            actions: vec![Action::PodsReady {
                workload: "team/pod-x".into(),
                object: crate::controller::model::ObjRef {
                    kind: crate::controller::model::ObjKind::Pod,
                    namespace: "team".into(),
                    name: "x".into(),
                },
                queued_at: NOW - 90_000,
                admitted_at: NOW - 30_000,
            }],
            subjects: [(
                "team/pod-x".to_string(),
                crate::controller::model::Subject {
                    cluster_queue: "a".into(),
                    local_queue: ("team".into(), "la".into()),
                    created: NOW - 90_000,
                    admitted_now: false,
                },
            )]
            .into(),
            ..Plan::default()
        };
        let inc = increments(&plan, &[0], NOW);
        assert_eq!(
            inc.ready,
            vec![Ready {
                cluster_queue: "a".into(),
                local_queue: ("team".into(), "la".into()),
                since_queued: 90.0,
                since_admitted: 30.0,
            }]
        );
        assert!(inc.admitted.is_empty() && inc.evicted.is_empty());
        // Its write failed: nothing observed (the next pass records it and counts then).
        assert!(increments(&plan, &[], NOW).ready.is_empty());
    }

    #[test]
    fn local_queues_carry_their_own_pending_admitted_usage_and_status() {
        // Two LocalQueues of ClusterQueue a: la runs 3 GPUs and waits for 5 (parked),
        // lc waits for 1 behind nothing (admitted now). lb (queue b) runs 2.
        let mut s = snapshot(vec![
            pod("run", "la", 3, true),
            pod("y", "la", 5, false),
            pod("runb", "lb", 2, true),
        ]);
        s.local_queues.push(local_queue("team", "lc", "a"));
        s.local_queues.push(local_queue("other", "ld", "missing"));
        s.pods.push(pod("c1", "lc", 1, false));
        let plan = decide(&s);
        let g = gauges(&plan.queues, &plan.local_queues);
        let lq = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        let pending: Vec<_> = g
            .lq_pending
            .iter()
            .filter(|(_, _, v)| *v > 0)
            .cloned()
            .collect();
        assert_eq!(
            pending,
            vec![(lq("team", "la"), "inadmissible", 1)],
            "{:?}",
            plan.local_queues
        );
        assert_eq!(
            g.lq_admitted_active,
            vec![
                (lq("other", "ld"), 0),
                (lq("team", "la"), 1),
                (lq("team", "lb"), 1),
                (lq("team", "lc"), 1),
            ]
        );
        let usage: Vec<_> = g
            .lq_quota
            .iter()
            .map(|r| (r.name.as_str(), r.resource.as_str(), r.usage, r.reservation))
            .collect();
        assert_eq!(
            usage,
            vec![
                ("la", "nvidia.com/gpu", 3.0, 3.0),
                ("lb", "nvidia.com/gpu", 2.0, 2.0),
                ("lc", "nvidia.com/gpu", 1.0, 1.0),
            ]
        );
        // The LocalQueue of a missing ClusterQueue is not active; the others are.
        let active: Vec<_> = g
            .lq_status
            .iter()
            .filter(|(_, _, v)| *v == 1)
            .map(|(id, s, _)| (id.1.as_str(), *s))
            .collect();
        assert_eq!(
            active,
            vec![
                ("ld", "False"),
                ("la", "True"),
                ("lb", "True"),
                ("lc", "True")
            ]
        );
        // Each ClusterQueue's admitted workloads are the sum of its LocalQueues'.
        assert_eq!(
            g.admitted_active,
            vec![("a".to_string(), 2), ("b".to_string(), 1)]
        );
        // The admission counts under its LocalQueue with its wait.
        let inc = increments(&plan, &all(&plan), NOW);
        assert_eq!(inc.lq_admitted, vec![(lq("team", "lc"), 60.0)]);
    }

    #[test]
    fn wait_buckets_are_kueues() {
        let b: Vec<f64> = wait_buckets().collect();
        assert_eq!(b.len(), 14);
        assert_eq!(&b[..4], &[1.0, 2.5, 5.0, 10.0]);
        assert_eq!(b[13], 10240.0);
    }
}
