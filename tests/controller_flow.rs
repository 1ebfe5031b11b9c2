//! The quota controller against the API-server double: pods gated by the webhook are
//! admitted within quota (the rest keep the gate and get a reason), a higher-priority
//! arrival evicts a victim through the Eviction API with its grace period, Jobs are
//! suspended and unsuspended, a restart keeps the admitted set, of two instances only
//! the Lease holder acts, and a clean shutdown hands the Lease over at once; passes
//! that read the watch-fed cache (`controller_flow/cache.rs`) keep the same guarantees;
//! its metrics count what it did (`controller_flow/metrics.rs`); the double behaves as
//! a real API server where those clients rely on it (`controller_flow/double.rs`).

mod support;

#[path = "controller_flow/assumed.rs"]
mod assumed;
#[path = "controller_flow/cache.rs"]
mod cache;
#[path = "controller_flow/disruption.rs"]
mod disruption;
#[path = "controller_flow/double.rs"]
mod double;
#[path = "controller_flow/metrics.rs"]
mod metrics;
#[path = "controller_flow/partial.rs"]
mod partial;
#[path = "controller_flow/pods_ready.rs"]
mod pods_ready;
#[path = "controller_flow/requeue_state.rs"]
mod requeue_state;
#[path = "controller_flow/serving.rs"]
mod serving;
#[path = "controller_flow/workloads.rs"]
mod workloads;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use support::apiserver::ApiServer;
use tessera::controller::decide::Action;
use tessera::controller::reconciler::{self, Config, SystemClock};
use tessera::controller::webhook::{decide as webhook, request as admission_request, Verdict};
use tokio_util::sync::CancellationToken;

const PODS: &str = "/api/v1/namespaces/team/pods";
const JOBS: &str = "/apis/batch/v1/namespaces/team/jobs";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events";
const GATE: &str = "tessera.io/admission";
/// The scenario's clock: pods are created at 12:00, passes run at 12:01.
const NOW: u64 = 1_795_003_260_000;

/// One pass at `at`, which must not fail.
async fn pass_at(
    client: &kube::Client,
    c: &Config,
    state: &mut reconciler::PassState,
    at: u64,
) -> tessera::controller::decide::Plan {
    reconciler::pass_with(client, c, state, at).await.unwrap()
}

fn cfg(identity: &str) -> Config {
    Config {
        lease_namespace: "tessera-system".into(),
        lease_name: "tessera-controller".into(),
        identity: identity.into(),
        lease_duration: 2_000,
        resync: Duration::from_millis(100),
        reporting_controller: "tessera.io/controller".into(),
        ..Config::default()
    }
}

/// One ClusterQueue of 4 GPUs (flavor h100, node label gpu=h100) whose workloads preempt
/// lower priorities, a LocalQueue `lq` in namespace `team`, classes low (10) and high (1000).
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
               "metadata": {"name": "h100"}, "spec": {"nodeLabels": {"gpu": "h100"}}}),
    );
    s.put_object(
        &format!("{g}/clusterqueues"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue", "metadata": {"name": "cq"},
               "spec": {"namespaceSelector": {},
                        "preemption": {"withinClusterQueue": "LowerPriority"},
                        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                            "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}}),
    );
    s.put_object(
        &format!("{g}/namespaces/team/localqueues"),
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "LocalQueue",
               "metadata": {"name": "lq", "namespace": "team"}, "spec": {"clusterQueue": "cq"}}),
    );
    for (name, value) in [("low", 10), ("high", 1000)] {
        s.put_object(
            &format!("{g}/workloadpriorityclasses"),
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "WorkloadPriorityClass",
                   "metadata": {"name": name}, "value": value}),
        );
    }
    s
}

/// The object as the webhook's JSONPatch leaves it (applied as the API server does).
fn patched(mut doc: Value, kind: (&str, &str)) -> Value {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "flow", "operation": "CREATE",
                    "kind": {"group": kind.0, "version": "v1", "kind": kind.1},
                    "resource": {"group": kind.0, "version": "v1", "resource": "objects"},
                    "userInfo": {"username": "alice"}, "object": doc.clone()}});
    let request = admission_request(&review).unwrap();
    let classes = [("low".to_string(), 10), ("high".to_string(), 1000)].into();
    let Verdict::Allow(ops) = webhook(&request, Some(&classes)) else {
        panic!("webhook denied {doc}");
    };
    json_patch::patch(&mut doc, &ops).unwrap();
    doc
}

