//! Property tests of the quota engine on random queues and workloads: quota is never
//! exceeded, nothing is lost, no preemption cycle, no missed wake-up, and runs are
//! deterministic.

use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use tessera::quota::events::EventType;
use tessera::quota::fixtures::{cluster_queue, flavor, local_queue};
use tessera::quota::{Engine, EngineConfig, Event, WaitForPodsReady, WorkloadInfo};

const GPU: &str = "nvidia.com/gpu";
const POLICIES: [&str; 5] = [
    "{}",
    "withinClusterQueue: LowerPriority",
    "withinClusterQueue: LowerOrNewerEqualPriority\nreclaimWithinCohort: LowerPriority",
    "withinClusterQueue: LowerPriority\nreclaimWithinCohort: Any\nminimumRuntime: 20s",
    "reclaimWithinCohort: Any\nborrowWithinCohort: {policy: LowerPriority}",
];

#[derive(Clone, Debug)]
struct Queue {
    nominal: [i64; 2],
    borrowing: Option<i64>,
    lending: Option<i64>,
    policy: usize,
    strict: bool,
}

#[derive(Clone, Debug)]
struct Job {
    queue: usize,
    gap: u64,
    gpus: i64,
    count: u32,
    min: Option<u32>,
    priority: i32,
    runtime: Option<u64>,
    checkpoint: Option<u64>,
    /// Seconds a victim keeps its quota after eviction.
    grace: u64,
    /// Seconds from admission until its pods are ready; `None`: never.
    ready: Option<u64>,
}

fn queue() -> impl Strategy<Value = Queue> {
    (
        [0i64..6, 0i64..6],
        proptest::option::of(0i64..4),
        proptest::option::of(0i64..3),
        0..POLICIES.len(),
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(nominal, borrowing, lending, policy, strict)| Queue {
            nominal,
            borrowing,
            lending,
            policy,
            strict,
        })
}

fn job(queues: usize) -> impl Strategy<Value = Job> {
    (
        0..queues,
        0u64..30,
        1i64..5,
        1u32..3,
        proptest::bool::weighted(0.3),
        prop_oneof![Just(0), Just(5), Just(10)],
        proptest::option::weighted(0.8, 5u64..60),
        proptest::option::of(5u64..20),
    )
        .prop_map(
            |(queue, gap, gpus, count, partial, priority, runtime, checkpoint)| Job {
                queue,
                gap,
                gpus,
                count,
                min: partial.then_some(1),
                priority,
                runtime,
                checkpoint,
                grace: 0,
                ready: Some(0),
            },
        )
}

/// A job that also has a random grace period and time until its pods are ready (some
/// never get ready), for runs with `waitForPodsReady`.
fn timed_job(queues: usize) -> impl Strategy<Value = Job> {
    (
        job(queues),
        prop_oneof![Just(0u64), 1u64..30],
        proptest::option::weighted(0.85, 0u64..25),
    )
        .prop_map(|(j, grace, ready)| Job { grace, ready, ..j })
}

fn timed_scenario() -> impl Strategy<Value = (Vec<Queue>, Vec<Job>)> {
    prop::collection::vec(queue(), 1..4).prop_flat_map(|qs| {
        let n = qs.len();
        (Just(qs), prop::collection::vec(timed_job(n), 1..25))
    })
}

/// `waitForPodsReady` with a 15 s timeout, 2 s backoff doubling up to 16 s, and
/// deactivation after 3 requeues.
fn pods_ready_config() -> EngineConfig {
    EngineConfig {
        wait_for_pods_ready: Some(WaitForPodsReady {
            timeout: 15_000,
            backoff_base: 2_000,
            backoff_max: 16_000,
            backoff_limit_count: Some(3),
            requeue_by_eviction_time: true,
            block_admission: false,
        }),
        ..EngineConfig::default()
    }
}

fn scenario() -> impl Strategy<Value = (Vec<Queue>, Vec<Job>)> {
    prop::collection::vec(queue(), 1..4).prop_flat_map(|qs| {
        let n = qs.len();
        (Just(qs), prop::collection::vec(job(n), 1..25))
    })
}

