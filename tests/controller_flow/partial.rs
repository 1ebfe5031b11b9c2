//! Partial admission through the controller: a pod group with
//! `tessera.io/pod-group-min-count` runs with the pods that fit (the others deleted,
//! never one changed since it was read), and a Job with
//! `kueue.x-k8s.io/job-min-parallelism` runs with lower parallelism, put back when it
//! is preempted so it queues with its full size.

use super::*;

fn group_pod(s: &ApiServer, name: &str, total: u32, min: u32) {
    create_pod(
        s,
        name,
        1,
        "low",
        json!({"tessera.io/pod-group-name": "g"}),
        Some(total),
    );
    let mut p = pod(s, name);
    p["metadata"]["annotations"]["tessera.io/pod-group-min-count"] = json!(min.to_string());
    s.put_object(PODS, p);
}

fn names(s: &ApiServer) -> BTreeSet<String> {
    s.objects(PODS)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_pod_group_runs_with_the_pods_that_fit_and_the_rest_is_deleted() {
    let s = cluster().await;
    let client = s.client();
    create_pod(&s, "solo", 1, "low", json!({}), None);
    reconciler::pass(&client, &cfg("a"), NOW).await.unwrap();
    // Five pods that may run with two; three GPUs are left.
    for i in 0..5 {
        group_pod(&s, &format!("g-{i}"), 5, 2);
    }
    // Another client changes g-4 between the controller's read and its DELETE (the
    // second DELETE; g-3's comes first).
    s.before_next_write("DELETE", PODS, |_: &ApiServer| {});
    s.before_next_write("DELETE", PODS, |s: &ApiServer| {
        let mut p = pod(s, "g-4");
        p["metadata"]["labels"]["team"] = json!("vision");
        s.put_object(PODS, p);
    });
    let plan = reconciler::pass(&client, &cfg("a"), NOW + 1_000)
        .await
        .unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(
        ungated_pods(&s),
        ["g-0", "g-1", "g-2", "solo"].map(String::from).into()
    );
    for name in ["g-0", "g-1", "g-2"] {
        assert_eq!(
            pod(&s, name)["metadata"]["annotations"]["tessera.io/admitted-count"],
            "3"
        );
    }
    // g-3 deleted (not needed), g-4 kept: it changed after it was read (409).
    assert_eq!(
        names(&s),
        ["g-0", "g-1", "g-2", "g-4", "solo"]
            .map(String::from)
            .into()
    );
    assert!(s
        .objects(EVENTS)
        .iter()
        .any(|e| e["reason"] == "NotAdmitted" && e["regarding"]["name"] == "g-3"));
    // The next pass deletes it, and nothing else happens; a restarted controller
    // keeps the same admitted set without a write.
    reconciler::pass(&client, &cfg("a"), NOW + 2_000)
        .await
        .unwrap();
    assert_eq!(
        names(&s),
        ["g-0", "g-1", "g-2", "solo"].map(String::from).into()
    );
    let writes = s.writes();
    let again = reconciler::pass(&client, &cfg("b"), NOW + 3_000)
        .await
        .unwrap();
    assert_eq!(
        again.admitted,
        ["team/group-g", "team/pod-solo"].map(String::from).into()
    );
    assert_eq!(s.writes(), writes, "{:?}", again.actions);
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn a_partially_admitted_job_queues_with_its_full_size_after_preemption() {
    let s = cluster().await;
    let client = s.client();
    let job = |name: &str, class: &str, parallelism: u32, min: Option<u32>| {
        let mut j = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                         "labels": {"tessera.io/queue-name": "lq", "tessera.io/priority-class": class}},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                                  "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}});
        if let Some(m) = min {
            j["metadata"]["annotations"] =
                json!({"kueue.x-k8s.io/job-min-parallelism": m.to_string()});
        }
        patched(j, ("batch", "Job"))
    };
    let get = |name: &str| job_named(&s, name);
    let shape = |name: &str| {
        let j = get(name);
        (
            j["spec"]["suspend"].as_bool().unwrap(),
            j["spec"]["parallelism"].as_u64().unwrap(),
            j["metadata"]["annotations"]["tessera.io/original-parallelism"]
                .as_str()
                .map(String::from),
        )
    };
    // Six workers, at least two, on four GPUs: runs with four.
    s.put_object(JOBS, job("train", "low", 6, Some(2)));
    reconciler::pass(&client, &cfg("a"), NOW).await.unwrap();
    assert_eq!(shape("train"), (false, 4, Some("6".into())));
    // A higher-priority Job of two preempts it: suspended with its six workers again.
    s.put_object(JOBS, job("urgent", "high", 2, None));
    reconciler::pass(&client, &cfg("a"), NOW + 1_000)
        .await
        .unwrap();
    assert_eq!(shape("train"), (true, 6, None));
    // Its pods gone, the preemptor runs and `train` comes back with the two left.
    reconciler::pass(&client, &cfg("a"), NOW + 2_000)
        .await
        .unwrap();
    assert_eq!(shape("urgent"), (false, 2, None));
    assert_eq!(shape("train"), (false, 2, Some("6".into())));
    // A restart keeps both as they are.
    let writes = s.writes();
    reconciler::pass(&client, &cfg("b"), NOW + 3_000)
        .await
        .unwrap();
    assert_eq!(s.writes(), writes);
    assert_rbac_allows_every_request(&s);
}

/// Through the watch-fed cache: the pass right after the partial admission (before any
/// watch event could land) sees the deleted pods gone and writes nothing.
#[tokio::test]
async fn a_cached_pass_reads_the_deletions_of_a_partial_admission() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for i in 0..6 {
        group_pod(&s, &format!("g-{i}"), 6, 2);
    }
    let (mut state, _cache, stop) = super::cache::cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(
        names(&s),
        ["g-0", "g-1", "g-2", "g-3"].map(String::from).into()
    );
    let writes = s.writes();
    let again = pass_at(&client, &c, &mut state, NOW + 1).await;
    assert!(again.actions.is_empty(), "{:?}", again.actions);
    assert_eq!(s.writes(), writes);
    assert_eq!(state.incremental_stats().map(|st| st.full), Some(1));
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}
