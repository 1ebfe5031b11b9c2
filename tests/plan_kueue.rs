//! Kueue's documented behaviours as acceptance scenarios, run through `tessera plan`'s
//! library entry point on the files in `tests/scenarios/plan/`.

use tessera::quota::events::{Event, EventType};
use tessera::quota::scenario::{plan_str, PlanOptions, PlanOutput};

fn plan(name: &str) -> PlanOutput {
    let path = format!(
        "{}/tests/scenarios/plan/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    plan_str(&text, &PlanOptions::default()).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn events<'a>(out: &'a PlanOutput, kind: EventType, wl: &str) -> Vec<&'a Event> {
    out.events
        .iter()
        .filter(|e| e.kind == kind && e.workload == wl)
        .collect()
}

fn admitted_at(out: &PlanOutput, wl: &str) -> Vec<f64> {
    events(out, EventType::Admitted, wl)
        .iter()
        .map(|e| e.time)
        .collect()
}

fn preempted(out: &PlanOutput) -> Vec<(&str, &str, &str)> {
    out.events
        .iter()
        .filter(|e| e.kind == EventType::Preempted)
        .map(|e| {
            (
                e.workload.as_str(),
                e.by.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
            )
        })
        .collect()
}

fn final_admitted(out: &PlanOutput) -> Vec<&str> {
    out.final_state
        .admitted
        .iter()
        .map(|a| a.workload.as_str())
        .collect()
}

fn final_reason<'a>(out: &'a PlanOutput, wl: &str) -> Option<&'a str> {
    out.final_state
        .pending
        .iter()
        .find(|p| p.workload == wl)
        .map(|p| p.reason.as_str())
}

#[test]
fn borrowing_limit_caps_what_a_queue_takes_from_the_cohort() {
    let out = plan("borrowing");
    assert_eq!(admitted_at(&out, "team-a/train-1"), vec![0.0]);
    let second = events(&out, EventType::Admitted, "team-a/train-2");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].borrowing, Some(true), "the 10th GPU is borrowed");
    // 9 nominal + 1 borrowingLimit = 10, although team-b's 12 GPUs are idle.
    assert_eq!(
        final_reason(&out, "team-a/train-3"),
        Some("WaitingForQuota")
    );
    let pending = &out.final_state.pending[0];
    assert_eq!(pending.position, Some(1));
}

#[test]
fn lending_limit_reserves_the_rest_of_the_lenders_quota() {
    let out = plan("lending");
    assert!(
        final_admitted(&out).contains(&"team-a/a-big"),
        "9 + 1 lent = 10"
    );
    assert_eq!(final_reason(&out, "team-a/a-more"), Some("WaitingForQuota"));
    assert!(
        final_admitted(&out).contains(&"team-b/b-own"),
        "team-b keeps its 11 guaranteed GPUs while team-a borrows the lent one"
    );
}

#[test]
fn a_queue_reclaims_its_nominal_quota_from_the_most_recent_borrower() {
    let out = plan("reclaim");
    assert_eq!(
        preempted(&out),
        vec![("team-a/a-3", "team-b/b-1", "InCohortReclamation")],
        "one victim is enough, the most recently admitted borrower"
    );
    assert_eq!(admitted_at(&out, "team-b/b-1"), vec![600.0]);
    assert!(final_admitted(&out).contains(&"team-a/a-2"));
}

#[test]
fn same_priority_reclaim_needs_any() {
    let out = plan("reclaim-same-priority");
    let victims = preempted(&out);
    assert_eq!(
        victims,
        vec![("ml/y-borrow", "ml/y-own", "InCohortReclamation")]
    );
    assert_eq!(final_reason(&out, "ml/x-own"), Some("WaitingForQuota"));
    assert!(final_admitted(&out).contains(&"ml/x-borrow"));
}

