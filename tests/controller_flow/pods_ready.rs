//! `waitForPodsReady` through the controller: a workload whose pods are not Ready within
//! the timeout is evicted (a pod through the Eviction API, a Job suspended) and a Job is
//! requeued after an exponential backoff, then deactivated past `backoffLimitCount`; a
//! workload whose pods became Ready is recorded once and never timed out.

use super::*;
use tessera::quota::WaitForPodsReady;

// The Job `name` as stored.
use super::job_named as job;

fn annotation(v: &Value, key: &str) -> Value {
    v["metadata"]["annotations"][key].clone()
}

#[tokio::test]
async fn pods_not_ready_in_time_are_evicted_and_jobs_requeued_with_backoff() {
    let s = cluster().await;
    let client = s.client();
    let c = Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            backoff_limit_count: Some(1),
            requeue_by_eviction_time: true,
            block_admission: false,
        }),
        ..cfg("a")
    };
    let slow = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "slow", "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                     "labels": {"tessera.io/queue-name": "lq"}},
        "spec": {"parallelism": 2, "completions": 2,
                 "template": {"metadata": {"labels": {"app": "slow"}},
                              "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                                       "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}});
    s.put_object(JOBS, patched(slow, ("batch", "Job")));
    create_pod(&s, "web", 1, "low", json!({}), None);
    create_pod(&s, "stuck", 1, "low", json!({}), None);
    let at = |secs: u64| NOW + secs * 1_000;

    reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert_eq!(job(&s, "slow")["spec"]["suspend"], false);
    assert_eq!(ungated_pods(&s), ["stuck", "web"].map(String::from).into());

    // web's container becomes Ready: recorded once, so the timeout no longer applies.
    let mut web = pod(&s, "web");
    web["status"] = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-18T12:01:00Z"}]});
    s.put_object(PODS, web);
    reconciler::pass(&client, &c, at(1)).await.unwrap();
    assert!(annotation(&pod(&s, "web"), "tessera.io/pods-ready-at").is_string());
    let writes = s.writes();
    reconciler::pass(&client, &c, at(30)).await.unwrap();
    assert_eq!(s.writes(), writes, "nothing times out before 60 s");

    // 60 s after admission: the not-ready ones are evicted.
    reconciler::pass(&client, &c, at(60)).await.unwrap();
    let evictions = s.evictions();
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    assert_eq!(evictions[0]["metadata"]["name"], "stuck");
    assert!(pod(&s, "web")["metadata"]["deletionTimestamp"].is_null());
    let slow = job(&s, "slow");
    assert_eq!(slow["spec"]["suspend"], true);
    assert_eq!(annotation(&slow, "tessera.io/requeue-count"), "1");
    assert!(annotation(&slow, "tessera.io/evicted-at").is_string());
    assert!(s.objects(EVENTS).iter().any(|e| e["reason"] == "Evicted"
        && e["regarding"]["name"] == "slow"
        && e["note"].as_str().unwrap().contains("PodsReadyTimeout")));

    // Requeued after the 10 s backoff, not before.
    reconciler::pass(&client, &c, at(61)).await.unwrap();
    let slow = job(&s, "slow");
    assert_eq!(slow["spec"]["suspend"], true);
    assert_eq!(annotation(&slow, "tessera.io/pending-reason"), "Backoff");
    let message = annotation(&slow, "tessera.io/pending-message");
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("requeued at 2026-11-18T12:02:10Z"),
        "{message}"
    );
    reconciler::pass(&client, &c, at(70)).await.unwrap();
    assert_eq!(job(&s, "slow")["spec"]["suspend"], false, "readmitted");

    // Times out again: past backoffLimitCount (1) it is deactivated for good.
    reconciler::pass(&client, &c, at(130)).await.unwrap();
    assert_eq!(job(&s, "slow")["spec"]["suspend"], true);
    assert_eq!(
        annotation(&job(&s, "slow"), "tessera.io/requeue-count"),
        "2"
    );
    reconciler::pass(&client, &c, at(131)).await.unwrap();
    reconciler::pass(&client, &c, at(10_000)).await.unwrap();
    let slow = job(&s, "slow");
    assert_eq!(slow["spec"]["suspend"], true);
    assert_eq!(
        annotation(&slow, "tessera.io/pending-reason"),
        "Deactivated"
    );
    assert!(pod(&s, "web")["metadata"]["deletionTimestamp"].is_null());

    let mut written = s.objects(JOBS);
    written.extend(s.objects(PODS));
    written.extend(s.objects(EVENTS));
    support::schema::validate_all(&written, &["1.34.0"]);
    assert_rbac_allows_every_request(&s);
}

/// Marks a pod's containers Ready (as the kubelet reports it).
pub(super) fn make_ready(s: &ApiServer, name: &str) {
    let mut p = pod(s, name);
    p["status"] = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-18T12:01:00Z"}]});
    s.put_object(PODS, p);
}

