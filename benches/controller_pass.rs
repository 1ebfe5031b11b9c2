//! Controller pass benchmark: the cost of the pass that admits one small pod while N
//! pods wait in a full ClusterQueue, against the API-server double on loopback.
//!
//! Run: `cargo bench --bench controller_pass` (`BENCH_ROUNDS=N` measured passes per
//! point, default 5; `BENCH_SIZES=100,1000` picks the N, default 100 / 1,000 / 5,000 /
//! 50,000; `BENCH_LIST_MAX=N`: the largest N the LIST-based pass is run for, default
//! 5,000). It prints, side by side for the three ways a pass can read and decide:
//! - `list`: the pass LISTs everything it reads (the controller before the cache;
//!   [`PassState::new`]);
//! - `rebuild`: the pass reads the watch-fed stores and decides from scratch
//!   ([`PassState::with_cache_rebuilding`]): the engine rebuilt from every object;
//! - `incr`: the pass reads the stores and decides from the changes since the last
//!   one ([`PassState::with_cache`], what `tessera controller` runs);
//!
//! the pass time (p50 over the rounds), the LIST requests the double served during the
//! pass, the time of an idle pass (nothing changed), for the cached passes the time
//! from the pod's creation until the cache holds it (watch delivery, not part of the
//! pass), and the ratios rebuild / incr and list / incr. `full` counts the incremental
//! decider's passes from scratch over the whole run (the first pass of each run is one).
//!
//! Shape: ClusterQueue `full` (4 GPUs) is used up by one admitted 4-GPU pod; N pods of
//! 1 GPU wait in it (their pending reasons already recorded, so they cause no writes);
//! ClusterQueue `free` (1,000 GPUs) takes the small 1-GPU pods, one per round.
//!
//! For the incremental idle pass it also prints (medians) the thread's wait on a run
//! queue during the pass (`/proc/thread-self/schedstat`, Linux; `-` elsewhere), its
//! involuntary context switches (`preempt`) and minor page faults: an idle pass whose
//! wall time is mostly run-queue wait was descheduled, not working.
//!
//! A second table times the passes that used to decide from scratch and now go on from
//! the kept engine, rebuild vs incr side by side: `resize` (a waiting pod's request
//! changed: it queues again) and `retry` (the pass after an admission whose write failed:
//! the workload queues again and is admitted again), and two passes of a preemption in
//! ClusterQueue `small` (2 GPUs, its own scope), where a high-priority pod evicts the
//! low-priority one: `terminating` (a pod arrives in `free` while the victim's pod
//! terminates) and `gone` (the victim's pod is deleted: the preemptor is admitted), after
//! `preempt` (the pass that evicts it); and `serving`, the pass admitting the second
//! replica of a Deployment scaled 1 -> 2 in `free`; and, with `waitForPodsReady` (a run
//! of its own), `timeout` (a pod admitted in `free` and never Ready is evicted after
//! its 60 s, its requeue state written to the ConfigMap) and `backoff end` (deleted and
//! created again, it waited out its backoff and is admitted again); with `blockAdmission`,
//! `block admit` (a pod arriving in `free` is admitted: every queue is held until its
//! pod is Ready), `held` (a pod arrives while it is not: it waits) and `block end` (its
//! pod became Ready: the hold ends and the waiting pod is admitted, holding every queue
//! again; before, both admitting passes decided from scratch); and `head`: the 4-GPU pod of the full queue is gone, so the pass admits the
//! head of the queue of N and every waiting pod moves up (its writes are printed too:
//! places past the first 10 are ranges, so a few reasons are rewritten, not N); and
//! `quota`: an operator raises ClusterQueue `full`'s quota from 4 to 6 GPUs, so the pass
//! reads the changed queue object and admits the next two (before, any queue-object
//! change decided from scratch); and `claim`: a ResourceClaim no pod names is created
//! in the queued namespace (before, any DRA claim change there decided from scratch);
//! `hold` and `hold end`: the autoscaler records a hold on Deployment `web` (one
//! replica's GPU in `free`, a coupled scale-down), then the hold ends (before, both
//! decided from scratch); `cohort`: an operator moves ClusterQueues `small` and `free`
//! into cohort `pool` (their scopes are re-decided), and `cohort full`: then `full`,
//! the queue of N, too (its N waiting workloads re-decided; both decided from scratch
//! before); `new team`: namespace `vision`, whose pod waits for a LocalQueue
//! (`LocalQueueNotFound`), gets its first, to its own 1-GPU ClusterQueue (the 2-GPU pod
//! waits there, `ExceedsMaxQuota`), and `team gone`: that LocalQueue deleted under a
//! 1-GPU pod admitted there meanwhile (it stays booked in `vision`, where its record
//! says it was admitted), the 2-GPU pod waiting for one again (both decided from
//! scratch before; `team gone` had no running pod until 12-08).
//! The cached passes assume their admissions, as `tessera controller` runs them
//! (`PassState::assuming_admissions`): a pass whose plan only admits, records readiness
//! (`block end`) and tells reasons returns before any of its writes, which a task makes
//! behind it (`admitting+written`
//! times the admitting pass until they landed); the others return before the record
//! writes they defer (the places that moved, `deferred_records`). Every case is timed until it returns, and each pass's deferred
//! writes land, and the watch echoes of its writes are read, before the next pass
//! starts, outside the time (in the controller the feeders run on other threads). `head+places` and
//! `quota+places` time those two passes until their deferred writes landed too.
//! `BENCH_MODES=incr` (or
//! `rebuild,incr`, `list`) runs only the modes named. `BENCH_API_DELAY_US=N` answers
//! every request but a WATCH N µs late after the warm-up (a round trip to an API server
//! across a network: the cost of a pass's writes in waiting, not in work).
//! `BENCH_SHOW_WRITES=1` prints the write requests of the `head` and `block end` passes.
//! `BENCH_API_THREAD=1` runs the double on a thread of its own (as a real API server is
//! another process); by default it shares the one-thread runtime of the pass.
//!
//! `cargo test --all-targets` runs it once with N = 50 and one round, as a smoke test.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[path = "support/stats.rs"]
mod stats;

use apiserver::ApiServer;
use serde_json::{json, Value};
use stats::stats;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::controller::cache::Cache;
use tessera::controller::reconciler::{pass_with, Config, PassState};
use tessera::quota::WaitForPodsReady;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const PODS: &str = "/api/v1/namespaces/team/pods";
const WORKLOADS: &str = "/apis/tessera.io/v1alpha1/namespaces/team/workloads";
const GATE: &str = "tessera.io/admission";
/// Pods are created at 12:00, passes run from 12:01.
const NOW: u64 = 1_795_003_260_000;