#[test]
fn lower_or_newer_equal_priority_preempts_a_newer_workload_of_the_same_priority() {
    let out = plan("newer-equal-priority");
    // `a` is older than `old`: never a candidate. `b` is newer: a candidate only under
    // LowerOrNewerEqualPriority.
    assert_eq!(
        preempted(&out),
        vec![("ml/newer-b", "ml/newer-old", "InClusterQueue")]
    );
    assert_eq!(admitted_at(&out, "ml/newer-old"), vec![60.0]);
    assert_eq!(
        admitted_at(&out, "ml/lower-old"),
        vec![320.0],
        "after b's 5 minutes"
    );
    assert_eq!(admitted_at(&out, "ml/lower-b"), vec![20.0]);
}

#[test]
fn preemption_takes_the_minimal_victim_set() {
    let out = plan("minimal-victims");
    // c (most recent) is tried first but is given back: b alone makes room.
    assert_eq!(
        preempted(&out),
        vec![("ml/b", "ml/urgent", "InClusterQueue")]
    );
    let fin = final_admitted(&out);
    assert!(fin.contains(&"ml/a") && fin.contains(&"ml/c") && fin.contains(&"ml/urgent"));
}

#[test]
fn flavor_fungibility_borrow_vs_try_next_flavor() {
    let out = plan("fungibility");
    let flavor = |wl: &str| {
        let e = events(&out, EventType::Admitted, wl);
        e.first()
            .and_then(|e| e.flavors.as_ref())
            .map(|f| f["main"]["nvidia.com/gpu"].clone())
    };
    assert_eq!(flavor("ml/borrow-default").as_deref(), Some("spot"));
    assert_eq!(
        events(&out, EventType::Admitted, "ml/borrow-default")[0].borrowing,
        Some(true)
    );
    assert_eq!(flavor("ml/borrow-try-next").as_deref(), Some("on-demand"));
    // whenCanPreempt: Preempt stops at the first flavor and preempts there ...
    assert_eq!(flavor("ml/high-p").as_deref(), Some("spot"));
    assert!(preempted(&out).contains(&("ml/low-p", "ml/high-p", "InClusterQueue")));
    // ... TryNextFlavor (default) finds room in the next flavor without preempting.
    assert_eq!(flavor("ml/high-n").as_deref(), Some("on-demand"));
    assert!(!preempted(&out).iter().any(|(v, _, _)| *v == "ml/low-n"));
}

#[test]
fn partial_admission_runs_with_what_fits_down_to_min_count() {
    let out = plan("partial-admission");
    let e = events(&out, EventType::Admitted, "ml/elastic");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].pod_counts.as_ref().map(|c| c["main"]), Some(6));
    assert_eq!(final_reason(&out, "ml/rigid"), Some("ExceedsMaxQuota"));
}

#[test]
fn a_pod_group_with_a_min_count_runs_with_the_pods_that_fit() {
    let out = plan("pod-group-partial-admission");
    let counts = |wl: &str| {
        let e = events(&out, EventType::Admitted, wl);
        assert_eq!(e.len(), 1, "{wl}");
        e[0].pod_counts.as_ref().map(|c| c["role-0"])
    };
    assert_eq!(counts("ml/whole"), None, "fits whole: not partial");
    assert_eq!(counts("ml/elastic"), Some(2));
    assert_eq!(final_reason(&out, "ml/late"), Some("WaitingForQuota"));
}

#[test]
fn pods_ready_timeout_requeues_with_exponential_backoff_then_deactivates() {
    let out = plan("backoff");
    assert_eq!(admitted_at(&out, "ml/stuck"), vec![0.0, 95.0, 175.0]);
    let evicted: Vec<f64> = events(&out, EventType::Evicted, "ml/stuck")
        .iter()
        .map(|e| e.time)
        .collect();
    assert_eq!(evicted, vec![60.0, 155.0, 235.0]);
    let backoff: Vec<&str> = events(&out, EventType::Pending, "ml/stuck")
        .iter()
        .filter_map(|e| e.reason.as_deref())
        .collect();
    assert_eq!(
        backoff,
        vec!["Backoff", "WaitingForQuota", "Backoff", "Deactivated"],
        "10s then 20s of backoff; the third timeout exceeds backoffLimitCount 2"
    );
    // The healthy job used the quota while the stuck one backed off.
    assert_eq!(admitted_at(&out, "ml/healthy"), vec![60.0]);
    assert_eq!(
        events(&out, EventType::Finished, "ml/healthy")[0].time,
        95.0
    );
    assert_eq!(final_reason(&out, "ml/stuck"), Some("Deactivated"));
}

