//! A HAMi-style pod from the scheduler extender's bind to the limits its containers run
//! under: the extender assigns GPUs and shares, the (emulated) kubelet admits the pod
//! through the agent's device plugin, and the agent binds each container's slots to the
//! assignment once the kubelet's PodResources API names the container, writing the
//! limits file and the CDI spec the runtime needs to create the container. Containers
//! get their own limits whatever the allocation order, a pod no Tessera scheduler placed
//! never gets a GPU, nor does one whose assignment gives more than its resources ask, and
//! an allocation left pending by an agent restart is bound after it.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::agent::{AgentBuilder, RunningAgent};
use support::apiserver::ApiServer;
use support::kubelet::Kubelet;
use tessera::agent::cluster::KubeEventRecorder;
use tessera::agent::slot_binding::{spec_stem, BindingSettings};
use tessera::agent::vgpu_record::RecordSettings;
use tessera::controller::extender::{keep_books, serve, Books, BooksConfig, Extender};
use tessera::gpu::GpuBackend;
use tessera::vgpu::record::{AssignmentRecord, ASSIGNMENT_ANNOTATION};

const NODE: &str = "gpu-node-1";
const SPLIT_ALL: &str = "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4 } } ] }";
const WAIT: Duration = Duration::from_secs(10);
const PODS: &str = "/api/v1/namespaces/team/pods";

