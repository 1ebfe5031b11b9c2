//! Serving replicas (a Deployment through its ReplicaSet) and DRA claims through the
//! controller, in a cohort shared with training: replicas are admitted up to quota one
//! by one, a scale-down returns their quota to the cohort where it admits a training
//! Job, and a scale-up reclaims it.

use super::*;

pub const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/team/deployments";
pub const REPLICASETS: &str = "/apis/apps/v1/namespaces/team/replicasets";
const G: &str = "/apis/tessera.io/v1alpha1";

/// Cohort `pool` of 4 GPUs (flavor h100): ClusterQueue `serve` owns them (reclaims
/// lent quota from anyone), `train` owns none and borrows. LocalQueues `serve-lq` and
/// `train-lq` in namespace `team`. `resource` is the covered resource.
pub async fn cohort(resource: &str) -> ApiServer {
    let s = ApiServer::empty().await;
    s.list_across_namespaces();
    s.put_object(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "labels": {}}}),
    );
    s.put_object(
        &format!("{G}/resourceflavors"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ResourceFlavor",
               "metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}}),
    );
    for (name, gpus, preemption) in [
        ("serve", 4, json!({"reclaimWithinCohort": "Any"})),
        ("train", 0, json!({})),
    ] {
        s.put_object(
            &format!("{G}/clusterqueues"),
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue", "metadata": {"name": name},
                   "spec": {"namespaceSelector": {}, "cohortName": "pool", "preemption": preemption,
                            "resourceGroups": [{"coveredResources": [resource],
                                "flavors": [{"name": "h100", "resources": [{"name": resource, "nominalQuota": gpus}]}]}]}}),
        );
        s.put_object(
            &format!("{G}/namespaces/team/localqueues"),
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
                   "metadata": {"name": format!("{name}-lq"), "namespace": "team"},
                   "spec": {"clusterQueue": name}}),
        );
    }
    s
}

fn deployment(replicas: u32) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "team", "uid": "uid-web"},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web", "tessera.io/queue-name": "serve-lq"}},
                                 "spec": {"containers": [{"name": "serve", "image": "server",
                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}})
}

/// Sets the Deployment's replicas and, as the ReplicaSet controller would, creates the
/// missing pods (through the webhook) or deletes surplus ones, gated pods first.
pub fn scale(s: &ApiServer, replicas: u32) {
    let mut d = s
        .objects(DEPLOYMENTS)
        .into_iter()
        .next()
        .unwrap_or_else(|| deployment(replicas));
    d["spec"]["replicas"] = json!(replicas);
    s.put_object(DEPLOYMENTS, d);
    if s.objects(REPLICASETS).is_empty() {
        s.put_object(
            REPLICASETS,
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": "web-6f9", "namespace": "team", "uid": "uid-rs",
                                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "web", "uid": "uid-web", "controller": true}]},
                   "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                            "template": deployment(replicas)["spec"]["template"].clone()}}),
        );
    }
    let mut pods: Vec<Value> = s
        .objects(PODS)
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .collect();
    // The ReplicaSet controller deletes unscheduled (gated) pods first, newest first.
    pods.sort_by_key(|p| {
        (
            !gated(p),
            std::cmp::Reverse(p["metadata"]["name"].as_str().map(String::from)),
        )
    });
    let have = pods.len() as u32;
    for p in pods.iter().take(have.saturating_sub(replicas) as usize) {
        assert!(s.delete_object(PODS, p["metadata"]["name"].as_str().unwrap()));
    }
    let first = s
        .objects(PODS)
        .iter()
        .filter_map(|p| {
            p["metadata"]["name"]
                .as_str()?
                .strip_prefix("web-6f9-")?
                .parse::<u32>()
                .ok()
        })
        .max()
        .map_or(0, |n| n + 1);
    for next in first..first + replicas.saturating_sub(have) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-6f9-{next}"), "namespace": "team",
                         "creationTimestamp": "2026-11-18T12:00:00Z",
                         "labels": {"app": "web", "tessera.io/queue-name": "serve-lq"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "web-6f9", "uid": "uid-rs", "controller": true, "blockOwnerDeletion": true}]},
            "spec": deployment(replicas)["spec"]["template"]["spec"].clone()});
        s.put_object(PODS, patched(pod, ("", "Pod")));
    }
}

fn web_pods(s: &ApiServer) -> (usize, usize) {
    let pods: Vec<Value> = s
        .objects(PODS)
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .collect();
    let gated_n = pods.iter().filter(|p| gated(p)).count();
    (pods.len() - gated_n, gated_n)
}

fn training_job(name: &str, resources: Value) -> Value {
    let j = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                     "labels": {"tessera.io/queue-name": "train-lq"}},
        "spec": {"parallelism": 2, "completions": 2,
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "x", "resources": resources}]}}}});
    patched(j, ("batch", "Job"))
}

// The Job `name` as stored.
use super::job_named as job;

