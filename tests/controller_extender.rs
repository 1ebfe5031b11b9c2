//! The scheduler extender over real HTTP, with the API-server double as the cluster:
//! request bodies written as kube-scheduler sends them (`k8s.io/kube-scheduler/extender/v1`),
//! the issue's pod through filter → prioritize → bind (assignment annotation, then the
//! Binding), a pod that fits nowhere, prioritize and bind by the placement engine
//! (Tessera's policy, binpack and spread by annotation), 50 concurrent binds to one
//! 8-GPU node, a controller restart, a deleted pod, a stale heartbeat, bad requests, and
//! the RBAC the extender needs.

mod support;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use support::apiserver::ApiServer;
use tessera::controller::extender::engine::WorkloadSource;
use tessera::controller::extender::records::{
    AssignmentRecord, ASSIGNMENT_ANNOTATION, DEVICES_ANNOTATION, HEARTBEAT_ANNOTATION,
};
use tessera::controller::extender::{keep_books, serve, Books, BooksConfig, Extender};
use tessera::controller::metrics::ControllerMetrics;
use tessera::controller::webhook_server::Limits;
use tessera::vgpu::{GpuRecord, NodeBooks};
use tokio_util::sync::CancellationToken;

const GPU_MIB: u64 = 40_960;

/// The extender's shipped RBAC: every request its tests make must be allowed by it.
const EXTENDER_RBAC: &str = "daemonset/components/vgpu-scheduler/extender.yaml";

struct Running {
    addr: SocketAddr,
    books: Arc<Books>,
    /// The controller's registry the extender counts in.
    metrics: Arc<ControllerMetrics>,
    shutdown: CancellationToken,
}

impl Running {
    /// The value of `series` on the metrics page (0 when absent).
    fn metric(&self, series: &str) -> f64 {
        support::http::sample(&self.metrics.encode(), series).unwrap_or(0.0)
    }
}

async fn start(api: &ApiServer) -> Running {
    start_with(api, Limits::default()).await
}

async fn start_with(api: &ApiServer, limits: Limits) -> Running {
    start_books(api, limits, Books::new(BooksConfig::default())).await
}

async fn start_books(api: &ApiServer, limits: Limits, books: Books) -> Running {
    let books = Arc::new(books);
    let shutdown = CancellationToken::new();
    tokio::spawn(keep_books(api.client(), books.clone(), shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(ControllerMetrics::new());
    let extender = Arc::new(Extender {
        books: books.clone(),
        client: api.client(),
        limits,
        metrics: metrics.extender.clone(),
    });
    tokio::spawn(serve(listener, extender, shutdown.clone()));
    wait_for("the books to sync", || books.synced()).await;
    Running {
        addr,
        books,
        metrics,
        shutdown,
    }
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn cluster() -> ApiServer {
    let api = ApiServer::empty().await;
    api.list_across_namespaces();
    api
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// A node whose agent publishes `gpus` 40 GiB A100s (10 slots each) with `heartbeat`.
fn vgpu_node(api: &ApiServer, name: &str, gpus: usize, heartbeat: &str) {
    vgpu_node_of(api, name, gpus, GPU_MIB, heartbeat);
}

/// A node whose agent publishes `gpus` A100s of `memory_mib` (10 slots each).
fn vgpu_node_of(api: &ApiServer, name: &str, gpus: usize, memory_mib: u64, heartbeat: &str) {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"uuid": format!("GPU-{name}-{i}"), "model": "NVIDIA A100-PCIE-40GB",
                   "memoryMiB": memory_mib, "sms": 108, "slots": 10, "numa": 0,
                   "healthy": true})
        })
        .collect();
    api.put_object(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
            DEVICES_ANNOTATION: Value::Array(devices).to_string(),
            HEARTBEAT_ANNOTATION: heartbeat}}}),
    );
}

fn pod_object(name: &str, memory_mib: u64, cores: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"schedulerName": "tessera-scheduler", "containers": [{"name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1",
                "nvidia.com/gpumem": memory_mib.to_string(),
                "nvidia.com/gpucores": cores.to_string()}}}]}})
}

