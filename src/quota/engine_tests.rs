//! Engine tests through the library API: semantics that need explicit times or
//! priorities, and the cost of a scheduling cycle.

use super::fixtures::{cluster_queue, flavor, local_queue};
use super::{Engine, EngineConfig, WorkloadInfo};

const GPU: &str = "nvidia.com/gpu";

fn engine(queues: &[super::api::ClusterQueue]) -> Engine {
    let mut e = Engine::new(EngineConfig::default());
    for f in ["h100", "a100"] {
        e.apply_flavor(&flavor(f), 0).unwrap();
    }
    for q in queues {
        e.apply_cluster_queue(q, 0).unwrap();
        e.apply_local_queue(&local_queue("ml", &q.metadata.name, &q.metadata.name), 0)
            .unwrap();
    }
    e
}

fn job(key: &str, queue: &str, gpus: i64) -> WorkloadInfo {
    WorkloadInfo::new(key, queue).pod_set("main", 1, &[(GPU, gpus)])
}

fn submit(e: &mut Engine, now: u64, w: WorkloadInfo) {
    e.submit(now, w).unwrap();
    e.schedule(now).unwrap();
    e.check_invariants().unwrap();
}

#[test]
fn lower_or_newer_equal_priority_preempts_only_newer_equals() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 4)
        .preemption("withinClusterQueue: LowerOrNewerEqualPriority")
        .build();
    let table = [
        // (victim created, preemptor created, preempted?)
        (100, 50, true), // victim is newer: may be preempted
        (10, 50, false), // victim is older: protected
        (50, 50, false), // same age: protected
    ];
    for (victim_created, preemptor_created, want) in table {
        let mut e = engine(std::slice::from_ref(&q));
        submit(
            &mut e,
            200,
            job("ml/victim", "q", 4).priority(5).created(victim_created),
        );
        submit(
            &mut e,
            300,
            job("ml/new", "q", 4).priority(5).created(preemptor_created),
        );
        assert_eq!(
            e.is_admitted("ml/new"),
            want,
            "{victim_created} vs {preemptor_created}"
        );
        assert_eq!(e.is_admitted("ml/victim"), !want);
    }
}

#[test]
fn lower_priority_policy_never_preempts_equal_priority() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 4)
        .preemption("withinClusterQueue: LowerPriority")
        .build();
    let mut e = engine(&[q]);
    submit(&mut e, 0, job("ml/old", "q", 4).priority(5).created(100));
    submit(&mut e, 10, job("ml/new", "q", 4).priority(5).created(1));
    assert!(e.is_admitted("ml/old"));
    assert_eq!(e.pending_reason("ml/new"), Some("WaitingForQuota"));
}

#[test]
fn borrow_within_cohort_preempts_lower_priority_below_threshold() {
    let table = [
        ("reclaimWithinCohort: Any\nborrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 10}", true),
        ("reclaimWithinCohort: Any\nborrowWithinCohort: {policy: LowerPriority, maxPriorityThreshold: 1}", false),
        ("reclaimWithinCohort: Any", false),
    ];
    for (policy, want) in table {
        let a = cluster_queue("a")
            .cohort("c")
            .quota("h100", GPU, 2)
            .preemption(policy)
            .build();
        let b = cluster_queue("b").cohort("c").quota("h100", GPU, 4).build();
        let mut e = engine(&[a, b]);
        submit(&mut e, 0, job("ml/b-own", "b", 2).priority(100));
        submit(&mut e, 1, job("ml/b-low", "b", 4).priority(5));
        assert!(e.is_admitted("ml/b-low"), "b borrows 2 of a's GPUs");
        // a-big needs 4 > a's nominal 2: it must borrow, so only borrowWithinCohort
        // lets it preempt in b, and only below the threshold.
        submit(&mut e, 2, job("ml/a-big", "a", 4).priority(50));
        assert_eq!(e.is_admitted("ml/a-big"), want, "{policy}");
        assert_eq!(e.is_admitted("ml/b-low"), !want, "{policy}");
        assert!(e.is_admitted("ml/b-own"));
    }
}

