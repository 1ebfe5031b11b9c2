//! Passes that assume their admissions (`PassState::assuming_admissions`, what `tessera
//! controller` runs): a pass whose plan only admits (or records readiness) and tells
//! reasons returns before its writes land; the passes after it hold those workloads
//! admitted until the writes are answered — no second admission, no quota handed out
//! twice — and one whose write failed is admitted again; a pass that must decide from scratch, sees an object of an
//! admission under way change, or evicts, waits for the writes under way first; with
//! `blockAdmission` the passes after an assumed admission hold every queue. A readiness
//! record (`waitForPodsReady`) and a pods-ready timeout's eviction go behind their pass
//! the same way, and are written once.

use super::cache::cached;
use super::pods_ready::make_ready;
use super::{cfg, cluster, condition, create_pod, pod, ungated_pods, NOW, PODS};
use crate::support::apiserver::ApiServer;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::controller::cache::Cache;
use tessera::controller::decide::{Action, Plan};
use tessera::controller::reconciler::{self, Config, PassState};
use tessera::controller::time::rfc3339;
use tessera::quota::WaitForPodsReady;
use tokio::sync::Notify;

/// How late the double answers while admissions are in flight: far longer than a pass.
const SLOW: Duration = Duration::from_millis(400);

fn admitted(actions: &[Action]) -> BTreeSet<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Admit { workload, .. } => Some(workload.clone()),
            _ => None,
        })
        .collect()
}

/// The workloads whose readiness `plan` records, in its order.
fn recorded(plan: &Plan) -> Vec<String> {
    workloads_of(plan, |a| match a {
        Action::PodsReady { workload, .. } => Some(workload),
        _ => None,
    })
}

/// The workloads `plan` evicts, in its order.
fn evicted(plan: &Plan) -> Vec<String> {
    workloads_of(plan, |a| match a {
        Action::Evict { workload, .. } => Some(workload),
        _ => None,
    })
}

fn workloads_of(plan: &Plan, pick: impl Fn(&Action) -> Option<&String>) -> Vec<String> {
    plan.actions.iter().filter_map(pick).cloned().collect()
}

/// Waits until the cache's copy of pod `name` satisfies `f`.
async fn cached_as(cache: &Cache, name: &str, f: impl Fn(&serde_json::Value) -> bool) {
    let key = ("team".to_string(), name.to_string());
    super::wait_for(&format!("{name} in the cache"), || {
        cache.pods[0].get(&key).is_some_and(|p| f(&p))
    })
    .await;
}

