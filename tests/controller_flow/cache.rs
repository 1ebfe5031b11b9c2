//! Passes that read the watch-fed cache instead of LISTing: no LIST per pass, a pass
//! right after another reads its own writes (no double admission before the watch
//! events arrive), a restart with a fresh cache keeps the admitted set and writes
//! nothing, a pod deleted by another client frees its quota through the watch, and a
//! pass with nothing to do is recognised as settled until an object changes; a watch
//! ended by a compaction (410 Gone) LISTs again and misses nothing; a ClusterQueue
//! joining a cohort or held, and a new team's first LocalQueue, are followed without a
//! pass from scratch; a LocalQueue deleted under a running pod leaves its quota taken;
//! a ClusterQueue set to drain evicts the pods running in it.

use super::{
    assert_rbac_allows_every_request, cfg, cluster, condition, create_pod, gated, pass_at, patched,
    pod, ungated_pods, wait_for, NOW, PODS,
};
use crate::support::apiserver::ApiServer;
use serde_json::json;
use std::sync::Arc;
use tessera::controller::cache::Cache;
use tessera::controller::decide::Action;
use tessera::controller::reconciler::{self, Config, PassState};
use tessera::controller::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A fed cache and the pass state reading it; the token stops the feeders.
pub(super) async fn cached(
    s: &ApiServer,
    c: &Config,
) -> (PassState, Arc<Cache>, CancellationToken) {
    let cache = Arc::new(Cache::new());
    let stop = CancellationToken::new();
    let mut state = PassState::with_cache(c, cache.clone());
    if !cache.synced() {
        let early = reconciler::pass_with(&s.client(), c, &mut state, NOW).await;
        assert!(matches!(early, Err(Error::NotSynced)), "{early:?}");
    }
    cache.spawn_feeders(&s.client(), Arc::new(Notify::new()), &stop);
    wait_for("the caches' first LISTs", || cache.synced()).await;
    (state, cache, stop)
}

/// Another client deletes pod `name`; returns once the cache's watch has told it.
async fn delete_seen(s: &ApiServer, cache: &Cache, name: &str) {
    assert!(s.delete_object(PODS, name), "{name} deleted");
    let key = ("team".to_string(), name.to_string());
    wait_for("the deletion in the cache", || {
        cache.pods.iter().all(|p| p.get(&key).is_none())
    })
    .await;
}

fn admits(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Admit { .. }))
        .count()
}

#[tokio::test]
async fn cached_passes_list_nothing_read_their_writes_and_survive_a_restart() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["low-1", "low-2", "low-3"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    let (mut state, _cache, stop) = cached(&s, &c).await;
    let lists = s.list_stats().0;

    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(
        ungated_pods(&s),
        ["low-1", "low-2"].map(String::from).into()
    );
    assert_eq!(condition(&pod(&s, "low-3")).0, "WaitingForQuota");
    // At once, before any watch event could land and before low-3's place is written
    // (a write the pass did not wait for): the pass sees its own writes.
    let writes = s.writes();
    let again = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert!(again.actions.is_empty(), "{:?}", again.actions);
    assert_eq!(again.admitted, plan.admitted);
    state.records_written().await;
    assert_eq!(record_place(&s, "low-3").as_deref(), Some("1"));
    assert_eq!(
        s.writes(),
        writes + 2,
        "nothing written twice: low-3's record created and its status written once"
    );
    let writes = s.writes();
    assert_eq!(s.list_stats().0, lists, "passes LIST nothing");
    // A fixed point: until an object changes, a pass would decide the same.
    assert!(
        state.settled(NOW + 2),
        "nothing changed since a pass with nothing to do"
    );

    // Restart: a fresh cache (one LIST per store) decides the same and writes nothing.
    stop.cancel();
    let c = cfg("b");
    let (mut state, cache, stop) = cached(&s, &c).await;
    let restarted = pass_at(&client, &c, &mut state, NOW + 2).await;
    assert_eq!(admits(&restarted.actions), 0, "{:?}", restarted.actions);
    assert_eq!(restarted.admitted, plan.admitted);
    assert_eq!(s.writes(), writes);

    // Another client deletes an admitted pod: once the watch tells, its quota goes to
    // the waiting one.
    delete_seen(&s, &cache, "low-1").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 3).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    assert!(!gated(&pod(&s, "low-3")));
    let quiet = pass_at(&client, &c, &mut state, NOW + 3).await;
    assert!(quiet.actions.is_empty(), "{:?}", quiet.actions);
    assert!(state.settled(NOW + 3));
    // A pod created after the LISTs arrives through the watch.
    create_pod(&s, "late", 2, "low", json!({}), None);
    let key = ("team".to_string(), "late".to_string());
    wait_for("the new pod in the cache", || {
        cache.pods[0].get(&key).is_some()
    })
    .await;
    assert!(!state.settled(NOW + 4), "a new pod unsettles");
    pass_at(&client, &c, &mut state, NOW + 4).await;
    assert_eq!(condition(&pod(&s, "late")).0, "WaitingForQuota");
    assert_eq!(s.list_stats().0, lists + cache.fed_stores().len() as u64);
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn a_compacted_watch_lists_again_and_misses_nothing() {
    compacted_watch_lists_again(cluster().await).await;
}