#[test]
fn strict_fifo_blocks_behind_the_head_best_effort_does_not() {
    let out = plan("strict-fifo");
    assert_eq!(admitted_at(&out, "ml/b-small"), vec![120.0]);
    assert!(admitted_at(&out, "ml/s-small").is_empty());
    assert_eq!(admitted_at(&out, "ml/s-big"), vec![600.0]);
}

#[test]
fn checkpoint_aware_preemption_loses_the_least_work() {
    let out = plan("checkpoint-aware");
    assert_eq!(
        preempted(&out),
        vec![("ml/ckpt", "ml/urgent", "InClusterQueue")]
    );
    let e = events(&out, EventType::Preempted, "ml/ckpt");
    assert_eq!(
        e[0].expected_rework,
        Some(300.0),
        "25m since admission, checkpoint every 10m"
    );
}

#[test]
fn minimum_runtime_gates_preemption_until_it_elapses() {
    let out = plan("minimum-runtime");
    let pending = events(&out, EventType::Pending, "ml/urgent");
    assert_eq!(pending[0].reason.as_deref(), Some("MinimumRuntime"));
    assert!(pending[0].message.as_deref().unwrap_or("").contains("10m"));
    assert_eq!(admitted_at(&out, "ml/urgent"), vec![600.0]);
    assert_eq!(events(&out, EventType::Preempted, "ml/low")[0].time, 600.0);
}

#[test]
fn every_pending_workload_has_a_precise_reason() {
    let out = plan("pending-reasons");
    let want = [
        ("research/untolerated", "NoMatchingFlavor"),
        ("research/wrong-model", "NoMatchingFlavor"),
        ("research/uncovered", "NoMatchingFlavor"),
        ("research/too-big", "ExceedsMaxQuota"),
        ("research/waits-1", "WaitingForQuota"),
        ("research/waits-2", "WaitingForQuota"),
        ("research/no-queue", "LocalQueueNotFound"),
        ("intruders/intruder", "NamespaceNotAllowed"),
        ("research/held", "ClusterQueueStopped"),
    ];
    for (wl, reason) in want {
        assert_eq!(final_reason(&out, wl), Some(reason), "{wl}");
    }
    let pos = |wl: &str| {
        out.final_state
            .pending
            .iter()
            .find(|p| p.workload == wl)
            .and_then(|p| p.position)
    };
    let (p1, p2) = (pos("research/waits-1"), pos("research/waits-2"));
    assert!(p1.is_some() && p2 == p1.map(|p| p + 1), "{p1:?} {p2:?}");
    assert_eq!(final_admitted(&out), vec!["research/fits"]);
}

#[test]
fn serving_scale_down_returns_quota_to_training() {
    let out = plan("serving-scale-down");
    let finished: Vec<&str> = out
        .events
        .iter()
        .filter(|e| e.kind == EventType::Finished)
        .map(|e| e.workload.as_str())
        .collect();
    assert_eq!(finished, vec!["llm/chat-3", "llm/chat-2"]);
    let e = events(&out, EventType::Admitted, "llm/finetune");
    assert_eq!((e[0].time, e[0].borrowing), (1800.0, Some(true)));
}

#[test]
fn preemptor_waits_for_victims_grace_period() {
    let out = plan("grace-period");
    let pending = events(&out, EventType::Pending, "ml/urgent");
    assert_eq!(
        pending[0].reason.as_deref(),
        Some("WaitingForPreemptedWorkloads")
    );
    assert_eq!(admitted_at(&out, "ml/urgent"), vec![180.0]);
}

