//! The requeue state of pod groups and pods without a serving owner, kept on their
//! `Workload` record (`status.requeueState`), which has no owner while it holds one: a
//! group that timed out and whose pods were all deleted and recreated (the API-server
//! double's garbage collector deletes what only they own) still waits out its backoff
//! (deadline included), also across controller restarts (LIST passes and a fresh
//! watch-fed cache), and stays deactivated past `backoffLimitCount`; a state is
//! forgotten once the workload is Ready (the record belongs to its pods again) or with
//! the record once its pods are gone past the TTL (never a record another writer moved
//! on meanwhile); a failed write defers the eviction (also of a serving replica whose
//! owner cannot be annotated); an admission decided without the state waits for it; a
//! concurrent writer loses nothing; unreadable states are reported and ignored.

use super::{
    assert_rbac_allows_every_request, cfg, cluster, condition, create_pod, gated, pod,
    ungated_pods, wait_for, NOW, PODS,
};
use crate::support::apiserver::ApiServer;
use serde_json::{json, Value};
use std::sync::Arc;
use tessera::controller::cache::Cache;
use tessera::controller::reconciler::{self, Config, PassState};
use tessera::quota::WaitForPodsReady;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const WORKLOADS: &str = "/apis/tessera.io/v1alpha1/namespaces/team/workloads";

fn at(secs: u64) -> u64 {
    NOW + secs * 1_000
}

fn config(limit: u32) -> Config {
    Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            backoff_limit_count: Some(limit),
            requeue_by_eviction_time: true,
            block_admission: false,
        }),
        ..cfg("a")
    }
}

/// The pods of group `g` (2 pods, 1 GPU each), as created through the webhook.
fn create_group(s: &ApiServer) {
    for name in ["g-0", "g-1"] {
        create_pod(
            s,
            name,
            1,
            "low",
            json!({"tessera.io/pod-group-name": "g"}),
            Some(2),
        );
    }
}

/// A user or an operator deletes every pod (their eviction finished) and creates them again.
fn recreate_group(s: &ApiServer) {
    for name in ["g-0", "g-1"] {
        assert!(s.delete_object(PODS, name));
    }
    create_group(s);
    assert!(s.objects(PODS).iter().all(gated), "new pods, gated");
}

/// The records holding a requeue state: (record name, `status.requeueState`).
fn entries(s: &ApiServer) -> Vec<(String, Value)> {
    s.objects(WORKLOADS)
        .into_iter()
        .filter(|r| r["status"]["requeueState"].is_object())
        .map(|r| {
            let name = r["metadata"]["name"].as_str().unwrap_or("").to_string();
            (name, r["status"]["requeueState"].clone())
        })
        .collect()
}

fn count(s: &ApiServer, entry: &str) -> Option<u64> {
    entries(s)
        .into_iter()
        .find(|(k, _)| k == entry)
        .and_then(|(_, v)| v["count"].as_u64())
}

fn record(s: &ApiServer, name: &str) -> Option<Value> {
    s.object(WORKLOADS, name)
}

fn owners(s: &ApiServer, name: &str) -> Vec<String> {
    let r = record(s, name).unwrap_or_default();
    let refs = r["metadata"]["ownerReferences"].as_array().cloned();
    refs.unwrap_or_default()
        .iter()
        .map(|o| o["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A record as another client (or an earlier controller) wrote it, with `state`.
fn put_record(s: &ApiServer, name: &str, state: Value) {
    let key = format!("team/{name}");
    s.put_object(
        WORKLOADS,
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": name, "namespace": "team",
                            "annotations": {"tessera.io/workload-key": key}},
               "spec": {"queueName": "lq"}, "status": {"requeueState": state}}),
    );
}

/// A fresh controller reading a watch-fed cache; the token stops its feeders.
async fn restarted(s: &ApiServer, c: &Config) -> (PassState, CancellationToken) {
    let cache = Arc::new(Cache::new());
    let stop = CancellationToken::new();
    let state = PassState::with_cache(c, cache.clone());
    cache.spawn_feeders(&s.client(), Arc::new(Notify::new()), &stop);
    wait_for("the caches' first LISTs", || cache.synced()).await;
    (state, stop)
}

fn group_ungated(s: &ApiServer) -> bool {
    ungated_pods(s) == ["g-0", "g-1"].map(String::from).into()
}