fn cfg() -> Config {
    Config {
        identity: "bench".into(),
        resync: Duration::from_secs(3600),
        ..Config::default()
    }
}

fn queue(name: &str, gpus: u64) -> Value {
    json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue", "metadata": {"name": name},
           "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                    "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                        "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}})
}

/// A ClusterQueue whose higher-priority workloads preempt lower-priority ones.
fn preempting_queue(name: &str, gpus: u64) -> Value {
    let mut q = queue(name, gpus);
    q["spec"]["preemption"] = json!({"withinClusterQueue": "LowerPriority"});
    q
}

fn gated_pod(name: &str, local_queue: &str, gpus: u64, created: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": created,
                     "labels": {"tessera.io/queue-name": local_queue}},
        "spec": {"schedulingGates": [{"name": GATE}],
                 "containers": [{"name": "train", "image": "trainer",
                                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
}

async fn cluster(pending: usize) -> ApiServer {
    let s = api_server().await;
    s.list_across_namespaces();
    s.put_object(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "labels": {}}}),
    );
    let g = "/apis/tessera.io/v1alpha1";
    s.put_object(
        &format!("{g}/resourceflavors"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ResourceFlavor",
               "metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}}),
    );
    s.put_object(&format!("{g}/clusterqueues"), queue("full", 4));
    s.put_object(&format!("{g}/clusterqueues"), queue("free", 1000));
    s.put_object(&format!("{g}/clusterqueues"), preempting_queue("small", 2));
    s.put_object(
        &format!("{g}/workloadpriorityclasses"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "WorkloadPriorityClass",
               "metadata": {"name": "high"}, "value": 1000}),
    );
    for (lq, cq) in [
        ("lq-full", "full"),
        ("lq-free", "free"),
        ("lq-small", "small"),
    ] {
        s.put_object(
            &format!("{g}/namespaces/team/localqueues"),
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
                   "metadata": {"name": lq, "namespace": "team"}, "spec": {"clusterQueue": cq}}),
        );
    }
    s.put_object(PODS, gated_pod("big", "lq-full", 4, "2026-11-18T11:00:00Z"));
    for i in 0..pending {
        s.put_object(
            PODS,
            gated_pod(
                &format!("wait-{i:05}"),
                "lq-full",
                1,
                "2026-11-18T12:00:00Z",
            ),
        );
    }
    s
}

/// Creates pod `pod` (namespace `team`) and waits until the cache holds it.
async fn create_seen(s: &ApiServer, cache: &Cache, pod: Value) {
    let key = (
        "team".to_string(),
        pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    s.put_object(PODS, pod);
    wait_until("the new pod in the cache", || {
        cache.pods[0].get(&key).is_some()
    })
    .await;
}

/// Deployment `web` (ReplicaSet `web-1`, queue `lq-free`) at `replicas`, with replica
/// pod `pod` created gated, as the webhook leaves it.
fn scale_web(s: &ApiServer, replicas: u64, pod: &str) {
    s.put_object(
        "/apis/apps/v1/namespaces/team/deployments",
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "team", "uid": "uid-web"},
               "spec": {"replicas": replicas}}),
    );
    s.put_object(
        "/apis/apps/v1/namespaces/team/replicasets",
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"name": "web-1", "namespace": "team", "uid": "uid-rs",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                "name": "web", "uid": "uid-web", "controller": true}]},
               "spec": {"replicas": replicas}}),
    );
    let mut p = gated_pod(pod, "lq-free", 1, "2026-11-18T12:30:00Z");
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "web-1", "uid": "uid-rs", "controller": true}]);
    s.put_object(PODS, p);
}

/// Whether pod `name` still carries the admission gate. It reads that one pod: a copy of
/// all N pods, freed right before a timed pass, would leave the allocator tens of
/// thousands of free chunks to sort at the pass's first allocation (measured: it made
/// the `retry` pass 2.8 ms slower).
fn gated(s: &ApiServer, name: &str) -> bool {
    s.object(PODS, name).is_some_and(|p| {
        p["spec"]["schedulingGates"]
            .as_array()
            .is_some_and(|g| g.iter().any(|x| x["name"] == GATE))
    })
}