/// A pod as created through the webhook: gated, priority recorded.
fn create_pod(
    s: &ApiServer,
    name: &str,
    gpus: i64,
    class: &str,
    extra_labels: Value,
    total: Option<u32>,
) {
    let mut labels = json!({"tessera.io/queue-name": "lq", "tessera.io/priority-class": class});
    for (k, v) in extra_labels.as_object().unwrap() {
        labels[k] = v.clone();
    }
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "labels": labels,
                     "creationTimestamp": "2026-11-18T12:00:00Z"},
        "spec": {"terminationGracePeriodSeconds": 45,
                 "containers": [{"name": "train", "image": "trainer",
                                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}});
    if let Some(n) = total {
        pod["metadata"]["annotations"] =
            json!({"kueue.x-k8s.io/pod-group-total-count": n.to_string()});
    }
    s.put_object(PODS, patched(pod, ("", "Pod")));
}

fn pod(s: &ApiServer, name: &str) -> Value {
    s.object(PODS, name).unwrap()
}

/// Every request of the test was allowed by the controller's RBAC.
fn assert_rbac_allows_every_request(s: &ApiServer) {
    support::rbac::assert_allows_every_request(s, "daemonset/controller/rbac.yaml");
}

#[test]
fn request_attributes_are_read_as_the_authorizer_does() {
    let cases = [
        ("GET /api/v1/pods?labelSelector=x", ("", "pods", "list")),
        (
            "GET /api/v1/pods?watch=true&resourceVersion=3",
            ("", "pods", "watch"),
        ),
        ("GET /api/v1/namespaces/team/pods/p", ("", "pods", "get")),
        (
            "PUT /api/v1/namespaces/team/pods/p/status?",
            ("", "pods/status", "update"),
        ),
        (
            "POST /api/v1/namespaces/team/pods/p/eviction?",
            ("", "pods/eviction", "create"),
        ),
        ("GET /api/v1/namespaces?", ("", "namespaces", "list")),
        ("GET /api/v1/namespaces/team?", ("", "namespaces", "get")),
        (
            "DELETE /apis/batch/v1/namespaces/team/jobs/j?",
            ("batch", "jobs", "delete"),
        ),
        (
            "GET /apis/tessera.io/v1alpha1/clusterqueues?",
            ("tessera.io", "clusterqueues", "list"),
        ),
    ];
    for (request, (g, r, v)) in cases {
        assert_eq!(
            support::rbac::request_attributes(request),
            (g.to_string(), r.to_string(), v.to_string()),
            "{request}"
        );
    }
}

fn job_named(s: &ApiServer, name: &str) -> Value {
    s.object(JOBS, name).unwrap()
}

fn gated(p: &Value) -> bool {
    p["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| g.iter().any(|x| x["name"] == GATE))
}

fn ungated_pods(s: &ApiServer) -> BTreeSet<String> {
    s.objects(PODS)
        .iter()
        .filter(|p| !gated(p))
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn condition(p: &Value) -> (String, String) {
    let c = p["status"]["conditions"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["type"] == "tessera.io/Admitted")
                .cloned()
        })
        .unwrap_or(Value::Null);
    (
        c["reason"].as_str().unwrap_or("").to_string(),
        c["message"].as_str().unwrap_or("").to_string(),
    )
}

fn writes_to(s: &ApiServer, prefix: &str) -> usize {
    s.requests()
        .iter()
        .filter(|r| (r.starts_with("PUT ") || r.starts_with("POST ")) && r.contains(prefix))
        .count()
}

