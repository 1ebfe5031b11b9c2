//! The `Workload` records (`tessera.io/v1alpha1`): one per workload, created by the
//! controller on first sight, owned by the workload's pods or Job; they show the queue,
//! the admission (ClusterQueue, flavor per resource, count), the conditions (QuotaReserved,
//! Admitted, Evicted) and a pending workload's reason and place in its ClusterQueue, as
//! the CRD declares them (no field the API server would prune); an unchanged record is
//! never written again, also by a restarted controller reading them from its cache; a
//! failed write is retried by the next pass; a finished workload's record says so
//! (`Finished`).

use super::cache::cached;
use super::{assert_rbac_allows_every_request, cfg, cluster, create_pod, pass_at, pod, NOW, PODS};
use crate::support::apiserver::ApiServer;
use serde_json::{json, Value};
use tessera::controller::reconciler;

const WORKLOADS: &str = "/apis/tessera.io/v1alpha1/namespaces/team/workloads";

fn record(s: &ApiServer, name: &str) -> Value {
    s.object(WORKLOADS, name)
        .unwrap_or_else(|| panic!("no Workload {name} in {:?}", s.objects(WORKLOADS)))
}

/// The (status, reason) of condition `type_` of `w`.
fn cond(w: &Value, type_: &str) -> (String, String) {
    let c = w["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition on {w}"));
    (
        c["status"].as_str().unwrap_or("").to_string(),
        c["reason"].as_str().unwrap_or("").to_string(),
    )
}

fn record_writes(s: &ApiServer) -> usize {
    s.requests()
        .iter()
        .filter(|r| (r.starts_with("PUT ") || r.starts_with("POST ")) && r.contains("/workloads"))
        .count()
}

#[tokio::test]
async fn every_workload_has_a_record_of_its_admission_conditions_and_place() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["low-1", "low-2", "low-3", "low-4"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    reconciler::pass(&client, &c, NOW).await.unwrap();
    let records = s.objects(WORKLOADS);
    assert_eq!(records.len(), 4, "{records:?}");

    let admitted = record(&s, "pod-low-1");
    assert_eq!(
        admitted["metadata"]["annotations"]["tessera.io/workload-key"],
        "team/pod-low-1"
    );
    assert_eq!(admitted["spec"]["queueName"], "lq");
    assert_eq!(admitted["spec"]["priorityClassName"], "low");
    assert_eq!(admitted["spec"]["priority"], 10);
    assert_eq!(admitted["spec"]["podSets"][0]["count"], 1);
    assert_eq!(
        admitted["spec"]["podSets"][0]["requests"]["nvidia.com/gpu"],
        "2"
    );
    let admission = &admitted["status"]["admission"];
    assert_eq!(admission["clusterQueue"], "cq");
    assert_eq!(
        admission["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"],
        "h100"
    );
    assert_eq!(
        cond(&admitted, "Admitted"),
        ("True".into(), "Admitted".into())
    );
    assert_eq!(cond(&admitted, "QuotaReserved").0, "True");
    let owner = &admitted["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Pod"), Some("low-1"))
    );
    assert_eq!(owner["uid"], pod(&s, "low-1")["metadata"]["uid"]);

    let (third, fourth) = (record(&s, "pod-low-3"), record(&s, "pod-low-4"));
    assert_eq!(
        cond(&third, "QuotaReserved"),
        ("False".into(), "WaitingForQuota".into())
    );
    assert_eq!(cond(&third, "Admitted").0, "False");
    assert!(third["status"].get("admission").is_none());
    assert_eq!(third["status"]["positionInClusterQueue"], "1");
    assert_eq!(fourth["status"]["positionInClusterQueue"], "2");
    crate::support::schema::validate_custom(
        &s.objects(WORKLOADS),
        "daemonset/controller/crds.yaml",
    );

    // Nothing changed: no record is written again.
    let writes = record_writes(&s);
    reconciler::pass(&client, &c, NOW + 1_000).await.unwrap();
    assert_eq!(record_writes(&s), writes);

    // A high-priority pod preempts one of the running ones.
    create_pod(&s, "high-1", 2, "high", json!({}), None);
    reconciler::pass(&client, &c, NOW + 2_000).await.unwrap();
    let victim = s.evictions()[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let evicted = record(&s, &format!("pod-{victim}"));
    assert_eq!(cond(&evicted, "Evicted").0, "True");
    assert_eq!(cond(&evicted, "Admitted").0, "False");
    assert!(evicted["status"].get("admission").is_none());
    let high = record(&s, "pod-high-1");
    assert_eq!(
        cond(&high, "QuotaReserved").1,
        "WaitingForPreemptedWorkloads"
    );
    assert_eq!(high["spec"]["priority"], 1000);

    // The victim's pod is gone (its record goes with it, by the garbage collector in a
    // real cluster): the preemptor is admitted, the transition time of a condition that
    // did not change is kept.
    assert!(s.delete_object(PODS, &victim));
    reconciler::pass(&client, &c, NOW + 3_000).await.unwrap();
    let high = record(&s, "pod-high-1");
    assert_eq!(cond(&high, "Admitted").0, "True");
    assert!(high["status"].get("positionInClusterQueue").is_none());
    assert_eq!(high["status"]["admission"]["clusterQueue"], "cq");
    crate::support::schema::validate_custom(
        &s.objects(WORKLOADS),
        "daemonset/controller/crds.yaml",
    );
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn a_restarted_controller_reads_the_records_and_writes_none_twice() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["low-1", "low-2", "low-3"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    let (mut state, cache, stop) = cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;
    state.records_written().await;
    assert_eq!(s.objects(WORKLOADS).len(), 3);
    let writes = record_writes(&s);
    stop.cancel();
    drop(cache);

    // A new leader with a fresh cache: the records are read, none is created or written
    // again, and a workload admitted later is recorded on top of the stored record.
    let c = cfg("b");
    let (mut state, cache, stop) = cached(&s, &c).await;
    super::wait_for("the records' first LIST", || cache.records.synced()).await;
    assert_eq!(cache.records.len(), 3);
    pass_at(&client, &c, &mut state, NOW + 1_000).await;
    assert_eq!(record_writes(&s), writes, "{:?}", s.requests());
    assert!(s.delete_object(PODS, "low-1"));
    super::wait_for("the deletion in the cache", || {
        cache
            .pods
            .iter()
            .all(|p| p.get(&("team".into(), "low-1".into())).is_none())
    })
    .await;
    pass_at(&client, &c, &mut state, NOW + 2_000).await;
    let third = record(&s, "pod-low-3");
    assert_eq!(cond(&third, "Admitted").0, "True");
    let names: Vec<String> = s
        .objects(WORKLOADS)
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        names,
        ["pod-low-2", "pod-low-3"],
        "no second record for one workload; low-1's collected with its pod"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_record_that_could_not_be_written_is_written_by_the_next_pass() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    create_pod(&s, "low-1", 2, "low", json!({}), None);
    s.fail_requests(&["POST"], WORKLOADS);
    let mut state = reconciler::PassState::new(&c);
    pass_at(&client, &c, &mut state, NOW).await;
    assert!(s.objects(WORKLOADS).is_empty());
    assert_eq!(
        super::ungated_pods(&s).len(),
        1,
        "admission does not wait for its record"
    );
    s.stop_failing();
    // Nothing else changed: the next pass has no action, and still writes the record.
    let plan = pass_at(&client, &c, &mut state, NOW + 1_000).await;
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(cond(&record(&s, "pod-low-1"), "Admitted").0, "True");
}

/// GPUs requested by the pods not gated (running, or terminating and still holding them).
fn held_gpus(s: &ApiServer) -> i64 {
    s.objects(PODS)
        .iter()
        .filter(|p| !super::gated(p))
        .map(|p| {
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                .as_i64()
                .unwrap_or(0)
        })
        .sum()
}

/// The record name of pod `p`'s workload.
fn record_of(p: &Value) -> String {
    match p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"].as_str() {
        Some(g) => format!("group-{g}"),
        None => format!("pod-{}", p["metadata"]["name"].as_str().unwrap_or("")),
    }
}

