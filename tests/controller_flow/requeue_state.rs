//! The requeue state of pod groups and pods without a serving owner, kept in the
//! namespace's `tessera-requeue-state` ConfigMap: a group that timed out and whose pods
//! were all deleted and recreated still waits out its backoff (deadline included), also
//! across controller restarts (LIST passes and a fresh watch-fed cache), and stays
//! deactivated past `backoffLimitCount`; entries are forgotten once the workload is
//! Ready or its pods are gone past the TTL, and the ConfigMap is deleted with its last
//! entry (never with an entry another writer set meanwhile); a failed write defers the eviction (also of
//! a serving replica whose owner cannot be annotated); an admission decided without the
//! state waits for it; a concurrent writer loses nothing; corrupt entries are reported
//! and ignored.

use super::{
    assert_rbac_allows_every_request, cfg, cluster, condition, create_pod, gated, pod,
    ungated_pods, wait_for, NOW, PODS,
};
use crate::support::apiserver::ApiServer;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use tessera::controller::cache::Cache;
use tessera::controller::reconciler::{self, Config, PassState};
use tessera::quota::WaitForPodsReady;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const CMS: &str = "/api/v1/namespaces/team/configmaps";
const STATE: &str = "tessera-requeue-state";

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

/// The state ConfigMap's entries (data key → JSON value).
fn entries(s: &ApiServer) -> Vec<(String, Value)> {
    s.objects(CMS)
        .into_iter()
        .filter(|c| c["metadata"]["name"] == STATE)
        .flat_map(|c| {
            c["data"]
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, serde_json::from_str(v.as_str().unwrap()).unwrap()))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn count(s: &ApiServer, entry: &str) -> Option<u64> {
    entries(s)
        .into_iter()
        .find(|(k, _)| k == entry)
        .and_then(|(_, v)| v["count"].as_u64())
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
        json!({"workload": "team/group-g", "count": 1, "evictedAt": "2026-11-18T12:02:00Z"})
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
    assert!(entries(&s).is_empty(), "{:?}", entries(&s));
    // A group created under the name again starts afresh.
    create_group(&s);
    reconciler::pass(&client, &c, at(130 + 3_601))
        .await
        .unwrap();
    assert!(group_ungated(&s));
    assert_rbac_allows_every_request(&s);
}

fn support_validate(s: &ApiServer) {
    let mut written = s.objects(CMS);
    written.extend(s.objects(PODS));
    crate::support::schema::validate_all(&written, &["1.34.0"]);
}

/// Ownerless pod `solo` times out (its entry written), is deleted and created again under
/// its name, waits out its backoff, is admitted again and becomes Ready (not recorded
/// yet: the next pass records it and forgets its entry).
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
    let mut p = pod(s, "solo");
    p["status"] = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-18T12:02:20Z"}]});
    s.put_object(PODS, p);
}

/// A single pod without an owner: recreated under its name, it waits out the backoff;
/// once Ready its entry is forgotten.
#[tokio::test]
async fn an_ownerless_pod_waits_out_its_backoff_and_is_forgotten_once_ready() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    solo_back_and_ready(&s, &c).await;
    reconciler::pass(&client, &c, at(80)).await.unwrap();
    assert!(entries(&s).is_empty(), "{:?}", entries(&s));
    assert!(
        s.objects(CMS).is_empty(),
        "no empty ConfigMap left behind: {:?}",
        s.objects(CMS)
    );
    assert!(pod(&s, "solo")["metadata"]["annotations"]["tessera.io/pods-ready-at"].is_string());
    support_validate(&s);
    assert_rbac_allows_every_request(&s);
}

/// Forgetting the last entry deletes the ConfigMap with the resourceVersion read as its
/// precondition: another controller replica setting an entry between our read and our
/// DELETE makes it 409, and the entry survives (merged again, written with a PUT).
#[tokio::test]
async fn the_last_entry_forgotten_deletes_the_configmap_but_not_a_racing_entry() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    solo_back_and_ready(&s, &c).await;
    let other = json!({"workload": "team/pod-other", "count": 1,
                       "evictedAt": "2026-11-18T12:01:30Z"})
    .to_string();
    s.before_next_write("DELETE", CMS, move |s: &ApiServer| {
        let mut cm = s.objects(CMS).remove(0);
        cm["data"]["pod-other"] = json!(other);
        s.put_object(CMS, cm);
    });
    reconciler::pass(&client, &c, at(80)).await.unwrap();
    let keys: Vec<String> = entries(&s).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["pod-other"], "the racing entry kept, ours forgotten");
    let deletes = s
        .requests()
        .iter()
        .filter(|r| r.starts_with("DELETE ") && r.contains(CMS))
        .count();
    assert_eq!(deletes, 1, "one DELETE, refused: {:?}", s.requests());
    support_validate(&s);
    assert_rbac_allows_every_request(&s);
}