/// `waitForPodsReady.blockAdmission` read from the controller's `--config` (Kueue's
/// sequential admission): `second` fits but stays gated (`WaitingForPodsReady`) until
/// `first`'s pods are Ready, then is admitted; without it both start at once. A third
/// pod whose predecessor never gets Ready is admitted when the timeout evicts it.
#[tokio::test]
async fn block_admission_holds_the_next_workload_until_pods_are_ready() {
    let text = "waitForPodsReady:\n  enable: true\n  blockAdmission: true\n  timeout: 1m\n";
    let file = tessera::controller::config::ControllerConfig::parse(text).unwrap();
    let unblocked = WaitForPodsReady {
        block_admission: false,
        ..file.wait_for_pods_ready.clone().unwrap()
    };
    // (pods_ready, both admitted in the first pass)
    let table = [
        (file.wait_for_pods_ready.clone(), false),
        (Some(unblocked), true),
    ];
    for (pods_ready, at_once) in table {
        let s = cluster().await;
        let client = s.client();
        let c = Config {
            pods_ready,
            ..cfg("a")
        };
        let at = |secs: u64| NOW + secs * 1_000;
        create_pod(&s, "first", 1, "high", json!({}), None);
        create_pod(&s, "second", 1, "low", json!({}), None);

        reconciler::pass(&client, &c, at(0)).await.unwrap();
        let both: BTreeSet<String> = ["first", "second"].map(String::from).into();
        if at_once {
            assert_eq!(ungated_pods(&s), both);
            continue;
        }
        assert_eq!(ungated_pods(&s), ["first".to_string()].into());
        assert_eq!(condition(&pod(&s, "second")).0, "WaitingForPodsReady");
        reconciler::pass(&client, &c, at(10)).await.unwrap();
        assert!(gated(&pod(&s, "second")), "first's pods are not Ready yet");

        make_ready(&s, "first");
        reconciler::pass(&client, &c, at(20)).await.unwrap();
        assert_eq!(ungated_pods(&s), both, "admitted once first is Ready");
        assert!(annotation(&pod(&s, "first"), "tessera.io/pods-ready-at").is_string());

        // second never gets Ready: third waits for second's timeout (1m after 20 s).
        create_pod(&s, "third", 1, "low", json!({}), None);
        reconciler::pass(&client, &c, at(30)).await.unwrap();
        assert!(gated(&pod(&s, "third")));
        assert_eq!(condition(&pod(&s, "third")).0, "WaitingForPodsReady");
        reconciler::pass(&client, &c, at(79)).await.unwrap();
        assert!(s.evictions().is_empty(), "{:?}", s.evictions());
        assert!(gated(&pod(&s, "third")));
        reconciler::pass(&client, &c, at(80)).await.unwrap();
        let evicted: Vec<Value> = s.evictions();
        assert_eq!(evicted.len(), 1, "{evicted:?}");
        assert_eq!(evicted[0]["metadata"]["name"], "second");
        assert!(!gated(&pod(&s, "third")), "admitted once second is evicted");
        assert_rbac_allows_every_request(&s);
    }
}

/// A serving replica (Deployment `web` through its ReplicaSet) whose pods are not Ready
/// in time: the pod is evicted and the requeue recorded on it and on the Deployment,
/// which outlives it, so the replacement pod the ReplicaSet creates waits out the 10 s
/// backoff; after a second timeout (past `backoffLimitCount` 1) the next replacement
/// stays gated as `Deactivated`.
#[tokio::test]
async fn a_replica_not_ready_in_time_is_requeued_with_backoff_through_its_owner() {
    use super::serving::{cohort, scale, DEPLOYMENTS};
    let s = cohort("nvidia.com/gpu").await;
    let client = s.client();
    let c = Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            backoff_limit_count: Some(1),
            requeue_by_eviction_time: true,
            block_admission: false,
        }),
        ..cfg("a")
    };
    let at = |secs: u64| NOW + secs * 1_000;
    let deployment = |s: &ApiServer| s.objects(DEPLOYMENTS).remove(0);
    // The only replica (a new object after each replacement).
    let web = |s: &ApiServer| {
        s.objects(PODS)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == "web")
            .unwrap()
    };
    // The evicted replica is gone; the ReplicaSet creates a new pod (no annotations).
    let replace = |s: &ApiServer| {
        let name = web(s)["metadata"]["name"].as_str().unwrap().to_string();
        s.delete_object(PODS, &name);
        scale(s, 1);
        assert!(annotation(&web(s), "tessera.io/requeue-count").is_null());
    };
    scale(&s, 1);
    reconciler::pass(&client, &c, at(0)).await.unwrap();
    assert!(!gated(&web(&s)));

    reconciler::pass(&client, &c, at(60)).await.unwrap();
    let evicted: Vec<Value> = s.evictions();
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!(
        annotation(&web(&s), "tessera.io/requeue-count"),
        "1",
        "on the pod too"
    );
    assert_eq!(annotation(&deployment(&s), "tessera.io/requeue-count"), "1");

    replace(&s);
    reconciler::pass(&client, &c, at(61)).await.unwrap();
    let (reason, message) = condition(&web(&s));
    assert_eq!(reason, "Backoff");
    assert!(
        message.contains("requeued at 2026-11-18T12:02:10Z"),
        "{message}"
    );
    reconciler::pass(&client, &c, at(69)).await.unwrap();
    assert!(gated(&web(&s)));
    reconciler::pass(&client, &c, at(70)).await.unwrap();
    assert!(!gated(&web(&s)), "admitted after the backoff");

    reconciler::pass(&client, &c, at(130)).await.unwrap();
    assert_eq!(s.evictions().len(), 2);
    assert_eq!(annotation(&deployment(&s), "tessera.io/requeue-count"), "2");
    replace(&s);
    reconciler::pass(&client, &c, at(131)).await.unwrap();
    reconciler::pass(&client, &c, at(10_000)).await.unwrap();
    assert!(gated(&web(&s)));
    assert_eq!(condition(&web(&s)).0, "Deactivated");

    let mut written = s.objects(PODS);
    written.extend(s.objects(DEPLOYMENTS));
    support::schema::validate_all(&written, &["1.34.0"]);
    assert_rbac_allows_every_request(&s);
}