fn create_pod(api: &ApiServer, name: &str, memory_mib: u64, cores: u32) -> Value {
    let pod = pod_object(name, memory_mib, cores);
    api.put_object("/api/v1/namespaces/team/pods", pod.clone());
    pod
}

fn stored_pod(api: &ApiServer, name: &str) -> Value {
    api.objects("/api/v1/namespaces/team/pods")
        .into_iter()
        .find(|p| p["metadata"]["name"] == name)
        .unwrap_or(Value::Null)
}

async fn post(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    support::http::call(addr, method, path, body).await
}

/// The body kube-scheduler sends to `/filter` and `/prioritize` with
/// `nodeCacheCapable: true`.
fn extender_args(pod: &Value, nodes: &[&str]) -> String {
    json!({"pod": pod, "nodenames": nodes}).to_string()
}

fn binding_args(pod: &Value, node: &str) -> String {
    json!({"podName": pod["metadata"]["name"], "podNamespace": pod["metadata"]["namespace"],
           "podUID": pod["metadata"]["uid"], "node": node})
    .to_string()
}

/// The assignment recorded on a stored pod.
fn recorded(pod: &Value) -> Option<AssignmentRecord> {
    let text = pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION].as_str()?;
    Some(serde_json::from_str(text).expect("a readable assignment"))
}

#[tokio::test]
async fn the_issue_pod_goes_through_filter_prioritize_and_bind() {
    let api = cluster().await;
    vgpu_node(&api, "gpu-node", 4, &now_rfc3339());
    api.put_object(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-node"}}),
    );
    let pod = create_pod(&api, "infer", 10_240, 30);
    let ext = start(&api).await;

    let args = extender_args(&pod, &["gpu-node", "cpu-node"]);
    let (code, filtered) = post(ext.addr, "POST", "/filter", &args).await;
    assert_eq!(code, 200);
    let keys: Vec<&String> = filtered.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["failedAndUnresolvableNodes", "nodenames"],
        "{filtered}"
    );
    assert_eq!(filtered["nodenames"], json!(["gpu-node"]));
    assert_eq!(
        filtered["failedAndUnresolvableNodes"]["cpu-node"],
        "cpu-node: publishes no vGPU devices (annotation tessera.io/vgpu-devices)"
    );

    // The placement engine ranks the node the pod fits: the only one, so the best.
    let (code, priorities) = post(ext.addr, "POST", "/prioritize", &args).await;
    assert_eq!(code, 200);
    assert_eq!(
        priorities,
        json!([{"host": "gpu-node", "score": 10}, {"host": "cpu-node", "score": 0}])
    );

    let (code, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "gpu-node")).await;
    assert_eq!((code, &bound), (200, &json!({})));
    // A retried bind (its answer lost) is done already and writes nothing.
    let (_, again) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "gpu-node")).await;
    assert_eq!(again, json!({}));
    let stored = stored_pod(&api, "infer");
    assert_eq!(stored["spec"]["nodeName"], "gpu-node");
    let record = recorded(&stored).expect("assignment annotation");
    assert_eq!(record.node, "gpu-node");
    assert_eq!(record.containers.len(), 1);
    assert_eq!(record.containers[0].name, "main");
    let device = &record.containers[0].devices[0];
    assert_eq!((device.memory_mib, device.cores), (10_240, 30));
    assert!(device.uuid.starts_with("GPU-gpu-node-"));
    assert_eq!(
        api.bindings(),
        [json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "infer", "namespace": "team", "uid": "uid-infer"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node"}})]
    );
    // The assignment is on the pod before the Binding exists.
    let writes: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH") || r.starts_with("POST"))
        .collect();
    assert_eq!(
        writes,
        [
            "PATCH /api/v1/namespaces/team/pods/infer?",
            "POST /api/v1/namespaces/team/pods/infer/binding?"
        ]
    );
    support::rbac::assert_allows_every_request(&api, EXTENDER_RBAC);
    // Counted on the controller's metrics: one filter that fit, two binds.
    assert_eq!(
        ext.metric("tessera_extender_filter_requests_total{result=\"fit\"}"),
        1.0
    );
    assert_eq!(
        ext.metric("tessera_extender_bind_requests_total{result=\"bound\"}"),
        2.0
    );
    for (verb, n) in [("filter", 1.0), ("prioritize", 1.0), ("bind", 2.0)] {
        let count = format!("tessera_extender_request_duration_seconds_count{{verb=\"{verb}\"}}");
        assert_eq!(ext.metric(&count), n, "{verb}");
    }
    ext.shutdown.cancel();
}