#[test]
fn hold_and_drain_evicts_and_resuming_readmits() {
    let q = cluster_queue("q").quota("h100", GPU, 4).build();
    let mut e = engine(std::slice::from_ref(&q));
    submit(&mut e, 0, job("ml/a", "q", 4));
    let mut drain = q.clone();
    drain.spec.stop_policy = super::api::StopPolicy::HoldAndDrain;
    e.apply_cluster_queue(&drain, 10).unwrap();
    e.schedule(10).unwrap();
    assert_eq!(e.pending_reason("ml/a"), Some("ClusterQueueStopped"));
    e.apply_cluster_queue(&q, 20).unwrap();
    e.schedule(20).unwrap();
    assert!(e.is_admitted("ml/a"));
    e.check_invariants().unwrap();
}

#[test]
fn evicted_workloads_resume_with_saved_progress() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 4)
        .preemption("withinClusterQueue: LowerPriority")
        .build();
    let mut e = engine(&[q]);
    // 100s of work, checkpoint every 30s; preempted at 70s (60s saved, 10s lost).
    let w = job("ml/low", "q", 4)
        .runtime(100_000)
        .checkpoint_interval(30_000);
    submit(&mut e, 0, w);
    submit(
        &mut e,
        70_000,
        job("ml/high", "q", 4).priority(10).runtime(50_000),
    );
    assert!(e.is_admitted("ml/high"));
    e.advance_to(120_000).unwrap();
    assert!(
        e.is_admitted("ml/low"),
        "readmitted when high finishes at 120s"
    );
    // 40s of work left: finishes at 160s, not 220s.
    e.advance_to(159_999).unwrap();
    assert!(e.is_admitted("ml/low"));
    e.advance_to(160_000).unwrap();
    assert!(!e.is_admitted("ml/low") && e.pending_reason("ml/low").is_none());
}

#[test]
fn flavors_are_tried_in_order_per_pod_set() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 2)
        .quota("a100", GPU, 8)
        .build();
    let mut e = engine(&[q]);
    submit(&mut e, 0, job("ml/one", "q", 2));
    submit(&mut e, 1, job("ml/two", "q", 4));
    let state = e.final_state();
    let flavor_of = |wl: &str| {
        state
            .admitted
            .iter()
            .find(|a| a.workload == wl)
            .map(|a| a.flavors["main"][GPU].clone())
    };
    assert_eq!(flavor_of("ml/one").as_deref(), Some("h100"));
    assert_eq!(flavor_of("ml/two").as_deref(), Some("a100"));
}

#[test]
fn unknown_priority_class_and_duplicates_are_errors() {
    let q = cluster_queue("q").quota("h100", GPU, 2).build();
    let mut e = engine(&[q]);
    let mut w = job("ml/x", "q", 1);
    w.priority_class = Some("nope".into());
    let err = e.submit(0, w).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    e.submit(0, job("ml/y", "q", 1)).unwrap();
    assert!(e.submit(0, job("ml/y", "q", 1)).is_err());
}

/// The point of parking: a cycle evaluates queue heads, not every pending workload.
/// With N huge workloads parked in a queue, admitting a stream of small ones costs the
/// same number of evaluations whatever N is.
#[test]
fn cycle_cost_does_not_grow_with_inadmissible_workloads() {
    let mut costs = Vec::new();
    for parked in [10, 100, 1000] {
        let q = cluster_queue("q").quota("h100", GPU, 100).build();
        let mut e = engine(&[q]);
        submit(&mut e, 0, job("ml/base", "q", 50).runtime(1_000_000));
        for i in 0..parked {
            // 60 GPUs never fit next to the 50 in use.
            submit(&mut e, 1, job(&format!("ml/huge-{i}"), "q", 60));
        }
        let before = e.stats.evaluations;
        for i in 0..50u64 {
            let t = 10 + i * 10;
            submit(&mut e, t, job(&format!("ml/small-{i}"), "q", 1).runtime(5));
            e.advance_to(t + 5).unwrap();
        }
        assert!(e.is_admitted("ml/base"));
        costs.push(e.stats.evaluations - before);
    }
    assert_eq!(
        costs[0], costs[2],
        "evaluations for 10 vs 1000 parked: {costs:?}"
    );
    assert!(costs[0] <= 2 * 50, "{costs:?}");
}