#[tokio::test]
async fn admits_within_quota_then_preempts_through_the_eviction_api() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    for name in ["low-1", "low-2", "low-3"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    assert!(
        s.objects(PODS).iter().all(gated),
        "the webhook gated every pod"
    );

    let plan = reconciler::pass(&client, &c, NOW).await.unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(
        ungated_pods(&s),
        ["low-1", "low-2"].map(String::from).into()
    );
    let admitted = pod(&s, "low-1");
    assert_eq!(
        admitted["spec"]["nodeSelector"]["gpu"], "h100",
        "flavor node labels"
    );
    assert!(admitted["metadata"]["annotations"]["tessera.io/admitted-at"].is_string());
    let (reason, message) = condition(&pod(&s, "low-3"));
    assert_eq!(reason, "WaitingForQuota");
    assert!(message.ends_with("0 available"), "{message}");
    let events = s.objects(EVENTS);
    assert!(events
        .iter()
        .any(|e| e["reason"] == "WaitingForQuota" && e["regarding"]["name"] == "low-3"));
    support::schema::validate_all(&events, &["1.34.0"]);

    let cq = &s.objects("/apis/tessera.io/v1alpha1/clusterqueues")[0];
    assert_eq!(
        cq["status"],
        json!({"admittedWorkloads": 2, "pendingWorkloads": 1})
    );

    // Nothing changed: a second pass writes nothing.
    let writes = s.writes();
    let plan = reconciler::pass(&client, &c, NOW + 1_000).await.unwrap();
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(s.writes(), writes);

    // A high-priority pod evicts exactly one low one, with the pod's grace period.
    create_pod(&s, "high-1", 2, "high", json!({}), None);
    reconciler::pass(&client, &c, NOW + 2_000).await.unwrap();
    let evictions = s.evictions();
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    assert_eq!(evictions[0]["deleteOptions"]["gracePeriodSeconds"], 45);
    assert_eq!(evictions[0]["apiVersion"], "policy/v1");
    support::schema::validate(&evictions[0], &["1.34.0"]);
    let victim = evictions[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(victim.starts_with("low-"));
    assert!(
        gated(&pod(&s, "high-1")),
        "waits for the victim to terminate"
    );
    assert_eq!(
        condition(&pod(&s, "high-1")).0,
        "WaitingForPreemptedWorkloads"
    );

    // While the victim terminates (it holds its GPUs), no second victim is chosen, even
    // when the other running pod now ranks first as a candidate (admitted more recently).
    let other = if victim == "low-1" { "low-2" } else { "low-1" };
    let mut p = pod(&s, other);
    p["metadata"]["annotations"]["tessera.io/admitted-at"] = json!("2026-11-18T12:01:01Z");
    s.put_object(PODS, p);
    reconciler::pass(&client, &c, NOW + 3_000).await.unwrap();
    assert_eq!(s.evictions().len(), 1);
    assert!(gated(&pod(&s, "high-1")));

    // The kubelet finishes: the pod is gone, the preemptor is admitted.
    assert!(s.delete_object(PODS, &victim));
    reconciler::pass(&client, &c, NOW + 4_000).await.unwrap();
    assert!(!gated(&pod(&s, "high-1")));
    assert_eq!(
        ungated_pods(&s).len(),
        2,
        "still 4 GPUs: {:?}",
        ungated_pods(&s)
    );
    assert!(gated(&pod(&s, "low-3")));
    assert!(s
        .objects(EVENTS)
        .iter()
        .any(|e| e["reason"] == "Preempted" && e["type"] == "Warning"));
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn jobs_are_unsuspended_on_admission_and_suspended_on_preemption() {
    let s = cluster().await;
    let client = s.client();
    let c = cfg("a");
    let job = |name: &str, class: &str, parallelism: u32| {
        let j = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                         "labels": {"tessera.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": class}},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x",
                                           "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}});
        patched(j, ("batch", "Job"))
    };
    let get = |name: &str| job_named(&s, name);
    s.put_object(JOBS, job("train", "low", 2));
    assert_eq!(
        get("train")["spec"]["suspend"],
        true,
        "the webhook suspends it"
    );
    reconciler::pass(&client, &c, NOW).await.unwrap();
    let train = get("train");
    assert_eq!(train["spec"]["suspend"], false);
    assert_eq!(
        train["spec"]["template"]["spec"]["nodeSelector"]["gpu"],
        "h100"
    );

    s.put_object(JOBS, job("urgent", "high", 2));
    reconciler::pass(&client, &c, NOW + 1_000).await.unwrap();
    assert_eq!(
        get("train")["spec"]["suspend"],
        true,
        "preempted: suspended again"
    );
    assert!(get("train")["metadata"]["annotations"]["tessera.io/admitted-at"].is_null());
    assert_eq!(get("urgent")["spec"]["suspend"], true);
    assert_eq!(
        get("urgent")["metadata"]["annotations"]["tessera.io/pending-reason"],
        "WaitingForPreemptedWorkloads"
    );
    // The Job controller reports no active pods any more: the quota is free.
    reconciler::pass(&client, &c, NOW + 2_000).await.unwrap();
    assert_eq!(get("urgent")["spec"]["suspend"], false);
    assert_eq!(get("train")["spec"]["suspend"], true);
    assert_eq!(
        get("train")["metadata"]["annotations"]["tessera.io/pending-reason"],
        "WaitingForQuota"
    );
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn a_restart_mid_way_keeps_the_admitted_set_and_admits_nothing_twice() {
    let s = cluster().await;
    let client = s.client();
    // A group of 3 pods x 1 GPU, and two single pods of 1 GPU created later.
    for i in 0..3 {
        create_pod(
            &s,
            &format!("g-{i}"),
            1,
            "low",
            json!({"kueue.x-k8s.io/pod-group-name": "g"}),
            Some(3),
        );
    }
    for name in ["solo-1", "solo-2"] {
        create_pod(&s, name, 1, "low", json!({}), None);
    }
    // Make the singles younger than the group.
    for name in ["solo-1", "solo-2"] {
        let mut p = pod(&s, name);
        p["metadata"]["creationTimestamp"] = json!("2026-11-18T12:00:30Z");
        s.put_object(PODS, p);
    }
    // The old controller crashed after ungating 2 of the group's 3 pods.
    for name in ["g-0", "g-1"] {
        let mut p = pod(&s, name);
        p["spec"].as_object_mut().unwrap().remove("schedulingGates");
        p["metadata"]["annotations"]["tessera.io/admitted-at"] = json!("2026-11-18T12:00:40Z");
        s.put_object(PODS, p);
    }
    let plan = reconciler::pass(&client, &cfg("b"), NOW).await.unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    let ungated = ungated_pods(&s);
    assert_eq!(
        ungated,
        ["g-0", "g-1", "g-2", "solo-1"].map(String::from).into()
    );
    let admits: Vec<&Action> = plan
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Admit { .. }))
        .collect();
    assert_eq!(
        admits.len(),
        2,
        "the group's last pod and one single: {admits:?}"
    );
    for name in ["g-0", "g-1"] {
        assert_eq!(
            writes_to(&s, &format!("/pods/{name}")),
            0,
            "{name} was not touched again"
        );
    }
    // Another restart: the same admitted set, and no writes at all.
    let writes = s.writes();
    let again = reconciler::pass(&client, &cfg("c"), NOW + 5_000)
        .await
        .unwrap();
    assert_eq!(again.admitted, plan.admitted);
    assert_eq!(ungated_pods(&s), ungated);
    assert_eq!(s.writes(), writes);
    assert_eq!(condition(&pod(&s, "solo-2")).0, "WaitingForQuota");
    assert_rbac_allows_every_request(&s);
}