/// kube-runtime's watcher alone retries a WATCH refused with 410 on the request (not in
/// the stream) from the same resourceVersion forever; the feeder LISTs again.
#[tokio::test]
async fn a_watch_request_refused_as_too_old_lists_again() {
    let s = cluster().await;
    s.refuse_old_watch_requests();
    compacted_watch_lists_again(s).await;
}

async fn compacted_watch_lists_again(s: ApiServer) {
    let client = s.client();
    let c = cfg("a");
    create_pod(&s, "p-1", 4, "low", json!({}), None);
    let (mut state, cache, stop) = cached(&s, &c).await;
    let lists = s.list_stats().0;
    // Every store's watch is open (a watch asked for after the compaction from the
    // LIST's own version would miss it: nothing to LIST again for).
    let watches = || {
        s.requests()
            .iter()
            .filter(|r| r.starts_with("GET ") && r.contains("watch=true"))
            .count()
    };
    wait_for("every store's watch", || {
        watches() >= cache.fed_stores().len()
    })
    .await;
    // A change no store watches: every store's resourceVersion is now behind, so the
    // compaction leaves each of them with a version the server no longer has.
    s.put_object(
        "/api/v1/namespaces/team/secrets",
        json!({"metadata": {"name": "unwatched", "namespace": "team"}}),
    );
    s.compact();
    // Changes right after the compaction reach the cache through the new LISTs.
    assert!(s.delete_object(PODS, "p-1"));
    create_pod(&s, "p-2", 4, "low", json!({}), None);
    let stores = cache.fed_stores().len() as u64;
    wait_for("every store to LIST again", || {
        s.list_stats().0 >= lists + stores
    })
    .await;
    let (gone, new) = (
        ("team".to_string(), "p-1".to_string()),
        ("team".to_string(), "p-2".to_string()),
    );
    wait_for("the cache to catch up", || {
        cache.pods[0].get(&gone).is_none() && cache.pods[0].get(&new).is_some()
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    assert!(!gated(&pod(&s, "p-2")));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

/// The pods whose status the requests since `from` wrote, in order.
fn status_writes(s: &ApiServer, from: usize) -> Vec<String> {
    status_writes_under(s, from, "/api/v1/namespaces/team/pods/")
}

/// The `Workload` records whose status the requests since `from` wrote.
fn record_status_writes(s: &ApiServer, from: usize) -> Vec<String> {
    status_writes_under(
        s,
        from,
        "/apis/tessera.io/v1alpha1/namespaces/team/workloads/",
    )
}

/// The names under `path` whose status the requests since `from` wrote, in order.
fn status_writes_under(s: &ApiServer, from: usize, path: &str) -> Vec<String> {
    s.requests()[from..]
        .iter()
        .filter_map(|r| r.strip_prefix("PUT ")?.strip_prefix(path))
        .filter_map(|p| p.strip_suffix("/status?"))
        .map(String::from)
        .collect()
}

/// The place the `Workload` record of pod `name` shows.
fn record_place(s: &ApiServer, name: &str) -> Option<String> {
    s.object(
        "/apis/tessera.io/v1alpha1/namespaces/team/workloads",
        &format!("pod-{name}"),
    )
    .and_then(|w| {
        w["status"]["positionInClusterQueue"]
            .as_str()
            .map(String::from)
    })
}

/// The places a pass hands to a task it does not wait for: while their writes fail, a
/// pass reads the places asked (not the older ones the records hold) and asks nothing
/// again; once the API server takes writes again, a later pass writes them, and the
/// admission whose record failed with them.
#[tokio::test]
async fn a_place_whose_write_failed_is_written_by_a_later_pass() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["run-1", "run-2", "w-00", "w-01", "w-02"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    let (mut state, cache, stop) = cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;
    state.records_written().await;
    let places = |s: &ApiServer| ["w-00", "w-01", "w-02"].map(|n| record_place(s, n));
    assert_eq!(
        places(&s),
        [Some("1"), Some("2"), Some("3")].map(|p| p.map(String::from))
    );

    s.fail_requests(
        &["PUT"],
        "/apis/tessera.io/v1alpha1/namespaces/team/workloads",
    );
    delete_seen(&s, &cache, "run-1").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    assert!(
        !gated(&pod(&s, "w-00")),
        "the admission does not wait for records"
    );
    state.records_written().await;
    assert_eq!(
        places(&s),
        [Some("1"), Some("2"), Some("3")].map(|p| p.map(String::from))
    );
    let quiet = pass_at(&client, &c, &mut state, NOW + 2).await;
    assert!(
        quiet.actions.is_empty(),
        "places asked are not asked again: {:?}",
        quiet.actions
    );

    s.stop_failing();
    pass_at(&client, &c, &mut state, NOW + 3).await;
    state.records_written().await;
    assert_eq!(
        places(&s),
        [None, Some("1"), Some("2")].map(|p| p.map(String::from))
    );
    let admitted = s
        .object(
            "/apis/tessera.io/v1alpha1/namespaces/team/workloads",
            "pod-w-00",
        )
        .and_then(|w| {
            w["status"]["admission"]["clusterQueue"]
                .as_str()
                .map(String::from)
        });
    assert_eq!(admitted.as_deref(), Some("cq"));
    assert!(cache.asked_places.is_empty(), "every ask answered");
    let writes = s.writes();
    pass_at(&client, &c, &mut state, NOW + 4).await;
    state.records_written().await;
    assert_eq!(s.writes(), writes, "nothing left to write");
    stop.cancel();
}

/// With 60 pods waiting in one queue, admitting its head writes the places of the first
/// 10 and of the two pods entering a lower place range, not of all 59, to their
/// `Workload` records alone; a pod's status is written only where its sentence changed
/// (the 11th, now among the first 10, is told the free quota), and no Event for a place
/// that moved. Past the first 10 a place is a range and the sentence gives no free
/// quota, so it changes a few times while the pod waits, not at every admission.
#[tokio::test]
async fn an_admission_from_a_long_queue_writes_few_reasons() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["run-1", "run-2"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    for i in 0..60 {
        create_pod(&s, &format!("w-{i:02}"), 2, "low", json!({}), None);
    }
    let (mut state, cache, stop) = cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 2, "{:?}", plan.actions);
    state.records_written().await;
    let message = |name: &str| condition(&pod(&s, name)).1;
    let full = "insufficient unused quota for pod set main: nvidia.com/gpu in flavor h100: 2 requested, 0 available";
    let brief =
        "insufficient unused quota for pod set main: nvidia.com/gpu in flavor h100: 2 requested";
    assert_eq!(message("w-00"), full);
    assert_eq!(message("w-10"), brief);
    assert_eq!(message("w-59"), brief);
    let place = |name: &str| record_place(&s, name);
    assert_eq!(place("w-00").as_deref(), Some("1"));
    assert_eq!(place("w-10").as_deref(), Some("11-20"));
    assert_eq!(place("w-59").as_deref(), Some("51-100"));

    let from = s.requests().len();
    delete_seen(&s, &cache, "run-1").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    assert!(!gated(&pod(&s, "w-00")));
    // Pods: only w-10's sentence changed (its place is exact now, with the free quota).
    assert_eq!(status_writes(&s, from), ["w-10"]);
    // Records: the admitted one in the pass; every place that moved after it, by a
    // task the pass does not wait for (up to 16 in flight: compared as a set).
    assert_eq!(record_status_writes(&s, from), ["pod-w-00"]);
    state.records_written().await;
    let mut want: Vec<String> = (0..=10).map(|i| format!("pod-w-{i:02}")).collect();
    want.extend(["pod-w-20", "pod-w-50"].map(String::from));
    let mut written = record_status_writes(&s, from);
    written.sort();
    assert_eq!(written, want);
    // One Event, for the admission: a place that moved announces nothing.
    let events = s.requests()[from..]
        .iter()
        .filter(|r| r.starts_with("POST /apis/events.k8s.io/v1/namespaces/team/events"))
        .count();
    assert_eq!(events, 1);
    // Each write starts from the cache's copy: nothing is read back first.
    let reads: Vec<String> = s.requests()[from..]
        .iter()
        .filter(|r| {
            r.starts_with("GET /api/v1/namespaces/team/pods/")
                || r.starts_with("GET /apis/tessera.io/v1alpha1/namespaces/team/workloads")
        })
        .cloned()
        .collect();
    assert!(reads.is_empty(), "{reads:?}");
    assert_eq!(message("w-10"), full);
    assert_eq!(place("w-10").as_deref(), Some("10"));
    assert_eq!(place("w-20").as_deref(), Some("11-20"));
    assert_eq!(place("w-21").as_deref(), Some("21-50"));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

/// A write starts from the cache's copy; when another client changed the object after
/// the cache read it, the PUT conflicts and the write reads the object again and
/// succeeds once, keeping the other client's change. A second conflict is the pass's
/// answer: the admission waits for the next pass, which admits it.
#[tokio::test]
async fn a_write_from_a_stale_cached_copy_reads_again_once() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    create_pod(&s, "first", 2, "low", json!({}), None);
    let (mut state, cache, stop) = cached(&s, &c).await;
    let label = |name: &'static str, value: &'static str| {
        move |s: &ApiServer| {
            let mut p = pod(s, name);
            p["metadata"]["labels"]["touched"] = json!(value);
            s.put_object(PODS, p);
        }
    };
    s.before_next_write("PUT", PODS, label("first", "once"));
    let from = s.requests().len();
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    let p = pod(&s, "first");
    assert!(!gated(&p), "admitted after one conflict");
    assert_eq!(
        p["metadata"]["labels"]["touched"], "once",
        "the other write kept"
    );
    let tries: Vec<String> = s.requests()[from..]
        .iter()
        .filter(|r| r.contains("/pods/first"))
        .cloned()
        .collect();
    assert_eq!(tries.len(), 3, "PUT (409), GET, PUT: {tries:?}");

    create_pod(&s, "second", 2, "low", json!({}), None);
    wait_for("the second pod in the cache", || {
        cache.pods.iter().any(|st| {
            st.get(&("team".to_string(), "second".to_string()))
                .is_some()
        })
    })
    .await;
    s.before_next_write("PUT", PODS, label("second", "a"));
    s.before_next_write("PUT", PODS, label("second", "b"));
    pass_at(&client, &c, &mut state, NOW + 1).await;
    assert!(
        gated(&pod(&s, "second")),
        "two conflicts: not admitted in this pass"
    );
    wait_for("the other client's writes in the cache", || {
        cache.pods.iter().any(|st| {
            st.get(&("team".to_string(), "second".to_string()))
                .is_some_and(|p| p["metadata"]["labels"]["touched"] == "b")
        })
    })
    .await;
    pass_at(&client, &c, &mut state, NOW + 2).await;
    assert!(!gated(&pod(&s, "second")), "the next pass admits it");
    stop.cancel();
}

/// A pass writes the waiting workloads' reasons, and their records, a bounded number at
/// a time: with every request answered 20 ms late (a server across a network), the 40
/// reasons of a first pass wait for a few round trips, not 40 one after the other, and
/// never more than `REASON_WRITES_IN_FLIGHT` requests are open at once.
#[tokio::test]
async fn waiting_reasons_are_written_a_bounded_number_at_a_time() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["run-1", "run-2"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    for i in 0..40 {
        create_pod(&s, &format!("w-{i:02}"), 2, "low", json!({}), None);
    }
    let (mut state, _cache, stop) = cached(&s, &c).await;
    s.delay_requests(std::time::Duration::from_millis(20));
    s.take_max_in_flight();
    let from = s.requests().len();
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 2, "{:?}", plan.actions);
    assert_eq!(
        status_writes(&s, from).len(),
        40,
        "every waiting pod's reason"
    );
    let most = s.take_max_in_flight();
    assert!(
        (2..=reconciler::REASON_WRITES_IN_FLIGHT).contains(&most),
        "{most} requests at once"
    );
    stop.cancel();
}

/// An operator edits ClusterQueues under cached passes: `cq` joins cohort `pool`, where
/// `lender` has 4 GPUs nobody uses, so the pod that waited for quota is admitted,
/// borrowing; then `cq` is held (`stopPolicy: Hold`): a pod arriving waits, told why;
/// released, it waits for quota, and is admitted once a running pod ends. The kept
/// engine follows each edit: nothing but the first pass decides from scratch.
#[tokio::test]
async fn a_queue_joining_a_cohort_or_held_is_followed_without_a_pass_from_scratch() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let cqs = "/apis/tessera.io/v1alpha1/clusterqueues";
    let queue = |name: &str, spec: serde_json::Value| {
        let mut q = json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"namespaceSelector": {},
                     "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                         "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}});
        for (k, v) in spec.as_object().into_iter().flatten() {
            q["spec"][k] = v.clone();
        }
        q
    };
    s.put_object(cqs, queue("lender", json!({"cohortName": "pool"})));
    create_pod(&s, "first", 4, "low", json!({}), None);
    create_pod(&s, "second", 4, "low", json!({}), None);
    let (mut state, cache, stop) = cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    state.records_written().await;
    assert_eq!(condition(&pod(&s, "second")).0, "WaitingForQuota");

    // Edits to `cq` seen through the watch before each pass.
    let edit = |spec: serde_json::Value| {
        let q = queue("cq", spec);
        let want = q["spec"].clone();
        s.put_object(cqs, q);
        let cache = cache.clone();
        async move {
            let key = (String::new(), "cq".to_string());
            wait_for("the edit in the cache", || {
                cache.queues[1].get(&key).is_some_and(|q| q["spec"] == want)
            })
            .await;
        }
    };
    edit(json!({"cohortName": "pool"})).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert_eq!(
        admits(&plan.actions),
        1,
        "borrowing from lender: {:?}",
        plan.actions
    );
    state.records_written().await;
    assert!(!gated(&pod(&s, "second")));

    edit(json!({"cohortName": "pool", "stopPolicy": "Hold"})).await;
    pass_at(&client, &c, &mut state, NOW + 2).await;
    create_pod(&s, "third", 1, "low", json!({}), None);
    wait_for("third in the cache", || {
        cache.pods[0]
            .get(&("team".to_string(), "third".to_string()))
            .is_some()
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW + 3).await;
    assert_eq!(admits(&plan.actions), 0, "held: {:?}", plan.actions);
    state.records_written().await;
    assert_eq!(condition(&pod(&s, "third")).0, "ClusterQueueStopped");

    // Released: the cohort is full, so it waits for quota now; `first` ending frees it.
    edit(json!({"cohortName": "pool"})).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 4).await;
    assert_eq!(admits(&plan.actions), 0, "{:?}", plan.actions);
    state.records_written().await;
    assert_eq!(condition(&pod(&s, "third")).0, "WaitingForQuota");
    delete_seen(&s, &cache, "first").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 5).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    assert_eq!(state.incremental_stats().map(|s| s.full), Some(1));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