/// The naive baseline rescans every parked workload after each release.
#[test]
fn full_rescan_baseline_pays_for_every_parked_workload() {
    let q = cluster_queue("q").quota("h100", GPU, 100).build();
    let mut e = Engine::new(EngineConfig {
        requeue: super::Requeue::FullRescan,
        ..Default::default()
    });
    e.apply_flavor(&flavor("h100"), 0).unwrap();
    e.apply_cluster_queue(&q, 0).unwrap();
    e.apply_local_queue(&local_queue("ml", "q", "q"), 0)
        .unwrap();
    submit(&mut e, 0, job("ml/base", "q", 50).runtime(1_000_000));
    for i in 0..200 {
        submit(&mut e, 1, job(&format!("ml/huge-{i}"), "q", 60));
    }
    let before = e.stats.evaluations;
    submit(&mut e, 10, job("ml/small", "q", 1).runtime(5));
    e.advance_to(15).unwrap();
    assert!(e.stats.evaluations - before >= 200);
}

#[test]
fn pods_resource_counts_pods_when_covered() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 100)
        .quota("h100-pods", super::model::PODS, 3)
        .build();
    let mut e = engine(&[q]);
    e.apply_flavor(&flavor("h100-pods"), 0).unwrap();
    submit(
        &mut e,
        0,
        WorkloadInfo::new("ml/two", "q").pod_set("main", 2, &[(GPU, 1)]),
    );
    submit(
        &mut e,
        1,
        WorkloadInfo::new("ml/two-more", "q").pod_set("main", 2, &[(GPU, 1)]),
    );
    assert!(e.is_admitted("ml/two"));
    assert_eq!(
        e.pending_reason("ml/two-more"),
        Some("WaitingForQuota"),
        "3 pods max"
    );
}

#[test]
fn missing_cluster_queue_is_a_pending_reason_until_it_appears() {
    let mut e = engine(&[]);
    e.apply_local_queue(&local_queue("ml", "q", "later"), 0)
        .unwrap();
    submit(&mut e, 0, job("ml/early", "q", 1));
    assert_eq!(e.pending_reason("ml/early"), Some("ClusterQueueNotFound"));
    e.apply_cluster_queue(&cluster_queue("later").quota("h100", GPU, 1).build(), 5)
        .unwrap();
    e.schedule(5).unwrap();
    assert!(e.is_admitted("ml/early"));
    e.check_invariants().unwrap();
}

/// Two borrowing victims with 1 s and 10 s grace periods, reclaimed by a 2-GPU job of
/// the lending queue: the GPU the first one frees is held for the preemptor (the victim
/// does not borrow it back), and goes back to the cohort, waking the victim, as soon as
/// the preemptor admits with less, or leaves.
#[test]
fn quota_freed_for_a_waiting_preemptor_is_held_until_it_is_done() {
    let lender = cluster_queue("lender")
        .cohort("c")
        .quota_with("h100", GPU, 2, None, Some(2))
        .preemption("reclaimWithinCohort: Any")
        .build();
    let borrower = cluster_queue("borrower")
        .cohort("c")
        .quota_with("h100", GPU, 0, Some(2), None)
        .build();
    // (what happens to the preemptor at 2 s, victim a1 admitted again at 2 s?)
    let table = [("deleted", true), ("kept", false)];
    for (fate, readmitted) in table {
        let mut e = engine(&[lender.clone(), borrower.clone()]);
        for (name, grace) in [("ml/a1", 1_000), ("ml/a2", 10_000)] {
            let mut w = job(name, "borrower", 1);
            w.grace_period = grace;
            submit(&mut e, 0, w);
        }
        submit(&mut e, 100, job("ml/b", "lender", 2));
        assert_eq!(
            e.pending_reason("ml/b"),
            Some("WaitingForPreemptedWorkloads")
        );
        e.advance_to(1_500).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.pending_reason("ml/a1"), Some("WaitingForQuota"), "{fate}");
        assert_eq!(
            e.pending_reason("ml/b"),
            Some("WaitingForPreemptedWorkloads")
        );
        assert_eq!(e.usage_total(), 2_000, "a2 still holds 1 GPU, b holds 1");
        if fate == "deleted" {
            e.remove(2_000, "ml/b").unwrap();
        }
        e.advance_to(2_000).unwrap();
        e.schedule(2_000).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.is_admitted("ml/a1"), readmitted, "{fate}");
        assert!(e.admissible_but_parked(2_000).is_empty(), "{fate}");
        e.advance_to(10_100).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.is_admitted("ml/b"), !readmitted, "{fate}");
    }
}