/// An administrator lowers the ClusterQueue's quota from 4 to 2 GPUs under two running
/// 2-GPU pods: both keep running (nothing is evicted), the one restored last is
/// reported over quota, and nothing is admitted in its place, also by a restarted
/// controller; once one of them ends, the waiting pod still waits (2 of 2 in use), and
/// once both end it is admitted.
#[tokio::test]
async fn a_lowered_quota_admits_nothing_until_the_running_workloads_fit_again() {
    let s = cluster().await;
    let client = s.client();
    for name in ["run-1", "run-2"] {
        create_pod(&s, name, 2, "low", json!({}), None);
    }
    reconciler::pass(&client, &cfg("a"), NOW).await.unwrap();
    assert_eq!(
        ungated_pods(&s),
        ["run-1", "run-2"].map(String::from).into()
    );
    let mut cq = s
        .objects("/apis/tessera.io/v1alpha1/clusterqueues")
        .remove(0);
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = json!(2);
    s.put_object("/apis/tessera.io/v1alpha1/clusterqueues", cq);
    create_pod(&s, "next", 1, "low", json!({}), None);
    for (i, identity) in ["a", "b"].into_iter().enumerate() {
        let plan = reconciler::pass(&client, &cfg(identity), NOW + 1_000 * (i as u64 + 1))
            .await
            .unwrap();
        assert_eq!(plan.problems.len(), 1, "{:?}", plan.problems);
        assert!(
            plan.problems[0].contains("team/pod-run-2 runs over its queue's quota"),
            "{:?}",
            plan.problems
        );
        assert!(s.evictions().is_empty(), "nothing evicted");
        assert!(gated(&pod(&s, "next")), "nothing admitted in its place");
        assert_eq!(condition(&pod(&s, "next")).0, "WaitingForQuota");
    }
    s.delete_object(PODS, "run-1");
    let plan = reconciler::pass(&client, &cfg("b"), NOW + 3_000)
        .await
        .unwrap();
    assert!(
        plan.problems.is_empty(),
        "run-2 fits alone: {:?}",
        plan.problems
    );
    assert!(gated(&pod(&s, "next")), "2 of 2 GPUs in use");
    s.delete_object(PODS, "run-2");
    reconciler::pass(&client, &cfg("b"), NOW + 4_000)
        .await
        .unwrap();
    assert!(!gated(&pod(&s, "next")), "admitted once the quota is free");
    assert_rbac_allows_every_request(&s);
}

