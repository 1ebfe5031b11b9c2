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
    agent_on(api, kubelet, root, "2xA100-80GB", SPLIT_ALL)
}

fn agent_on(
    api: &ApiServer,
    kubelet: &Kubelet,
    root: &Path,
    gpus: &str,
    config: &str,
) -> RunningAgent {
    let mut builder = AgentBuilder::new(gpus)
        .config(config)
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
        kubelet_checkpoint: kubelet.dir.join("kubelet_internal_checkpoint"),
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
        metrics: Default::default(),
    });
    tokio::spawn(serve(listener, extender, stop.clone()));
    addr
}

/// The emulated cluster: the API-server double, the kubelet emulator, and (when asked)
/// the extender serving on `addr`; the extender stops when this is dropped.
struct Cluster {
    api: ApiServer,
    kubelet: Kubelet,
    tmp: tempfile::TempDir,
    stop: tokio_util::sync::CancellationToken,
    addr: std::net::SocketAddr,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn cluster(with_extender: bool) -> Cluster {
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let addr = if with_extender {
        extender(&api, &stop).await
    } else {
        "127.0.0.1:9".parse().unwrap()
    };
    Cluster {
        api,
        kubelet,
        tmp,
        stop,
        addr,
    }
}

/// The kubelet admits `name`'s container `main` (one slot); returns the allocation ID.
async fn admit_main(kubelet: &Kubelet, name: &str) -> String {
    kubelet.devices("nvidia.com/gpu").await;
    let answers = kubelet
        .admit(
            "team",
            name,
            &format!("uid-{name}"),
            &[("main", "nvidia.com/gpu", 1)],
        )
        .await
        .unwrap();
    alloc_id(&answers[0])
}

/// The note of the first Event about pod `name`, once there is one.
async fn event_note(api: &ApiServer, name: &str) -> (Value, String) {
    let deadline = Instant::now() + WAIT;
    loop {
        let events = api.objects("/apis/events.k8s.io/v1/namespaces/team/events");
        if let Some(e) = events.into_iter().find(|e| e["regarding"]["name"] == name) {
            let note = e["note"].as_str().unwrap().to_string();
            return (e, note);
        }
        assert!(Instant::now() < deadline, "no Event on pod {name}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Value {
    let (code, answer) = support::http::call(addr, "POST", path, &body.to_string()).await;
    assert_eq!(code, 200, "{answer}");
    answer
}

/// Filter (until the books know the node) and bind `pod` to the node, as kube-scheduler
/// does with the extender; returns the assignment recorded on the pod.
async fn schedule(addr: std::net::SocketAddr, api: &ApiServer, pod: &Value) -> AssignmentRecord {
    wait_until_fits(addr, pod).await;
    assert_eq!(bind(addr, pod).await, json!({}));
    assignment_of(api, pod["metadata"]["name"].as_str().unwrap())
}

async fn wait_until_fits(addr: std::net::SocketAddr, pod: &Value) {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = post(addr, "/filter", &json!({"pod": pod, "nodenames": [NODE]})).await;
        if answer["nodenames"] == json!([NODE]) {
            return;
        }
        assert!(Instant::now() < deadline, "/filter answers {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kube-scheduler's bind call: `{}` when bound, else `{"error": ...}`.
async fn bind(addr: std::net::SocketAddr, pod: &Value) -> Value {
    let meta = &pod["metadata"];
    post(
        addr,
        "/bind",
        &json!({"podName": meta["name"], "podNamespace": meta["namespace"],
                "podUID": meta["uid"], "node": NODE}),
    )
    .await
}

fn assignment_of(api: &ApiServer, name: &str) -> AssignmentRecord {
    let stored = api
        .objects(PODS)
        .into_iter()
        .find(|p| p["metadata"]["name"] == name)
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
    let c = cluster(true).await;
    let (api, kubelet, tmp, addr) = (&c.api, &c.kubelet, &c.tmp, c.addr);
    let agent = agent(api, kubelet, tmp.path());
    let minors: Vec<(String, u32)> = agent
        .backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| (g.uuid.clone(), g.minor))
        .collect();

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
    let assignment = schedule(addr, api, &infer).await;
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
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_without_an_assignment_or_with_a_forged_one_never_gets_a_gpu_and_is_told_why() {
    let c = cluster(false).await;
    let (api, kubelet, tmp) = (&c.api, &c.kubelet, &c.tmp);
    let agent = agent(api, kubelet, tmp.path());

    // Placed by the default scheduler (no extender, no assignment).
    let plain = pod(
        "plain",
        json!([container("main", json!({"nvidia.com/gpu": "1"}))]),
    );
    api.put_object(PODS, plain);
    let id = admit_main(kubelet, "plain").await;
    let (event, note) = event_note(api, "plain").await;
    assert_eq!(event["reason"], "VgpuBindingRefused");
    assert_eq!(event["regarding"]["kind"], "Pod");
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
    let forged_id = admit_main(kubelet, "forged").await;
    let (_, note) = event_note(api, "forged").await;
    assert!(
        note.contains("gives 81920 MiB") && note.contains("asks for 10240 MiB"),
        "{note}"
    );
    assert!(!spec_path(&agent, &forged_id).exists());
    agent.shutdown().await;
    support::rbac::assert_allows_every_request(api, "daemonset/node/rbac.yaml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_pending_across_an_agent_restart_is_bound_after_it() {
    let c = cluster(true).await;
    let (api, kubelet, tmp, addr) = (&c.api, &c.kubelet, &c.tmp, c.addr);
    let first = agent(api, kubelet, tmp.path());
    let infer = pod(
        "infer",
        json!([container(
            "main",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096",
                                        "nvidia.com/gpucores": "20"})
        )]),
    );
    api.put_object(PODS, infer.clone());
    schedule(addr, api, &infer).await;

    // The pod cannot be read while the kubelet allocates; the agent then stops.
    api.fail_requests(&["GET"], PODS);
    let id = admit_main(kubelet, "infer").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!spec_path(&first, &id).exists());
    first.shutdown().await;

    // A new agent over the same state finds the pending allocation and binds it.
    api.stop_failing();
    let second = agent(api, kubelet, tmp.path());
    let (_, limits) = bound(&second, &id).await;
    assert!(
        limits.contains("CUDA_DEVICE_MEMORY_LIMIT_0=4096m\nCUDA_DEVICE_SM_LIMIT_0=20\n"),
        "{limits}"
    );
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pods_bound_at_once_to_one_node_each_get_their_own_limits() {
    let c = cluster(true).await;
    let (api, kubelet, tmp, addr) = (&c.api, &c.kubelet, &c.tmp, c.addr);
    let split10 = "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 10 } } ] }";
    let agent = agent_on(api, kubelet, tmp.path(), "8xA100-80GB", split10);
    let gpus = agent.backend.inventory().unwrap().gpus;

    // 50 pods of mixed sizes, some with two vGPUs or two containers, in the shapes of
    // HAMi's examples (a share, a percentage, memory alone, an exclusive GPU).
    let mut pods = Vec::new();
    for i in 0..50 {
        let limits = match i % 6 {
            0 => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                        "nvidia.com/gpucores": "10"}),
            1 => json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096",
                        "nvidia.com/gpucores": "5"}),
            2 => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "5"}),
            3 => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
            4 => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048",
                        "nvidia.com/gpucores": "15"}),
            _ => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192",
                        "nvidia.com/gpucores": "20"}),
        };
        let mut containers = vec![container("main", limits)];
        if i % 10 == 7 {
            containers.push(container(
                "sidecar",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024",
                       "nvidia.com/gpucores": "5"}),
            ));
        }
        let p = pod(&format!("p{i:02}"), Value::from(containers));
        api.put_object(PODS, p.clone());
        pods.push(p);
    }
    wait_until_fits(addr, &pods[0]).await;

    // Every bind at once (kube-scheduler binds asynchronously); a bind that lost a race
    // is retried as kube-scheduler would, after filtering again.
    let binds: Vec<_> = pods
        .iter()
        .cloned()
        .map(|p| tokio::spawn(async move { (bind(addr, &p).await, p) }))
        .collect();
    for handle in binds {
        let (answer, p) = handle.await.unwrap();
        if answer != json!({}) {
            wait_until_fits(addr, &p).await;
            assert_eq!(bind(addr, &p).await, json!({}), "{answer}");
        }
    }
    assert_eq!(api.bindings().len(), 50);

    // No GPU overcommitted by the assignments.
    let mut per_gpu: std::collections::BTreeMap<String, (u64, u32, u32)> = Default::default();
    let assignments: Vec<(String, AssignmentRecord)> = pods
        .iter()
        .map(|p| {
            let name = p["metadata"]["name"].as_str().unwrap().to_string();
            let a = assignment_of(api, &name);
            (name, a)
        })
        .collect();
    for (_, a) in &assignments {
        for g in a.containers.iter().flat_map(|c| &c.devices) {
            let e = per_gpu.entry(g.uuid.clone()).or_default();
            e.0 += g.memory_mib;
            e.1 += g.cores;
            e.2 += 1;
        }
    }
    for (uuid, (memory, cores, slots)) in &per_gpu {
        assert!(
            *memory <= 81_920 && *cores <= 100 && *slots <= 10,
            "{uuid}: {memory} MiB, {cores} %, {slots} slots"
        );
    }

    // The kubelet admits the pods in another order than they were bound (a fixed
    // shuffle), each pod's containers last to first.
    kubelet.devices("nvidia.com/gpu").await;
    let mut order: Vec<usize> = (0..50).collect();
    order.sort_by_key(|i| (i * 37) % 50);
    let mut allocated = Vec::new();
    for i in order {
        let (name, assignment) = &assignments[i];
        let asks: Vec<(String, usize)> = assignment
            .containers
            .iter()
            .rev()
            .map(|c| (c.name.clone(), c.devices.len()))
            .collect();
        let asks: Vec<(&str, &str, usize)> = asks
            .iter()
            .map(|(c, n)| (c.as_str(), "nvidia.com/gpu", *n))
            .collect();
        let answers = kubelet
            .admit("team", name, &format!("uid-{name}"), &asks)
            .await
            .unwrap();
        for ((container, _, _), answer) in asks.iter().zip(&answers) {
            allocated.push((i, container.to_string(), alloc_id(answer)));
        }
    }

    // Every container runs on the GPUs of its own assignment, with its own limits.
    for (i, container, id) in allocated {
        let grants = &assignments[i]
            .1
            .containers
            .iter()
            .find(|c| c.name == container)
            .unwrap()
            .devices;
        let (spec, limits) = bound(&agent, &id).await;
        let device = &spec["devices"][0]["containerEdits"];
        let want_nodes: Vec<Value> = grants
            .iter()
            .map(|g| {
                let minor = gpus.iter().find(|x| x.uuid == g.uuid).unwrap().minor;
                json!({"path": format!("/dev/nvidia{minor}")})
            })
            .collect();
        assert_eq!(device["deviceNodes"], Value::from(want_nodes), "{id}");
        for (ordinal, g) in grants.iter().enumerate() {
            let want = format!(
                "CUDA_DEVICE_MEMORY_LIMIT_{ordinal}={}m\nCUDA_DEVICE_SM_LIMIT_{ordinal}={}\n",
                g.memory_mib, g.cores
            );
            assert!(limits.contains(&want), "{id}: {want:?} not in {limits}");
        }
    }
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_created_again_under_the_same_name_is_not_taken_for_the_old_one() {
    let c = cluster(true).await;
    let (api, kubelet, tmp, addr) = (&c.api, &c.kubelet, &c.tmp, c.addr);
    let agent = agent(api, kubelet, tmp.path());
    let infer = pod(
        "infer",
        json!([container(
            "main",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"})
        )]),
    );
    api.put_object(PODS, infer.clone());
    schedule(addr, api, &infer).await;
    // The kubelet allocates to the pod while the agent cannot read it; meanwhile the pod
    // is deleted and created again (new UID) with the same name and an assignment.
    api.fail_requests(&["GET"], PODS);
    let id = admit_main(kubelet, "infer").await;
    let mut again = api
        .objects(PODS)
        .into_iter()
        .find(|p| p["metadata"]["name"] == "infer")
        .unwrap();
    again["metadata"]["uid"] = json!("uid-infer-2");
    api.put_object(PODS, again);
    api.stop_failing();
    let (_, note) = event_note(api, "infer").await;
    assert!(
        note.contains("pod UID uid-infer, but the pod of that name is now UID uid-infer-2"),
        "{note}"
    );
    assert!(!spec_path(&agent, &id).exists());
    agent.shutdown().await;
}