fn cq_status(s: &ApiServer, name: &str) -> Value {
    s.object(&format!("{G}/clusterqueues"), name)
        .map(|q| q["status"].clone())
        .unwrap_or(Value::Null)
}

fn admitted_replicas(s: &ApiServer) -> Value {
    s.objects(DEPLOYMENTS)[0]["metadata"]["annotations"]["tessera.io/admitted-replicas"].clone()
}

#[tokio::test]
async fn serving_replicas_hold_quota_and_a_scale_down_returns_it_to_training() {
    let s = cohort("nvidia.com/gpu").await;
    let client = s.client();
    let c = cfg("a");

    // Scale up: every replica fits the serving queue's nominal quota.
    scale(&s, 3);
    assert_eq!(web_pods(&s), (0, 3), "the webhook gated the replicas");
    let plan = reconciler::pass(&client, &c, NOW).await.unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(web_pods(&s), (3, 0));
    assert_eq!(admitted_replicas(&s), "3/3");
    assert_eq!(cq_status(&s, "serve")["admittedWorkloads"], 3);
    // Pods and Jobs are listed by Tessera's queue label (Kueue's is not accepted by
    // default), never the whole cluster.
    let lists: Vec<String> = s
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /api/v1/pods?") || r.starts_with("GET /apis/batch/v1/jobs?"))
        .collect();
    assert!(
        lists.len() == 2 && lists.iter().all(|r| r.contains("labelSelector=tessera.io")),
        "{lists:?}"
    );

    // A training Job of 2 x 1 GPU: one GPU is left in the cohort, it waits.
    s.put_object(
        JOBS,
        training_job("train", json!({"limits": {"nvidia.com/gpu": 1}})),
    );
    reconciler::pass(&client, &c, NOW + 1_000).await.unwrap();
    assert_eq!(job(&s, "train")["spec"]["suspend"], true);

    // Scale to 5: one more replica fits (4 GPUs), the fifth waits with a reason that
    // names its Deployment.
    scale(&s, 5);
    reconciler::pass(&client, &c, NOW + 2_000).await.unwrap();
    assert_eq!(web_pods(&s), (4, 1));
    assert_eq!(admitted_replicas(&s), "4/5");
    let waiting = s.objects(PODS).into_iter().find(gated).unwrap();
    let (reason, message) = condition(&waiting);
    assert_eq!(reason, "WaitingForQuota", "{message}");
    assert!(
        message.starts_with("replica of Deployment team/web (4 of 5 admitted): "),
        "{message}"
    );
    assert_eq!(job(&s, "train")["spec"]["suspend"], true);

    // Scale down to 2: the waiting replica and two running ones go; their quota goes
    // back to the cohort, where the training Job borrows it.
    scale(&s, 2);
    assert_eq!(web_pods(&s), (2, 0));
    reconciler::pass(&client, &c, NOW + 3_000).await.unwrap();
    let train = job(&s, "train");
    assert_eq!(
        train["spec"]["suspend"], false,
        "admitted with the freed quota"
    );
    assert_eq!(
        train["spec"]["template"]["spec"]["nodeSelector"]["gpu"],
        "h100"
    );
    assert_eq!(admitted_replicas(&s), "2/2");
    assert_eq!(cq_status(&s, "train")["admittedWorkloads"], 1);
    assert_eq!(cq_status(&s, "serve")["admittedWorkloads"], 2);

    // Scale back up to 4: serving reclaims its lent quota, the Job is suspended, and
    // once its pods are gone the new replicas run.
    scale(&s, 4);
    reconciler::pass(&client, &c, NOW + 4_000).await.unwrap();
    assert_eq!(job(&s, "train")["spec"]["suspend"], true, "reclaimed");
    reconciler::pass(&client, &c, NOW + 5_000).await.unwrap();
    assert_eq!(web_pods(&s), (4, 0));
    assert_eq!(admitted_replicas(&s), "4/4");

    // Every object the controller wrote is valid for the API server.
    let mut written = s.objects(DEPLOYMENTS);
    written.extend(s.objects(PODS));
    written.extend(s.objects(JOBS));
    written.extend(s.objects(EVENTS));
    support::schema::validate_all(&written, &["1.34.0"]);
    assert_rbac_allows_every_request(&s);
}