/// Runs a scenario, checking the books after every step, until nothing is left to
/// happen. Returns the events.
fn run(
    queues: &[Queue],
    jobs: &[Job],
    cfg: EngineConfig,
) -> Result<(Engine, Vec<Event>), TestCaseError> {
    run_until(queues, jobs, cfg, None)
}

/// Like [`run`], stopping timers `horizon` ms after the last arrival when given.
fn run_until(
    queues: &[Queue],
    jobs: &[Job],
    cfg: EngineConfig,
    horizon: Option<u64>,
) -> Result<(Engine, Vec<Event>), TestCaseError> {
    let mut e = Engine::new(cfg);
    for f in ["a", "b"] {
        e.apply_flavor(&flavor(f), 0)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
    }
    for (i, q) in queues.iter().enumerate() {
        let mut b = cluster_queue(&format!("q{i}"));
        if q.borrowing.is_some() || q.lending.is_some() || i % 2 == 0 {
            b = b.cohort("c");
        }
        let in_cohort = b.0.spec.cohort_name.is_some();
        for (fi, f) in ["a", "b"].iter().enumerate() {
            let lend = q
                .lending
                .map(|l| l.min(q.nominal[fi]))
                .filter(|_| in_cohort);
            let borrow = q.borrowing.filter(|_| in_cohort);
            b = b.quota_with(f, GPU, q.nominal[fi], borrow, lend);
        }
        b = b.preemption(POLICIES[q.policy]);
        if q.strict {
            b = b.strict_fifo();
        }
        e.apply_cluster_queue(&b.build(), 0)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
        e.apply_local_queue(&local_queue("ns", &format!("q{i}"), &format!("q{i}")), 0)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
    }
    let mut now = 0;
    for (i, j) in jobs.iter().enumerate() {
        now += j.gap * 1000;
        e.advance_to(now)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
        e.check_invariants().map_err(TestCaseError::fail)?;
        let mut w = WorkloadInfo::new(&format!("ns/j{i}"), &format!("q{}", j.queue))
            .pod_set("main", j.count, &[(GPU, j.gpus)])
            .priority(j.priority)
            .created(now);
        if let Some(m) = j.min {
            w = w.min_count(m);
        }
        if let Some(r) = j.runtime {
            w = w.runtime(r * 1000);
        }
        if let Some(c) = j.checkpoint {
            w = w.checkpoint_interval(c * 1000);
        }
        w.grace_period = j.grace * 1000;
        w.pods_ready_after = j.ready.map(|r| r * 1000);
        e.submit(now, w)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
        e.schedule(now)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
        e.check_invariants().map_err(TestCaseError::fail)?;
        let missed = e.admissible_but_parked(now);
        prop_assert!(missed.is_empty(), "missed wake-ups at {now}: {missed:?}");
    }
    let end = horizon.map(|h| now + h);
    while let Some(t) = e.next_timer() {
        if end.is_some_and(|end| t > end) {
            break;
        }
        e.advance_to(t)
            .map_err(|x| TestCaseError::fail(x.to_string()))?;
        e.check_invariants().map_err(TestCaseError::fail)?;
        let missed = e.admissible_but_parked(t);
        prop_assert!(missed.is_empty(), "missed wake-ups at {t}: {missed:?}");
    }
    let events = e.take_events();
    Ok((e, events))
}