/// One pass at `now`; its plan.
async fn pass(s: &ApiServer, c: &Config, state: &mut PassState, now: u64) -> Plan {
    reconciler::pass_with(&s.client(), c, state, now)
        .await
        .unwrap()
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Three 2-GPU pods (`low-1` … `low-3`) wait in the 4-GPU ClusterQueue; passes assume.
async fn three_waiting() -> (ApiServer, PassState, Arc<Cache>, Arc<Notify>) {
    waiting_with(&cfg("a"), &["low-1", "low-2", "low-3"]).await
}

/// 2-GPU pods `names` wait in the 4-GPU ClusterQueue; passes configured `c` assume.
async fn waiting_with(
    c: &Config,
    names: &[&str],
) -> (ApiServer, PassState, Arc<Cache>, Arc<Notify>) {
    let s = cluster().await;
    for name in names {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    let (state, cache, _stop) = cached(&s, c).await;
    let wake = Arc::new(Notify::new());
    (s, state.assuming_admissions(wake.clone()), cache, wake)
}

#[tokio::test]
async fn a_pass_returns_before_its_admissions_land_and_the_next_admits_nothing_twice() {
    let (s, mut state, cache, _wake) = three_waiting().await;
    let c = cfg("a");
    s.delay_requests(SLOW);

    let started = Instant::now();
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert!(
        started.elapsed() < SLOW,
        "the pass returned before its writes: {:?}",
        started.elapsed()
    );
    let first = admitted(&plan.actions);
    assert_eq!(first.len(), 2, "{:?}", plan.actions);
    assert!(ungated_pods(&s).is_empty(), "nothing written yet");

    // A pod arrives while those writes are under way: the quota is held by the two
    // assumed admissions, so it waits (its reason is written behind this pass too).
    create_pod(&s, "late", 2, "low", json!({}), None);
    cached_as(&cache, "late", |_| true).await;
    let started = Instant::now();
    let next = pass(&s, &c, &mut state, NOW + 1).await;
    assert!(started.elapsed() < SLOW, "it does not wait either");
    assert!(
        next.actions
            .iter()
            .all(|a| matches!(a, Action::Pending { .. })),
        "nothing admitted twice, nothing evicted: {:?}",
        next.actions
    );
    assert!(ungated_pods(&s).is_empty(), "still nothing written");

    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
    assert_eq!(condition(&pod(&s, "low-3")).0, "WaitingForQuota");
    let quiet = pass(&s, &c, &mut state, NOW + 2).await;
    assert!(
        admitted(&quiet.actions).is_empty(),
        "the landed admissions are read back as running: {:?}",
        quiet.actions
    );
    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
    let record = s
        .object(
            "/apis/tessera.io/v1alpha1/namespaces/team/workloads",
            "pod-low-1",
        )
        .expect("low-1's record");
    assert_eq!(record["status"]["admission"]["clusterQueue"], "cq");
}

#[tokio::test]
async fn an_assumed_admission_whose_write_failed_is_admitted_again() {
    let (s, mut state, _cache, wake) = three_waiting().await;
    let c = cfg("a");
    s.fail_requests(&["PUT"], PODS);

    let plan = pass(&s, &c, &mut state, NOW).await;
    let first = admitted(&plan.actions);
    assert_eq!(first.len(), 2, "{:?}", plan.actions);
    state.records_written().await;
    assert!(ungated_pods(&s).is_empty(), "every ungate refused");
    tokio::time::timeout(Duration::from_secs(5), wake.notified())
        .await
        .expect("a failed write wakes the controller's loop");

    s.stop_failing();
    let again = pass(&s, &c, &mut state, NOW + 1).await;
    assert_eq!(
        admitted(&again.actions),
        first,
        "the same two admitted again, not the third"
    );
    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
}

#[tokio::test]
async fn a_pass_from_scratch_waits_for_the_admissions_under_way() {
    let (s, mut state, _cache, _wake) = three_waiting().await;
    let c = cfg("a");
    s.delay_requests(SLOW);
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert_eq!(admitted(&plan.actions).len(), 2, "{:?}", plan.actions);

    // Time going back makes the kept engine give up: the pass from scratch reads the
    // objects only once the admissions landed, so it admits nothing again.
    let started = Instant::now();
    let scratch = pass(&s, &c, &mut state, NOW - 1).await;
    assert!(started.elapsed() >= SLOW / 2, "it waited for the writes");
    assert!(
        admitted(&scratch.actions).is_empty(),
        "{:?}",
        scratch.actions
    );
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
    assert_eq!(state.incremental_stats().map(|s| s.full), Some(2));
}

#[tokio::test]
async fn an_eviction_is_written_after_the_admissions_under_way() {
    let (s, mut state, cache, _wake) = three_waiting().await;
    let c = cfg("a");
    s.delay_requests(SLOW);
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert_eq!(admitted(&plan.actions).len(), 2, "{:?}", plan.actions);

    // A high-priority pod arrives while they are written: it preempts one of the two
    // assumed admissions, and the eviction follows their writes.
    create_pod(&s, "urgent", 2, "high", json!({}), None);
    cached_as(&cache, "urgent", |_| true).await;
    let preempt = pass(&s, &c, &mut state, NOW + 1).await;
    assert!(
        preempt
            .actions
            .iter()
            .any(|a| matches!(a, Action::Evict { .. })),
        "{:?}",
        preempt.actions
    );
    assert!(
        admitted(&preempt.actions).is_empty(),
        "{:?}",
        preempt.actions
    );
    let evicted = s.evictions();
    assert_eq!(evicted.len(), 1, "written before the pass returned");
    let victim = evicted[0]["metadata"]["name"].as_str().unwrap_or_default();
    assert!(
        ["low-1", "low-2"].contains(&victim),
        "one of the assumed admissions: {victim}"
    );
    assert_eq!(
        ungated_pods(&s),
        names(&["low-1", "low-2"]),
        "ungated before the eviction"
    );
}

#[tokio::test]
async fn another_clients_change_to_an_admission_under_way_waits_for_it() {
    let (s, mut state, cache, _wake) = three_waiting().await;
    let c = cfg("a");
    s.delay_requests(SLOW);
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert_eq!(admitted(&plan.actions).len(), 2, "{:?}", plan.actions);

    // low-1 is relabelled, still gated: read now it would look like a waiting workload.
    let mut low = pod(&s, "low-1");
    low["metadata"]["labels"]["team"] = json!("vision");
    s.put_object(PODS, low);
    cached_as(&cache, "low-1", |p| {
        p["metadata"]["labels"]["team"] == "vision"
    })
    .await;
    let next = pass(&s, &c, &mut state, NOW + 1).await;
    assert!(
        admitted(&next.actions).is_empty(),
        "decided from the objects as written: {:?}",
        next.actions
    );
    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
    assert_eq!(state.incremental_stats().map(|s| s.full), Some(2));
}

/// [`cfg`] with `waitForPodsReady` and `blockAdmission`.
fn block_cfg() -> Config {
    Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            block_admission: true,
            ..WaitForPodsReady::default()
        }),
        ..cfg("a")
    }
}