/// Re-applying a queue of the cohort (here: the lender lowers its quota) while a
/// preemptor holds a reservation gives the reservation back first, so the books never
/// hold more than the new limits.
#[test]
fn reapplying_a_cohort_queue_ends_reservations() {
    let lender = |nominal| {
        cluster_queue("lender")
            .cohort("c")
            .quota_with("h100", GPU, nominal, None, Some(nominal))
            .preemption("reclaimWithinCohort: Any")
            .build()
    };
    let borrower = cluster_queue("borrower")
        .cohort("c")
        .quota_with("h100", GPU, 0, Some(2), None)
        .build();
    let mut e = engine(&[lender(2), borrower]);
    for (name, grace) in [("ml/a1", 1_000), ("ml/a2", 10_000)] {
        let mut w = job(name, "borrower", 1);
        w.grace_period = grace;
        submit(&mut e, 0, w);
    }
    submit(&mut e, 100, job("ml/b", "lender", 2));
    e.advance_to(1_500).unwrap();
    assert_eq!(e.usage_total(), 2_000, "a2 holds 1 GPU, b's reservation 1");
    e.apply_cluster_queue(&lender(1), 1_600).unwrap();
    e.schedule(1_600).unwrap();
    e.check_invariants().unwrap();
    assert_eq!(e.usage_total(), 1_000, "only a2 is left");
    e.advance_to(20_000).unwrap();
    e.check_invariants().unwrap();
    assert!(
        !e.is_admitted("ml/b"),
        "2 GPUs exceed the lender's new quota"
    );
}

/// Lender (4 GPUs, reclaims with `Any`, `withinClusterQueue: LowerPriority`) and a
/// borrower running `fast` (2 GPUs, 1 s grace) and `slow` (2 GPUs, 10 s grace), both
/// reclaimed at 0.1 s by `mine` (4 GPUs). `fast` is gone at 1.1 s: `mine` holds 2 GPUs.
fn reservation_held_at_1500() -> Engine {
    let lender = cluster_queue("lender")
        .cohort("c")
        .quota_with("h100", GPU, 4, None, Some(4))
        .preemption("{reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}")
        .build();
    let borrower = cluster_queue("borrower")
        .cohort("c")
        .quota_with("h100", GPU, 0, Some(4), None)
        .build();
    let mut e = engine(&[lender, borrower]);
    for (name, grace) in [("ml/fast", 1_000), ("ml/slow", 10_000)] {
        let mut w = job(name, "borrower", 2);
        w.grace_period = grace;
        submit(&mut e, 0, w);
    }
    submit(&mut e, 100, job("ml/mine", "lender", 4).runtime(60_000));
    e.advance_to(1_500).unwrap();
    e.check_invariants().unwrap();
    assert_eq!(
        e.usage_total(),
        4_000,
        "slow holds 2 GPUs, mine's reservation 2"
    );
    e
}

/// A higher-priority workload arriving in the waiting preemptor's own queue goes first,
/// as in Kueue's queue order: it uses the reserved quota and the victims' quota on its
/// way. One that fits in what is reserved now is admitted at once (the holder keeps the
/// rest and goes on waiting); one that needs the victims gone waits for them at the head
/// of the queue; one of lower priority waits behind the holder.
#[test]
fn a_higher_priority_workload_in_the_queue_takes_over_a_reservation() {
    let table = [
        // (gpus, priority, urgent admitted at, its reason at 1.5 s, mine admitted at)
        (1, 10, Some(1_500), None, 10_100),
        (
            4,
            10,
            Some(10_100),
            Some("WaitingForPreemptedWorkloads"),
            15_100,
        ),
        (1, -10, None, Some("Queued"), 10_100),
    ];
    for (gpus, prio, urgent_at, reason, mine_at) in table {
        let mut e = reservation_held_at_1500();
        let w = job("ml/urgent", "lender", gpus)
            .priority(prio)
            .created(1_500)
            .runtime(5_000);
        submit(&mut e, 1_500, w);
        assert_eq!(e.pending_reason("ml/urgent"), reason, "{gpus} {prio}");
        if urgent_at == Some(1_500) {
            assert_eq!(e.usage_total(), 4_000, "urgent took 1 of mine's 2 GPUs");
        }
        assert_eq!(
            e.pending_reason("ml/mine"),
            Some("WaitingForPreemptedWorkloads"),
            "mine keeps waiting for slow"
        );
        e.advance_to(20_000).unwrap();
        e.schedule(20_000).unwrap();
        e.check_invariants().unwrap();
        assert!(e.admissible_but_parked(20_000).is_empty(), "{gpus} {prio}");
        assert_eq!(e.first_admitted_at("ml/urgent"), urgent_at, "{gpus} {prio}");
        assert_eq!(
            e.first_admitted_at("ml/mine"),
            Some(mine_at),
            "{gpus} {prio}"
        );
    }
}