fn has_cycle(edges: &[(String, String)]) -> bool {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        g: &BTreeMap<&'a str, Vec<&'a str>>,
        on: &mut BTreeSet<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> bool {
        if on.contains(n) {
            return true;
        }
        if !done.insert(n) {
            return false;
        }
        on.insert(n);
        let cyc = g
            .get(n)
            .is_some_and(|next| next.iter().any(|m| visit(m, g, on, done)));
        on.remove(n);
        cyc
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .any(|n| visit(n, &graph, &mut BTreeSet::new(), &mut done))
}

/// Every workload ends in exactly one place (admitted, pending or finished), none is
/// lost, and every admission is balanced by a finish or an eviction, or still holds quota.
fn nothing_lost_and_books_balance(
    e: &Engine,
    events: &[Event],
    jobs: usize,
) -> Result<(), TestCaseError> {
    let f = e.final_state();
    let mut seen: Vec<&str> = f
        .admitted
        .iter()
        .map(|a| a.workload.as_str())
        .chain(f.pending.iter().map(|p| p.workload.as_str()))
        .chain(f.finished.iter().map(String::as_str))
        .collect();
    seen.sort();
    let before = seen.len();
    seen.dedup();
    prop_assert_eq!(before, seen.len(), "a workload is in two places");
    prop_assert_eq!(seen.len(), jobs, "a workload was lost");
    for i in 0..jobs {
        let key = format!("ns/j{i}");
        let count = |k: EventType| {
            events
                .iter()
                .filter(|ev| ev.kind == k && ev.workload == key)
                .count()
        };
        let admits = count(EventType::Admitted);
        let ends =
            count(EventType::Finished) + count(EventType::Preempted) + count(EventType::Evicted);
        let holding = f.admitted.iter().any(|a| a.workload == key) as usize;
        prop_assert_eq!(admits, ends + holding, "{}", key);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, timeout: 20_000, ..ProptestConfig::default() })]

    #[test]
    fn books_balance_and_nothing_is_lost((queues, jobs) in scenario()) {
        let (e, events) = run(&queues, &jobs, EngineConfig::default())?;
        nothing_lost_and_books_balance(&e, &events, jobs.len())?;
    }

    #[test]
    fn no_preemption_cycle((queues, jobs) in scenario()) {
        let (_, events) = run(&queues, &jobs, EngineConfig::default())?;
        let mut by_time: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
        for ev in events.iter().filter(|e| e.kind == EventType::Preempted) {
            let by = ev.by.clone().unwrap_or_default();
            by_time.entry((ev.time * 1000.0) as u64).or_default().push((by, ev.workload.clone()));
        }
        for (t, edges) in &by_time {
            prop_assert!(!has_cycle(edges), "preemption cycle at {t}ms: {edges:?}");
        }
        // Within one queue (no reclaim) priority strictly drops along preemptions, so
        // the whole history is acyclic.
        let within_only: Vec<(String, String)> = events
            .iter()
            .filter(|e| e.kind == EventType::Preempted && e.reason.as_deref() == Some("InClusterQueue"))
            .map(|e| (e.by.clone().unwrap_or_default(), e.workload.clone()))
            .collect();
        let strict_priority = queues.iter().all(|q| q.policy <= 1);
        if strict_priority {
            prop_assert!(!has_cycle(&within_only), "{within_only:?}");
        }
    }

    #[test]
    fn runs_are_deterministic((queues, jobs) in scenario()) {
        let (_, a) = run(&queues, &jobs, EngineConfig::default())?;
        let (_, b) = run(&queues, &jobs, EngineConfig::default())?;
        prop_assert_eq!(a, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, timeout: 30_000, ..ProptestConfig::default() })]

    /// Random grace periods and pods-ready timeouts (with requeue backoff and
    /// deactivation): the books balance after every step, nothing is lost or admitted
    /// twice, no wake-up is missed, runs are deterministic, and every run reaches a fixed
    /// point (no timer left) within one simulated hour after the last arrival: no
    /// endless preemption chain.
    #[test]
    fn grace_periods_and_pods_ready_timeouts((queues, jobs) in timed_scenario()) {
        let hour = 3_600_000;
        let (mut e, events) = run_until(&queues, &jobs, pods_ready_config(), Some(hour))?;
        if let Some(t) = e.next_timer() {
            let preempted = events.iter().filter(|e| e.kind == EventType::Preempted).count();
            return Err(TestCaseError::fail(format!(
                "no fixed point: a timer at {t} ms after {preempted} preemptions; first events: {:?}",
                &events[..events.len().min(40)]
            )));
        }
        nothing_lost_and_books_balance(&e, &events, jobs.len())?;
        let (_, again) = run_until(&queues, &jobs, pods_ready_config(), Some(hour))?;
        prop_assert_eq!(events, again);
    }

    /// The same with `blockAdmission`: the books balance, held queues are always let go
    /// (the run reaches a fixed point), and no admission happens while an admitted
    /// workload's pods are not ready.
    #[test]
    fn block_admission_holds_admissions_until_pods_are_ready((queues, jobs) in timed_scenario()) {
        let mut cfg = pods_ready_config();
        if let Some(w) = cfg.wait_for_pods_ready.as_mut() {
            w.block_admission = true;
        }
        let (mut e, events) = run_until(&queues, &jobs, cfg, Some(3_600_000))?;
        prop_assert_eq!(e.next_timer(), None, "no fixed point");
        // Replay: track when each admitted workload gets ready (or stops running).
        let ready_after: BTreeMap<String, Option<u64>> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (format!("ns/j{i}"), j.ready.filter(|&r| r <= 15).map(|r| r * 1000)))
            .collect();
        let mut unready: BTreeMap<String, Option<f64>> = BTreeMap::new();
        for ev in &events {
            unready.retain(|_, until| until.is_none_or(|t| t > ev.time));
            match ev.kind {
                EventType::Admitted => {
                    prop_assert!(unready.is_empty(), "{} admitted at {} while {:?} not ready", ev.workload, ev.time, unready);
                    match ready_after.get(&ev.workload).copied().flatten() {
                        Some(0) => {}
                        Some(r) => { unready.insert(ev.workload.clone(), Some(ev.time + r as f64 / 1000.0)); }
                        None => { unready.insert(ev.workload.clone(), None); }
                    }
                }
                EventType::Preempted | EventType::Evicted | EventType::Finished => {
                    unready.remove(&ev.workload);
                }
                _ => {}
            }
        }
    }
}