/// A coupled scale-down's hold, as the autoscaler records it on the Deployment
/// (`tests/autoscaler_live.rs` shows it written), through watch-fed incremental passes:
/// the held GPUs go to a training Job that checkpoints every two minutes, not to one
/// that never checkpoints; a restarted controller holds them still; once the hold ends
/// the second Job is admitted.
#[tokio::test]
async fn a_scale_down_hold_lends_only_to_cheap_training_across_a_restart() {
    let s = cohort("nvidia.com/gpu").await;
    let client = s.client();
    let c = cfg("a");
    scale(&s, 4);
    let (mut state, cache, stop) = super::cache::cached(&s, &c).await;
    pass_at(&client, &c, &mut state, NOW).await;
    assert_eq!(web_pods(&s), (4, 0));

    // Scaled down from 4 to 1, holding for ten minutes what the 4 used.
    let mut web = s.objects(DEPLOYMENTS)[0].clone();
    web["metadata"]["annotations"]["tessera.io/hold-freed"] = json!(format!(
        r#"{{"replicas":4,"until":"{}","maxReworkSeconds":300}}"#,
        tessera::controller::time::rfc3339(NOW + 600_000)
    ));
    s.put_object(DEPLOYMENTS, web);
    scale(&s, 1);
    let mut cheap = training_job("train-short", json!({"limits": {"nvidia.com/gpu": 1}}));
    cheap["spec"]["parallelism"] = json!(1);
    cheap["spec"]["completions"] = json!(1);
    cheap["metadata"]["annotations"] = json!({"tessera.io/checkpoint-interval": "2m"});
    s.put_object(JOBS, cheap);
    s.put_object(
        JOBS,
        training_job("train-long", json!({"limits": {"nvidia.com/gpu": 1}})),
    );
    let seen = |cache: &tessera::controller::cache::Cache| {
        cache.jobs.iter().map(|j| j.len()).sum::<usize>() == 2
            && cache.pods.iter().map(|p| p.len()).sum::<usize>() == 1
            && cache.deployments.values()[0]["metadata"]["annotations"]["tessera.io/hold-freed"]
                .is_string()
    };
    super::wait_for("the scale-down and the Jobs in the cache", || seen(&cache)).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 1_000).await;
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(
        job(&s, "train-short")["spec"]["suspend"],
        false,
        "cheap to reclaim"
    );
    assert_eq!(
        job(&s, "train-long")["spec"]["suspend"],
        true,
        "held from it"
    );
    assert_eq!(
        plan.next_timer,
        Some(NOW + 600_000),
        "woken when the hold ends"
    );

    // A restarted controller reads the hold back from the Deployment.
    stop.cancel();
    let c = cfg("b");
    let (mut state, _cache, stop) = super::cache::cached(&s, &c).await;
    let plan = pass_at(&client, &c, &mut state, NOW + 2_000).await;
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(job(&s, "train-long")["spec"]["suspend"], true, "still held");
    assert_eq!(job(&s, "train-short")["spec"]["suspend"], false);

    // The hold ends: the long Job borrows the GPUs.
    pass_at(&client, &c, &mut state, NOW + 600_000).await;
    assert_eq!(
        job(&s, "train-long")["spec"]["suspend"],
        false,
        "hold ended"
    );
    stop.cancel();
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn pods_are_charged_for_their_resource_claim_templates_by_device_class() {
    let s = cohort("gpu.tessera.io").await;
    let client = s.client();
    let c = cfg("a");
    let templates = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates";
    s.put_object(
        templates,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": "two-gpus", "namespace": "team"},
               "spec": {"spec": {"devices": {"requests": [
                   {"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 2}}]}}}}),
    );
    support::schema::validate_all(&s.objects(templates), &["1.34.0"]);
    let claiming = |name: &str, template: &str| {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                         "labels": {"tessera.io/queue-name": "serve-lq"}},
            "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}]}});
        s.put_object(PODS, patched(pod, ("", "Pod")));
    };
    // 4 GPUs of class gpu.tessera.io: two pods of 2 fit, the third waits.
    for name in ["a", "b", "c"] {
        claiming(name, "two-gpus");
    }
    claiming("d", "missing");
    let plan = reconciler::pass(&client, &c, NOW).await.unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(ungated_pods(&s), ["a", "b"].map(String::from).into());
    assert_eq!(condition(&pod(&s, "c")).0, "WaitingForQuota");
    let (reason, message) = condition(&pod(&s, "d"));
    assert_eq!(reason, "ResourceClaimTemplateNotFound");
    assert!(message.contains("team/missing"), "{message}");
    support::schema::validate_all(&s.objects(PODS), &["1.34.0"]);

    // A training Job whose pods claim through the same template is charged 2 x 2.
    s.put_object(
        JOBS,
        training_job("train", json!({"claims": [{"name": "gpus"}]})),
    );
    let mut j = job(&s, "train");
    j["spec"]["template"]["spec"]["resourceClaims"] =
        json!([{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]);
    s.put_object(JOBS, j);
    assert!(s.delete_object(PODS, "a"));
    assert!(s.delete_object(PODS, "b"));
    reconciler::pass(&client, &c, NOW + 1_000).await.unwrap();
    // c (2 GPUs) is admitted first (older); the Job needs 4 and waits.
    assert!(!gated(&pod(&s, "c")));
    assert_eq!(job(&s, "train")["spec"]["suspend"], true);
    assert!(s.delete_object(PODS, "c"));
    reconciler::pass(&client, &c, NOW + 2_000).await.unwrap();
    assert_eq!(job(&s, "train")["spec"]["suspend"], false);
    assert_rbac_allows_every_request(&s);
}