/// The holder, or the workload waiting ahead of it for its victims, is deleted. The one
/// left carries on with the reservation (the holder passes it on): the victim `fast`
/// does not borrow the 2 GPUs back, and the one left runs when `slow` is gone.
#[test]
fn a_deleted_holder_or_taker_leaves_the_reservation_to_the_other() {
    for (deleted, other) in [("ml/mine", "ml/urgent"), ("ml/urgent", "ml/mine")] {
        let mut e = reservation_held_at_1500();
        let w = job("ml/urgent", "lender", 4)
            .priority(10)
            .created(1_500)
            .runtime(5_000);
        submit(&mut e, 1_500, w);
        e.remove(2_000, deleted).unwrap();
        e.schedule(2_000).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.usage_total(), 4_000, "{deleted}: slow 2 GPUs, reserved 2");
        assert!(!e.is_admitted("ml/fast"), "{deleted}");
        assert_eq!(
            e.pending_reason(other),
            Some("WaitingForPreemptedWorkloads"),
            "{deleted}"
        );
        e.advance_to(10_100).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.first_admitted_at(other), Some(10_100), "{deleted}");
    }
}

/// Without anyone waiting for its victims, a holder that leaves gives its reservation
/// back to the cohort at once.
#[test]
fn a_deleted_holder_releases_its_reservation() {
    let mut e = reservation_held_at_1500();
    e.remove(2_000, "ml/mine").unwrap();
    e.schedule(2_000).unwrap();
    e.check_invariants().unwrap();
    assert!(e.is_admitted("ml/fast"), "fast borrows the 2 GPUs back");
    assert_eq!(e.usage_total(), 4_000, "slow 2 GPUs (terminating), fast 2");
    e.advance_to(10_100).unwrap();
    e.check_invariants().unwrap();
    assert!(e.is_admitted("ml/slow"), "slow borrows what it frees back");
}

/// StrictFIFO: a head that blocked the queue and is overtaken by a new head (higher
/// priority) that blocks it first waits `Queued` again, as a schedule from scratch
/// leaves every workload behind a blocking head (its old reason is not re-decided).
#[test]
fn an_overtaken_strict_fifo_head_waits_queued_again() {
    let q = cluster_queue("q")
        .quota("h100", GPU, 2)
        .strict_fifo()
        .build();
    let mut e = engine(std::slice::from_ref(&q));
    submit(&mut e, 0, job("ml/first", "q", 1));
    submit(&mut e, 1, job("ml/big", "q", 2).created(1));
    let reason = |e: &Engine, key: &str| e.pending_entry(key).map(|(r, _)| r);
    assert_eq!(reason(&e, "ml/big").as_deref(), Some("WaitingForQuota"));
    submit(&mut e, 2, job("ml/urgent", "q", 2).priority(100).created(2));
    assert_eq!(reason(&e, "ml/urgent").as_deref(), Some("WaitingForQuota"));
    assert_eq!(
        e.pending_entry("ml/big"),
        Some((
            "Queued".into(),
            "queued (position 2 in its ClusterQueue)".into()
        ))
    );
    // A release lets the new head in; the old one is evaluated again and blocks.
    e.remove(3, "ml/first").unwrap();
    e.schedule(3).unwrap();
    assert!(e.is_admitted("ml/urgent"));
    assert_eq!(reason(&e, "ml/big").as_deref(), Some("WaitingForQuota"));
}