#[tokio::test]
async fn a_recreated_group_keeps_its_backoff_and_deactivation_across_restarts() {
    let s = cluster().await;
    let client = s.client();
    let c = config(1);
    create_group(&s);
    reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert!(group_ungated(&s));

    // Not Ready 60 s after admission: the state is written, then both pods are evicted.
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert_eq!(s.evictions().len(), 2);
    let (key, entry) = entries(&s).remove(0);
    assert_eq!(key, "group-g");
    assert_eq!(
        entry,
        json!({"count": 1, "evictedAt": "2026-11-18T12:02:00Z", "requeueAt": "2026-11-18T12:02:10Z"})
    );
    assert!(
        owners(&s, "group-g").is_empty(),
        "outlives the evicted pods"
    );

    // All pods deleted and recreated; a restarted controller (fresh cache) holds them.
    recreate_group(&s);
    let (mut state, stop) = restarted(&s, &c).await;
    reconciler::pass_with(&client, &c, &mut state, at(61))
        .await
        .unwrap();
    for name in ["g-0", "g-1"] {
        let (reason, message) = condition(&pod(&s, name));
        assert_eq!(reason, "Backoff", "{name}");
        assert!(
            message.contains("requeued at 2026-11-18T12:02:10Z"),
            "{message}"
        );
    }
    reconciler::pass_with(&client, &c, &mut state, at(69))
        .await
        .unwrap();
    assert!(ungated_pods(&s).is_empty(), "not before the deadline");
    reconciler::pass_with(&client, &c, &mut state, at(70))
        .await
        .unwrap();
    assert!(group_ungated(&s), "admitted at the deadline");
    stop.cancel();

    // Times out again (LIST passes: a restart every pass): counted once, not twice.
    reconciler::pass(&client, &c, at(130)).await.unwrap();
    assert_eq!(s.evictions().len(), 4);
    assert_eq!(count(&s, "group-g"), Some(2));
    reconciler::pass(&client, &c, at(131)).await.unwrap();
    assert_eq!(count(&s, "group-g"), Some(2));

    // Past backoffLimitCount (1): the recreated group stays deactivated, also past the TTL.
    recreate_group(&s);
    for secs in [131, 10_000] {
        reconciler::pass(&client, &c, at(secs)).await.unwrap();
        assert!(ungated_pods(&s).is_empty(), "at {secs} s");
        assert_eq!(condition(&pod(&s, "g-0")).0, "Deactivated");
    }
    support_validate(&s);

    // Its pods deleted for good: forgotten once the TTL (1 h) ran out since the eviction.
    for name in ["g-0", "g-1"] {
        s.delete_object(PODS, name);
    }
    reconciler::pass(&client, &c, at(130 + 3_599))
        .await
        .unwrap();
    assert_eq!(count(&s, "group-g"), Some(2), "within the TTL");
    reconciler::pass(&client, &c, at(130 + 3_600))
        .await
        .unwrap();
    assert!(record(&s, "group-g").is_none(), "deleted with its state");
    // A group created under the name again starts afresh.
    create_group(&s);
    reconciler::pass(&client, &c, at(130 + 3_601))
        .await
        .unwrap();
    assert!(group_ungated(&s));
    assert_rbac_allows_every_request(&s);
}

fn support_validate(s: &ApiServer) {
    crate::support::schema::validate_all(&s.objects(PODS), &["1.34.0"]);
    crate::support::schema::validate_custom(
        &s.objects(WORKLOADS),
        "daemonset/controller/crds.yaml",
    );
}

/// Ownerless pod `solo` times out (its state written), is deleted and created again under
/// its name, waits out its backoff, is admitted again and becomes Ready (not recorded
/// yet: the next pass records it and forgets its state).
async fn solo_back_and_ready(s: &ApiServer, c: &Config) {
    let client = s.client();
    create_pod(s, "solo", 1, "low", json!({}), None);
    reconciler::pass(&client, c, at(0)).await.unwrap();
    reconciler::pass(&client, c, at(60)).await.unwrap();
    assert_eq!(count(s, "pod-solo"), Some(1));
    s.delete_object(PODS, "solo");
    create_pod(s, "solo", 1, "low", json!({}), None);
    reconciler::pass(&client, c, at(65)).await.unwrap();
    assert_eq!(condition(&pod(s, "solo")).0, "Backoff");
    reconciler::pass(&client, c, at(70)).await.unwrap();
    assert!(!gated(&pod(s, "solo")));
    mark_ready(s, "solo", "2026-11-18T12:02:20Z");
}

/// The kubelet reports pod `name` Running and Ready since `since`.
fn mark_ready(s: &ApiServer, name: &str, since: &str) {
    let mut p = pod(s, name);
    p["status"] = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": since}]});
    s.put_object(PODS, p);
}

/// A single pod without an owner: recreated under its name, it waits out the backoff;
/// once Ready its state is forgotten and its record belongs to the pod again (the
/// garbage collector deletes it with the pod).
#[tokio::test]
async fn an_ownerless_pod_waits_out_its_backoff_and_is_forgotten_once_ready() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    solo_back_and_ready(&s, &c).await;
    reconciler::pass(&client, &c, at(80)).await.unwrap();
    assert!(entries(&s).is_empty(), "{:?}", entries(&s));
    assert_eq!(owners(&s, "pod-solo"), ["solo"]);
    assert!(pod(&s, "solo")["metadata"]["annotations"]["tessera.io/pods-ready-at"].is_string());
    support_validate(&s);
    s.delete_object(PODS, "solo");
    assert!(record(&s, "pod-solo").is_none(), "collected with its pod");
    assert_rbac_allows_every_request(&s);
}