#[tokio::test]
async fn only_the_lease_holder_acts_and_a_standby_takes_over_after_expiry() {
    let s = cluster().await;
    let start = |identity: &str| {
        let token = CancellationToken::new();
        let task = tokio::spawn(reconciler::run(
            s.client(),
            cfg(identity),
            Arc::new(SystemClock),
            token.clone(),
        ));
        (token, task)
    };
    let holder = |s: &ApiServer| -> Option<String> {
        s.objects("/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases")
            .first()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    let wait = |what: &'static str, f: Box<dyn Fn() -> bool>| async move {
        for _ in 0..100 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {what}");
    };
    let (a_token, a_task) = start("a");
    let s1 = s.clone();
    wait(
        "a to lead",
        Box::new(move || holder(&s1).as_deref() == Some("a")),
    )
    .await;
    let (b_token, b_task) = start("b");
    create_pod(&s, "first", 1, "low", json!({}), None);
    fn instances(s: &ApiServer, regarding: &str) -> BTreeSet<String> {
        s.objects(EVENTS)
            .iter()
            .filter(|e| e["regarding"]["name"] == regarding && e["reason"] == "Admitted")
            .map(|e| e["reportingInstance"].as_str().unwrap_or("").to_string())
            .collect()
    }
    let s1 = s.clone();
    wait(
        "first admitted",
        Box::new(move || !gated(&pod(&s1, "first")) && !instances(&s1, "first").is_empty()),
    )
    .await;
    assert_eq!(
        instances(&s, "first"),
        ["a".to_string()].into(),
        "only the holder acts"
    );
    // Lease still held by a (b keeps following it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(holder(&s).as_deref(), Some("a"));

    // a crashes (no release); b takes over once the 2 s lease has expired.
    let crashed = std::time::Instant::now();
    a_task.abort();
    let _ = a_task.await;
    drop(a_token);
    let s1 = s.clone();
    wait(
        "b to take over",
        Box::new(move || holder(&s1).as_deref() == Some("b")),
    )
    .await;
    create_pod(&s, "second", 1, "low", json!({}), None);
    let s1 = s.clone();
    wait(
        "second admitted",
        Box::new(move || !gated(&pod(&s1, "second")) && !instances(&s1, "second").is_empty()),
    )
    .await;
    assert!(
        crashed.elapsed() >= Duration::from_millis(1_500),
        "b took over a crashed leader's lease before its term ran out"
    );
    assert_eq!(instances(&s, "second"), ["b".to_string()].into());
    b_token.cancel();
    b_task.await.unwrap().unwrap();
    assert_rbac_allows_every_request(&s);
}