/// With ranged positions, refreshing a cohort whose queues cannot preempt re-decides
/// only the first `EXACT_PLACES` parked workloads of each queue (their messages name
/// the quota free now; the others' reasons cannot change with the books); a queue that
/// can preempt is re-decided whole. The reasons stay what a fresh decision gives.
#[test]
fn refreshing_reasons_without_preemption_re_decides_only_the_front() {
    use super::events::{Positions, EXACT_PLACES};
    for (preempting, woken) in [(false, EXACT_PLACES as u64), (true, 100)] {
        let mut b = cluster_queue("q").quota("h100", GPU, 4);
        if preempting {
            b = b.preemption("withinClusterQueue: LowerPriority");
        }
        let q = b.build();
        let mut e = Engine::new(EngineConfig {
            positions: Positions::Ranged,
            ..EngineConfig::default()
        });
        e.apply_flavor(&flavor("h100"), 0).unwrap();
        e.apply_cluster_queue(&q, 0).unwrap();
        e.apply_local_queue(&local_queue("ml", "q", "q"), 0)
            .unwrap();
        submit(&mut e, 0, job("ml/big", "q", 4));
        for i in 0..100 {
            submit(&mut e, 1, job(&format!("ml/w{i:03}"), "q", 1).created(1));
        }
        e.take_events();
        let before = e.stats.wakes;
        e.refresh_cohort_of("q", 2);
        e.schedule(2).unwrap();
        e.check_invariants().unwrap();
        assert_eq!(e.stats.wakes - before, woken, "preempting: {preempting}");
        // Still parked, with the same reasons; the big one ending wakes them as before.
        assert!(e.take_events().is_empty());
        e.remove(3, "ml/big").unwrap();
        e.schedule(3).unwrap();
        let admitted = (0..100)
            .filter(|i| e.is_admitted(&format!("ml/w{i:03}")))
            .count();
        assert_eq!(admitted, 4, "preempting: {preempting}");
    }
}

/// A cohort of a serving queue (4 GPUs) with `replicas` one-GPU replicas submitted at 0
/// and a training queue with `train_nominal` GPUs.
fn serving_beside_training(train_nominal: i64, replicas: usize) -> Engine {
    let serve = cluster_queue("serve")
        .cohort("fleet")
        .quota("h100", GPU, 4)
        .build();
    let train = cluster_queue("train")
        .cohort("fleet")
        .quota("h100", GPU, train_nominal)
        .build();
    let mut e = engine(&[serve, train]);
    for i in 0..replicas {
        submit(&mut e, 0, job(&format!("ml/chat-{i}"), "serve", 1));
    }
    e
}

/// A cohort of a serving queue (4 GPUs, all four replicas admitted) and a training
/// queue with `train_nominal` GPUs; at 10 s replicas 3 and 2 scale down with a hold
/// until `until` for borrowers losing more than 5 minutes.
fn scaled_down_with_hold(train_nominal: i64, until: u64) -> Engine {
    let mut e = serving_beside_training(train_nominal, 4);
    let hold = super::HoldFreed {
        until,
        max_rework: 300_000,
    };
    for i in [3, 2] {
        e.remove_holding(
            10_000,
            &format!("ml/chat-{i}"),
            "DeploymentScaledDown",
            hold,
        )
        .unwrap();
    }
    e.schedule(10_000).unwrap();
    e
}

/// The serving queue of [`scaled_down_with_hold`] as a live controller rebuilds it: two
/// replicas run, and the hold at four (read back from the scale target) is set from
/// outside with [`Engine::replica_usage`] and [`Engine::set_hold`].
fn hold_set_from_outside(train_nominal: i64, until: u64) -> Engine {
    let mut e = serving_beside_training(train_nominal, 2);
    let (cq, levels) = e.replica_usage(&job("ml/chat", "serve", 1), 4).unwrap();
    assert_eq!(cq, "serve");
    let want = [(("h100".to_string(), GPU.to_string()), 4_000)];
    assert_eq!(levels, want.into_iter().collect());
    let hold = super::HoldFreed {
        until,
        max_rework: 300_000,
    };
    e.set_hold(10_000, &cq, &levels, hold).unwrap();
    e.schedule(10_000).unwrap();
    e.check_invariants().unwrap();
    e
}

/// A scale-down's freed capacity (`hold.rs`): lent within the hold only to work that is
/// cheap to reclaim; the queue that borrows keeps its own nominal quota; when the hold
/// ends, the expensive borrower waiting for it is admitted.
#[test]
fn held_capacity_goes_only_to_cheap_borrowers_until_the_hold_ends() {
    lend_only_to_cheap_borrowers(scaled_down_with_hold(2, 600_000));
}

/// A hold set from outside (a live controller's) lends, keeps out and wakes exactly as
/// one a scale-down left in the engine.
#[test]
fn a_hold_set_from_outside_behaves_like_one_left_by_a_scale_down() {
    lend_only_to_cheap_borrowers(hold_set_from_outside(2, 600_000));
}