#[tokio::test]
async fn with_block_admission_an_assumed_admission_holds_every_queue() {
    let c = block_cfg();
    let (s, mut state, _cache, _wake) = waiting_with(&c, &["low-1", "low-2"]).await;
    s.delay_requests(SLOW);
    let started = Instant::now();
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
    assert_eq!(
        admitted(&plan.actions),
        names(&["team/pod-low-1"]),
        "{:?}",
        plan.actions
    );
    let next = pass(&s, &c, &mut state, NOW + 1).await;
    assert!(
        admitted(&next.actions).is_empty(),
        "held while low-1's pods start: {:?}",
        next.actions
    );
    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1"]));
    assert_eq!(condition(&pod(&s, "low-2")).0, "WaitingForPodsReady");
}

/// The pass that ends a `blockAdmission` hold records the Ready workload's readiness and
/// admits the next one, all behind it; the pass after it, while those writes are under
/// way, neither records the readiness again nor admits anything.
#[tokio::test]
async fn a_readiness_record_written_behind_its_pass_is_written_once() {
    let c = block_cfg();
    let (s, mut state, cache, _wake) = waiting_with(&c, &["low-1", "low-2"]).await;
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert_eq!(admitted(&plan.actions), names(&["team/pod-low-1"]));
    state.records_written().await;
    make_ready(&s, "low-1");
    cached_as(&cache, "low-1", |p| p["status"]["phase"] == "Running").await;

    s.delay_requests(SLOW);
    let started = Instant::now();
    let end = pass(&s, &c, &mut state, NOW + 1).await;
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
    assert_eq!(recorded(&end), ["team/pod-low-1"], "{:?}", end.actions);
    assert_eq!(admitted(&end.actions), names(&["team/pod-low-2"]));
    let ready_at = |s: &ApiServer| {
        pod(s, "low-1")["metadata"]["annotations"]["tessera.io/pods-ready-at"].clone()
    };
    assert!(ready_at(&s).is_null(), "not written yet");

    let next = pass(&s, &c, &mut state, NOW + 2).await;
    assert!(recorded(&next).is_empty(), "{:?}", next.actions);
    assert!(admitted(&next.actions).is_empty(), "{:?}", next.actions);
    state.records_written().await;
    assert_eq!(ungated_pods(&s), names(&["low-1", "low-2"]));
    assert_eq!(
        ready_at(&s),
        json!(rfc3339(NOW + 1)),
        "written once, by its pass"
    );
    s.delay_requests(Duration::ZERO);
    let after = pass(&s, &c, &mut state, NOW + 3).await;
    assert!(
        recorded(&after).is_empty(),
        "read back: {:?}",
        after.actions
    );
    assert_eq!(state.incremental_stats().map(|s| s.full), Some(1));
}

/// A pods-ready timeout goes behind its pass too: the pass returns before the eviction
/// and its requeue state are written, and the pass after it, while they are, does not
/// evict again. The pod is evicted once, with its requeue recorded first, and nothing
/// is decided from scratch.
#[tokio::test]
async fn a_pods_ready_eviction_written_behind_its_pass_is_written_once() {
    let c = Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            ..WaitForPodsReady::default()
        }),
        ..cfg("a")
    };
    let (s, mut state, cache, _wake) = waiting_with(&c, &["low-1"]).await;
    let plan = pass(&s, &c, &mut state, NOW).await;
    assert_eq!(admitted(&plan.actions), names(&["team/pod-low-1"]));
    state.records_written().await;
    cached_as(&cache, "low-1", |p| !super::gated(p)).await;

    s.delay_requests(SLOW);
    let started = Instant::now();
    let timeout = pass(&s, &c, &mut state, NOW + 60_001).await;
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
    assert_eq!(
        evicted(&timeout),
        ["team/pod-low-1"],
        "{:?}",
        timeout.actions
    );
    assert!(s.evictions().is_empty(), "not written yet");

    let next = pass(&s, &c, &mut state, NOW + 60_002).await;
    assert!(evicted(&next).is_empty(), "{:?}", next.actions);
    state.records_written().await;
    let evictions = s.evictions();
    assert_eq!(evictions.len(), 1, "evicted once: {evictions:?}");
    assert_eq!(evictions[0]["metadata"]["name"], "low-1");
    let requeue = &pod(&s, "low-1")["metadata"]["annotations"]["tessera.io/requeue-count"];
    assert_eq!(requeue, "1", "recorded before it went");
    assert_eq!(state.incremental_stats().map(|s| s.full), Some(1));
}