/// Deleting a record whose pods are gone past the TTL carries the resourceVersion read
/// as its precondition: another controller replica moving the state on between our
/// read and our DELETE makes it 409, and the record survives with its newer state.
#[tokio::test]
async fn a_state_past_its_ttl_is_deleted_but_not_one_moved_on_meanwhile() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_pod(&s, "solo", 1, "low", json!({}), None);
    reconciler::pass(&client, &c, at(0)).await.unwrap();
    let status_puts = |s: &ApiServer| {
        let path = format!("PUT {WORKLOADS}/pod-solo/status");
        s.requests().iter().filter(|r| r.starts_with(&path)).count()
    };
    let before = status_puts(&s);
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert_eq!(
        status_puts(&s) - before,
        1,
        "the state and the eviction's conditions in one status write: {:?}",
        s.requests()
    );
    let evicted = record(&s, "pod-solo").unwrap();
    assert!(evicted["status"]["conditions"]
        .to_string()
        .contains("PodsReadyTimeout"));
    s.delete_object(PODS, "solo");
    s.before_next_write("DELETE", WORKLOADS, move |s: &ApiServer| {
        let mut r = record(s, "pod-solo").unwrap();
        r["status"]["requeueState"] = json!({"count": 2, "evictedAt": "2026-11-18T13:01:00Z"});
        s.put_object(WORKLOADS, r);
    });
    reconciler::pass(&client, &c, at(60 + 3_600)).await.unwrap();
    assert_eq!(count(&s, "pod-solo"), Some(2), "the racing state kept");
    let deletes = s
        .requests()
        .iter()
        .filter(|r| r.starts_with("DELETE ") && r.contains(WORKLOADS))
        .count();
    assert_eq!(deletes, 1, "one DELETE, refused: {:?}", s.requests());
    // Its own TTL runs out in turn: deleted.
    reconciler::pass(&client, &c, at(60 + 2 * 3_600))
        .await
        .unwrap();
    assert!(record(&s, "pod-solo").is_none());
    assert_rbac_allows_every_request(&s);
}

/// The state write fails: no pod is evicted (so none can come back early) until it is
/// written. Another controller replica moves the state on between our read and our
/// write: the later state survives, and a forget does not clear a state it did not read.
#[tokio::test]
async fn a_failed_or_racing_state_write_loses_nothing() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_group(&s);
    reconciler::pass(&client, &c, at(0)).await.unwrap();

    s.fail_requests(&["POST", "PUT"], WORKLOADS);
    let plan = reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert!(!plan.actions.is_empty());
    assert!(s.evictions().is_empty(), "{:?}", s.evictions());
    assert!(group_ungated(&s) && entries(&s).is_empty());
    s.stop_failing();

    // The other replica records a later timeout first: our status PUT gets 409, reads
    // again, and leaves the later state as it is.
    s.before_next_write("PUT", WORKLOADS, move |s: &ApiServer| {
        let mut r = record(s, "group-g").unwrap();
        r["status"]["requeueState"] = json!({"count": 3, "evictedAt": "2026-11-18T12:01:30Z"});
        s.put_object(WORKLOADS, r);
    });
    reconciler::pass(&client, &c, at(61)).await.unwrap();
    assert_eq!(s.evictions().len(), 2, "evicted once the state is written");
    assert_eq!(count(&s, "group-g"), Some(3), "never moved back");
    let puts = s
        .requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains(WORKLOADS))
        .count();
    assert!(puts >= 2, "a PUT retried after its 409: {puts}");

    // Readmitted after the backoff and Ready: forgetting races with the other replica
    // moving the state on again; the forget reads it again and leaves it.
    recreate_group(&s);
    reconciler::pass(&client, &c, at(61 + 80)).await.unwrap();
    assert!(group_ungated(&s));
    for name in ["g-0", "g-1"] {
        mark_ready(&s, name, "2026-11-18T12:03:20Z");
    }
    s.before_next_write("PUT", WORKLOADS, move |s: &ApiServer| {
        let mut r = record(s, "group-g").unwrap();
        r["status"]["requeueState"] = json!({"count": 4, "evictedAt": "2026-11-18T12:03:30Z"});
        s.put_object(WORKLOADS, r);
    });
    reconciler::pass(&client, &c, at(61 + 90)).await.unwrap();
    assert_eq!(
        count(&s, "group-g"),
        Some(4),
        "a state it did not read is kept"
    );
    support_validate(&s);
    assert_rbac_allows_every_request(&s);
}

