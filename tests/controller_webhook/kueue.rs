//! `--accept-kueue-labels` in the controller: off (the default), a pod or Job carrying
//! only Kueue's queue label is Kueue's: the controller neither reads nor writes it
//! (beside a real Kueue, Kueue admits it). On, it is a Tessera workload like one
//! labelled `tessera.io/queue-name`.

use crate::support::apiserver::ApiServer;
use serde_json::{json, Value};
use std::time::Duration;
use tessera::controller::reconciler::{self, Config};

const PODS: &str = "/api/v1/namespaces/team/pods";
const JOBS: &str = "/apis/batch/v1/namespaces/team/jobs";
/// The scenario's clock: objects are created at 12:00, passes run at 12:01.
const NOW: u64 = 1_795_003_260_000;

/// A ClusterQueue of 4 GPUs, LocalQueue `lq` in `team`; a gated pod and a suspended Job
/// labelled only with Kueue's queue label, and one of each with Tessera's.
async fn cluster() -> ApiServer {
    let s = ApiServer::empty().await;
    s.list_across_namespaces();
    s.put_object(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "labels": {}}}),
    );
    let g = "/apis/tessera.io/v1alpha1";
    s.put_object(
        &format!("{g}/resourceflavors"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ResourceFlavor",
               "metadata": {"name": "h100"}, "spec": {}}),
    );
    s.put_object(
        &format!("{g}/clusterqueues"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue", "metadata": {"name": "cq"},
               "spec": {"namespaceSelector": {},
                        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                            "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}}),
    );
    s.put_object(
        &format!("{g}/namespaces/team/localqueues"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
               "metadata": {"name": "lq", "namespace": "team"}, "spec": {"clusterQueue": "cq"}}),
    );
    for (name, label) in [
        ("kueue", "kueue.x-k8s.io/queue-name"),
        ("ours", "tessera.io/queue-name"),
    ] {
        s.put_object(
            PODS,
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "team", "labels": {label: "lq"},
                             "creationTimestamp": "2026-11-18T12:00:00Z"},
                "spec": {"schedulingGates": [{"name": "tessera.io/admission"}],
                         "containers": [{"name": "c", "image": "x",
                                         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}),
        );
        s.put_object(
            JOBS,
            json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": "team", "labels": {label: "lq"},
                             "creationTimestamp": "2026-11-18T12:00:00Z"},
                "spec": {"suspend": true, "parallelism": 1, "completions": 1,
                         "template": {"spec": {"restartPolicy": "Never",
                             "containers": [{"name": "c", "image": "x",
                                             "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}),
        );
    }
    s
}

fn named(s: &ApiServer, collection: &str, name: &str) -> Value {
    s.objects(collection)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap()
}

fn admitted(s: &ApiServer, name: &str) -> (bool, bool) {
    let pod = named(s, PODS, name);
    let ungated = !pod["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| g.iter().any(|x| x["name"] == "tessera.io/admission"));
    let job = named(s, JOBS, name);
    (ungated, job["spec"]["suspend"] == false)
}

fn cfg(accept_kueue_labels: bool) -> Config {
    Config {
        resync: Duration::from_millis(100),
        accept_kueue_labels,
        ..Config::default()
    }
}

#[tokio::test]
async fn kueue_labelled_workloads_are_left_to_kueue_unless_accepted() {
    let s = cluster().await;
    let before = (named(&s, PODS, "kueue"), named(&s, JOBS, "kueue"));
    reconciler::pass(&s.client(), &cfg(false), NOW)
        .await
        .unwrap();
    assert_eq!(
        admitted(&s, "ours"),
        (true, true),
        "Tessera's label: admitted"
    );
    assert_eq!(
        (named(&s, PODS, "kueue"), named(&s, JOBS, "kueue")),
        before,
        "Kueue's label only: untouched (no ungate, no unsuspend, no pending reason)"
    );
    assert!(
        s.requests()
            .iter()
            .all(|r| !r.contains("labelSelector=kueue")),
        "Kueue's objects are not even listed"
    );
    let s = cluster().await;
    reconciler::pass(&s.client(), &cfg(true), NOW)
        .await
        .unwrap();
    assert_eq!(admitted(&s, "ours"), (true, true));
    assert_eq!(
        admitted(&s, "kueue"),
        (true, true),
        "accepted: admitted too"
    );
    crate::support::rbac::assert_allows_every_request(&s, "daemonset/controller/rbac.yaml");
}