/// Minimised by proptest from `grace_periods_and_pods_ready_timeouts`: j1 preempts j0
/// (5 s grace) and j2 (1 s grace). When j2 is gone, j1 still does not fit; it used to
/// lose the head of its queue, so j2 took back the quota, then j0, and with a 20 s
/// `minimumRuntime` the preemption repeated every 25 s forever. Now j1 keeps waiting for
/// j0 and is admitted when it leaves; the run reaches a fixed point.
#[test]
fn preemptor_keeps_its_head_until_all_victims_are_gone() -> Result<(), TestCaseError> {
    let queues = [Queue {
        nominal: [0, 2],
        borrowing: None,
        lending: None,
        policy: 3,
        strict: false,
    }];
    let job = |gpus, count, priority, grace, ready| Job {
        queue: 0,
        gap: 0,
        gpus,
        count,
        min: None,
        priority,
        runtime: None,
        checkpoint: None,
        grace,
        ready,
    };
    let jobs = [
        job(1, 1, 0, 5, Some(0)),
        job(1, 2, 5, 0, None),
        job(1, 1, 0, 1, Some(0)),
        job(1, 1, 0, 0, None),
    ];
    let (mut e, events) = run_until(&queues, &jobs, pods_ready_config(), Some(3_600_000))?;
    prop_assert_eq!(
        e.next_timer(),
        None,
        "no fixed point within an hour: {:?}",
        events
    );
    let preempted = events
        .iter()
        .filter(|e| e.kind == EventType::Preempted)
        .count();
    // j1 preempts j0 and j2 once per requeue (3 pods-ready timeouts, then deactivated).
    prop_assert!(preempted <= 8, "{preempted} preemptions: {events:?}");
    let readmitted_early = events.iter().any(|e| {
        e.kind == EventType::Admitted && e.workload == "ns/j2" && e.time > 20.0 && e.time < 25.0
    });
    prop_assert!(
        !readmitted_early,
        "a victim took back its preemptor's quota: {events:?}"
    );
    Ok(())
}

