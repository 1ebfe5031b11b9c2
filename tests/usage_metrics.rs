//! Allocated vs used, end to end (issue 21): the node agent with fake GPUs, the kubelet
//! emulator admitting pods (its PodResources API and device checkpoint), the API-server
//! double holding the pods' labels, the shim's accounting file of a vGPU container, the
//! usage sampler, and a real Prometheus scraping the agent's `/metrics` with
//! `honor_labels: true`. Checks the per-GPU and per-container gauges, HAMi's names, that
//! the chargeback counters grow by share × seconds (used: × busy), that a failing
//! PodResources socket charges nothing and keeps the gauges, and that a container gone
//! loses its gauges at once and its chargeback series after `forget_after`.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::agent::AgentBuilder;
use support::apiserver::ApiServer;
use support::exposition::value;
use support::kubelet::Kubelet;
use support::prometheus::Prometheus;
use tessera::gpu::{GpuBackend, GpuUsage};
use tessera::metrics::sampler::{self, SamplerSettings};
use tessera::metrics::NodeMetrics;
use tessera::prometheus::PromClient;
use tessera::shimfiles::{self, accounting, AllocDirs};
use tokio_util::sync::CancellationToken;

const NODE: &str = "gpu-node-1";
const GIB: u64 = 1 << 30;
const CONFIG: &str = "tessera: { gpus: [\n\
  { match: { index: [1] }, mode: timeslice, timeslice: { replicas: 2, rename: nvidia.com/gpu.shared } },\n\
  { match: { index: [2] }, mode: vgpu, vgpu: { count: 4, memory: 20g, cores: 25 } },\n\
  { match: all, mode: whole } ] }";

fn pod(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "ml", "uid": format!("{name}-uid"), "labels": labels },
        "spec": { "containers": [ { "name": "main", "image": "x" } ] }
    })
}