/// The vGPU guard over a real allocation: the extender's assignment, the kubelet's
/// admission through the agent (its units record and the kubelet's device checkpoint),
/// the driver's per-process accounting from the fake inventory and a `/proc` stand-in: a
/// pod using more of its GPU than its slice allows is reported with its process once the
/// grace period has passed, on a Node Event; a process no pod owns is never blamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_reports_a_pod_over_its_slice_from_the_drivers_accounting() {
    use tessera::agent::vgpu_guard::{sample, BackendProcesses, GuardConfig, GuardMode};
    use tessera::gpu::{GpuUsage, ProcessUsage};
    use tessera::vgpu::guard::{Finding, Guard, Settings};
    const UID: &str = "0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6b";
    const MIB: u64 = 1 << 20;
    let c = cluster(true).await;
    let (api, kubelet, tmp, addr) = (&c.api, &c.kubelet, &c.tmp, c.addr);
    let agent = agent(api, kubelet, tmp.path());
    let mut infer = pod(
        "infer",
        json!([container(
            "main",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"})
        )]),
    );
    infer["metadata"]["uid"] = json!(UID);
    api.put_object(PODS, infer.clone());
    let assignment = schedule(addr, api, &infer).await;
    let grant = assignment.containers[0].devices[0].clone();
    kubelet.devices("nvidia.com/gpu").await;
    let answers = kubelet
        .admit("team", "infer", UID, &[("main", "nvidia.com/gpu", 1)])
        .await
        .unwrap();
    bound(&agent, &alloc_id(&answers[0])).await;

    // The driver sees the pod's process at 12 GiB on its GPU (10 GiB slice + 1 GiB
    // tolerance = 11 GiB allowed), and a process of no pod.
    agent.backend.set_usage(GpuUsage {
        uuid: grant.uuid.clone(),
        memory_used_bytes: 12_800 * MIB,
        memory_total_bytes: 81_920 * MIB,
        utilization_percent: Some(50),
        mig: Vec::new(),
        processes: vec![
            ProcessUsage {
                pid: 4242,
                memory_used_bytes: Some(12_288 * MIB),
            },
            ProcessUsage {
                pid: 5151,
                memory_used_bytes: Some(512 * MIB),
            },
        ],
    });
    let proc_root = tmp.path().join("guard-proc");
    let cgroup = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-1.scope\n",
        UID.replace('-', "_")
    );
    for (pid, text) in [
        (4242, cgroup.as_str()),
        (5151, "0::/system.slice/sshd.service\n"),
    ] {
        std::fs::create_dir_all(proc_root.join(pid.to_string())).unwrap();
        std::fs::write(proc_root.join(pid.to_string()).join("cgroup"), text).unwrap();
    }
    let cfg = GuardConfig {
        mode: GuardMode::Report,
        interval: Duration::from_secs(10),
        settings: Settings {
            tolerance_per_process_bytes: 1024 * MIB,
            grace_ms: 30_000,
        },
        alloc_dirs: tessera::deviceplugin::allocate::AllocateSettings::with_state_dir(
            &agent.state_dir,
        )
        .alloc_dirs(),
        kubelet_checkpoint: kubelet.dir.join("kubelet_internal_checkpoint"),
        proc_root,
    };
    let source = BackendProcesses(agent.backend.clone());
    let recorder = KubeEventRecorder::new(api.client(), NODE.into());
    let mut guard = Guard::new();
    let over = |findings: &[Finding]| {
        findings
            .iter()
            .filter(|f| matches!(f, Finding::OverLimit { .. }))
            .cloned()
            .collect::<Vec<_>>()
    };
    let first = sample(&cfg, &mut guard, &source, &recorder, 1_000_000).unwrap();
    assert!(
        over(&first).is_empty(),
        "within the grace period: {first:?}"
    );
    let later = sample(&cfg, &mut guard, &source, &recorder, 1_031_000).unwrap();
    match over(&later).as_slice() {
        [Finding::OverLimit {
            pod_uid,
            gpu,
            used_bytes,
            limit_bytes,
            pids,
            ..
        }] => {
            assert_eq!((pod_uid.as_str(), gpu), (UID, &grant.uuid));
            assert_eq!((*used_bytes, *limit_bytes), (12_288 * MIB, 10_240 * MIB));
            assert_eq!(pids, &[4242], "the process of no pod is not blamed");
        }
        other => panic!("one pod over its slice, not {other:?} (all: {later:?})"),
    }
    let start = Instant::now();
    while !api.events().iter().any(|e| {
        e["reason"] == "VgpuOverLimit" && e["note"].as_str().is_some_and(|n| n.contains(UID))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    agent.shutdown().await;
}