/// Minimised by proptest from `grace_periods_and_pods_ready_timeouts` with termination
/// asserted: q0 (no nominal quota, borrows up to 3) and q1 (2+2 GPUs, all lendable) in
/// one cohort. q1's j3 reclaims both of q0's borrowing jobs, j1 (1 s grace) and j2 (2 s
/// grace). When j1 is gone j3 still waits for j2; j1 used to borrow the freed GPU back
/// at once, be reclaimed again when j2 left, and so on every 1-2 s forever. Now the
/// quota j3's victims free stays reserved for j3 until it is admitted, and the run
/// reaches a fixed point.
#[test]
fn quota_freed_for_a_waiting_preemptor_stays_reserved() -> Result<(), TestCaseError> {
    let q0 = Queue {
        nominal: [0, 0],
        borrowing: Some(3),
        lending: Some(2),
        policy: 2,
        strict: false,
    };
    let q1 = Queue {
        nominal: [2, 2],
        borrowing: None,
        lending: Some(2),
        policy: 4,
        strict: false,
    };
    let job = |queue, gpus, count, grace, ready| Job {
        queue,
        gap: 0,
        gpus,
        count,
        min: None,
        priority: 0,
        runtime: None,
        checkpoint: None,
        grace,
        ready,
    };
    let jobs = [
        job(1, 1, 2, 0, Some(0)),
        job(0, 1, 1, 1, Some(0)),
        job(0, 1, 1, 2, None),
        job(1, 2, 1, 0, None),
    ];
    let (mut e, events) = run_until(&[q0, q1], &jobs, pods_ready_config(), Some(3_600_000))?;
    let preempted: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == EventType::Preempted)
        .collect();
    prop_assert_eq!(
        e.next_timer(),
        None,
        "no fixed point within an hour after {} preemptions: {:?}",
        preempted.len(),
        &events[..events.len().min(30)]
    );
    // j3 reclaims j1 and j2 once per admission (it never gets ready: deactivated at its
    // fourth pods-ready timeout), never a victim that came back meanwhile.
    prop_assert!(
        preempted.len() <= 8,
        "{} preemptions: {events:?}",
        preempted.len()
    );
    // From j3's preemption until its admission, q0 admits nothing.
    let mut waiting = false;
    for ev in &events {
        match ev.kind {
            EventType::Preempted if ev.by.as_deref() == Some("ns/j3") => waiting = true,
            EventType::Admitted if ev.workload == "ns/j3" => waiting = false,
            EventType::Admitted if waiting => prop_assert!(
                ev.cluster_queue.as_deref() != Some("q0"),
                "{} took back quota freed for its preemptor at {}: {events:?}",
                ev.workload,
                ev.time
            ),
            _ => {}
        }
    }
    Ok(())
}

/// Found by `PROPTEST_CASES=3000` after the reservation fix: j9 (priority 5) waits for
/// its victim j1 with quota reserved; j6 (priority 10, partial admission) comes back
/// from backoff, cannot preempt the reservation and parks; j9 is then admitted, and j6
/// could preempt it but was never woken (admitting j9 turned unpreemptible reserved
/// quota into a preemptible workload). Ending a reservation now always releases it with
/// wake-ups; `run_until` checks for missed wake-ups after every step.
#[test]
fn ending_a_reservation_wakes_workloads_that_may_preempt_the_preemptor() -> Result<(), TestCaseError>
{
    let queues = [Queue {
        nominal: [0, 4],
        borrowing: None,
        lending: None,
        policy: 1,
        strict: false,
    }];
    #[allow(clippy::type_complexity)]
    let table: [(
        u64,
        i64,
        u32,
        Option<u32>,
        i32,
        Option<u64>,
        u64,
        Option<u64>,
    ); 13] = [
        // (gap, gpus, count, minCount, priority, runtime, grace, ready after)
        (0, 1, 2, None, 0, None, 0, None),
        (0, 1, 1, None, 0, None, 15, Some(0)),
        (0, 2, 2, None, 10, Some(5), 0, None),
        (4, 2, 2, None, 10, Some(17), 0, Some(7)),
        (1, 3, 1, None, 0, None, 0, None),
        (14, 4, 1, None, 10, None, 10, None),
        (7, 2, 2, Some(1), 10, None, 6, None),
        (13, 1, 1, None, 10, Some(24), 0, Some(2)),
        (4, 4, 1, None, 0, None, 0, None),
        (24, 2, 1, None, 5, None, 0, None),
        (20, 1, 1, None, 0, None, 0, None),
        (28, 1, 1, None, 10, None, 10, None),
        (0, 3, 1, None, 0, None, 0, None),
    ];
    let jobs: Vec<Job> = table
        .iter()
        .map(
            |&(gap, gpus, count, min, priority, runtime, grace, ready)| Job {
                queue: 0,
                gap,
                gpus,
                count,
                min,
                priority,
                runtime,
                checkpoint: None,
                grace,
                ready,
            },
        )
        .collect();
    let (mut e, _) = run_until(&queues, &jobs, pods_ready_config(), Some(3_600_000))?;
    prop_assert_eq!(e.next_timer(), None, "no fixed point within an hour");
    Ok(())
}