/// How many of the `wait-*` pods are no longer gated (counted in place, as [`gated`]).
fn admitted_waiting(s: &ApiServer) -> usize {
    s.count(PODS, |p| {
        p["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("wait-"))
            && !p["spec"]["schedulingGates"]
                .as_array()
                .is_some_and(|g| g.iter().any(|x| x["name"] == GATE))
    })
}

/// The calling thread's wait on a run queue (ready, not running) so far, its involuntary
/// context switches and its minor page faults (`None` without `/proc/thread-self`). The
/// wait is accounted each time the thread gets a CPU back, so it is exact across a pass.
fn thread_times() -> Option<(Duration, u64, u64)> {
    let sched = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let wait = sched.split_whitespace().nth(1)?.parse().ok()?;
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let switches = status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, minflt 10.
    let rest = &stat[stat.rfind(')')? + 1..];
    let minflt = rest.split_whitespace().nth(7)?.parse().ok()?;
    Some((Duration::from_nanos(wait), switches, minflt))
}

#[derive(Default)]
struct Point {
    pass: Vec<Duration>,
    idle: Vec<Duration>,
    /// Per idle pass: time waiting for a CPU, involuntary switches, minor page faults.
    idle_wait: Vec<Duration>,
    idle_switches: Vec<u64>,
    idle_faults: Vec<u64>,
    /// Per incremental idle pass: the decision alone (`IncStats::last_decide`).
    idle_decide: Vec<Duration>,
    /// A waiting pod's request changed / the pass after a failed admission write.
    resize: Option<Duration>,
    retry: Option<Duration>,
    /// Passes of a preemption in another scope: the eviction, while the victim
    /// terminates, once it is gone.
    preempt: Option<Duration>,
    terminating: Option<Duration>,
    gone: Option<Duration>,
    /// The pass admitting a Deployment's second replica.
    serving: Option<Duration>,
    /// The pass admitting the head of the full queue once `big` is gone, and the
    /// writes (pod status, Event, queue status, records) it made: in the pass, and
    /// deferred (the places that moved, written after the pass returned).
    head: Option<Duration>,
    head_writes: (usize, usize),
    /// From the start of the `head` pass until its deferred record writes landed.
    head_places: Option<Duration>,
    /// From the start of each admitting pass until its deferred writes landed.
    written: Vec<Duration>,
    /// The pass reading ClusterQueue `full` with its quota raised by 2 GPUs: the next
    /// two of the long queue admitted.
    quota: Option<Duration>,
    /// From the start of the `quota` pass until its deferred record writes landed.
    quota_places: Option<Duration>,
    /// The pass reading a ResourceClaim created in the queued namespace that no pod
    /// names (as one generated from a template for a pod).
    claim: Option<Duration>,
    /// The passes reading a hold recorded on Deployment `web` (a coupled scale-down),
    /// and the one after it ended.
    hold: Option<Duration>,
    hold_end: Option<Duration>,
    /// The pass reading ClusterQueues `small` and `free` moved into cohort `pool`, and
    /// the one reading `full` (the N waiting) moved there too.
    cohort: Option<Duration>,
    cohort_full: Option<Duration>,
    /// The passes reading namespace `vision`'s first LocalQueue created, then deleted.
    new_team: Option<Duration>,
    team_gone: Option<Duration>,
    /// Per case above (by its name), the incremental pass's decision alone
    /// (`IncStats::last_decide`), the rest of the case's time being its writes.
    decide: BTreeMap<&'static str, Duration>,
    delivery: Vec<Duration>,
    lists: u64,
    /// Passes the incremental decider made from scratch / from the changes.
    full: u64,
    incremental: u64,
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// Waits until the cache's watches have delivered every change made so far: the record
/// writes a pass deferred echo back through the watch after their answers came, and a
/// warm-up's tens of thousands of them would otherwise be read during the first timed
/// passes. A marker `Workload` (no workload's: the controller ignores it) put now is
/// the last change; once the cache holds it, the ones before it are in too.
async fn caught_up(s: &ApiServer, cache: &Cache) {
    static MARKERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("caught-up-{n}");
    s.put_object(
        WORKLOADS,
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": name, "namespace": "team"}, "spec": {}}),
    );
    let key = ("team".to_string(), name);
    wait_until("the watch caught up", || cache.records.contains(&key)).await;
}

/// The last pass's deferred record writes landed and their watch echoes read, as a
/// controller whose feeders run on other threads finds them: neither is timed in the
/// next pass.
async fn settle(s: &ApiServer, state: &mut PassState) {
    state.records_written().await;
    if let Some(cache) = state.cache.clone() {
        caught_up(s, &cache).await;
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    List,
    Rebuild,
    Incremental,
}

/// [`cluster`] with `waitForPodsReady` (60 s timeout, 10 s backoff; `block` sets
/// `blockAdmission`), read through a watch-fed cache, after the passes that admit `big`
/// (Ready from the start) and record its readiness. The token stops the feeders.
async fn pods_ready_cluster(
    pending: usize,
    mode: Mode,
    block: bool,
) -> (
    ApiServer,
    kube::Client,
    Config,
    Arc<Cache>,
    PassState,
    CancellationToken,
) {
    let s = cluster(pending).await;
    let mut big = gated_pod("big", "lq-full", 4, "2026-11-18T11:00:00Z");
    big["status"] =
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    s.put_object(PODS, big);
    let client = s.client();
    let c = Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            backoff_limit_count: Some(3),
            requeue_by_eviction_time: true,
            block_admission: block,
        }),
        ..cfg()
    };
    let shutdown = CancellationToken::new();
    let cache = Arc::new(Cache::new());
    cache.spawn_feeders(&client, Arc::new(Notify::new()), &shutdown);
    wait_until("the caches' first LISTs", || cache.synced()).await;
    let mut state = if mode == Mode::Rebuild {
        PassState::with_cache_rebuilding(&c, cache.clone())
    } else {
        PassState::with_cache(&c, cache.clone()).assuming_admissions(Arc::new(Notify::new()))
    };
    let big = ("team".to_string(), "big".to_string());
    pass_with(&client, &c, &mut state, NOW).await.unwrap();
    settle(&s, &mut state).await;
    wait_until("big admitted in the cache", || {
        cache.pods[0]
            .get(&big)
            .is_some_and(|p| p["spec"]["schedulingGates"].is_null())
    })
    .await;
    pass_with(&client, &c, &mut state, NOW + 1).await.unwrap();
    settle(&s, &mut state).await;
    wait_until("big's readiness in the cache", || {
        cache.pods[0]
            .get(&big)
            .is_some_and(|p| p["metadata"]["annotations"]["tessera.io/pods-ready-at"].is_string())
    })
    .await;
    pass_with(&client, &c, &mut state, NOW + 2).await.unwrap();
    settle(&s, &mut state).await;
    (s, client, c, cache, state, shutdown)
}

/// The passes of a `waitForPodsReady` timeout beside N waiting pods: `timeout` (pod
/// `slow`, admitted in `free` and never Ready, is evicted 61 s later: its requeue state
/// goes to the ConfigMap first) and `backoff end` (deleted and created again under its
/// name, it waited out its 10 s backoff and is admitted again). Returns their times and
/// the passes decided from scratch (cached modes only).
async fn measure_pods_ready(pending: usize, mode: Mode) -> (Duration, Duration, u64) {
    let (s, client, c, cache, mut state, shutdown) = pods_ready_cluster(pending, mode, false).await;
    let key = |name: &str| ("team".to_string(), name.to_string());
    // `slow` is admitted and never becomes Ready.
    create_seen(
        &s,
        &cache,
        gated_pod("slow", "lq-free", 1, "2026-11-18T12:30:00Z"),
    )
    .await;
    let admitted = NOW + 10_000;
    pass_with(&client, &c, &mut state, admitted).await.unwrap();
    settle(&s, &mut state).await;
    assert!(!gated(&s, "slow"), "slow admitted");
    wait_until("slow admitted in the cache", || {
        cache.pods[0]
            .get(&key("slow"))
            .is_some_and(|p| p["spec"]["schedulingGates"].is_null())
    })
    .await;
    pass_with(&client, &c, &mut state, admitted + 1)
        .await
        .unwrap();
    settle(&s, &mut state).await;
    let evicted_at = admitted + 61_000;
    let t = Instant::now();
    pass_with(&client, &c, &mut state, evicted_at)
        .await
        .unwrap();
    let timeout = t.elapsed();
    settle(&s, &mut state).await;
    assert_eq!(s.evictions().len(), 1, "slow evicted for its timeout");
    wait_until("slow terminating and its state in the cache", || {
        cache.pods[0]
            .get(&key("slow"))
            .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
            && cache
                .records
                .get(&key("pod-slow"))
                .is_some_and(|r| r["status"]["requeueState"].is_object())
    })
    .await;
    pass_with(&client, &c, &mut state, evicted_at + 1)
        .await
        .unwrap();
    settle(&s, &mut state).await;
    // Deleted, and created again under its name: it waits out its backoff.
    s.delete_object(PODS, "slow");
    s.put_object(
        PODS,
        gated_pod("slow", "lq-free", 1, "2026-11-18T12:30:00Z"),
    );
    wait_until("slow again in the cache", || {
        cache.pods[0]
            .get(&key("slow"))
            .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null())
    })
    .await;
    pass_with(&client, &c, &mut state, evicted_at + 2)
        .await
        .unwrap();
    settle(&s, &mut state).await;
    assert!(gated(&s, "slow"), "slow waits out its backoff");
    tokio::time::sleep(Duration::from_millis(20)).await;
    pass_with(&client, &c, &mut state, evicted_at + 3)
        .await
        .unwrap();
    settle(&s, &mut state).await;
    let t = Instant::now();
    pass_with(&client, &c, &mut state, evicted_at + 10_000)
        .await
        .unwrap();
    let backoff_end = t.elapsed();
    settle(&s, &mut state).await;
    assert!(
        !gated(&s, "slow"),
        "slow admitted again once its backoff ended"
    );
    let full = state.incremental_stats().map_or(0, |st| st.full);
    shutdown.cancel();
    (timeout, backoff_end, full)
}