/// A new team: its namespace has no LocalQueue yet, so its pod waits
/// `LocalQueueNotFound`; the namespace's first LocalQueue (it has no serving owner and
/// no DRA claim to read) is followed on the kept engine, and the pod is admitted with
/// nothing decided from scratch after the first pass.
#[tokio::test]
async fn a_new_teams_first_local_queue_is_followed_without_a_pass_from_scratch() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let pods = "/api/v1/namespaces/vision/pods";
    s.put_object(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vision", "labels": {}}}),
    );
    let (mut state, cache, stop) = cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;

    let new = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "detector", "namespace": "vision",
                     "labels": {"tessera.io/queue-name": "lq", "tessera.io/priority-class": "low"},
                     "creationTimestamp": "2026-11-18T12:00:00Z"},
        "spec": {"containers": [{"name": "train", "image": "trainer",
                                 "resources": {"limits": {"nvidia.com/gpu": 2}}}]}});
    s.put_object(pods, patched(new, ("", "Pod")));
    let key = ("vision".to_string(), "detector".to_string());
    wait_for("the pod in the cache", || cache.pods[0].get(&key).is_some()).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert_eq!(admits(&plan.actions), 0, "{:?}", plan.actions);
    state.records_written().await;
    let detector = || s.object(pods, "detector").unwrap();
    assert_eq!(condition(&detector()).0, "LocalQueueNotFound");

    s.put_object(
        "/apis/tessera.io/v1alpha1/namespaces/vision/localqueues",
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
               "metadata": {"name": "lq", "namespace": "vision"}, "spec": {"clusterQueue": "cq"}}),
    );
    let lq = ("vision".to_string(), "lq".to_string());
    wait_for("the LocalQueue in the cache", || {
        cache.queues[2].get(&lq).is_some()
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW + 2).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    state.records_written().await;
    assert!(!gated(&detector()));
    let stats = state.incremental_stats();
    assert_eq!(stats.as_ref().map(|s| s.full), Some(1), "{stats:?}");
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

/// A LocalQueue deleted under a running pod: the pod stays booked in the ClusterQueue
/// its `Workload` record says admitted it (as Kueue books an admitted Workload), so a
/// newcomer through another LocalQueue waits for the quota it holds, on the kept
/// engine (nothing decided from scratch) and after a restart (a fresh pass reads the
/// record). The pod ending frees it.
#[tokio::test]
async fn a_local_queue_deleted_under_a_running_pod_leaves_its_quota_taken() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let lqs = "/apis/tessera.io/v1alpha1/namespaces/team/localqueues";
    create_pod(&s, "first", 4, "low", json!({}), None);
    let (mut state, cache, stop) = cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    state.records_written().await;
    assert!(!gated(&pod(&s, "first")));
    // Later, once the cache shows it running and its record admitted.
    let first = ("team".to_string(), "first".to_string());
    let record = ("team".to_string(), "pod-first".to_string());
    wait_for("first running and recorded in the cache", || {
        cache.pods[0].get(&first).is_some_and(|p| !gated(&p))
            && cache
                .records
                .get(&record)
                .is_some_and(|r| r["status"]["admission"]["clusterQueue"] == "cq")
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);

    s.put_object(
        lqs,
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
               "metadata": {"name": "lq2", "namespace": "team"}, "spec": {"clusterQueue": "cq"}}),
    );
    assert!(s.delete_object(lqs, "lq"), "lq deleted");
    create_pod(
        &s,
        "second",
        4,
        "low",
        json!({"tessera.io/queue-name": "lq2"}),
        None,
    );
    let seen = |k: (&str, &str)| {
        let key = ("team".to_string(), k.1.to_string());
        match k.0 {
            "lq" => cache.queues[2].get(&key).is_none(),
            "lq2" => cache.queues[2].get(&key).is_some(),
            _ => cache.pods[0].get(&key).is_some(),
        }
    };
    wait_for("the queues and the pod in the cache", || {
        seen(("lq", "lq")) && seen(("lq2", "lq2")) && seen(("pod", "second"))
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW + 2).await;
    assert_eq!(
        admits(&plan.actions),
        0,
        "first holds 4 of 4: {:?}",
        plan.actions
    );
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    state.records_written().await;
    assert_eq!(condition(&pod(&s, "second")).0, "WaitingForQuota");
    let stats = state.incremental_stats();
    assert_eq!(stats.as_ref().map(|s| s.full), Some(1), "{stats:?}");
    stop.cancel();

    // A restarted controller reads the admission back from the record.
    let (mut state, cache, stop) = cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 3).await;
    assert_eq!(
        admits(&plan.actions),
        0,
        "after a restart: {:?}",
        plan.actions
    );
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    state.records_written().await;
    delete_seen(&s, &cache, "first").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 4).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    state.records_written().await;
    assert!(!gated(&pod(&s, "second")));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

