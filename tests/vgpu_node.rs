//! The node side of HAMi-style vGPUs: GPUs in the layout's `vgpu: { split }` mode are
//! `nvidia.com/gpu` slots for the kubelet (each naming its GPU, health following the
//! GPU; refused at Allocate without a cluster), a layout giving `nvidia.com/gpu` two meanings is refused, and the agent
//! describes the split GPUs on its Node in the record the scheduler extender reads,
//! kept current (health, config) and confirmed by a heartbeat; the extender places the
//! issue's pod on that record and takes a dead agent's GPUs out of scheduling.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use support::agent::AgentBuilder;
use support::apiserver::ApiServer;
use support::kubelet::Kubelet;
use tessera::agent::cluster::KubeEventRecorder;
use tessera::agent::vgpu_record::RecordSettings;
use tessera::controller::extender::records::{
    heartbeat_problem, node_state, NodeState, DEVICES_ANNOTATION, HEARTBEAT_ANNOTATION,
};
use tessera::gpu::{GpuBackend, HealthEvent};
use tessera::proto::deviceplugin as pb;

const WAIT: Duration = Duration::from_secs(5);
const NODE: &str = "gpu-node-1";
const SPLIT_ALL: &str = "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4 } } ] }";

fn health_of(list: &[pb::Device], gpu: &str) -> Vec<String> {
    list.iter()
        .filter(|d| d.id.starts_with(gpu))
        .map(|d| d.health.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_gpus_are_gpu_slots_naming_their_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config(SPLIT_ALL)
        .root(tmp.path().to_path_buf())
        .start();
    let gpus: Vec<String> = agent
        .backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();

    // split × GPUs IDs, each `<GPU UUID>::s<n>`, with the GPU's NUMA node.
    let devices = kubelet.devices("nvidia.com/gpu").await;
    let mut ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort();
    let mut want: Vec<String> = gpus
        .iter()
        .flat_map(|g| (0..4).map(move |i| format!("{g}::s{i}")))
        .collect();
    want.sort();
    assert_eq!(ids, want);
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    assert!(devices.iter().all(|d| d.topology.is_some()));

    // Without a cluster the agent cannot learn a slot's pod and its assignment, so
    // Allocate refuses rather than hand out a GPU without limits (tests/vgpu_limits.rs
    // has the path with the API server and the kubelet's PodResources).
    let mut client = kubelet.client("nvidia.com/gpu").await;
    let refused = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![pb::ContainerAllocateRequest {
                devices_ids: vec![format!("{}::s2", gpus[1])],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("PodResources"), "{refused:?}");

    // Health follows the GPU: all of GPU 0's slots, none of GPU 1's.
    agent.backend.inject(HealthEvent::Xid {
        gpu_uuid: gpus[0].clone(),
        xid: 79,
    });
    kubelet
        .wait_until(WAIT, "GPU 0's slots unhealthy", |m| {
            m["nvidia.com/gpu"].lists.last().is_some_and(|l| {
                health_of(l, &gpus[0]) == ["Unhealthy"; 4]
                    && health_of(l, &gpus[1]) == ["Healthy"; 4]
            })
        })
        .await;

    // Whole GPUs beside the slots under the same name: refused, naming the fields; the
    // slots stay as they were.
    agent.write_config(
        "tessera: { gpus: [ { match: { index: [0] }, mode: vgpu, vgpu: { split: 4 } }, \
         { match: all, mode: whole } ] }",
    );
    let deadline = Instant::now() + WAIT;
    while agent.events.0.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the config was not rejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rejected = agent.events.0.lock().unwrap()[0].clone();
    assert!(
        rejected.contains("resource nvidia.com/gpu: would mean two things")
            && rejected.contains("tessera.gpus[0].vgpu.resource")
            && rejected.contains("GPU 1 (tessera.gpus[1])"),
        "{rejected}"
    );
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 8);

    // With their own name the whole GPUs are fine.
    agent.write_config(
        "resources: { gpus: [ { pattern: \"*\", name: whole-gpu } ] }\n\
         tessera: { gpus: [ { match: { index: [0] }, mode: vgpu, vgpu: { split: 4 } } ] }",
    );
    kubelet
        .wait_until(WAIT, "one split GPU and one whole GPU", |m| {
            m.get("nvidia.com/whole-gpu")
                .and_then(|s| s.lists.last())
                .is_some_and(|l| l.len() == 1)
                && m["nvidia.com/gpu"]
                    .lists
                    .last()
                    .is_some_and(|l| l.len() == 4)
        })
        .await;
    agent.shutdown().await;
}

fn node(api: &ApiServer) -> Value {
    api.objects("/api/v1/nodes")
        .into_iter()
        .find(|n| n["metadata"]["name"] == NODE)
        .expect("the node")
}

fn annotation(api: &ApiServer, key: &str) -> Option<String> {
    node(api)["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// Wait until the Node's vGPU state satisfies `cond`.
async fn wait_for_state(api: &ApiServer, what: &str, cond: impl Fn(&Option<NodeState>) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let state = node_state(&node(api));
        if cond(&state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the node's vGPU state is {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn healthy(state: &Option<NodeState>) -> Vec<bool> {
    state
        .as_ref()
        .and_then(|s| s.gpus.as_ref().ok())
        .map(|g| g.iter().map(|g| g.healthy).collect())
        .unwrap_or_default()
}

fn recorded_agent(api: &ApiServer, config: &str) -> AgentBuilder {
    let mut builder = AgentBuilder::new("2xA100-80GB").config(config);
    builder.vgpu_record = Some(RecordSettings {
        client: api.client(),
        node_name: NODE.into(),
        heartbeat: Duration::from_millis(300),
    });
    builder.recorder = Some(Arc::new(KubeEventRecorder::new(api.client(), NODE.into())));
    builder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_record_follows_the_gpus_and_the_heartbeat() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let agent = recorded_agent(&api, SPLIT_ALL)
        .root(tmp.path().to_path_buf())
        .start();
    let inventory = agent.backend.inventory().unwrap();

    // The record the extender reads: both GPUs, as its books hold them.
    wait_for_state(&api, "the record is published", |s| s.is_some()).await;
    let state = node_state(&node(&api)).expect("a vGPU node");
    let gpus = state.gpus.clone().expect("readable");
    assert_eq!(gpus.len(), 2);
    for (record, gpu) in gpus.iter().zip(&inventory.gpus) {
        assert_eq!(record.uuid, gpu.uuid);
        assert_eq!(record.model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(record.memory_mib, 81_920);
        assert_eq!(record.sm_count, Some(108));
        assert_eq!(record.slots, 4);
        assert_eq!(record.numa, gpu.numa_node);
        assert!(record.healthy);
    }
    let devices: Value =
        serde_json::from_str(&annotation(&api, DEVICES_ANNOTATION).unwrap()).unwrap();
    assert_eq!(devices[0]["nvlinkPeers"], json!([inventory.gpus[1].uuid]));
    assert_eq!(
        heartbeat_problem(&state, Timestamp::now(), Duration::from_secs(60)),
        None
    );

    // The heartbeat advances while nothing changes.
    let first = annotation(&api, HEARTBEAT_ANNOTATION).unwrap();
    let deadline = Instant::now() + WAIT;
    while annotation(&api, HEARTBEAT_ANNOTATION).as_ref() == Some(&first) {
        assert!(Instant::now() < deadline, "the heartbeat stays at {first}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let later: Timestamp = annotation(&api, HEARTBEAT_ANNOTATION)
        .unwrap()
        .parse()
        .unwrap();
    assert!(later > first.parse::<Timestamp>().unwrap());

    // A health flip is written at once; one the API server refuses is retried.
    agent.backend.inject(HealthEvent::Xid {
        gpu_uuid: inventory.gpus[0].uuid.clone(),
        xid: 79,
    });
    wait_for_state(&api, "GPU 0 unhealthy", |s| healthy(s) == [false, true]).await;
    api.fail_requests(&["PATCH"], "/api/v1/nodes");
    agent.backend.inject(HealthEvent::Recovered {
        gpu_uuid: inventory.gpus[0].uuid.clone(),
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(healthy(&node_state(&node(&api))), [false, true]);
    api.stop_failing();
    wait_for_state(&api, "GPU 0 healthy again", |s| healthy(s) == [true, true]).await;

    // No split GPUs any more: no record.
    agent.write_config("version: v1");
    wait_for_state(&api, "the record is removed", |s| s.is_none()).await;
    assert_eq!(annotation(&api, HEARTBEAT_ANNOTATION), None);
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_record_goes_at_start_and_a_stopped_agent_leaves_its_heartbeat_to_age() {
    let api = ApiServer::start(NODE).await;
    let mut stale = node(&api);
    stale["metadata"]["annotations"] = json!({
        DEVICES_ANNOTATION: "[{\"uuid\":\"GPU-gone\",\"model\":\"L4\",\"memoryMiB\":23034,\"slots\":10,\"healthy\":true}]",
        HEARTBEAT_ANNOTATION: "2026-01-01T00:00:00Z",
        "team": "ml",
    });
    api.put_object("/api/v1/nodes", stale);

    // Whole GPUs only: the record an earlier run left is removed, nothing else is.
    let tmp = tempfile::tempdir().unwrap();
    let agent = recorded_agent(&api, "version: v1")
        .root(tmp.path().join("a"))
        .start();
    wait_for_state(&api, "the stale record is removed", |s| s.is_none()).await;
    assert_eq!(annotation(&api, HEARTBEAT_ANNOTATION), None);
    assert_eq!(annotation(&api, "team").as_deref(), Some("ml"));
    agent.shutdown().await;

    // A split layout is published; once the agent stops, the record stays and its
    // heartbeat ages until the extender's window takes the GPUs out.
    let agent = recorded_agent(&api, SPLIT_ALL)
        .root(tmp.path().join("b"))
        .start();
    wait_for_state(&api, "published", |s| healthy(s) == [true, true]).await;
    agent.shutdown().await;
    let writes = api.writes();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(api.writes(), writes, "nothing is written after the stop");
    let state = node_state(&node(&api)).expect("the record stays");
    let at: Timestamp = annotation(&api, HEARTBEAT_ANNOTATION)
        .unwrap()
        .parse()
        .unwrap();
    let later = at
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(61))
        .unwrap();
    let why = heartbeat_problem(&state, later, Duration::from_secs(60)).expect("stale");
    assert!(why.contains("out of scheduling"), "{why}");
}

/// POST `body` to the extender at `addr`, as kube-scheduler does.
async fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Value {
    let (code, answer) = support::http::call(addr, "POST", path, &body.to_string()).await;
    assert_eq!(code, 200, "{answer}");
    answer
}

/// Filter `pod` on the node until the answer satisfies `cond` (the extender's books
/// follow the Node's watch).
async fn filter_until(
    addr: std::net::SocketAddr,
    pod: &Value,
    what: &str,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let args = json!({"pod": pod, "nodenames": [NODE]});
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let answer = post(addr, "/filter", &args).await;
        if cond(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /filter answers {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extender_places_on_the_agents_record_and_drops_a_dead_agents_gpus() {
    use tessera::controller::extender::{keep_books, serve, Books, BooksConfig, Extender};
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let agent = recorded_agent(&api, SPLIT_ALL)
        .root(tmp.path().to_path_buf())
        .start();
    let inventory = agent.backend.inventory().unwrap();
    wait_for_state(&api, "published", |s| s.is_some()).await;

    let books = Arc::new(Books::new(BooksConfig {
        heartbeat_window: Duration::from_secs(3),
        ..BooksConfig::default()
    }));
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(keep_books(api.client(), books.clone(), stop.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let extender = Arc::new(Extender {
        books: books.clone(),
        client: api.client(),
        limits: tessera::controller::webhook_server::Limits::default(),
        metrics: Default::default(),
    });
    tokio::spawn(serve(listener, extender, stop.clone()));

    // The pod fits on the agent's split GPUs.
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "infer", "namespace": "team", "uid": "uid-infer"},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"}}}]}});
    filter_until(addr, &pod, "the node fits", |a| {
        a["nodenames"] == json!([NODE])
    })
    .await;

    // Both GPUs fail: the node is out, with the reason.
    for gpu in &inventory.gpus {
        agent.backend.inject(HealthEvent::Xid {
            gpu_uuid: gpu.uuid.clone(),
            xid: 79,
        });
    }
    let answer = filter_until(addr, &pod, "unhealthy GPUs refused", |a| {
        a["nodenames"] != json!([NODE])
    })
    .await;
    assert!(answer.to_string().contains("unhealthy"), "{answer}");

    // Healthy again, then the agent dies: once its heartbeat is older than the window,
    // its GPUs leave scheduling.
    for gpu in &inventory.gpus {
        agent.backend.inject(HealthEvent::Recovered {
            gpu_uuid: gpu.uuid.clone(),
        });
    }
    filter_until(addr, &pod, "fits again", |a| {
        a["nodenames"] == json!([NODE])
    })
    .await;
    agent.shutdown().await;
    let answer = filter_until(addr, &pod, "a dead agent's GPUs are out", |a| {
        a["nodenames"] != json!([NODE])
    })
    .await;
    let why = answer["failedAndUnresolvableNodes"][NODE]
        .as_str()
        .unwrap_or("");
    assert!(
        why.contains("vGPU agent heartbeat is") && why.contains("out of scheduling"),
        "{answer}"
    );
    stop.cancel();
}