/// The `blockAdmission` passes, timed.
#[derive(Clone, Copy)]
struct Held {
    /// The pass admitting `slow` (in `free`): every queue is held after it.
    admit: Duration,
    /// The pass while `slow` has not become Ready, when pod `next` arrives in `free`.
    held: Duration,
    /// The pass after `slow` became Ready: the hold ends and `next` is admitted.
    end: Duration,
    /// The passes decided from scratch (cached modes only).
    full: u64,
}

/// With `blockAdmission`: the pass admitting pod `slow`, the pass while it has not become
/// Ready when a pod arrives (it waits: every queue is held), and the pass once it is.
async fn measure_held(pending: usize, mode: Mode) -> Held {
    let (s, client, c, cache, mut state, shutdown) = pods_ready_cluster(pending, mode, true).await;
    let key = |name: &str| ("team".to_string(), name.to_string());
    let admitted = |name: &str| {
        cache.pods[0]
            .get(&key(name))
            .is_some_and(|p| p["spec"]["schedulingGates"].is_null())
    };
    create_seen(
        &s,
        &cache,
        gated_pod("slow", "lq-free", 1, "2026-11-18T12:30:00Z"),
    )
    .await;
    let t = Instant::now();
    pass_with(&client, &c, &mut state, NOW + 3).await.unwrap();
    let admit = t.elapsed();
    settle(&s, &mut state).await;
    assert!(!gated(&s, "slow"), "slow admitted");
    wait_until("slow admitted in the cache", || admitted("slow")).await;
    // Held: `slow`'s pod is not Ready.
    pass_with(&client, &c, &mut state, NOW + 4).await.unwrap();
    settle(&s, &mut state).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    pass_with(&client, &c, &mut state, NOW + 5).await.unwrap();
    settle(&s, &mut state).await;
    create_seen(
        &s,
        &cache,
        gated_pod("next", "lq-free", 1, "2026-11-18T12:30:00Z"),
    )
    .await;
    let t = Instant::now();
    pass_with(&client, &c, &mut state, NOW + 6).await.unwrap();
    let held = t.elapsed();
    settle(&s, &mut state).await;
    assert!(gated(&s, "next"), "held: next waits");
    // `slow` becomes Ready: the hold ends.
    let mut slow = s.object(PODS, "slow").expect("slow");
    slow["status"] =
        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    s.put_object(PODS, slow);
    wait_until("slow Ready in the cache", || {
        cache.pods[0]
            .get(&key("slow"))
            .is_some_and(|p| p["status"]["phase"] == "Running")
    })
    .await;
    let writes = s.writes();
    perf_control("block end", "enable");
    let t = Instant::now();
    pass_with(&client, &c, &mut state, NOW + 7).await.unwrap();
    let end = t.elapsed();
    perf_control("block end", "disable");
    let in_pass = s.writes() - writes;
    settle(&s, &mut state).await;
    if std::env::var_os("BENCH_SHOW_WRITES").is_some() {
        let after = s.writes() - writes - in_pass;
        println!("writes of the `block end` pass: {in_pass} in the pass + {after} deferred");
        show_writes(&s, writes);
    }
    assert!(!gated(&s, "next"), "the hold ended: next admitted");
    let full = state.incremental_stats().map_or(0, |st| st.full);
    shutdown.cancel();
    Held {
        admit,
        held,
        end,
        full,
    }
}