/// A pod of `milli` thousandths of a 16,000 MiB GPU (16 MiB each) with `annotations`.
fn share_pod(name: &str, milli: u64, annotations: Value) -> Value {
    let mut pod = pod_object(name, milli * 16, 0);
    pod["metadata"]["annotations"] = annotations;
    pod
}

#[tokio::test]
async fn prioritize_and_bind_place_by_the_placement_engine() {
    let api = cluster().await;
    let beat = now_rfc3339();
    for (node, gpus) in [("x", 1), ("y", 1), ("z", 1), ("w", 3)] {
        vgpu_node_of(&api, node, gpus, 16_000, &beat);
    }
    // The engine measures fragmentation against a workload of sharing pods of 550,
    // 230, 220, 650 and 320 thousandths of a GPU, whose packing plan puts 550 + 230 +
    // 220 and 650 + 320 on one GPU each.
    let books = Books::new(BooksConfig {
        workload: WorkloadSource::Fixed,
        ..BooksConfig::default()
    });
    let workload: Vec<Pod> = [550, 230, 220, 650, 320]
        .iter()
        .map(|&m| serde_json::from_value(share_pod(&format!("w{m}"), m, json!({}))).unwrap())
        .collect();
    books.set_workload(&workload);
    let ext = start_books(&api, Limits::default(), books).await;
    // x holds a 650 (350 free), y a 550 (450 free), z nothing; on w, GPU 0 a 650, GPU 1
    // a 550. Bound through the extender, each pinned to its GPU.
    for (gpu, milli) in [("x-0", 650), ("y-0", 550), ("w-0", 650), ("w-1", 550)] {
        let uuid = format!("GPU-{gpu}");
        let pod = share_pod(
            &format!("filler-{gpu}"),
            milli,
            json!({"nvidia.com/use-gpuuuid": uuid}),
        );
        api.put_object("/api/v1/namespaces/team/pods", pod.clone());
        let node = &gpu[..1];
        let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, node)).await;
        assert_eq!(bound, json!({}), "{gpu}");
    }
    // A 230 on x would leave 120, which no planned pair fills; on y it leaves 220 for a
    // 220. Tessera's policy ranks y, then z, then x; binpack the fullest first; spread
    // the emptiest.
    let policy = |p: &str| json!({"hami.io/node-scheduler-policy": p});
    let cases = [
        ("tessera", json!({}), [8, 10, 9]),
        ("binpack", policy("binpack"), [10, 9, 8]),
        ("spread", policy("spread"), [8, 9, 10]),
    ];
    for (name, annotations, [x, y, z]) in cases {
        let pod = share_pod(&format!("rank-{name}"), 230, annotations);
        let args = extender_args(&pod, &["x", "y", "z"]);
        let (code, priorities) = post(ext.addr, "POST", "/prioritize", &args).await;
        assert_eq!(code, 200);
        assert_eq!(
            priorities,
            json!([{"host": "x", "score": x}, {"host": "y", "score": y},
                   {"host": "z", "score": z}]),
            "{name}"
        );
    }
    // Bind takes the GPU the engine picks on w: Tessera's keeps to the plan (GPU 1,
    // 220 left), binpack the fullest that fits (GPU 0), spread the emptiest (GPU 2).
    let gpu = |p: &str| json!({"hami.io/gpu-scheduler-policy": p});
    let binds = [
        ("tessera", json!({}), "GPU-w-1"),
        ("binpack", gpu("binpack"), "GPU-w-0"),
        ("spread", gpu("spread"), "GPU-w-2"),
    ];
    for (name, annotations, want) in binds {
        let pod = share_pod(&format!("bind-{name}"), 230, annotations);
        api.put_object("/api/v1/namespaces/team/pods", pod.clone());
        let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "w")).await;
        assert_eq!(bound, json!({}), "{name}");
        let record = recorded(&stored_pod(&api, &format!("bind-{name}"))).expect("assigned");
        assert_eq!(record.containers[0].devices[0].uuid, want, "{name}");
    }
    ext.shutdown.cancel();
}