/// Two 2-GPU pods running in the 4-GPU queue; then a high-priority 2-GPU pod (preempts
/// one), a group of two 1-GPU pods and a 1-GPU pod arrive.
async fn busy_cluster() -> ApiServer {
    let s = cluster().await;
    for name in ["low-1", "low-2"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    reconciler::pass(&s.client(), &cfg("a"), NOW).await.unwrap();
    create_pod(&s, "high-1", 2, "high", json!({}), None);
    for i in 0..2 {
        let group = json!({"kueue.x-k8s.io/pod-group-name": "g"});
        create_pod(&s, &format!("g-{i}"), 1, "low", group, Some(2));
    }
    create_pod(&s, "low-3", 1, "low", json!({}), None);
    s
}

/// The controller killed after each possible number of writes of a busy pass (an
/// admission, a preemption, pending reasons, records, queue status): a new controller
/// goes on from the API server's objects alone. Whatever the point, the GPUs held never
/// exceed the quota, no running workload is admitted a second time, and once the
/// evicted pod is gone the new controller reaches the same outcome, with every record
/// saying what its pods show.
#[tokio::test]
async fn a_controller_killed_at_any_write_leaves_nothing_a_new_one_admits_twice() {
    let mut outcomes = std::collections::BTreeSet::new();
    let mut kills = 0;
    for k in 0.. {
        let s = busy_cluster().await;
        let client = s.client();
        s.crash_after_writes(k);
        // Dead before its first write: even its reads fail; the pass gives up.
        let _ = reconciler::pass(&client, &cfg("a"), NOW + 1_000).await;
        let crashed = s.crashed();
        kills += usize::from(crashed);
        s.stop_failing();
        assert!(held_gpus(&s) <= 4, "k={k}: {} GPUs held", held_gpus(&s));

        let c = cfg("b");
        let mut state = reconciler::PassState::new(&c);
        for round in 0..4u64 {
            let running_before = super::ungated_pods(&s);
            let plan = pass_at(&client, &c, &mut state, NOW + 2_000 + round * 1_000).await;
            assert!(
                held_gpus(&s) <= 4,
                "k={k} round {round}: {} GPUs held",
                held_gpus(&s)
            );
            for (key, subject) in &plan.subjects {
                let name = key.rsplit_once("/pod-").map_or("", |(_, n)| n);
                assert!(
                    !(subject.admitted_now && running_before.contains(name)),
                    "k={k} round {round}: {key} admitted again while running"
                );
            }
            // The kubelet finishes the evictions.
            for p in s.objects(PODS) {
                if !p["metadata"]["deletionTimestamp"].is_null() {
                    s.delete_object(PODS, p["metadata"]["name"].as_str().unwrap());
                }
            }
        }
        for p in s.objects(PODS) {
            let record = record(&s, &record_of(&p));
            let admitted = cond(&record, "Admitted").0 == "True";
            assert_eq!(
                admitted,
                !super::gated(&p),
                "k={k}: {} vs {record}",
                p["metadata"]["name"]
            );
        }
        let mut running: Vec<String> = super::ungated_pods(&s).into_iter().collect();
        running.sort();
        outcomes.insert(running);
        if !crashed {
            break;
        }
    }
    // The same preemption victim is chosen whatever the crash point.
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert!(kills > 10, "a busy pass makes more than 10 writes: {kills}");
}

/// A workload that ran to completion gets `Finished` on its record, once, as Kueue's
/// workload controller sets it: a lone pod that succeeded, a Job `Complete`, and a pod
/// group only when its last pod is done (`Failed` when one failed, naming it). Found by
/// a cached pass among the pods and Jobs that changed.
#[tokio::test]
async fn a_finished_workload_is_marked_on_its_record_once() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    create_pod(&s, "solo", 1, "low", json!({}), None);
    for name in ["g-0", "g-1"] {
        create_pod(
            &s,
            name,
            1,
            "low",
            json!({"tessera.io/pod-group-name": "g"}),
            Some(2),
        );
    }
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                     "labels": {"tessera.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "low"}},
        "spec": {"parallelism": 1, "completions": 1,
                 "template": {"metadata": {"labels": {"app": "train"}},
                              "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                                       "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}});
    s.put_object(super::JOBS, super::patched(job, ("batch", "Job")));
    let (mut state, cache, stop) = cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;
    for name in ["pod-solo", "group-g", "job-train"] {
        assert_eq!(cond(&record(&s, name), "Admitted").0, "True", "{name}");
    }

    let end = |name: &str, phase: &str| {
        let mut p = pod(&s, name);
        p["status"] = json!({"phase": phase, "message": format!("{name} {phase}")});
        s.put_object(PODS, p);
    };
    end("solo", "Succeeded");
    end("g-0", "Succeeded");
    let mut j = super::job_named(&s, "train");
    j["status"] = json!({"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1});
    s.put_object(super::JOBS, j);
    let seen = |what: &'static str, phase: &'static str, name: &'static str| {
        let cache = cache.clone();
        async move {
            super::wait_for(what, || {
                cache.pods[0]
                    .get(&("team".into(), name.into()))
                    .is_some_and(|p| p["status"]["phase"] == phase)
            })
            .await
        }
    };
    seen("solo done in the cache", "Succeeded", "solo").await;
    seen("g-0 done in the cache", "Succeeded", "g-0").await;
    super::wait_for("the Job done in the cache", || {
        cache.jobs[0]
            .get(&("team".into(), "train".into()))
            .is_some_and(|j| !j["status"]["conditions"].is_null())
    })
    .await;
    pass_at(&client, &c, &mut state, NOW + 1_000).await;
    assert_eq!(
        cond(&record(&s, "pod-solo"), "Finished"),
        ("True".into(), "Succeeded".into())
    );
    assert_eq!(
        cond(&record(&s, "job-train"), "Finished"),
        ("True".into(), "Succeeded".into())
    );
    let group = record(&s, "group-g");
    assert!(
        !group["status"]["conditions"]
            .to_string()
            .contains("Finished"),
        "one pod still runs: {group}"
    );

    end("g-1", "Failed");
    seen("g-1 done in the cache", "Failed", "g-1").await;
    pass_at(&client, &c, &mut state, NOW + 2_000).await;
    let group = record(&s, "group-g");
    assert_eq!(cond(&group, "Finished"), ("True".into(), "Failed".into()));
    let message = group["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Finished"))
        .map(|c| c["message"].to_string())
        .unwrap_or_default();
    assert!(message.contains("pod g-1 failed: g-1 Failed"), "{message}");

    // Written once: nothing changed, nothing written.
    let writes = record_writes(&s);
    pass_at(&client, &c, &mut state, NOW + 3_000).await;
    assert_eq!(record_writes(&s), writes);
    crate::support::schema::validate_custom(
        &s.objects(WORKLOADS),
        "daemonset/controller/crds.yaml",
    );
    assert_rbac_allows_every_request(&s);
    stop.cancel();
}