async fn measure(pending: usize, mode: Mode, rounds: usize) -> Point {
    let s = cluster(pending).await;
    let client = s.client();
    let c = cfg();
    let shutdown = CancellationToken::new();
    let mut state = if mode == Mode::List {
        PassState::new(&c)
    } else {
        let cache = Arc::new(Cache::new());
        cache.spawn_feeders(&client, Arc::new(Notify::new()), &shutdown);
        wait_until("the caches' first LISTs", || cache.synced()).await;
        if mode == Mode::Rebuild {
            PassState::with_cache_rebuilding(&c, cache)
        } else {
            PassState::with_cache(&c, cache).assuming_admissions(Arc::new(Notify::new()))
        }
    };
    // Warm-up: admits `big`, records the N pending reasons; the second pass writes nothing.
    for i in 0..2 {
        pass_with(&client, &c, &mut state, NOW + i).await.unwrap();
        settle(&s, &mut state).await;
    }
    assert!(!gated(&s, "big"), "the 4-GPU pod is admitted");
    if let Some(d) = api_delay() {
        s.delay_requests(d);
    }
    let mut point = Point::default();
    for r in 0..rounds {
        let name = format!("small-{r}");
        let created = Instant::now();
        s.put_object(PODS, gated_pod(&name, "lq-free", 1, "2026-11-18T12:30:00Z"));
        if let Some(cache) = &state.cache {
            let key = ("team".to_string(), name.clone());
            wait_until("the small pod in the cache", || {
                cache.pods[0].get(&key).is_some()
            })
            .await;
            point.delivery.push(created.elapsed());
        }
        let (lists, _) = s.list_stats();
        perf_control("admitting", "enable");
        let t = Instant::now();
        let plan = pass_with(&client, &c, &mut state, NOW + 10 + r as u64)
            .await
            .unwrap();
        point.pass.push(t.elapsed());
        perf_control("admitting", "disable");
        state.records_written().await;
        point.written.push(t.elapsed());
        settle(&s, &mut state).await;
        let (lists_after, _) = s.list_stats();
        point.lists += lists_after - lists;
        assert!(!gated(&s, &name), "{name} admitted: {:?}", plan.actions);
        assert!(gated(&s, "wait-00000"), "the full queue admits nothing");
        // Let the admission's watch events land before timing an idle pass.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = thread_times();
        let t = Instant::now();
        let idle = pass_with(&client, &c, &mut state, NOW + 10 + r as u64)
            .await
            .unwrap();
        point.idle.push(t.elapsed());
        settle(&s, &mut state).await;
        if let (Some(a), Some(b)) = (before, thread_times()) {
            point.idle_wait.push(b.0.saturating_sub(a.0));
            point.idle_switches.push(b.1.saturating_sub(a.1));
            point.idle_faults.push(b.2.saturating_sub(a.2));
        }
        assert!(idle.actions.is_empty(), "idle pass: {:?}", idle.actions);
        if let Some(st) = state.incremental_stats() {
            point.idle_decide.push(st.last_decide);
        }
    }
    if let Some(cache) = state.cache.clone() {
        let now = NOW + 20 + rounds as u64;
        // A waiting pod asks for 2 GPUs instead of 1: it leaves and queues again.
        let key = ("team".to_string(), "wait-00000".to_string());
        let mut pod = cache.pods[0].get(&key).expect("a waiting pod");
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(2);
        s.put_object(PODS, pod);
        wait_until("the resized pod in the cache", || {
            cache.pods[0].get(&key).is_some_and(|p| {
                p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
            })
        })
        .await;
        let t = Instant::now();
        pass_with(&client, &c, &mut state, now).await.unwrap();
        point.resize = Some(t.elapsed());
        settle(&s, &mut state).await;
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("resize", st.last_decide);
        }
        assert!(gated(&s, "wait-00000"), "the resized pod still waits");
        // An admission whose write fails: the next pass admits it again.
        create_seen(
            &s,
            &cache,
            gated_pod("retry", "lq-free", 1, "2026-11-18T12:30:00Z"),
        )
        .await;
        s.fail_requests(&["PUT"], &format!("{PODS}/retry"));
        pass_with(&client, &c, &mut state, now + 1).await.unwrap();
        settle(&s, &mut state).await;
        s.stop_failing();
        assert!(gated(&s, "retry"), "the failed write left it gated");
        perf_control("retry", "enable");
        let t = Instant::now();
        let plan = pass_with(&client, &c, &mut state, now + 2).await.unwrap();
        point.retry = Some(t.elapsed());
        perf_control("retry", "disable");
        settle(&s, &mut state).await;
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("retry", st.last_decide);
        }
        assert!(!gated(&s, "retry"), "retry admitted: {:?}", plan.actions);
        // A preemption in `small`: `low` runs, `urgent` (high priority) evicts it.
        let mut urgent = gated_pod("urgent", "lq-small", 2, "2026-11-18T12:30:00Z");
        urgent["metadata"]["labels"]["tessera.io/priority-class"] = json!("high");
        for (name, pod) in [
            (
                "low",
                gated_pod("low", "lq-small", 2, "2026-11-18T12:00:00Z"),
            ),
            ("urgent", urgent),
        ] {
            create_seen(&s, &cache, pod).await;
            let t = Instant::now();
            pass_with(&client, &c, &mut state, now + 3).await.unwrap();
            if name == "urgent" {
                point.preempt = Some(t.elapsed());
                if let Some(st) = state.incremental_stats() {
                    point.decide.insert("preempt", st.last_decide);
                }
            }
            settle(&s, &mut state).await;
        }
        assert_eq!(s.evictions().len(), 1, "low evicted");
        let low = ("team".to_string(), "low".to_string());
        wait_until("the victim terminating in the cache", || {
            cache.pods[0]
                .get(&low)
                .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
        })
        .await;
        pass_with(&client, &c, &mut state, now + 4).await.unwrap();
        settle(&s, &mut state).await;
        // A pass while the victim terminates: a pod arrives in `free`.
        create_seen(
            &s,
            &cache,
            gated_pod("beside", "lq-free", 1, "2026-11-18T12:30:00Z"),
        )
        .await;
        let t = Instant::now();
        pass_with(&client, &c, &mut state, now + 5).await.unwrap();
        point.terminating = Some(t.elapsed());
        settle(&s, &mut state).await;
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("terminating", st.last_decide);
        }
        assert!(!gated(&s, "beside") && gated(&s, "urgent"));
        // The victim's pod is gone: the preemptor is admitted.
        s.delete_object(PODS, "low");
        wait_until("the victim gone from the cache", || {
            cache.pods[0].get(&low).is_none()
        })
        .await;
        let t = Instant::now();
        pass_with(&client, &c, &mut state, now + 6).await.unwrap();
        point.gone = Some(t.elapsed());
        settle(&s, &mut state).await;
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("gone", st.last_decide);
        }
        assert!(!gated(&s, "urgent"), "the preemptor admitted");
        // Serving: Deployment `web` in `free` scales 1 -> 2 (its ReplicaSet and a new
        // replica pod); the second replica's pass is timed.
        for replicas in 1..=2u64 {
            let pod = format!("web-1-{replicas}");
            scale_web(&s, replicas, &pod);
            let key = ("team".to_string(), pod.clone());
            wait_until("the replica in the cache", || {
                cache.pods[0].get(&key).is_some()
                    && cache
                        .deployments
                        .get(&("team".to_string(), "web".to_string()))
                        .is_some_and(|d| d["spec"]["replicas"] == replicas)
            })
            .await;
            let t = Instant::now();
            pass_with(&client, &c, &mut state, now + 7 + replicas)
                .await
                .unwrap();
            if replicas == 2 {
                point.serving = Some(t.elapsed());
                if let Some(st) = state.incremental_stats() {
                    point.decide.insert("serving", st.last_decide);
                }
            }
            settle(&s, &mut state).await;
            assert!(!gated(&s, &pod), "{pod} admitted");
        }
        // `big` finishes: the head of the long queue is admitted (`wait-00000`, resized
        // to 2 GPUs, and the next two) and every waiting pod moves up three places.
        let big = ("team".to_string(), "big".to_string());
        s.delete_object(PODS, "big");
        wait_until("big gone from the cache", || {
            cache.pods[0].get(&big).is_none()
        })
        .await;
        let writes = s.writes();
        perf_control("head", "enable");
        let t = Instant::now();
        pass_with(&client, &c, &mut state, now + 10).await.unwrap();
        point.head = Some(t.elapsed());
        perf_control("head", "disable");
        let in_pass = s.writes() - writes;
        settle(&s, &mut state).await;
        point.head_places = Some(t.elapsed());
        point.head_writes = (in_pass, s.writes() - writes - in_pass);
        if std::env::var_os("BENCH_SHOW_WRITES").is_some() {
            show_writes(&s, writes);
        }
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("head", st.last_decide);
        }
        assert!(
            !gated(&s, "wait-00000") || pending < 3,
            "the head of the full queue admitted"
        );
        // An operator raises `full`'s quota from 4 to 6 GPUs: the pass reads the new
        // ClusterQueue and admits the next two waiting pods.
        let cqs = "/apis/tessera.io/v1alpha1/clusterqueues";
        s.put_object(cqs, queue("full", 6));
        wait_until("the new quota in the cache", || {
            cache.queues[1]
                .get(&(String::new(), "full".to_string()))
                .is_some_and(|q| {
                    q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]
                        == 6
                })
        })
        .await;
        let admitted_before = admitted_waiting(&s);
        perf_control("quota", "enable");
        let t = Instant::now();
        pass_with(&client, &c, &mut state, now + 11).await.unwrap();
        point.quota = Some(t.elapsed());
        perf_control("quota", "disable");
        settle(&s, &mut state).await;
        point.quota_places = Some(t.elapsed());
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("quota", st.last_decide);
        }
        let admitted = admitted_waiting(&s);
        assert_eq!(
            admitted,
            (admitted_before + 2).min(pending),
            "the raised quota admits two more"
        );
        // The pass that sees the admissions back, then a ResourceClaim appears in the
        // queued namespace (generated for some pod from a template): nothing names it,
        // nothing changes.
        pass_with(&client, &c, &mut state, now + 12).await.unwrap();
        settle(&s, &mut state).await;
        let claims = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims";
        s.put_object(
            claims,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "gen-1", "namespace": "team"},
                   "spec": {"devices": {"requests": [{"name": "g",
                       "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}}),
        );
        let claim = ("team".to_string(), "gen-1".to_string());
        wait_until("the claim in the cache", || cache.claims.contains(&claim)).await;
        let t = Instant::now();
        let plan = pass_with(&client, &c, &mut state, now + 12).await.unwrap();
        point.claim = Some(t.elapsed());
        settle(&s, &mut state).await;
        if let Some(st) = state.incremental_stats() {
            point.decide.insert("claim", st.last_decide);
        }
        assert!(
            plan.actions.is_empty(),
            "a claim no pod names changes nothing"
        );
        // The autoscaler records a hold on `web` (one replica's GPU in `free`, for a
        // second); then the hold ends.
        let until = tessera::controller::time::rfc3339(now + 1_000);
        s.put_object(
            "/apis/apps/v1/namespaces/team/deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "team", "uid": "uid-web",
                                "annotations": {"tessera.io/hold-freed":
                                    format!(r#"{{"replicas":1,"until":"{until}","maxReworkSeconds":300}}"#)}},
                   "spec": {"replicas": 2, "template": {
                       "metadata": {"labels": {"tessera.io/queue-name": "lq-free"}},
                       "spec": {"containers": [{"name": "c", "image": "x",
                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}),
        );
        let web = ("team".to_string(), "web".to_string());
        wait_until("the hold in the cache", || {
            cache
                .deployments
                .get(&web)
                .is_some_and(|d| d["metadata"]["annotations"]["tessera.io/hold-freed"].is_string())
        })
        .await;
        for (at, case) in [(now + 13, "hold"), (now + 2_000, "hold end")] {
            let took =
                Some(timed_pass(&s, &client, &c, &mut state, at, case, &mut point.decide).await);
            match case {
                "hold" => point.hold = took,
                _ => point.hold_end = took,
            }
        }
        // An operator groups `small` and `free` into cohort `pool` (they lend to each
        // other now), then moves `full` there too.
        let small = ("small", preempting_queue("small", 2));
        let free = ("free", queue("free", 1000));
        let full = ("full", queue("full", 6));
        for (case, moved) in [("cohort", vec![small, free]), ("cohort full", vec![full])] {
            for (_, mut q) in moved.clone() {
                q["spec"]["cohortName"] = json!("pool");
                s.put_object(cqs, q);
            }
            wait_until("the cohort in the cache", || {
                moved.iter().all(|(name, _)| {
                    cache.queues[1]
                        .get(&(String::new(), name.to_string()))
                        .is_some_and(|q| q["spec"]["cohortName"] == "pool")
                })
            })
            .await;
            let at = now + 3_000;
            let took =
                Some(timed_pass(&s, &client, &c, &mut state, at, case, &mut point.decide).await);
            match case {
                "cohort" => point.cohort = took,
                _ => point.cohort_full = took,
            }
        }
        // A new team: ClusterQueue `vision` (1 GPU) and a 2-GPU pod in namespace
        // `vision`, which has no LocalQueue yet; then its LocalQueue (the pod, more than
        // the queue holds, stays waiting there), then deleted.
        s.put_object(
            "/apis/tessera.io/v1alpha1/clusterqueues",
            queue("vision", 1),
        );
        let mut detector = gated_pod("detector", "lq-vision", 2, "2026-11-18T12:30:00Z");
        detector["metadata"]["namespace"] = json!("vision");
        s.put_object("/api/v1/namespaces/vision/pods", detector);
        let key = ("vision".to_string(), "detector".to_string());
        wait_until("detector in the cache", || {
            cache.pods[0].get(&key).is_some()
        })
        .await;
        pass_with(&client, &c, &mut state, now + 4_000)
            .await
            .unwrap();
        settle(&s, &mut state).await;
        let lqs = "/apis/tessera.io/v1alpha1/namespaces/vision/localqueues";
        let lq = ("vision".to_string(), "lq-vision".to_string());
        s.put_object(
            lqs,
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
                   "metadata": {"name": "lq-vision", "namespace": "vision"},
                   "spec": {"clusterQueue": "vision"}}),
        );
        wait_until("the LocalQueue in the cache", || {
            cache.queues[2].contains(&lq)
        })
        .await;
        point.new_team = Some(
            timed_pass(
                &s,
                &client,
                &c,
                &mut state,
                now + 4_001,
                "new team",
                &mut point.decide,
            )
            .await,
        );
        let reason = || {
            let pod = s.object("/api/v1/namespaces/vision/pods", "detector");
            pod.and_then(|p| {
                let conditions = p["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .find(|c| c["type"] == "tessera.io/Admitted")
                    .and_then(|c| c["reason"].as_str().map(String::from))
            })
        };
        assert_eq!(reason().as_deref(), Some("ExceedsMaxQuota"), "new team");
        // A 1-GPU pod admitted there, running (its record admitted) when the
        // LocalQueue goes: it stays booked in `vision`.
        let mut tracker = gated_pod("tracker", "lq-vision", 1, "2026-11-18T12:31:00Z");
        tracker["metadata"]["namespace"] = json!("vision");
        s.put_object("/api/v1/namespaces/vision/pods", tracker);
        let key = ("vision".to_string(), "tracker".to_string());
        wait_until("tracker in the cache", || cache.pods[0].get(&key).is_some()).await;
        for at in [now + 4_002, now + 4_003] {
            pass_with(&client, &c, &mut state, at).await.unwrap();
            settle(&s, &mut state).await;
        }
        let running = |p: Option<Value>| {
            p.is_some_and(|p| {
                !p["spec"]["schedulingGates"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|x| x["name"] == GATE))
            })
        };
        assert!(running(
            s.object("/api/v1/namespaces/vision/pods", "tracker")
        ));
        assert!(s.delete_object(lqs, "lq-vision"), "lq-vision deleted");
        wait_until("the deletion in the cache", || {
            !cache.queues[2].contains(&lq)
        })
        .await;
        point.team_gone = Some(
            timed_pass(
                &s,
                &client,
                &c,
                &mut state,
                now + 4_004,
                "team gone",
                &mut point.decide,
            )
            .await,
        );
        assert_eq!(reason().as_deref(), Some("LocalQueueNotFound"), "team gone");
        assert!(running(
            s.object("/api/v1/namespaces/vision/pods", "tracker")
        ));
    }
    point.lists /= rounds as u64;
    if let Some(st) = state.incremental_stats() {
        point.full = st.full;
        point.incremental = st.incremental;
    }
    shutdown.cancel();
    point
}

/// One pass of `case` at `at`, timed until it returns (its deferred writes land after,
/// untimed); it reports no unusable object. Its decision alone goes to `decide`.
async fn timed_pass(
    s: &ApiServer,
    client: &kube::Client,
    c: &Config,
    state: &mut PassState,
    at: u64,
    case: &'static str,
    decide: &mut BTreeMap<&'static str, Duration>,
) -> Duration {
    perf_control(case, "enable");
    let t = Instant::now();
    let plan = pass_with(client, c, state, at).await.unwrap();
    let took = t.elapsed();
    perf_control(case, "disable");
    settle(s, state).await;
    assert!(plan.problems.is_empty(), "{case}: {:?}", plan.problems);
    if let Some(st) = state.incremental_stats() {
        decide.insert(case, st.last_decide);
    }
    took
}

/// The API-server double: on this runtime, or with `BENCH_API_THREAD=1` on a thread and
/// runtime of its own (as a real API server is another process: its work is not the
/// controller's, and the cache's watch feeders here still share the pass's thread).
async fn api_server() -> ApiServer {
    if std::env::var_os("BENCH_API_THREAD").is_none() {
        return ApiServer::empty().await;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the double");
        rt.block_on(async move {
            let _ = tx.send(ApiServer::empty().await);
            std::future::pending::<()>().await;
        });
    });
    rx.await.expect("the double started")
}

/// `BENCH_PERF_CTL=FIFO`: `perf record -D -1 --control fifo:FIFO` records one case's
/// pass alone (the command written to the FIFO: `enable` / `disable`): `head`, or the
/// one `BENCH_PERF_CASE` names (`admitting`, its five rounds; `retry`, `quota`, `block end`,
/// `hold`, `hold end`, `cohort`, `cohort full`, `new team`, `team gone`).
fn perf_control(case: &str, command: &str) {
    let wanted = std::env::var("BENCH_PERF_CASE").unwrap_or_else(|_| "head".into());
    if wanted != case {
        return;
    }
    if let Some(path) = std::env::var_os("BENCH_PERF_CTL") {
        if let Err(e) = std::fs::write(&path, format!("{command}\n")) {
            eprintln!("BENCH_PERF_CTL: {e}");
        }
    }
}

/// `BENCH_API_DELAY_US`: every request to the double but a WATCH answered that late
/// (the round trip to an API server across a network), from the first measured pass on.
fn api_delay() -> Option<Duration> {
    std::env::var("BENCH_API_DELAY_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&us| us > 0)
        .map(Duration::from_micros)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn p50(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    stats(v.to_vec()).0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let env_num = |k: &str| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    let rounds = env_num("BENCH_ROUNDS")
        .unwrap_or(if full { 5 } else { 1 })
        .max(1);
    let list_max = env_num("BENCH_LIST_MAX").unwrap_or(5_000);
    let modes = std::env::var("BENCH_MODES").unwrap_or_else(|_| "list,rebuild,incr".into());
    let runs = |m: &str| modes.split(',').any(|x| x.trim() == m);
    let sizes: Vec<usize> = std::env::var("BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| {
            if full {
                vec![100, 1_000, 5_000, 50_000]
            } else {
                vec![50]
            }
        });
    println!("controller pass admitting 1 small pod beside N pending pods ({rounds} rounds, p50)");
    if let Some(d) = api_delay() {
        println!("every request but a WATCH answered {d:?} late (BENCH_API_DELAY_US; the `timeout`, `backoff end` and `held` runs without)");
    }
    println!(
        "{:>6} | {:>10} {:>5} | {:>12} {:>12} | {:>10} {:>10} {:>11} {:>9} {:>7} {:>7} {:>9} {:>11} | {:>13} {:>10} | {:>8}",
        "N",
        "list pass",
        "LISTs",
        "rebuild pass",
        "rebuild idle",
        "incr pass",
        "incr idle",
        "idle decide",
        "idle wait",
        "preempt",
        "faults",
        "delivery",
        "full/incr",
        "rebuild/incr",
        "list/incr",
        "µs/pend."
    );
    let mut cases = Vec::new();
    let mut head_writes = Vec::new();
    for n in sizes {
        let list = if n <= list_max && runs("list") {
            Some(measure(n, Mode::List, rounds).await)
        } else {
            None
        };
        let rebuild = if runs("rebuild") {
            Some(measure(n, Mode::Rebuild, rounds).await)
        } else {
            None
        };
        let incr = runs("incr").then_some(());
        let incr = match incr {
            Some(()) => measure(n, Mode::Incremental, rounds).await,
            None => Point::default(),
        };
        let pr_rebuild = if runs("rebuild") {
            Some(measure_pods_ready(n, Mode::Rebuild).await)
        } else {
            None
        };
        let pr_incr = if runs("incr") {
            let m = measure_pods_ready(n, Mode::Incremental).await;
            assert_eq!(m.2, 1, "the pods-ready passes stay incremental");
            Some(m)
        } else {
            None
        };
        let held_rebuild = if runs("rebuild") {
            Some(measure_held(n, Mode::Rebuild).await)
        } else {
            None
        };
        let held_incr = if runs("incr") {
            let h = measure_held(n, Mode::Incremental).await;
            assert_eq!(h.full, 1, "the blockAdmission passes stay incremental");
            Some(h)
        } else {
            None
        };
        let ip = p50(&incr.pass).as_secs_f64().max(1e-9);
        let rp = rebuild.as_ref().map(|r| p50(&r.pass));
        let median = |v: &[u64]| {
            let mut f = v.to_vec();
            f.sort_unstable();
            f.get(f.len() / 2).map_or("-".into(), |x| x.to_string())
        };
        let faults = median(&incr.idle_faults);
        let switches = median(&incr.idle_switches);
        let or_dash = |v: &[Duration]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                ms(p50(v))
            }
        };
        println!(
            "{:>6} | {:>10} {:>5} | {:>12} {:>12} | {:>10} {:>10} {:>11} {:>9} {:>7} {:>7} {:>9} {:>11} | {:>13} {:>10} | {:>8.3}",
            n,
            list.as_ref().map_or("-".into(), |l| ms(p50(&l.pass))),
            list.as_ref().map_or("-".into(), |l| l.lists.to_string()),
            rp.map_or("-".into(), ms),
            rebuild.as_ref().map_or("-".into(), |r| ms(p50(&r.idle))),
            or_dash(&incr.pass),
            or_dash(&incr.idle),
            or_dash(&incr.idle_decide),
            or_dash(&incr.idle_wait),
            switches,
            faults,
            or_dash(&incr.delivery),
            format!("{}/{}", incr.full, incr.incremental),
            rp.map_or("-".into(), |rp| format!("{:.1}x", rp.as_secs_f64() / ip)),
            list.as_ref().map_or("-".into(), |l| format!(
                "{:.1}x",
                p50(&l.pass).as_secs_f64() / ip
            )),
            ip * 1e6 / n.max(1) as f64,
        );
        if let Some(r) = &rebuild {
            assert_eq!(r.lists, 0, "a cached pass LISTs nothing");
        }
        if runs("incr") {
            assert_eq!(incr.lists, 0, "a cached pass LISTs nothing");
            assert_eq!(
                incr.full, 1,
                "only the first incremental pass decides from scratch (the cases below included)"
            );
        }
        let written = |p: &Point| (!p.written.is_empty()).then(|| p50(&p.written));
        for (case, r, i) in [
            (
                "admitting+written",
                rebuild.as_ref().and_then(written),
                written(&incr),
            ),
            (
                "resize",
                rebuild.as_ref().and_then(|r| r.resize),
                incr.resize,
            ),
            ("retry", rebuild.as_ref().and_then(|r| r.retry), incr.retry),
            (
                "preempt",
                rebuild.as_ref().and_then(|r| r.preempt),
                incr.preempt,
            ),
            (
                "terminating",
                rebuild.as_ref().and_then(|r| r.terminating),
                incr.terminating,
            ),
            ("gone", rebuild.as_ref().and_then(|r| r.gone), incr.gone),
            (
                "serving",
                rebuild.as_ref().and_then(|r| r.serving),
                incr.serving,
            ),
            ("timeout", pr_rebuild.map(|m| m.0), pr_incr.map(|m| m.0)),
            ("backoff end", pr_rebuild.map(|m| m.1), pr_incr.map(|m| m.1)),
            (
                "block admit",
                held_rebuild.map(|h| h.admit),
                held_incr.map(|h| h.admit),
            ),
            (
                "held",
                held_rebuild.map(|h| h.held),
                held_incr.map(|h| h.held),
            ),
            (
                "block end",
                held_rebuild.map(|h| h.end),
                held_incr.map(|h| h.end),
            ),
            ("head", rebuild.as_ref().and_then(|r| r.head), incr.head),
            (
                "head+places",
                rebuild.as_ref().and_then(|r| r.head_places),
                incr.head_places,
            ),
            ("quota", rebuild.as_ref().and_then(|r| r.quota), incr.quota),
            (
                "quota+places",
                rebuild.as_ref().and_then(|r| r.quota_places),
                incr.quota_places,
            ),
            ("claim", rebuild.as_ref().and_then(|r| r.claim), incr.claim),
            ("hold", rebuild.as_ref().and_then(|r| r.hold), incr.hold),
            (
                "hold end",
                rebuild.as_ref().and_then(|r| r.hold_end),
                incr.hold_end,
            ),
            (
                "cohort",
                rebuild.as_ref().and_then(|r| r.cohort),
                incr.cohort,
            ),
            (
                "cohort full",
                rebuild.as_ref().and_then(|r| r.cohort_full),
                incr.cohort_full,
            ),
            (
                "new team",
                rebuild.as_ref().and_then(|r| r.new_team),
                incr.new_team,
            ),
            (
                "team gone",
                rebuild.as_ref().and_then(|r| r.team_gone),
                incr.team_gone,
            ),
        ] {
            cases.push((n, case, r, i, incr.decide.get(case).copied()));
        }
        head_writes.push((
            n,
            rebuild.as_ref().map(|r| r.head_writes),
            runs("incr").then_some(incr.head_writes),
        ));
    }
    println!();
    println!("passes that decided from scratch before (one pass each)");
    println!(
        "{:>6} | {:>17} | {:>12} | {:>10} | {:>12} | {:>12}",
        "N", "case", "rebuild", "incr", "rebuild/incr", "incr decide"
    );
    for (n, case, r, i, d) in cases {
        let ratio = match (r, i) {
            (Some(r), Some(i)) => format!("{:.1}x", r.as_secs_f64() / i.as_secs_f64().max(1e-9)),
            _ => "-".into(),
        };
        println!(
            "{:>6} | {:>17} | {:>12} | {:>10} | {:>12} | {:>12}",
            n,
            case,
            r.map_or("-".into(), ms),
            i.map_or("-".into(), ms),
            ratio,
            d.map_or("-".into(), ms)
        );
    }
    println!();
    println!(
        "writes of the `head` pass (pod status, Events, admissions, queue status, records): in the pass + deferred"
    );
    for (n, r, i) in head_writes {
        let show = |w: Option<(usize, usize)>| w.map_or("-".into(), |(a, b)| format!("{a} + {b}"));
        println!("{n:>6} | rebuild {:>6} | incr {:>6}", show(r), show(i));
    }
}

/// Prints the write requests after the first `from`, grouped by method and the path
/// without the object's name (`BENCH_SHOW_WRITES`).
fn show_writes(s: &ApiServer, from: usize) {
    let mut groups: BTreeMap<String, usize> = BTreeMap::new();
    let writes = s.requests().into_iter().filter(|r| !r.starts_with("GET "));
    for r in writes.skip(from) {
        let path = r.split('?').next().unwrap_or_default();
        let shape: Vec<&str> = path
            .split('/')
            .map(|p| match p.rfind(|c: char| !c.is_ascii_digit()) {
                Some(i) if i + 1 < p.len() && p.len() - i > 3 => "<n>",
                _ => p,
            })
            .collect();
        *groups.entry(shape.join("/")).or_default() += 1;
    }
    for (shape, n) in groups {
        println!("  {n:>4} {shape}");
    }
}