/// Found by `PROPTEST_CASES=3000 ... grace` (no preemption and no reservation
/// involved): j9 (q2, 6 GPUs, `borrowWithinCohort`) parked at 113 s as `WaitingForQuota`
/// although j12 of q0, protected by q0's 20 s `minimumRuntime` until 118 s, suffices as
/// its victim: the search over every candidate took the also-protected j7 first, which
/// stopped q0 from borrowing and ruled j12 out. At 121 s the missed-wake-up check found
/// it could preempt j12. Now each protection end is tried in turn: j9 waits as
/// `MinimumRuntime` until 118 s.
#[test]
fn missed_wake_up_when_minimum_runtime_protection_ends() -> Result<(), TestCaseError> {
    let q = |nominal, lending, policy| Queue {
        nominal,
        borrowing: None,
        lending,
        policy,
        strict: false,
    };
    let queues = [
        q([5, 4], Some(2), 3),
        q([1, 1], None, 4),
        q([2, 5], None, 4),
    ];
    #[allow(clippy::type_complexity)]
    let table: [(usize, u64, i64, u32, i32, Option<u64>, u64, Option<u64>); 13] = [
        // (queue, gap, gpus, count, priority, runtime, grace, ready after)
        (0, 0, 2, 1, 0, Some(24), 0, None),
        (0, 19, 3, 1, 0, Some(52), 0, Some(0)),
        (0, 18, 2, 1, 0, None, 0, Some(0)),
        (0, 0, 1, 1, 0, Some(5), 0, Some(0)),
        (2, 14, 1, 1, 0, None, 0, None),
        (2, 0, 1, 2, 0, Some(5), 0, None),
        (2, 0, 1, 1, 0, Some(5), 0, None),
        (0, 0, 3, 1, 0, None, 13, None),
        (1, 19, 1, 1, 0, None, 0, None),
        (2, 1, 3, 2, 5, None, 0, None),
        (0, 0, 1, 1, 0, None, 0, None),
        (1, 6, 1, 1, 0, None, 0, None),
        (0, 10, 2, 2, 0, None, 0, Some(0)),
    ];
    let jobs: Vec<Job> = table
        .iter()
        .map(
            |&(queue, gap, gpus, count, priority, runtime, grace, ready)| Job {
                queue,
                gap,
                gpus,
                count,
                min: None,
                priority,
                runtime,
                checkpoint: None,
                grace,
                ready,
            },
        )
        .collect();
    run_until(&queues, &jobs, pods_ready_config(), Some(3_600_000))?;
    Ok(())
}