/// Kueue's "Sequential Admission with Ready Pods": with `blockAdmission`, job2 (which fits
/// once quick is done at 1 s) waits for job1's pods to be ready (8 s), and late waits for
/// the never-ready stuck job until its 1m timeout evicts it. Without it both start as
/// soon as they fit.
#[test]
fn block_admission_admits_one_workload_at_a_time_until_pods_are_ready() {
    let path = format!(
        "{}/tests/scenarios/plan/block-admission.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let unblocked = text.replace("blockAdmission: true", "blockAdmission: false");
    assert_ne!(text, unblocked);
    let table = [
        // (file, job2 admitted at, late admitted at)
        (text.as_str(), 8.0, 80.0),
        (unblocked.as_str(), 1.0, 21.0),
    ];
    for (file, job2, late) in table {
        let out = plan_str(file, &PlanOptions::default()).unwrap();
        assert_eq!(admitted_at(&out, "ml/quick"), vec![0.0]);
        assert_eq!(admitted_at(&out, "ml/job1"), vec![0.0]);
        assert_eq!(admitted_at(&out, "ml/job2"), vec![job2], "job2");
        assert_eq!(admitted_at(&out, "ml/stuck"), vec![20.0]);
        assert_eq!(admitted_at(&out, "ml/late"), vec![late], "late");
        assert_eq!(final_reason(&out, "ml/stuck"), Some("Deactivated"));
        let waited = events(&out, EventType::Pending, "ml/job2")
            .iter()
            .any(|e| e.reason.as_deref() == Some("WaitingForPodsReady"));
        assert_eq!(waited, job2 == 8.0, "job2's pending reason");
    }
}

/// Reclaim with grace periods: the 2 GPUs `fast` frees at 1m10s stay with the waiting
/// preemptor `mine`; `fast` waits for quota instead of borrowing them back, `mine` runs
/// when `slow` is gone at 2m, and both victims return when it finishes at 7m.
#[test]
fn quota_freed_by_victims_is_held_for_the_waiting_preemptor() {
    let out = plan("reclaim-grace-reserved");
    let mut victims: Vec<(&str, &str, &str)> = preempted(&out);
    victims.sort();
    assert_eq!(
        victims,
        vec![
            ("ml/fast", "ml/mine", "InCohortReclamation"),
            ("ml/slow", "ml/mine", "InCohortReclamation"),
        ]
    );
    assert_eq!(admitted_at(&out, "ml/mine"), vec![120.0]);
    assert_eq!(admitted_at(&out, "ml/fast"), vec![0.0, 420.0]);
    assert_eq!(admitted_at(&out, "ml/slow"), vec![0.0, 420.0]);
    let fast_waits: Vec<(f64, &str)> = events(&out, EventType::Pending, "ml/fast")
        .iter()
        .map(|e| (e.time, e.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(fast_waits, vec![(70.0, "WaitingForQuota")]);
}

/// A higher-priority job arriving in the queue of a waiting preemptor goes first (Kueue's
/// queue order): `urgent` takes the 2 GPUs held for `mine` and waits for `slow`, runs at
/// 2m; `mine` runs after it at 3m. `fast` does not borrow the held GPUs back meanwhile.
#[test]
fn a_higher_priority_job_takes_over_a_waiting_preemptors_reservation() {
    let out = plan("reservation-overtaken");
    let waits: Vec<(f64, &str)> = events(&out, EventType::Pending, "ml/urgent")
        .iter()
        .map(|e| (e.time, e.reason.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(waits, vec![(80.0, "WaitingForPreemptedWorkloads")]);
    assert_eq!(admitted_at(&out, "ml/urgent"), vec![120.0]);
    assert_eq!(admitted_at(&out, "ml/mine"), vec![180.0]);
    assert_eq!(admitted_at(&out, "ml/fast"), vec![0.0, 480.0]);
    assert_eq!(admitted_at(&out, "ml/slow"), vec![0.0, 480.0]);
    let victims: Vec<&str> = preempted(&out).iter().map(|v| v.0).collect();
    assert_eq!(
        victims.len(),
        2,
        "no victim is preempted twice: {victims:?}"
    );
}