#[tokio::test]
async fn a_pod_that_fits_nowhere_gets_the_reason_per_node() {
    let api = cluster().await;
    vgpu_node(&api, "a", 2, &now_rfc3339());
    vgpu_node(&api, "b", 4, &now_rfc3339());
    let pod = create_pod(&api, "huge", 50_000, 10);
    let ext = start(&api).await;
    let (code, filtered) = post(
        ext.addr,
        "POST",
        "/filter",
        &extender_args(&pod, &["a", "b"]),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(filtered["nodenames"], json!([]));
    for (node, gpus) in [("a", 2), ("b", 4)] {
        assert_eq!(
            filtered["failedNodes"][node],
            format!("no GPU with 50000 MiB free among {gpus} NVIDIA A100-PCIE-40GBs; largest free 40960 MiB on {node}")
        );
    }
    let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "a")).await;
    let error = bound["error"].as_str().expect("a bind error");
    assert!(error.starts_with("pod no longer fits: "), "{error}");
    assert!(api.bindings().is_empty());
    assert_eq!(stored_pod(&api, "huge")["spec"]["nodeName"], Value::Null);
    assert_eq!(
        ext.metric("tessera_extender_filter_requests_total{result=\"unschedulable\"}"),
        1.0
    );
    assert_eq!(
        ext.metric("tessera_extender_bind_requests_total{result=\"refused\"}"),
        1.0
    );
    assert_eq!(
        ext.metric("tessera_extender_filter_requests_total{result=\"fit\"}"),
        0.0
    );
    ext.shutdown.cancel();
}

#[tokio::test]
async fn a_node_with_a_stale_heartbeat_is_filtered_out_with_the_reason() {
    let api = cluster().await;
    vgpu_node(&api, "fresh", 1, &now_rfc3339());
    vgpu_node(&api, "dead", 8, "2026-01-01T00:00:00Z");
    let pod = create_pod(&api, "p", 1_024, 10);
    let ext = start(&api).await;
    let (_, filtered) = post(
        ext.addr,
        "POST",
        "/filter",
        &extender_args(&pod, &["fresh", "dead"]),
    )
    .await;
    assert_eq!(filtered["nodenames"], json!(["fresh"]));
    let why = filtered["failedAndUnresolvableNodes"]["dead"]
        .as_str()
        .unwrap();
    assert!(
        why.starts_with("dead: vGPU agent heartbeat is ")
            && why.ends_with("s old (limit 60 s); its GPUs are out of scheduling"),
        "{why}"
    );
    let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "dead")).await;
    assert!(
        bound["error"].as_str().unwrap().contains("heartbeat"),
        "{bound}"
    );
    ext.shutdown.cancel();
}