/// The state write fails: no pod is evicted (so none can come back early) until it is
/// written. Another controller replica writes the same ConfigMap between our read and
/// our write (create, then update): both writers' entries survive.
#[tokio::test]
async fn a_failed_or_racing_state_write_loses_nothing() {
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_group(&s);
    reconciler::pass(&client, &c, at(0)).await.unwrap();

    s.fail_requests(&["POST", "PUT"], CMS);
    let plan = reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert!(!plan.actions.is_empty());
    assert!(s.evictions().is_empty(), "{:?}", s.evictions());
    assert!(group_ungated(&s) && entries(&s).is_empty());
    s.stop_failing();

    // The other replica creates the ConfigMap first: our POST gets AlreadyExists.
    let other = |count: u32| {
        json!({"workload": "team/group-other", "count": count,
               "evictedAt": "2026-11-18T12:00:30Z"})
        .to_string()
    };
    let first = other(3);
    s.before_next_write("POST", CMS, move |s: &ApiServer| {
        s.put_object(
            CMS,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": STATE, "namespace": "team",
                                "labels": {"tessera.io/requeue-state": "v1"}},
                   "data": {"group-other": first}}),
        )
    });
    reconciler::pass(&client, &c, at(61)).await.unwrap();
    assert_eq!(s.evictions().len(), 2, "evicted once the state is written");
    assert_eq!(count(&s, "group-g"), Some(1));
    assert_eq!(count(&s, "group-other"), Some(3));

    // Readmitted after the backoff and Ready: forgetting group-g races with the other
    // replica moving group-other on; our PUT conflicts, is merged again, keeps it.
    recreate_group(&s);
    reconciler::pass(&client, &c, at(71)).await.unwrap();
    assert!(group_ungated(&s));
    for name in ["g-0", "g-1"] {
        let mut p = pod(&s, name);
        p["status"] = json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-18T12:02:20Z"}]});
        s.put_object(PODS, p);
    }
    let second = other(4);
    s.before_next_write("PUT", CMS, move |s: &ApiServer| {
        let mut cm = s.objects(CMS).remove(0);
        cm["data"]["group-other"] = json!(second);
        s.put_object(CMS, cm);
    });
    reconciler::pass(&client, &c, at(80)).await.unwrap();
    let keys: BTreeSet<String> = entries(&s).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["group-other".to_string()].into());
    assert_eq!(count(&s, "group-other"), Some(4));
    let conflicts = s
        .requests()
        .iter()
        .filter(|r| r.starts_with("PUT ") && r.contains(CMS))
        .count();
    assert!(conflicts >= 2, "a PUT retried after its 409: {conflicts}");
    support_validate(&s);
    assert_rbac_allows_every_request(&s);
}

/// Corrupt entries are reported as problems of the pass and ignored: the group they
/// would name is admitted as if nothing were recorded, and nothing panics.
#[tokio::test]
async fn corrupt_entries_are_reported_and_ignored() {
    let s = cluster().await;
    let client = s.client();
    let c = config(1);
    s.put_object(
        CMS,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": STATE, "namespace": "team",
                            "labels": {"tessera.io/requeue-state": "v1"}},
               "data": {"group-g": "{\"count\": ", "pod-x": "{\"workload\":\"team/pod-x\",\"count\":1,\"evictedAt\":\"soon\"}"}}),
    );
    create_group(&s);
    let plan = reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert!(group_ungated(&s));
    let problems: Vec<&String> = plan
        .problems
        .iter()
        .filter(|p| p.contains("tessera-requeue-state"))
        .collect();
    assert_eq!(problems.len(), 2, "{:?}", plan.problems);
    assert!(problems
        .iter()
        .any(|p| p.contains("entry \"pod-x\": field evictedAt")));
    // Timed out: its entry is written over the corrupt one.
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    assert_eq!(count(&s, "group-g"), Some(1));
    assert_rbac_allows_every_request(&s);
}

/// An admission decided from a view that missed the state (a cache whose ConfigMap
/// lags behind its pods, e.g. a new leader's) is checked against the ConfigMap on the
/// API server before it is written: deferred while the state holds the group back.
#[tokio::test]
async fn an_admission_decided_without_the_state_waits_for_it() {
    use std::collections::BTreeMap;
    use tessera::controller::decide::{Action, ObjKind, ObjRef, Plan};
    use tessera::controller::evictions::EvictionBackoff;
    let s = cluster().await;
    let client = s.client();
    let c = config(3);
    create_group(&s);
    let entry = json!({"workload": "team/group-g", "count": 1,
                       "evictedAt": "2026-11-18T12:01:00Z"});
    s.put_object(
        CMS,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": STATE, "namespace": "team",
                            "labels": {"tessera.io/requeue-state": "v1"}},
               "data": {"group-g": entry.to_string()}}),
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