fn lease_spec(s: &ApiServer) -> Value {
    s.objects("/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases")
        .first()
        .map(|l| l["spec"].clone())
        .unwrap_or(Value::Null)
}

/// Polls `f` every 20 ms for up to 10 s (generous: CI's 2 cores may be busy).
async fn wait_for(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_clean_shutdown_releases_the_lease_and_a_standby_takes_over_at_once() {
    let s = cluster().await;
    // A 30 s term: a standby waiting it out would time this test out.
    let long = |identity: &str| Config {
        lease_duration: 30_000,
        ..cfg(identity)
    };
    let a_token = CancellationToken::new();
    let a_task = tokio::spawn(reconciler::run(
        s.client(),
        long("a"),
        Arc::new(SystemClock),
        a_token.clone(),
    ));
    wait_for("a to lead", || lease_spec(&s)["holderIdentity"] == "a").await;
    let b_token = CancellationToken::new();
    let b_task = tokio::spawn(reconciler::run(
        s.client(),
        long("b"),
        Arc::new(SystemClock),
        b_token.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        lease_spec(&s)["holderIdentity"],
        "a",
        "b follows a live leader"
    );

    a_token.cancel();
    a_task.await.unwrap().unwrap();
    let released = std::time::Instant::now();
    wait_for("b to take over", || lease_spec(&s)["holderIdentity"] == "b").await;
    assert!(released.elapsed() < Duration::from_secs(2));
    assert_eq!(
        lease_spec(&s)["leaseDurationSeconds"],
        30,
        "b renews with its own term"
    );
    assert_eq!(lease_spec(&s)["leaseTransitions"], 1);
    create_pod(&s, "after", 1, "low", json!({}), None);
    wait_for("b to admit", || !gated(&pod(&s, "after"))).await;

    // b shuts down with nobody to hand over to: the Lease is left free.
    b_token.cancel();
    b_task.await.unwrap().unwrap();
    assert!(lease_spec(&s)["holderIdentity"].is_null());
    assert_eq!(lease_spec(&s)["leaseDurationSeconds"], 1);
    assert_rbac_allows_every_request(&s);
}

/// HAMi-style vGPU pods in a queue are charged their memory and cores per vGPU (issue 18,
/// part 6): with 40 GiB of `nvidia.com/gpumem` quota, two pods of 2 × 10 GiB are admitted
/// and a third waits with the resource named, as `tessera plan` decides it.
#[tokio::test]
async fn vgpu_pods_are_charged_memory_and_cores_per_vgpu() {
    let s = cluster().await;
    s.put_object(
        "/apis/tessera.io/v1alpha1/clusterqueues",
        json!({"apiVersion": "tessera.io/v1alpha1", "kind": "ClusterQueue", "metadata": {"name": "cq"},
               "spec": {"namespaceSelector": {},
                        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"],
                            "flavors": [{"name": "h100", "resources": [
                                {"name": "nvidia.com/gpu", "nominalQuota": 8},
                                {"name": "nvidia.com/gpumem", "nominalQuota": 40960},
                                {"name": "nvidia.com/gpucores", "nominalQuota": 800}]}]}]}}),
    );
    for (name, gpus, minute) in [("a", 2, "00"), ("b", 2, "01"), ("c", 1, "02")] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team",
                         "labels": {"tessera.io/queue-name": "lq", "tessera.io/priority-class": "low"},
                         "creationTimestamp": format!("2026-11-18T11:{minute}:00Z")},
            "spec": {"containers": [{"name": "infer", "image": "server",
                "resources": {"limits": {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": 10240,
                                         "nvidia.com/gpucores": 30}}}]}});
        s.put_object(PODS, patched(pod, ("", "Pod")));
    }
    let plan = reconciler::pass(&s.client(), &cfg("a"), NOW).await.unwrap();
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    assert_eq!(ungated_pods(&s), ["a", "b"].map(String::from).into());
    let (reason, message) = condition(&pod(&s, "c"));
    assert_eq!(reason, "WaitingForQuota");
    assert!(message.contains("nvidia.com/gpumem"), "{message}");
    assert_rbac_allows_every_request(&s);
}