fn agent(api: &ApiServer, kubelet: &Kubelet, root: &Path) -> RunningAgent {
    let mut builder = AgentBuilder::new("2xA100-80GB")
        .config(SPLIT_ALL)
        .root(root.to_path_buf());
    builder.vgpu_record = Some(RecordSettings {
        client: api.client(),
        node_name: NODE.into(),
        heartbeat: Duration::from_millis(300),
    });
    builder.slot_binding = Some(BindingSettings {
        client: api.client(),
        node_name: NODE.into(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        poll: Duration::from_millis(20),
    });
    builder.recorder = Some(Arc::new(KubeEventRecorder::new(api.client(), NODE.into())));
    builder.start()
}

/// The extender, serving on a loopback port, its books fed by the API double.
async fn extender(
    api: &ApiServer,
    stop: &tokio_util::sync::CancellationToken,
) -> std::net::SocketAddr {
    let books = Arc::new(Books::new(BooksConfig::default()));
    tokio::spawn(keep_books(api.client(), books.clone(), stop.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let extender = Arc::new(Extender {
        books,
        client: api.client(),
        limits: tessera::controller::webhook_server::Limits::default(),
    });
    tokio::spawn(serve(listener, extender, stop.clone()));
    addr
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Value {
    let (code, answer) = support::http::call(addr, "POST", path, &body.to_string()).await;
    assert_eq!(code, 200, "{answer}");
    answer
}

/// Filter (until the books know the node) and bind `pod` to the node, as kube-scheduler
/// does with the extender; returns the assignment recorded on the pod.
async fn schedule(addr: std::net::SocketAddr, api: &ApiServer, pod: &Value) -> AssignmentRecord {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = post(addr, "/filter", &json!({"pod": pod, "nodenames": [NODE]})).await;
        if answer["nodenames"] == json!([NODE]) {
            break;
        }
        assert!(Instant::now() < deadline, "/filter answers {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let meta = &pod["metadata"];
    let bound = post(
        addr,
        "/bind",
        &json!({"podName": meta["name"], "podNamespace": meta["namespace"],
                "podUID": meta["uid"], "node": NODE}),
    )
    .await;
    assert_eq!(bound, json!({}));
    let stored = api
        .objects(PODS)
        .into_iter()
        .find(|p| p["metadata"]["name"] == meta["name"])
        .unwrap();
    serde_json::from_str(
        stored["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

fn pod(name: &str, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-03T00:00:00Z"},
        "spec": {"schedulerName": "tessera-scheduler", "containers": containers}})
}

fn container(name: &str, limits: Value) -> Value {
    json!({"name": name, "image": "cuda", "resources": {"limits": limits}})
}

/// The allocation directory named by an Allocate answer.
fn alloc_id(answer: &tessera::proto::deviceplugin::ContainerAllocateResponse) -> String {
    answer.annotations[tessera::shimfiles::ALLOCATION_ANNOTATION].clone()
}

fn spec_path(agent: &RunningAgent, id: &str) -> PathBuf {
    agent.cdi_root.join(format!("{}.json", spec_stem(id)))
}

/// Wait for the allocation's CDI spec; returns it with the limits file's text.
async fn bound(agent: &RunningAgent, id: &str) -> (Value, String) {
    let deadline = Instant::now() + WAIT;
    while !spec_path(agent, id).exists() {
        assert!(Instant::now() < deadline, "allocation {id} was never bound");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spec = serde_json::from_slice(&std::fs::read(spec_path(agent, id)).unwrap()).unwrap();
    let limits =
        std::fs::read_to_string(agent.state_dir.join("vgpu").join(id).join("limits")).unwrap();
    (spec, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_container_runs_under_its_own_assignment_whatever_the_allocation_order() {
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = agent(&api, &kubelet, tmp.path());
    let minors: Vec<(String, u32)> = agent
        .backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| (g.uuid.clone(), g.minor))
        .collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = extender(&api, &stop).await;

    // The pod, plus a second container asking for a share by percentage.
    let infer = pod(
        "infer",
        json!([
            container(
                "main",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                                     "nvidia.com/gpucores": "30"})
            ),
            container(
                "side",
                json!({"nvidia.com/gpu": "1",
                                     "nvidia.com/gpumem-percentage": "25",
                                     "nvidia.com/gpucores": "10"})
            ),
        ]),
    );
    api.put_object(PODS, infer.clone());
    let assignment = schedule(addr, &api, &infer).await;
    let grant = |c: &str| {
        assignment
            .containers
            .iter()
            .find(|x| x.name == c)
            .unwrap()
            .devices[0]
            .clone()
    };
    let (main, side) = (grant("main"), grant("side"));
    assert_eq!((main.memory_mib, main.cores), (10_240, 30));
    assert_eq!((side.memory_mib, side.cores), (20_480, 10));

    // The kubelet allocates "side" first, then "main", taking the first free slots
    // (both of GPU 0, whatever the assignment says).
    kubelet.devices("nvidia.com/gpu").await;
    let answers = kubelet
        .admit(
            "team",
            "infer",
            "uid-infer",
            &[("side", "nvidia.com/gpu", 1), ("main", "nvidia.com/gpu", 1)],
        )
        .await
        .unwrap();
    for answer in &answers {
        // Nothing in the answer itself gives a GPU: it comes with the CDI device.
        assert_eq!(answer.envs["NVIDIA_VISIBLE_DEVICES"], "void");
        assert_eq!(answer.cdi_devices.len(), 1);
        assert_eq!(
            answer.cdi_devices[0].name,
            format!("tessera.io/gpu={}", alloc_id(answer))
        );
    }
    for (answer, grant) in answers.iter().zip([&side, &main]) {
        let (spec, limits) = bound(&agent, &alloc_id(answer)).await;
        let minor = minors.iter().find(|(u, _)| *u == grant.uuid).unwrap().1;
        let device = &spec["devices"][0];
        assert_eq!(device["name"], alloc_id(answer));
        assert_eq!(
            device["containerEdits"]["deviceNodes"],
            json!([{"path": format!("/dev/nvidia{minor}")}])
        );
        let env = &device["containerEdits"]["env"];
        assert_eq!(
            env[0],
            format!("NVIDIA_VISIBLE_DEVICES={}", grant.uuid),
            "{spec}"
        );
        assert!(
            limits.contains(&format!(
                "CUDA_DEVICE_MEMORY_LIMIT_0={}m\nCUDA_DEVICE_SM_LIMIT_0={}\n",
                grant.memory_mib, grant.cores
            )),
            "{limits}"
        );
    }
    stop.cancel();
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_an_assignment_or_with_a_forged_one_never_gets_a_gpu_and_is_told_why() {
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = agent(&api, &kubelet, tmp.path());

    // Placed by the default scheduler (no extender, no assignment).
    let plain = pod(
        "plain",
        json!([container("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    api.put_object(PODS, plain);
    kubelet.devices("nvidia.com/gpu").await;
    let answers = kubelet
        .admit(
            "team",
            "plain",
            "uid-plain",
            &[("main", "nvidia.com/gpu", 1)],
        )
        .await
        .unwrap();
    let id = alloc_id(&answers[0]);
    let deadline = Instant::now() + WAIT;
    let event = loop {
        let events = api.objects("/apis/events.k8s.io/v1/namespaces/team/events");
        if let Some(e) = events.into_iter().next() {
            break e;
        }
        assert!(Instant::now() < deadline, "no Event on the pod");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(event["reason"], "VgpuBindingRefused");
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "plain");
    let note = event["note"].as_str().unwrap();
    assert!(
        note.contains("container \"main\"") && note.contains(ASSIGNMENT_ANNOTATION),
        "{note}"
    );
    // Neither the spec (so the runtime cannot create the container) nor limits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!spec_path(&agent, &id).exists());
    assert!(!agent
        .state_dir
        .join("vgpu")
        .join(&id)
        .join("limits")
        .exists());
    // One Event per reason, not one per poll.
    assert_eq!(
        api.objects("/apis/events.k8s.io/v1/namespaces/team/events")
            .len(),
        1
    );

    // A tenant who writes its own assignment (bypassing the scheduler with nodeName)
    // cannot give itself more than its resources ask.
    let mut forged = pod(
        "forged",
        json!([container(
            "main",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                                        "nvidia.com/gpucores": "30"})
        )]),
    );
    let gpu = agent.backend.inventory().unwrap().gpus[0].uuid.clone();
    forged["spec"]["nodeName"] = json!(NODE);
    forged["metadata"]["annotations"] = json!({ASSIGNMENT_ANNOTATION: json!({"node": NODE,
        "containers": [{"name": "main", "devices": [{"uuid": gpu, "memoryMiB": 81920, "cores": 0}]}]})
        .to_string()});
    api.put_object(PODS, forged);
    let answers = kubelet
        .admit(
            "team",
            "forged",
            "uid-forged",
            &[("main", "nvidia.com/gpu", 1)],
        )
        .await
        .unwrap();
    let forged_id = alloc_id(&answers[0]);
    let deadline = Instant::now() + WAIT;
    let note = loop {
        let events = api.objects("/apis/events.k8s.io/v1/namespaces/team/events");
        if let Some(e) = events
            .into_iter()
            .find(|e| e["regarding"]["name"] == "forged")
        {
            break e["note"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "no Event on the forged pod");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        note.contains("gives 81920 MiB") && note.contains("asks for 10240 MiB"),
        "{note}"
    );
    assert!(!spec_path(&agent, &forged_id).exists());
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_pending_across_an_agent_restart_is_bound_after_it() {
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let first = agent(&api, &kubelet, tmp.path());
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = extender(&api, &stop).await;
    let infer = pod(
        "infer",
        json!([container(
            "main",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                        "nvidia.com/gpucores": "20"})
        )]),
    );
    api.put_object(PODS, infer.clone());
    schedule(addr, &api, &infer).await;

    // The pod cannot be read while the kubelet allocates; the agent then stops.
    api.fail_requests(&["GET"], PODS);
    kubelet.devices("nvidia.com/gpu").await;
    let answers = kubelet
        .admit(
            "team",
            "infer",
            "uid-infer",
            &[("main", "nvidia.com/gpu", 1)],
        )
        .await
        .unwrap();
    let id = alloc_id(&answers[0]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!spec_path(&first, &id).exists());
    first.shutdown().await;

    // A new agent over the same state finds the pending allocation and binds it.
    api.stop_failing();
    let second = agent(&api, &kubelet, tmp.path());
    let (_, limits) = bound(&second, &id).await;
    assert!(
        limits.contains("CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nCUDA_DEVICE_SM_LIMIT_0=20\n"),
        "{limits}"
    );
    stop.cancel();
    second.shutdown().await;
}