/// Found by a random run of `grace_periods_and_pods_ready_timeouts` on main: three
/// queues in one cohort; j7 (q2, 2x4 GPUs, priority 10, reclaim `Any` and
/// `borrowWithinCohort`) parks at 82 s: q0 borrows flavor b with j6 (4 GPUs) and j2 (2
/// GPUs, 3 s grace), and Kueue's order takes the newer j2 first, which ends q0's
/// borrowing and rules out j6, the victim that suffices. At 83 s j2's pods-ready timeout
/// evicts it: it stops being a candidate but keeps its quota until 86 s, so no release
/// woke j7, although it could now reclaim j6. Now an eviction with a grace period wakes
/// the cohort's reclaimers (and the missed-wake-up check passes at every step).
#[test]
fn missed_wake_up_of_a_high_priority_reclaimer() -> Result<(), TestCaseError> {
    let q = |nominal, borrowing, policy, strict| Queue {
        nominal,
        borrowing,
        lending: None,
        policy,
        strict,
    };
    let queues = [
        q([5, 5], Some(2), 1, true),
        q([2, 0], Some(2), 0, false),
        q([4, 5], None, 4, false),
    ];
    #[allow(clippy::type_complexity)]
    let table: [(
        usize,
        u64,
        i64,
        u32,
        i32,
        Option<u64>,
        Option<u64>,
        u64,
        Option<u64>,
    ); 8] = [
        // (queue, gap, gpus, count, priority, runtime, checkpoint, grace, ready after)
        (0, 0, 4, 1, 5, None, None, 0, Some(0)),
        (1, 0, 1, 2, 0, None, None, 0, Some(0)),
        (0, 0, 1, 2, 0, None, None, 3, None),
        (2, 0, 1, 1, 0, None, None, 0, None),
        (0, 20, 1, 1, 0, Some(5), None, 0, Some(0)),
        (0, 11, 2, 1, 0, None, None, 0, None),
        (0, 0, 2, 2, 0, None, None, 0, Some(0)),
        (2, 1, 4, 2, 10, Some(51), Some(15), 3, Some(15)),
    ];
    let jobs: Vec<Job> = table
        .iter()
        .map(
            |&(queue, gap, gpus, count, priority, runtime, checkpoint, grace, ready)| Job {
                queue,
                gap,
                gpus,
                count,
                min: None,
                priority,
                runtime,
                checkpoint,
                grace,
                ready,
            },
        )
        .collect();
    let (mut e, events) = run_until(&queues, &jobs, pods_ready_config(), Some(3_600_000))?;
    prop_assert_eq!(e.next_timer(), None, "no fixed point within an hour");
    let reclaimed = events.iter().any(|ev| {
        ev.kind == EventType::Preempted
            && ev.workload == "ns/j6"
            && ev.by.as_deref() == Some("ns/j7")
            && ev.time == 83.0
    });
    prop_assert!(reclaimed, "j7 did not reclaim j6 at 83 s: {events:?}");
    Ok(())
}

/// Found by `PROPTEST_CASES=3000 ... runs_are_deterministic` (no grace periods, q0 and
/// q1 with a 20 s `minimumRuntime`, reclaim `Any`): j8 (q0, 4 GPUs, priority 5) parks at
/// 5 s; q0 uses 3 of its 4 nominal GPUs in flavor b (j5, priority 5, and j7, priority
/// 0). Reclaiming from q1 needs j8 within q0's nominal quota, and its wake-up key counted
/// that as q0 releasing 3 GPUs, forgetting that preempting j7 in q0 frees 2 of them.
/// When j5 ended at 22 s (1 GPU), j8 could reclaim j2 with j7 (protected until 25 s),
/// but was not woken; at 45 s the missed-wake-up check found it admissible. Now the key
/// subtracts what preemption within its own queue can free.
#[test]
fn missed_wake_up_under_minimum_runtime_without_grace() -> Result<(), TestCaseError> {
    let q = |nominal, lending| Queue {
        nominal,
        borrowing: Some(3),
        lending: Some(lending),
        policy: 3,
        strict: false,
    };
    let queues = [q([1, 4], 2), q([0, 5], 1)];
    #[allow(clippy::type_complexity)]
    let table: [(usize, u64, i64, u32, i32, Option<u64>); 10] = [
        // (queue, gap, gpus, count, priority, runtime)
        (0, 0, 1, 1, 0, Some(45)),
        (0, 0, 1, 1, 0, Some(5)),
        (1, 0, 2, 1, 0, None),
        (0, 0, 1, 1, 0, Some(5)),
        (0, 0, 3, 2, 0, None),
        (0, 0, 1, 1, 5, Some(22)),
        (1, 0, 2, 2, 0, None),
        (0, 1, 1, 2, 0, None),
        (0, 4, 4, 1, 5, None),
        (0, 0, 3, 1, 0, None),
    ];
    let jobs: Vec<Job> = table
        .iter()
        .map(|&(queue, gap, gpus, count, priority, runtime)| Job {
            queue,
            gap,
            gpus,
            count,
            min: None,
            priority,
            runtime,
            checkpoint: None,
            grace: 0,
            ready: Some(0),
        })
        .collect();
    run(&queues, &jobs, EngineConfig::default())?;
    Ok(())
}