#[tokio::test]
async fn bad_requests_are_answered_not_crashed_on() {
    let api = cluster().await;
    vgpu_node(&api, "n", 1, &now_rfc3339());
    let ext = start(&api).await;
    for path in ["/filter", "/prioritize", "/bind"] {
        let (code, body) = post(ext.addr, "POST", path, "{not json").await;
        assert_eq!(code, 400, "{path}");
        let msg = body["error"].as_str().unwrap();
        assert!(
            msg.starts_with("body is not a valid Extender"),
            "{path}: {msg}"
        );
    }
    let (code, body) = post(ext.addr, "POST", "/filter", r#"{"nodenames": ["n"]}"#).await;
    assert_eq!(code, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("missing field `pod`"),
        "{body}"
    );
    assert_eq!(post(ext.addr, "GET", "/filter", "").await.0, 405);
    assert_eq!(post(ext.addr, "POST", "/preempt", "{}").await.0, 404);
    // Still serving.
    let pod = create_pod(&api, "p", 1_024, 0);
    let (code, _) = post(ext.addr, "POST", "/filter", &extender_args(&pod, &["n"])).await;
    assert_eq!(code, 200);
    ext.shutdown.cancel();
}

/// Per GPU: (memory, cores, vGPUs) summed over the assignments recorded on the pods.
fn recorded_usage(api: &ApiServer) -> BTreeMap<String, (u64, u32, u32)> {
    let mut usage = BTreeMap::new();
    for pod in api.objects("/api/v1/namespaces/team/pods") {
        for c in recorded(&pod).map(|r| r.containers).unwrap_or_default() {
            for d in c.devices {
                let u = usage.entry(d.uuid).or_insert((0, 0, 0));
                *u = (u.0 + d.memory_mib, u.1 + d.cores, u.2 + 1);
            }
        }
    }
    usage
}

fn assert_within_capacity(usage: &BTreeMap<String, (u64, u32, u32)>) {
    for (gpu, (memory, cores, vgpus)) in usage {
        assert!(
            *memory <= GPU_MIB && *cores <= 100 && *vgpus <= 10,
            "{gpu} overcommitted: {memory} MiB, {cores}% cores, {vgpus} vGPUs"
        );
    }
}

/// The books' per-GPU usage of one node, as (memory, cores, vGPUs).
fn books_usage(books: &NodeBooks) -> BTreeMap<String, (u64, u32, u32)> {
    books
        .gpus()
        .filter(|(_, u)| u.vgpus > 0)
        .map(|(g, u): (&GpuRecord, _)| (g.uuid.clone(), (u.memory_mib, u.cores, u.vgpus)))
        .collect()
}

const SIZES: [(u64, u32); 5] = [
    (2_048, 0),
    (4_096, 10),
    (8_192, 20),
    (10_240, 30),
    (20_480, 50),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_binds_to_one_node_never_overcommit() {
    let api = cluster().await;
    vgpu_node(&api, "big", 8, &now_rfc3339());
    let pods: Vec<Value> = (0..50)
        .map(|i| {
            let (memory, cores) = SIZES[i % SIZES.len()];
            create_pod(&api, &format!("p{i:02}"), memory, cores)
        })
        .collect();
    let ext = start(&api).await;
    let addr = ext.addr;
    let tasks: Vec<_> = pods
        .into_iter()
        .map(|pod| {
            tokio::spawn(async move {
                let (_, filtered) =
                    post(addr, "POST", "/filter", &extender_args(&pod, &["big"])).await;
                if filtered["nodenames"] != json!(["big"]) {
                    return (
                        pod,
                        Err(filtered["failedNodes"]["big"]
                            .as_str()
                            .unwrap_or("")
                            .to_string()),
                    );
                }
                let (_, bound) = post(addr, "POST", "/bind", &binding_args(&pod, "big")).await;
                let error = bound["error"].as_str().unwrap_or("").to_string();
                (pod, if error.is_empty() { Ok(()) } else { Err(error) })
            })
        })
        .collect();
    let (mut bound, mut refused) = (0, 0);
    for t in tasks {
        let (pod, outcome) = t.await.unwrap();
        let name = pod["metadata"]["name"].as_str().unwrap();
        let stored = stored_pod(&api, name);
        match outcome {
            Ok(()) => {
                bound += 1;
                assert_eq!(stored["spec"]["nodeName"], "big", "{name}");
                assert!(
                    recorded(&stored).is_some(),
                    "{name} bound without its assignment"
                );
            }
            Err(reason) => {
                refused += 1;
                assert!(!reason.is_empty(), "{name} refused without a reason");
                assert_eq!(stored["spec"]["nodeName"], Value::Null, "{name}");
            }
        }
    }
    assert_eq!(bound + refused, 50);
    assert!(
        bound > 0 && refused > 0,
        "bound {bound}, refused {refused}: the node should fill up"
    );
    let usage = recorded_usage(&api);
    assert_within_capacity(&usage);
    assert_eq!(api.bindings().len(), bound);
    wait_for("the books to match the pods", || {
        ext.books.node_books("big").map(|b| books_usage(&b)) == Some(recorded_usage(&api))
    })
    .await;
    ext.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_extender_rebuilds_its_books_from_the_pods() {
    let api = cluster().await;
    vgpu_node(&api, "n", 2, &now_rfc3339());
    let first = start(&api).await;
    for i in 0..4 {
        let pod = create_pod(&api, &format!("before{i}"), 16_384, 40);
        let (_, bound) = post(first.addr, "POST", "/bind", &binding_args(&pod, "n")).await;
        assert_eq!(bound, json!({}), "before{i}");
    }
    first.shutdown.cancel();
    // A restart between the annotation and the Binding: the pod carries its
    // assignment but is not bound. Hand-written as the bind would have written it.
    let half = create_pod(&api, "half", 4_096, 10);
    let usage_before = recorded_usage(&api);
    let free_gpu = usage_before
        .iter()
        .min_by_key(|(_, (m, _, _))| *m)
        .map(|(uuid, _)| uuid.clone())
        .unwrap();
    let mut annotated = half.clone();
    annotated["metadata"]["annotations"] = json!({ASSIGNMENT_ANNOTATION: json!({"node": "n",
        "containers": [{"name": "main", "devices": [{"uuid": free_gpu, "memoryMiB": 4096, "cores": 10}]}]}).to_string()});
    api.put_object("/api/v1/namespaces/team/pods", annotated);

    let second = start(&api).await;
    let rebuilt = second.books.node_books("n").unwrap();
    assert_eq!(
        books_usage(&rebuilt),
        recorded_usage(&api),
        "books = the pods' annotations"
    );
    assert_eq!(rebuilt.assignments().count(), 5);
    // The half-bound pod's retried bind gets the assignment it already holds.
    let (_, bound) = post(second.addr, "POST", "/bind", &binding_args(&half, "n")).await;
    assert_eq!(bound, json!({}));
    assert_eq!(stored_pod(&api, "half")["spec"]["nodeName"], "n");
    // More pods fill the node without double-booking what the old pods hold.
    for i in 0..6 {
        let pod = create_pod(&api, &format!("after{i}"), 8_192, 20);
        post(second.addr, "POST", "/bind", &binding_args(&pod, "n")).await;
    }
    assert_within_capacity(&recorded_usage(&api));
    second.shutdown.cancel();
}

#[tokio::test]
async fn a_deleted_pod_releases_its_assignment() {
    let api = cluster().await;
    vgpu_node(&api, "n", 1, &now_rfc3339());
    let ext = start(&api).await;
    let pod = create_pod(&api, "whole", GPU_MIB, 100);
    let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "n")).await;
    assert_eq!(bound, json!({}));
    let next = create_pod(&api, "next", 1_024, 10);
    let args = extender_args(&next, &["n"]);
    let (_, filtered) = post(ext.addr, "POST", "/filter", &args).await;
    assert_eq!(
        filtered["nodenames"],
        json!([]),
        "the GPU is held: {filtered}"
    );
    // The watch shows the pod's annotation: the booking now stands on the pod's record.
    wait_for("the bind to be seen", || ext.books.in_flight() == 0).await;
    assert!(api.delete_object("/api/v1/namespaces/team/pods", "whole"));
    wait_for("the assignment to be released", || {
        ext.books.assignment("uid-whole").is_none()
    })
    .await;
    let (_, filtered) = post(ext.addr, "POST", "/filter", &args).await;
    assert_eq!(filtered["nodenames"], json!(["n"]));
    ext.shutdown.cancel();
}

/// `tessera controller --extender-addr` as shipped: the flag starts the extender, which
/// syncs from the cluster and answers; SIGTERM ends the process cleanly.
#[tokio::test]
async fn the_binary_serves_the_extender_on_its_flag() {
    let api = cluster().await;
    vgpu_node(&api, "n", 2, &now_rfc3339());
    let pod = create_pod(&api, "p", 1_024, 10);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = support::dra_agent::kubeconfig(dir.path(), &api.url);
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (extender, probes) = (free(), free());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["controller", "--webhook-only", "--no-webhook"])
        .arg(format!("--extender-addr={extender}"))
        .arg(format!("--probe-addr={probes}"))
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let args = extender_args(&pod, &["n"]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let answer = loop {
        if tokio::net::TcpStream::connect(extender).await.is_ok() {
            let (code, answer) = post(extender, "POST", "/filter", &args).await;
            if code == 200 && answer.get("error").is_none() {
                break answer;
            }
        }
        if tokio::time::Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "extender not serving: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer["nodenames"], json!(["n"]));
    // The same process serves the extender's counts on the probes' /metrics.
    let (code, kind, page) = support::http::get_text(probes, "/metrics").await;
    assert_eq!(code, 200, "{page}");
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let fit = support::http::sample(
        &page,
        "tessera_extender_filter_requests_total{result=\"fit\"}",
    );
    assert_eq!(fit, Some(1.0), "{page}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_binding_the_api_server_refuses_releases_the_reservation() {
    let api = cluster().await;
    vgpu_node(&api, "n", 1, &now_rfc3339());
    let pod = create_pod(&api, "taken", 20_480, 50);
    let ext = start(&api).await;
    // Another scheduler binds it just before our Binding: that one answers 409.
    api.before_next_write("POST", "/api/v1/namespaces/team/pods", |api| {
        let mut pod = stored_pod(api, "taken");
        pod["spec"]["nodeName"] = json!("elsewhere");
        api.put_object("/api/v1/namespaces/team/pods", pod);
    });
    let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "n")).await;
    let error = bound["error"].as_str().expect("a bind error");
    assert!(error.starts_with("binding pod taken to n: "), "{error}");
    assert_eq!(ext.books.assignment("uid-taken"), None);
    let stored = stored_pod(&api, "taken");
    assert_eq!(stored["spec"]["nodeName"], "elsewhere");
    assert_eq!(recorded(&stored), None, "the annotation is taken back");
    // Asked again, it is refused before anything is reserved.
    let (_, again) = post(ext.addr, "POST", "/bind", &binding_args(&pod, "n")).await;
    assert_eq!(
        again["error"],
        "pod team/taken is already bound to elsewhere"
    );
    // The room is free for the next pod.
    let next = create_pod(&api, "next", GPU_MIB, 100);
    let (_, bound) = post(ext.addr, "POST", "/bind", &binding_args(&next, "n")).await;
    assert_eq!(bound, json!({}));
    ext.shutdown.cancel();
}

/// `nodeCacheCapable: false`: the scheduler sends whole Nodes and reads Nodes back.
#[tokio::test]
async fn a_node_list_is_answered_with_a_node_list() {
    let api = cluster().await;
    vgpu_node(&api, "gpu", 1, &now_rfc3339());
    let pod = create_pod(&api, "p", 1_024, 10);
    let ext = start(&api).await;
    let gpu = json!({"metadata": {"name": "gpu", "labels": {"zone": "a"}}});
    let cpu = json!({"metadata": {"name": "cpu"}});
    let body = json!({"pod": pod, "nodes": {"items": [gpu, cpu]}}).to_string();
    let (code, filtered) = post(ext.addr, "POST", "/filter", &body).await;
    assert_eq!(code, 200);
    assert_eq!(filtered["nodes"]["items"], json!([gpu]), "{filtered}");
    assert!(filtered.get("nodenames").is_none(), "{filtered}");
    assert!(filtered["failedAndUnresolvableNodes"]["cpu"].is_string());
    ext.shutdown.cancel();
}

/// kube-scheduler binds in a goroutine per pod and its HTTP client opens a connection per
/// concurrent call: a call over the connection cap waits for a slot instead of being
/// reset (a reset bind sends the pod back to the scheduler's backoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_the_connection_cap_waits_for_a_slot() {
    let api = cluster().await;
    vgpu_node(&api, "gpu", 8, &now_rfc3339());
    let pod = create_pod(&api, "p", 1_024, 10);
    let limits = Limits {
        max_connections: 4,
        connection_wait: Duration::from_secs(10),
        ..Limits::default()
    };
    let ext = start_with(&api, limits).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::net::TcpStream::connect(ext.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let body = extender_args(&pod, &["gpu"]);
    let call = tokio::spawn(async move { post(ext.addr, "POST", "/filter", &body).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "answered while every slot was held");
    drop(held);
    let (code, filtered) = call.await.unwrap();
    assert_eq!(code, 200);
    assert_eq!(filtered["nodenames"], json!(["gpu"]), "{filtered}");
    ext.shutdown.cancel();
}
