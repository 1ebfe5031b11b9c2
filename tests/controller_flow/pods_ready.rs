//! `waitForPodsReady` through the controller: a workload whose pods are not Ready within
//! the timeout is evicted (a pod through the Eviction API, a Job suspended) and a Job is
//! requeued after an exponential backoff, then deactivated past `backoffLimitCount`; a
//! workload whose pods became Ready is recorded once and never timed out.

use super::*;
use tessera::quota::WaitForPodsReady;

fn job(s: &ApiServer, name: &str) -> Value {
    s.objects(JOBS)
        .into_iter()
        .find(|j| j["metadata"]["name"] == name)
        .unwrap()
}

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
}