/// Unreadable states are reported as problems of the pass and ignored: the group they
/// would name is admitted as if nothing were recorded, and nothing panics.
#[tokio::test]
async fn unreadable_states_are_reported_and_ignored() {
    let s = cluster().await;
    let client = s.client();
    let c = config(1);
    put_record(
        &s,
        "group-g",
        json!({"count": "one", "evictedAt": "2026-11-18T12:00:00Z"}),
    );
    put_record(&s, "pod-x", json!({"count": 1, "evictedAt": "soon"}));
    create_group(&s);
    let plan = reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert!(group_ungated(&s));
    let problems: Vec<&String> = plan
        .problems
        .iter()
        .filter(|p| p.contains("status.requeueState"))
        .collect();
    assert_eq!(problems.len(), 2, "{:?}", plan.problems);
    assert!(problems
        .iter()
        .any(|p| p.contains("Workload team/pod-x") && p.contains("evictedAt")));
    // Timed out: its state is written over the unreadable one.
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert_eq!(count(&s, "group-g"), Some(1));
    assert_rbac_allows_every_request(&s);
}

/// An admission decided from a view that missed the state (a cache whose record lags
/// behind its pods, e.g. a new leader's) is checked against the record on the API
/// server before it is written: deferred while the state holds the group back.
#[tokio::test]
async fn an_admission_decided_without_the_state_waits_for_it() {
    use std::collections::BTreeMap;
    use tessera::controller::decide::{Action, ObjKind, ObjRef, Plan};
    use tessera::controller::evictions::EvictionBackoff;
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_group(&s);
    put_record(
        &s,
        "group-g",
        json!({"count": 1, "evictedAt": "2026-11-18T12:01:00Z"}),
    );
    let pod = |name: &str| ObjRef {
        kind: ObjKind::Pod,
        namespace: "team".into(),
        name: name.into(),
    };
    let plan = Plan {
        actions: vec![Action::Admit {
            workload: "team/group-g".into(),
            objects: vec![pod("g-0"), pod("g-1")],
            node_selector: BTreeMap::new(),
            pod_selectors: BTreeMap::new(),
            partial: None,
            excess: Vec::new(),
        }],
        ..Plan::default()
    };
    let mut evictions = EvictionBackoff::new(5_000, 60_000);
    // (now, failed writes, admitted): held until 12:01:10.
    for (now, failed, admitted) in [(at(9), 1, false), (at(10), 0, true)] {
        let got = reconciler::apply(&client, &c, &plan, &mut evictions, None, now).await;
        assert_eq!((got, group_ungated(&s)), (failed, admitted), "at {now}");
    }
    assert_rbac_allows_every_request(&s);
}

/// A serving replica's state goes on its owner first: while that write fails, the
/// replica is not evicted (its replacement could not be held back without it).
#[tokio::test]
async fn a_replica_is_not_evicted_before_its_owner_records_the_timeout() {
    use super::serving::{cohort, scale, DEPLOYMENTS};
    let s = cohort("nvidia.com/gpu").await;
    let client = s.client();
    let c = config(3);
    scale(&s, 1);
    reconciler::pass(&client, &c, at(0)).await.unwrap();
    s.fail_requests(&["PUT"], DEPLOYMENTS);
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert!(s.evictions().is_empty(), "{:?}", s.evictions());
    s.stop_failing();
    reconciler::pass(&client, &c, at(61)).await.unwrap();
    assert_eq!(s.evictions().len(), 1);
    let deployment = s.objects(DEPLOYMENTS).remove(0);
    assert_eq!(
        deployment["metadata"]["annotations"]["tessera.io/requeue-count"],
        "1"
    );
    assert_rbac_allows_every_request(&s);
}

/// A record left without owners and without a state (a controller stopped between the
/// two writes of a forget) gets its owners back with the workload's next record update,
/// so the garbage collector still deletes it with its pod.
#[tokio::test]
async fn an_ownerless_record_without_a_state_gets_its_owners_back() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_pod(&s, "solo", 1, "low", json!({}), None);
    reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert_eq!(owners(&s, "pod-solo"), ["solo"]);
    let mut r = record(&s, "pod-solo").unwrap();
    r["metadata"]["ownerReferences"] = json!([]);
    s.put_object(WORKLOADS, r);
    mark_ready(&s, "solo", "2026-11-18T12:01:10Z");
    reconciler::pass(&client, &c, at(10)).await.unwrap();
    assert_eq!(
        owners(&s, "pod-solo"),
        ["solo"],
        "given back with PodsReady"
    );
    s.delete_object(PODS, "solo");
    assert!(record(&s, "pod-solo").is_none(), "collected with its pod");
    assert_rbac_allows_every_request(&s);
}