fn lend_only_to_cheap_borrowers(mut e: Engine) {
    // Training's own nominal quota is never held from it.
    submit(
        &mut e,
        20_000,
        job("ml/own", "train", 2).checkpoint_interval(1_200_000),
    );
    assert!(e.is_admitted("ml/own"));
    // A three-hour job checkpointing every 20 minutes would borrow the held GPUs: it waits.
    let long = job("ml/long", "train", 2)
        .checkpoint_interval(1_200_000)
        .runtime(3 * 3_600_000);
    submit(&mut e, 30_000, long);
    assert!(!e.is_admitted("ml/long"));
    // A two-minute job loses little when reclaimed: it may borrow them.
    let short = job("ml/short", "train", 1).runtime(120_000);
    submit(&mut e, 40_000, short);
    assert!(e.is_admitted("ml/short"));
    assert!(!e.is_admitted("ml/long"));
    // The short job ends; the hold still stands.
    e.advance_to(599_999).unwrap();
    e.check_invariants().unwrap();
    assert!(!e.is_admitted("ml/long"));
    // The hold ends: the parked job is woken and admitted.
    e.advance_to(600_000).unwrap();
    e.check_invariants().unwrap();
    assert!(e.is_admitted("ml/long"));
}

/// The serving queue itself uses its held capacity at once, and what it uses again is
/// no longer headroom (a hold never makes its own queue wait).
#[test]
fn the_holding_queue_takes_its_capacity_back_without_waiting() {
    let mut e = scaled_down_with_hold(0, 3_600_000);
    submit(&mut e, 20_000, job("ml/chat-2b", "serve", 1));
    assert!(e.is_admitted("ml/chat-2b"));
    // Held headroom left: level 4, usage 3. A long job waits; nothing is preempted for it.
    submit(
        &mut e,
        30_000,
        job("ml/long", "train", 1).runtime(3 * 3_600_000),
    );
    assert!(!e.is_admitted("ml/long"));
    assert_eq!(e.pending_reason("ml/long"), Some("WaitingForQuota"));
    // Holds never lift a limit: after the hold the job borrows the free GPU.
    e.advance_to(3_600_000).unwrap();
    assert!(e.is_admitted("ml/long"));
    e.check_invariants().unwrap();
}

/// The serving queue takes a hold set from outside back at once too, and an ended hold
/// sets nothing.
#[test]
fn a_hold_set_from_outside_never_makes_its_own_queue_wait() {
    let mut e = hold_set_from_outside(0, 3_600_000);
    submit(&mut e, 20_000, job("ml/chat-2", "serve", 2));
    assert!(e.is_admitted("ml/chat-2"));
    e.check_invariants().unwrap();
    let mut ended = hold_set_from_outside(0, 5_000);
    submit(
        &mut ended,
        20_000,
        job("ml/long", "train", 2).runtime(3 * 3_600_000),
    );
    assert!(
        ended.is_admitted("ml/long"),
        "a hold ended before it was set"
    );
}

/// What replicas use of their queue: the first flavor their pod set may use in each
/// resource group, times the replicas; `pods` when the queue covers it. Unknown queues
/// and uncovered resources are errors, not holds.
#[test]
fn replica_usage_takes_the_first_flavor_the_replicas_may_use() {
    let mut e = Engine::new(EngineConfig::default());
    for (name, gen) in [("a100", "a100"), ("h100", "h100")] {
        let mut f = flavor(name);
        f.spec.node_labels.insert("gpu".into(), gen.into());
        e.apply_flavor(&f, 0).unwrap();
    }
    let q = cluster_queue("serve")
        .quota("a100", GPU, 8)
        .quota("h100", GPU, 8)
        .quota("any", "pods", 100)
        .build();
    e.apply_flavor(&flavor("any"), 0).unwrap();
    e.apply_cluster_queue(&q, 0).unwrap();
    e.apply_local_queue(&local_queue("ml", "serve", "serve"), 0)
        .unwrap();
    let mut shape = job("ml/chat", "serve", 2);
    let (cq, levels) = e.replica_usage(&shape, 3).unwrap();
    assert_eq!(cq, "serve");
    let fr = |f: &str, r: &str| (f.to_string(), r.to_string());
    let want = [(fr("a100", GPU), 6_000), (fr("any", "pods"), 3_000)];
    assert_eq!(levels, want.into_iter().collect());
    shape.pod_sets[0]
        .node_selector
        .insert("gpu".into(), "h100".into());
    let (_, levels) = e.replica_usage(&shape, 3).unwrap();
    assert_eq!(levels.get(&fr("h100", GPU)), Some(&6_000), "{levels:?}");
    assert!(e.replica_usage(&job("ml/x", "nowhere", 1), 1).is_err());
    let cpu = WorkloadInfo::new("ml/cpu", "serve").pod_set("main", 1, &[("cpu", 1)]);
    assert!(e.replica_usage(&cpu, 1).is_err());
    let unknown = [(fr("a100", "cpu"), 1_000)].into_iter().collect();
    let hold = super::HoldFreed {
        until: 10,
        max_rework: 0,
    };
    assert!(e.set_hold(0, "serve", &unknown, hold).is_err());
    assert!(e.set_hold(0, "nowhere", &levels, hold).is_err());
}