/// `stopPolicy: HoldAndDrain` on the ClusterQueue a pod runs in: the pod is evicted
/// through the Eviction API (reason `ClusterQueueStopped`, as Kueue's) and a newcomer
/// waits, told the queue is stopped; released, the newcomer is admitted once the
/// evicted pod is gone.
#[tokio::test]
async fn a_draining_cluster_queue_evicts_its_running_pods() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let cqs = "/apis/tessera.io/v1alpha1/clusterqueues";
    create_pod(&s, "first", 4, "low", json!({}), None);
    let (mut state, cache, stop) = cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(admits(&plan.actions), 1, "{:?}", plan.actions);
    state.records_written().await;

    let stopped = |policy: &str| {
        let mut q = s.object(cqs, "cq").unwrap();
        q["spec"]["stopPolicy"] = json!(policy);
        s.put_object(cqs, q);
        let cache = cache.clone();
        let policy = policy.to_string();
        async move {
            let key = (String::new(), "cq".to_string());
            wait_for("the stop policy in the cache", || {
                cache.queues[1]
                    .get(&key)
                    .is_some_and(|q| q["spec"]["stopPolicy"] == policy.as_str())
            })
            .await;
        }
    };
    stopped("HoldAndDrain").await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1).await;
    let evicted: Vec<(&str, &str)> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict {
                workload, reason, ..
            } => Some((workload.as_str(), reason.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        evicted,
        [("team/pod-first", "ClusterQueueStopped")],
        "{:?}",
        plan.actions
    );
    state.records_written().await;
    let names: Vec<String> = s
        .evictions()
        .iter()
        .filter_map(|e| e["metadata"]["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, ["first"]);

    create_pod(&s, "second", 1, "low", json!({}), None);
    wait_for("second in the cache", || {
        cache.pods[0]
            .get(&("team".to_string(), "second".to_string()))
            .is_some()
    })
    .await;
    let plan = pass_at(&client, &c, &mut state, NOW + 2).await;
    assert_eq!(admits(&plan.actions), 0, "draining: {:?}", plan.actions);
    state.records_written().await;
    assert_eq!(condition(&pod(&s, "second")).0, "ClusterQueueStopped");

    stopped("None").await;
    if s.object(PODS, "first").is_some() {
        delete_seen(&s, &cache, "first").await;
    }
    let plan = pass_at(&client, &c, &mut state, NOW + 3).await;
    assert_eq!(admits(&plan.actions), 1, "released: {:?}", plan.actions);
    state.records_written().await;
    assert!(!gated(&pod(&s, "second")));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}