/// An accounting file in the shim's layout holding `used` bytes on CUDA ordinal 0.
fn accounting_file(used: u64) -> Vec<u8> {
    use accounting::*;
    let mut words = vec![0u64; WORDS];
    let header = [MAGIC, VERSION, DEVICES as u64, SLOTS as u64];
    words[..4].copy_from_slice(&header);
    words[4] = checksum(&header);
    words[TOTALS_AT] = used;
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn usage(uuid: &str, used: u64, util: u32) -> GpuUsage {
    GpuUsage {
        uuid: uuid.to_string(),
        memory_used_bytes: used,
        memory_total_bytes: 80 * GIB,
        utilization_percent: Some(util),
        ..GpuUsage::default()
    }
}

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn query(prom: &Prometheus, client: &PromClient, q: &str) -> Vec<(String, f64)> {
    client
        .query_vector(&prom.url, q, now())
        .await
        .unwrap_or_else(|e| panic!("{q}: {e}"))
        .into_iter()
        .map(|s| {
            let labels = s
                .labels
                .iter()
                .filter(|(k, _)| ["pod", "queue", "team", "mode", "podname"].contains(&k.as_str()))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            (labels, s.value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocated_vs_used_reaches_prometheus_and_chargeback_counts_gpu_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let api = ApiServer::start(NODE).await;
    api.put_object(
        "/api/v1/namespaces/ml/pods",
        pod(
            "train",
            json!({ "kueue.x-k8s.io/queue-name": "research", "team": "vision" }),
        ),
    );
    api.put_object(
        "/api/v1/namespaces/ml/pods",
        pod(
            "infer",
            json!({ "tessera.io/queue-name": "serving", "team": "nlp" }),
        ),
    );
    api.put_object("/api/v1/namespaces/ml/pods", pod("share", json!({})));

    let (tap, advertised) = tokio::sync::watch::channel(Default::default());
    let mut builder = AgentBuilder::new("4xA100-80GB")
        .config(CONFIG)
        .root(tmp.path().to_path_buf());
    builder.advertised = Some(tap);
    let agent = builder.start();
    let gpus: Vec<String> = agent
        .backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    for r in ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/vgpu"] {
        kubelet
            .wait_until(Duration::from_secs(10), r, |m| {
                m.get(r)
                    .is_some_and(|s| s.lists.last().is_some_and(|l| !l.is_empty()))
            })
            .await;
    }
    kubelet
        .admit("ml", "train", "train-uid", &[("main", "nvidia.com/gpu", 1)])
        .await
        .unwrap();
    kubelet
        .admit(
            "ml",
            "share",
            "share-uid",
            &[("main", "nvidia.com/gpu.shared", 1)],
        )
        .await
        .unwrap();
    let answer = kubelet
        .admit(
            "ml",
            "infer",
            "infer-uid",
            &[("main", "nvidia.com/vgpu", 1)],
        )
        .await
        .unwrap();
    let alloc = answer[0].annotations[shimfiles::ALLOCATION_ANNOTATION].clone();
    let dirs = AllocDirs::new(agent.state_dir.join("vgpu"));
    std::fs::write(
        dirs.accounting_dir(&alloc).join(shimfiles::ACCOUNTING_FILE),
        accounting_file(3 * GIB),
    )
    .unwrap();
    // GPU 0 whole (train), GPU 1 two replicas (share holds one), GPU 2 vGPU (infer).
    agent.backend.set_usage(usage(&gpus[0], 10 * GIB, 50));
    agent.backend.set_usage(usage(&gpus[1], 4 * GIB, 80));
    agent.backend.set_usage(usage(&gpus[2], 5 * GIB, 20));

    // The agent's metrics with HAMi's names, served on a loopback port.
    let metrics = Arc::new(NodeMetrics::with_hami(true));
    let cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tessera::metrics::serve(
        listener,
        metrics.clone(),
        cancel.clone(),
    ));
    let settings = SamplerSettings {
        node_name: NODE.into(),
        interval: Duration::from_millis(500),
        forget_after: Duration::from_secs(3),
        team_label: "team".into(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        kubelet_checkpoint: agent.plugin_dir.join("kubelet_internal_checkpoint"),
        alloc_dirs: dirs.clone(),
        client: Some(api.client()),
        proc_root: agent.state_dir.join("no-proc"),
    };
    let backend: Arc<dyn GpuBackend> = agent.backend.clone();
    tokio::spawn(sampler::run(
        settings,
        backend,
        advertised,
        metrics.clone(),
        cancel.clone(),
    ));

    let alloc_name = "tessera_chargeback_gpu_allocated_seconds_total";
    let used_name = "tessera_chargeback_gpu_used_seconds_total";
    wait_for(
        "the three containers charged",
        Duration::from_secs(10),
        || {
            let page = metrics.encode();
            ["train", "share", "infer"]
                .iter()
                .all(|p| value(&page, alloc_name, &[("pod", p)]).is_some_and(|v| v > 0.0))
                .then_some(())
        },
    )
    .await;

    // What the agent serves, read through a real Prometheus.
    let Some(prom) = Prometheus::scraping(addr).await else {
        return;
    };
    let client = PromClient::new(Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let shares = loop {
        let got = query(&prom, &client, "tessera_container_gpu_allocated_share").await;
        if got.len() == 3 || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut shares = shares;
    shares.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        shares,
        [
            ("mode=timeslice,pod=share".to_string(), 0.5),
            ("mode=vgpu,pod=infer,queue=serving".to_string(), 0.25),
            ("mode=whole,pod=train,queue=research".to_string(), 1.0),
        ]
    );
    let q = |s: &str| s.to_string();
    assert_eq!(
        query(&prom, &client, "tessera_container_gpu_memory_used_bytes")
            .await
            .len(),
        2,
        "whole and vGPU only: a time-sliced replica's memory is not attributed"
    );
    assert_eq!(
        query(
            &prom,
            &client,
            "tessera_container_gpu_memory_used_bytes{pod=\"infer\"}"
        )
        .await,
        [(q("mode=vgpu,pod=infer,queue=serving"), (3 * GIB) as f64)]
    );
    assert_eq!(
        query(
            &prom,
            &client,
            "tessera_container_gpu_memory_limit_bytes{pod=\"infer\"}"
        )
        .await,
        [(q("mode=vgpu,pod=infer,queue=serving"), (20 * GIB) as f64)]
    );
    assert_eq!(
        query(
            &prom,
            &client,
            &format!(
                "tessera_gpu_utilization_ratio{{gpu=\"{}\",node=\"{NODE}\",model=\"A100-80GB\"}}",
                gpus[0]
            )
        )
        .await,
        [(q("mode=whole"), 0.5)]
    );
    assert_eq!(
        query(
            &prom,
            &client,
            &format!("tessera_gpu_memory_used_bytes{{gpu=\"{}\"}}", gpus[1])
        )
        .await,
        [(q("mode=timeslice"), (4 * GIB) as f64)]
    );
    // HAMi's names for the same values.
    assert_eq!(
        query(&prom, &client, "vGPU_device_memory_usage_in_bytes{podnamespace=\"ml\",ctrname=\"main\",vdeviceid=\"0\"}").await,
        [(q("podname=infer"), (3 * GIB) as f64)]
    );
    assert_eq!(
        query(
            &prom,
            &client,
            &format!("HostCoreUtilization{{deviceuuid=\"{}\"}}", gpus[2])
        )
        .await
        .len(),
        1
    );
    let team = query(&prom, &client, &format!("{alloc_name}{{pod=\"train\"}}")).await;
    assert!(team[0].0.contains("team=vision"), "{team:?}");

    // Chargeback: over the same ticks, allocated grows by share × seconds and used by
    // allocated × busy (whole: 0.5; replica: 0.8; vGPU: 20 % / 25 % SMs = 0.8).
    let page = metrics.encode();
    let before: Vec<(f64, f64)> = ["train", "share", "infer"]
        .iter()
        .map(|p| {
            (
                value(&page, alloc_name, &[("pod", p)]).unwrap(),
                value(&page, used_name, &[("pod", p)]).unwrap(),
            )
        })
        .collect();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let page = metrics.encode();
    let elapsed = started.elapsed().as_secs_f64();
    let grown: Vec<(f64, f64)> = ["train", "share", "infer"]
        .iter()
        .zip(&before)
        .map(|(p, (a, u))| {
            (
                value(&page, alloc_name, &[("pod", p)]).unwrap() - a,
                value(&page, used_name, &[("pod", p)]).unwrap() - u,
            )
        })
        .collect();
    let train = grown[0];
    assert!(
        (train.0 - elapsed).abs() <= 0.75,
        "a whole GPU held {elapsed:.2} s charged {:.2} GPU-s",
        train.0
    );
    for ((alloc, used), (share_of, busy)) in
        grown
            .iter()
            .copied()
            .zip([(1.0, 0.5), (0.5, 0.8), (0.25, 0.8)])
    {
        assert!((alloc - train.0 * share_of).abs() < 1e-6, "{grown:?}");
        assert!((used - alloc * busy).abs() < 1e-6, "{grown:?}");
    }

    // The PodResources socket fails: nothing is charged, the gauges stay.
    kubelet.stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let frozen = value(&metrics.encode(), alloc_name, &[("pod", "train")]).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let page = metrics.encode();
    assert_eq!(value(&page, alloc_name, &[("pod", "train")]), Some(frozen));
    assert_eq!(
        value(
            &page,
            "tessera_container_gpu_allocated_share",
            &[("pod", "train")]
        ),
        Some(1.0)
    );
    drop(prom);
    cancel.cancel();
    agent.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_gone_loses_its_gauges_at_once_and_its_counters_after_the_delay() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let (tap, advertised) = tokio::sync::watch::channel(Default::default());
    let mut builder = AgentBuilder::new("2xA100-80GB").root(tmp.path().to_path_buf());
    builder.advertised = Some(tap);
    let agent = builder.start();
    kubelet
        .wait_until(Duration::from_secs(10), "GPUs", |m| {
            m.get("nvidia.com/gpu")
                .is_some_and(|s| s.lists.last().is_some_and(|l| l.len() == 2))
        })
        .await;
    kubelet
        .admit("ml", "done", "done-uid", &[("main", "nvidia.com/gpu", 1)])
        .await
        .unwrap();
    let metrics = Arc::new(NodeMetrics::new());
    let cancel = CancellationToken::new();
    let settings = SamplerSettings {
        node_name: NODE.into(),
        interval: Duration::from_millis(300),
        forget_after: Duration::from_secs(2),
        team_label: "team".into(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        kubelet_checkpoint: agent.plugin_dir.join("kubelet_internal_checkpoint"),
        alloc_dirs: AllocDirs::new(agent.state_dir.join("vgpu")),
        client: None,
        proc_root: agent.state_dir.join("no-proc"),
    };
    tokio::spawn(sampler::run(
        settings,
        agent.backend.clone(),
        advertised,
        metrics.clone(),
        cancel.clone(),
    ));
    let alloc_name = "tessera_chargeback_gpu_allocated_seconds_total";
    wait_for("the container charged", Duration::from_secs(10), || {
        value(
            &metrics.encode(),
            alloc_name,
            &[("pod", "done"), ("queue", "")],
        )
        .filter(|v| *v > 0.0)
    })
    .await;
    kubelet.remove_pod("done-uid");
    let gone = Instant::now();
    wait_for("the gauges removed", Duration::from_secs(5), || {
        value(
            &metrics.encode(),
            "tessera_container_gpu_allocated_share",
            &[("pod", "done")],
        )
        .is_none()
        .then_some(())
    })
    .await;
    let page = metrics.encode();
    assert!(
        value(&page, alloc_name, &[("pod", "done")]).is_some(),
        "counters kept so their last increments are scraped"
    );
    wait_for("the counters forgotten", Duration::from_secs(10), || {
        value(&metrics.encode(), alloc_name, &[("pod", "done")])
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        gone.elapsed() >= Duration::from_secs(2),
        "forgotten after {:?}, before --chargeback-forget-after",
        gone.elapsed()
    );
    cancel.cancel();
    agent.cancel.cancel();
}

/// `GET /metrics` from 127.0.0.1:`port` (`None` while nothing listens).
async fn scrape(port: u16) -> Option<String> {
    support::http::try_get(port, "/metrics")
        .await
        .map(|(_, body)| body)
}

/// The `tessera node` binary wires the flags: `--usage-interval`, `--hami-metrics` and
/// the default PodResources socket under `--kubelet-dir`; a pod the kubelet admitted is
/// charged and shows up in the gauges, HAMi's host names are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_samples_usage_with_its_flags() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let tmp = tempfile::tempdir().unwrap();
    let kubelet_dir = tmp.path().join("kubelet");
    let kubelet = Kubelet::start(&kubelet_dir.join("device-plugins")).await;
    let port = support::http::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "node",
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "2xH100-80GB",
        ])
        .args(["--standalone", "--node-name", NODE, "--usage-interval", "1"])
        .args([
            "--hami-metrics",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--cdi-root")
        .arg(tmp.path().join("cdi"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    kubelet
        .admit("ml", "train", "train-uid", &[("main", "nvidia.com/gpu", 1)])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let page = loop {
        let page = scrape(port).await.unwrap_or_default();
        let charged = value(
            &page,
            "tessera_chargeback_gpu_allocated_seconds_total",
            &[("pod", "train"), ("node", NODE), ("model", "H100-80GB")],
        )
        .is_some_and(|v| v >= 1.0);
        if charged || Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let _ = child.wait();
    assert!(
        value(
            &page,
            "tessera_chargeback_gpu_allocated_seconds_total",
            &[("pod", "train")]
        )
        .is_some_and(|v| v >= 1.0),
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            "tessera_chargeback_gpu_used_seconds_total",
            &[("pod", "train")]
        ),
        Some(0.0),
        "the fake GPUs are idle"
    );
    assert_eq!(
        value(
            &page,
            "tessera_container_gpu_allocated_share",
            &[("pod", "train"), ("mode", "whole")]
        ),
        Some(1.0),
        "{page}"
    );
    assert_eq!(
        value(
            &page,
            "tessera_gpu_memory_total_bytes",
            &[("mode", "whole")]
        ),
        Some(81_559.0 * 1024.0 * 1024.0),
        "{page}"
    );
    assert_eq!(
        page.lines()
            .filter(|l| l.starts_with("HostGPUMemoryUsage{"))
            .count(),
        2,
        "{page}"
    );
}

/// DRA claims (issue: the DRA path invisible to usage metrics): a container's claims come
/// from PodResources `dynamic_resources`, what each device is from the driver's checkpoint
/// and, for a vGPU slice, the claim's units record and the shim's accounting file. A whole
/// GPU and a vGPU slice are charged like device-plugin ones; a claim of another driver is
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_are_charged_from_pod_resources_and_the_drivers_checkpoint() {
    use tessera::dra::checkpoint::{self, Phase, PreparedClaim, PreparedDevice, Store};
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let backend = Arc::new(tessera::gpu::fake::FakeBackend::from_spec("2xA100-80GB").unwrap());
    let gpus: Vec<String> = backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    backend.set_usage(usage(&gpus[0], 10 * GIB, 50));
    backend.set_usage(usage(&gpus[1], 5 * GIB, 20));

    // What the driver prepared: its checkpoint and the vGPU claim's directory.
    let state = tmp.path().join("state");
    let device = |name: &str, uid: &str| PreparedDevice {
        pool: NODE.into(),
        device: name.into(),
        request_names: vec!["gpu".into()],
        cdi_device_ids: vec![format!("tessera.io/gpu={uid}-{name}")],
        mig: None,
        time_slice: None,
    };
    let mut data = checkpoint::Data::default();
    for (uid, name, dev) in [
        ("uid-train", "train", "gpu-0"),
        ("uid-slice", "slice", "gpu-1-vgpu"),
    ] {
        data.claims.insert(
            uid.into(),
            PreparedClaim {
                namespace: "ml".into(),
                name: name.into(),
                phase: Phase::Completed,
                devices: vec![device(dev, uid)],
            },
        );
    }
    Store::new(&state.join("dra")).write(&data).unwrap();
    let dirs = AllocDirs::new(state.join("vgpu"));
    dirs.create("claim-uid-slice").unwrap();
    dirs.write_limits(
        "claim-uid-slice",
        &[shimfiles::UnitLimits {
            index: 0,
            gpu: gpus[1].clone(),
            memory_mib: 20 * 1024,
            cores: 25,
        }],
    )
    .unwrap();
    std::fs::write(
        dirs.accounting_dir("claim-uid-slice")
            .join(shimfiles::ACCOUNTING_FILE),
        accounting_file(3 * GIB),
    )
    .unwrap();
    // The kubelet runs the pods with their claims.
    let ours = |dev: &'static str, uid: &str| {
        (
            "gpu.tessera.io",
            NODE,
            dev,
            vec![format!("tessera.io/gpu={uid}-{dev}")],
        )
    };
    kubelet.admit_claim(
        "ml",
        "trainer",
        "trainer-uid",
        "main",
        "uid-train",
        "train",
        &[ours("gpu-0", "uid-train")],
    );
    kubelet.admit_claim(
        "ml",
        "infer",
        "infer-uid",
        "main",
        "uid-slice",
        "slice",
        &[ours("gpu-1-vgpu", "uid-slice")],
    );
    kubelet.admit_claim(
        "ml",
        "nic",
        "nic-uid",
        "main",
        "uid-nic",
        "nic",
        &[("nic.example.com", NODE, "eth-0", vec![])],
    );

    let metrics = Arc::new(NodeMetrics::new());
    let cancel = CancellationToken::new();
    let settings = SamplerSettings {
        node_name: NODE.into(),
        interval: Duration::from_millis(300),
        forget_after: Duration::from_secs(60),
        team_label: "team".into(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        kubelet_checkpoint: tmp
            .path()
            .join("kubelet/device-plugins/kubelet_internal_checkpoint"),
        alloc_dirs: dirs,
        client: None,
        proc_root: std::path::PathBuf::from("/nonexistent-proc"),
    };
    assert_eq!(settings.dra_checkpoint_dir(), Some(state.join("dra")));
    let (_tap, advertised) = tokio::sync::watch::channel(Default::default());
    tokio::spawn(sampler::run(
        settings,
        backend.clone(),
        advertised,
        metrics.clone(),
        cancel.clone(),
    ));
    let alloc_name = "tessera_chargeback_gpu_allocated_seconds_total";
    wait_for("both claims charged", Duration::from_secs(10), || {
        let page = metrics.encode();
        let charged = |pod| value(&page, alloc_name, &[("pod", pod)]).filter(|v| *v > 0.0);
        charged("trainer").and(charged("infer")).map(|_| page)
    })
    .await;
    let page = metrics.encode();
    let share = "tessera_container_gpu_allocated_share";
    assert_eq!(
        value(
            &page,
            share,
            &[("pod", "trainer"), ("mode", "whole"), ("gpu", &gpus[0])]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &page,
            share,
            &[("pod", "infer"), ("mode", "vgpu"), ("gpu", &gpus[1])]
        ),
        Some(0.25)
    );
    assert_eq!(
        value(
            &page,
            "tessera_container_gpu_memory_used_bytes",
            &[("pod", "infer")]
        ),
        Some((3 * GIB) as f64)
    );
    assert_eq!(
        value(
            &page,
            "tessera_container_gpu_memory_limit_bytes",
            &[("pod", "infer")]
        ),
        Some((20 * GIB) as f64)
    );
    assert!(
        value(&page, share, &[("pod", "nic")]).is_none(),
        "another driver's claim"
    );
    cancel.cancel();
}