/// A quota raised from zero: the workloads that could never fit are evaluated again and
/// the head is admitted, as an engine built with the new quota admits it — at the same
/// instant, where a failure remembered for identical workloads (keyed by the cohort's
/// version, which a queue without a cohort may repeat) must not answer for the new spec.
/// The queue keeps its one unnamed cohort.
#[test]
fn a_quota_raised_from_zero_admits_what_exceeded_it() {
    let mut e = engine(&[cluster_queue("d").quota("h100", GPU, 0).build()]);
    submit(&mut e, 10, job("ml/one", "d", 1).created(1));
    submit(&mut e, 10, job("ml/two", "d", 1).created(2));
    assert!(!e.is_admitted("ml/one"));
    let cohorts = e.cohorts.len();
    e.apply_cluster_queue(&cluster_queue("d").quota("h100", GPU, 1).build(), 10)
        .unwrap();
    assert_eq!(e.cohorts.len(), cohorts);
    e.schedule(10).unwrap();
    e.check_invariants().unwrap();
    assert!(e.is_admitted("ml/one"));
    assert!(!e.is_admitted("ml/two"));
}

/// An engine with ranged positions (the controller's) over ClusterQueue `f` (`gpus`, no
/// preemption) with `n` identical 1-GPU workloads submitted.
fn ranged_queue(gpus: i64, n: u64) -> Engine {
    let mut e = Engine::new(EngineConfig {
        positions: super::events::Positions::Ranged,
        ..EngineConfig::default()
    });
    e.apply_flavor(&flavor("h100"), 0).unwrap();
    e.apply_cluster_queue(&cluster_queue("f").quota("h100", GPU, gpus).build(), 0)
        .unwrap();
    e.apply_local_queue(&local_queue("ml", "f", "f"), 0)
        .unwrap();
    for i in 0..n {
        e.submit(10, job(&format!("ml/w{i:03}"), "f", 1).created(i))
            .unwrap();
    }
    e.schedule(10).unwrap();
    e
}

/// Every workload's reason code, in key order.
fn reasons(e: &Engine, n: u64) -> Vec<Option<&'static str>> {
    (0..n)
        .map(|i| e.pending_reason(&format!("ml/w{i:03}")))
        .collect()
}

/// A ClusterQueue updated in place ([`Engine::update_cluster_queue`]) under a long
/// queue of identical workloads: a quota raised admits what fits and re-decides only
/// the front and the first of the class, the others' reasons standing; a quota lowered
/// below the request retells every one of them (`ExceedsMaxQuota`, as an engine built
/// with that quota says), and raised again, every one waits for quota again.
#[test]
fn a_queue_updated_in_place_retells_only_what_it_moves() {
    let n = 200;
    let mut e = ranged_queue(2, n);
    let before = e.stats.evaluations;
    e.update_cluster_queue(&cluster_queue("f").quota("h100", GPU, 3).build(), 20)
        .unwrap();
    e.schedule(20).unwrap();
    e.check_invariants().unwrap();
    assert_eq!(reasons(&e, n), reasons(&ranged_queue(3, n), n));
    let looked = e.stats.evaluations - before;
    assert!(looked < 40, "{looked} evaluations for a raise by one");
    for (gpus, want) in [(0, "ExceedsMaxQuota"), (3, "WaitingForQuota")] {
        e.update_cluster_queue(&cluster_queue("f").quota("h100", GPU, gpus).build(), 30)
            .unwrap();
        e.schedule(30).unwrap();
        let told = reasons(&e, n);
        // The three admitted keep running (over a lowered quota, as Kueue keeps them).
        assert_eq!(told[..3], [None; 3]);
        assert!(
            told[3..].iter().all(|r| *r == Some(want)),
            "{gpus}: {told:?}"
        );
    }
}
