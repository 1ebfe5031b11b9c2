//! The NVML backend against a stand-in `libnvidia-ml.so.1` (tests/fake_nvml/fake_nvml.c,
//! compiled here with the system C compiler, which every Rust toolchain on Linux has as
//! its linker). This drives the real NVML glue — symbol loading, struct layouts,
//! versioned structs, MIG instance calls, the event thread — without a GPU. The model
//! (three GPUs, MIG state, NVLink, events) is described at the top of the C file.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::exposition::series;

use tessera::gpu::nvml::probe::ProbeConfig;
use tessera::gpu::nvml::NvmlBackend;
use tessera::gpu::{Error, GpuBackend, HealthEvent};

const A: &str = "GPU-11111111-1111-1111-1111-111111111111";
const B: &str = "GPU-22222222-2222-2222-2222-222222222222";
const L4: &str = "GPU-33333333-3333-3333-3333-333333333333";

/// A fresh copy of the fake driver (own path, so own state) in its own directory.
struct FakeDriver {
    dir: tempfile::TempDir,
}

impl FakeDriver {
    fn build(conf: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O0", "-Wall", "-o"])
            .arg(dir.path().join("libnvidia-ml.so.1"))
            .arg(&src)
            .arg("-ldl")
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
        assert!(
            out.status.success(),
            "building the fake NVML failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(dir.path().join("fake_nvml.conf"), conf).unwrap();
        // A sysfs tree for the NUMA fallback of the L4 (NVML has no NUMA id for it).
        let numa = dir.path().join("sys/bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&numa).unwrap();
        std::fs::write(numa.join("numa_node"), "1\n").unwrap();
        Self { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    fn backend(&self) -> NvmlBackend {
        NvmlBackend::new(Some(self.lib().as_os_str()))
            .unwrap()
            .with_sysfs_root(self.dir.path().join("sys"))
            .with_probe_config(ProbeConfig {
                interval: Duration::from_millis(30),
                clean_needed: 3,
            })
    }

    fn event(&self, line: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("events"))
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

fn layout(items: &[(&str, u8)]) -> Vec<(String, u8)> {
    items.iter().map(|(p, s)| (p.to_string(), *s)).collect()
}

#[test]
fn inventory_reads_every_field() {
    let fake = FakeDriver::build("");
    let inv = fake.backend().inventory().unwrap();
    assert_eq!(inv.driver.driver_version, "570.86.15");
    assert_eq!(inv.driver.cuda_version, "12.8");
    assert_eq!(inv.gpus.len(), 3);

    let a = inv.gpu(A).unwrap();
    assert_eq!((a.index, a.minor), (0, 0));
    assert_eq!(a.product_name, "NVIDIA A100-SXM4-80GB");
    assert_eq!(a.memory_mib, 81920);
    assert_eq!(a.compute_capability, (8, 0));
    assert_eq!(a.architecture, "Ampere");
    assert_eq!(a.pci_bus_id, "0000:07:00.0");
    assert_eq!(a.numa_node, Some(0));
    assert_eq!(a.sm_count, 108, "MIG on: SMs from the table");
    assert!(a.mig_capable && a.mig_enabled);
    // Two direct links to B, plus B shares the NVSwitch link.
    assert_eq!(a.nvlink_peers, vec![B, B, B]);
    assert_eq!(a.nvlinks_to(inv.gpu(B).unwrap()), 3);
    // The 1g.10gb at slot 4 has no compute instance: not a MIG device.
    assert_eq!(a.mig_devices.len(), 1);
    let m = &a.mig_devices[0];
    assert_eq!(m.uuid, "MIG-00000001-0000-0000-0000-000000000001");
    assert_eq!(m.profile, "3g.40gb");
    assert_eq!((m.gi_id, m.ci_id, m.start, m.size), (1, 0, 0, 4));
    assert_eq!((m.memory_mib, m.sm_count), (40192, 42));

    let b = inv.gpu(B).unwrap();
    assert_eq!(b.numa_node, Some(1));
    assert_eq!(b.sm_count, 108, "MIG off: SMs from nvmlDeviceGetAttributes");
    assert!(b.mig_capable && !b.mig_enabled && b.mig_devices.is_empty());
    assert_eq!(b.nvlink_peers, vec![A, A, A]);

    let l4 = inv.gpu(L4).unwrap();
    assert_eq!(l4.architecture, "Ada");
    assert_eq!(l4.pci_bus_id, "0000:3B:00.0");
    assert_eq!(l4.numa_node, Some(1), "sysfs fallback");
    assert_eq!(l4.sm_count, 58, "attributes NotSupported: table fallback");
    assert!(!l4.mig_capable && !l4.mig_enabled);
    assert!(l4.nvlink_peers.is_empty());
}

#[test]
fn a_broken_gpu_is_left_out_and_the_others_still_reported() {
    let fake = FakeDriver::build("broken_name 1\n");
    let inv = fake.backend().inventory().unwrap();
    let uuids: Vec<&str> = inv.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, vec![A, L4]);
    // Peers are resolved among the GPUs that are reported: B's links are gone, the
    // switch link has no reported partner left.
    assert!(inv.gpu(A).unwrap().nvlink_peers.is_empty());
}

#[test]
fn mig_layout_keeps_what_fits_and_creates_the_rest() {
    let fake = FakeDriver::build("");
    let backend = fake.backend();
    let before = backend
        .inventory()
        .unwrap()
        .gpu(A)
        .unwrap()
        .mig_devices
        .clone();
    let want = layout(&[
        ("3g.40gb", 0),
        ("1g.10gb", 4),
        ("1g.10gb+me", 5),
        ("1g.10gb", 6),
    ]);
    let made = backend.apply_mig_layout(A, &want).unwrap();
    let got: Vec<(String, u8)> = made.iter().map(|m| (m.profile.clone(), m.start)).collect();
    assert_eq!(got, want);
    assert_eq!(made[0], before[0], "the 3g.40gb was kept, same UUID");
    assert_eq!(
        made[1].gi_id, 2,
        "the 1g.10gb at 4 got its compute instance"
    );
    // Idempotent.
    assert_eq!(backend.apply_mig_layout(A, &want).unwrap(), made);
    // Re-partition: everything different is replaced.
    let want = layout(&[("7g.80gb", 0)]);
    let made = backend.apply_mig_layout(A, &want).unwrap();
    assert_eq!(made.len(), 1);
    assert_eq!((made[0].profile.as_str(), made[0].size), ("7g.80gb", 8));
    // The inventory sees the same devices.
    let inv = backend.inventory().unwrap();
    assert_eq!(inv.gpu(A).unwrap().mig_devices, made);
    // Empty layout: no MIG devices, MIG mode stays on.
    assert!(backend.apply_mig_layout(A, &[]).unwrap().is_empty());
    assert!(backend.inventory().unwrap().gpu(A).unwrap().mig_enabled);
}

#[test]
fn mig_layout_enables_mig_mode() {
    let fake = FakeDriver::build("");
    let backend = fake.backend();
    let made = backend
        .apply_mig_layout(B, &layout(&[("2g.20gb", 0), ("2g.20gb", 2)]))
        .unwrap();
    assert_eq!(made.len(), 2);
    assert!(made.iter().all(|m| m.profile == "2g.20gb" && m.size == 2));
    assert!(backend.inventory().unwrap().gpu(B).unwrap().mig_enabled);
}

#[test]
fn mig_layout_errors_are_specific() {
    let fake = FakeDriver::build("mig_needs_reset\n");
    let backend = fake.backend();
    let reason = |r: Result<_, Error>| match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    };
    let e = reason(backend.apply_mig_layout(B, &layout(&[("1g.10gb", 0)])));
    assert!(
        e.contains("pending a GPU reset") && e.contains("nvidia-smi -r -i 1"),
        "{e}"
    );
    let e = reason(backend.apply_mig_layout(L4, &layout(&[("1g.10gb", 0)])));
    assert!(e.contains("does not support MIG"), "{e}");
    let e = reason(backend.apply_mig_layout("GPU-nope", &layout(&[("1g.10gb", 0)])));
    assert!(e.contains("unknown GPU GPU-nope"), "{e}");
    let e = reason(backend.apply_mig_layout(A, &layout(&[("1g.11gb", 0)])));
    assert!(
        e.contains("unknown MIG profile 1g.11gb") && e.contains("3g.40gb"),
        "{e}"
    );
    let e = reason(backend.apply_mig_layout(A, &layout(&[("3g.40gb", 2)])));
    assert!(
        e.contains("3g.40gb cannot start at slot 2; valid starts: 0, 4"),
        "{e}"
    );
    let e = reason(backend.apply_mig_layout(A, &layout(&[("1g.10gb", 0), ("1g.10gb", 0)])));
    assert!(e.contains("more than once"), "{e}");
    // Overlaps are the catalog's job to refuse; the driver's refusal still reads well.
    let e = reason(backend.apply_mig_layout(A, &layout(&[("4g.40gb", 0), ("3g.40gb", 0)])));
    assert!(e.contains("overlaps an existing MIG instance"), "{e}");
}

async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("no health event within 5 s")
        .expect("health channel closed")
}

#[tokio::test]
async fn health_events_and_recovery() {
    let fake = FakeDriver::build("");
    let backend = fake.backend();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    backend.watch_health(tx).unwrap();
    // The L4 supports no events: skipped, its lines are ignored.
    fake.event("xid 2 79");
    fake.event("remap 0 1");
    fake.event("xid 0 79");
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::Xid {
            gpu_uuid: A.into(),
            xid: 79
        }
    );
    // Row remapping pending: probes are dirty, no recovery yet.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        rx.try_recv().is_err(),
        "recovered while a remap was pending"
    );
    fake.event("remap 0 0");
    let t0 = std::time::Instant::now();
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::Recovered { gpu_uuid: A.into() }
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(60),
        "needs 3 clean probes"
    );

    // An XID reported on a MIG device handle names the physical GPU.
    fake.event("migxid 0 43");
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::Xid {
            gpu_uuid: A.into(),
            xid: 43
        }
    );
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::Recovered { gpu_uuid: A.into() }
    );

    fake.event("dbe 1");
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::EccUncorrectable {
            gpu_uuid: B.into(),
            count: 1
        }
    );
    assert_eq!(
        next(&mut rx).await,
        HealthEvent::Recovered { gpu_uuid: B.into() }
    );
    drop(rx); // the thread exits once it sees the closed channel
}

#[test]
fn a_lost_gpu_is_not_probed_clean() {
    let fake = FakeDriver::build("");
    let backend = fake.backend();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    backend.watch_health(tx).unwrap();
    fake.event("lost 0 1");
    fake.event("xid 0 79");
    let deadline = std::time::Instant::now() + Duration::from_millis(400);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        if let Ok(ev) = rx.try_recv() {
            seen.push(ev);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        seen,
        vec![HealthEvent::Xid {
            gpu_uuid: A.into(),
            xid: 79
        }]
    );
}

/// A MIG device's utilization comes from GPM where the driver has it: nothing on the
/// first read (no earlier sample), then the GPU instance's activity between two reads;
/// a GPU without GPM (an A100) reports none, never 0. GPU 0 holds the 3g.40gb (GPU
/// instance 1, with a compute instance: a MIG device) of the fake's model.
#[test]
fn mig_utilization_comes_from_gpm_between_two_reads() {
    let mig = |usage: &[tessera::gpu::GpuUsage]| -> Vec<(String, Option<f64>)> {
        usage
            .iter()
            .find(|u| u.uuid == A)
            .map(|u| {
                u.mig
                    .iter()
                    .map(|m| (m.uuid.clone(), m.utilization_percent))
                    .collect()
            })
            .unwrap_or_default()
    };
    let uuid = "MIG-00000001-0000-0000-0000-000000000001".to_string();
    let fake = FakeDriver::build("gpm 0 1 42.5\n");
    let b = fake.backend();
    assert_eq!(mig(&b.usage().unwrap()), vec![(uuid.clone(), None)]);
    assert_eq!(mig(&b.usage().unwrap()), vec![(uuid.clone(), Some(42.5))]);
    assert_eq!(mig(&b.usage().unwrap()), vec![(uuid.clone(), Some(42.5))]);
    // Whole GPUs in MIG mode still report no GPU utilization.
    let usage = b.usage().unwrap();
    assert_eq!(
        usage
            .iter()
            .find(|u| u.uuid == A)
            .and_then(|u| u.utilization_percent),
        None
    );

    let no_gpm = FakeDriver::build("");
    let b = no_gpm.backend();
    for _ in 0..2 {
        assert_eq!(mig(&b.usage().unwrap()), vec![(uuid.clone(), None)]);
    }
}

/// A running sampler over `fake`'s stand-in NVML and the advertised `snapshot`: its
/// metrics, the token that stops it, and the advertised channel's sender (kept open).
fn start_sampler(
    settings: tessera::metrics::sampler::SamplerSettings,
    snapshot: tessera::deviceplugin::snapshot::Snapshot,
    fake: &FakeDriver,
) -> (
    std::sync::Arc<tessera::metrics::NodeMetrics>,
    tokio_util::sync::CancellationToken,
    tokio::sync::watch::Sender<std::sync::Arc<tessera::deviceplugin::snapshot::Snapshot>>,
) {
    use std::sync::Arc;
    let metrics = Arc::new(tessera::metrics::NodeMetrics::new());
    let cancel = tokio_util::sync::CancellationToken::new();
    let (tap, advertised) = tokio::sync::watch::channel(Arc::new(snapshot));
    let backend: Arc<dyn GpuBackend> = Arc::new(fake.backend());
    tokio::spawn(tessera::metrics::sampler::run(
        settings,
        backend,
        advertised,
        metrics.clone(),
        cancel.clone(),
    ));
    (metrics, cancel, tap)
}

/// The agent's metrics page once `ready` holds for it (polled every 50 ms, at most 10 s).
async fn page_when(
    metrics: &tessera::metrics::NodeMetrics,
    what: &str,
    ready: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = metrics.encode();
        if ready(&page) {
            return page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {what} after 10 s:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node of the sampler tests below.
const SAMPLER_NODE: &str = "gpu-node-1";

/// The DRA driver's checkpoint under `state` with one prepared whole-GPU claim on the
/// L4 (`gpu-2`), and the vGPU directory the sampler reads; gives the claim's CDI ID.
fn prepare_whole_gpu_claim(state: &Path, claim_uid: &str, claim_name: &str) -> String {
    use tessera::dra::checkpoint::{self, Phase, PreparedClaim, PreparedDevice, Store};
    let cdi = format!("tessera.io/gpu={claim_uid}-gpu-2");
    let mut data = checkpoint::Data::default();
    data.claims.insert(
        claim_uid.into(),
        PreparedClaim {
            namespace: "ml".into(),
            name: claim_name.into(),
            phase: Phase::Completed,
            devices: vec![PreparedDevice {
                pool: SAMPLER_NODE.into(),
                device: "gpu-2".into(),
                request_names: vec!["gpu".into()],
                cdi_device_ids: vec![cdi.clone()],
                mig: None,
                time_slice: None,
            }],
        },
    );
    Store::new(&state.join("dra")).write(&data).unwrap();
    std::fs::create_dir_all(state.join("vgpu")).unwrap();
    cdi
}

/// The kubelet runs container `main` of pod `ml/<pod>` with that claim.
fn admit_to_claim(
    kubelet: &support::kubelet::Kubelet,
    pod: &str,
    uid: &str,
    claim_uid: &str,
    claim_name: &str,
    cdi: &str,
) {
    kubelet.admit_claim(
        "ml",
        pod,
        uid,
        "main",
        claim_uid,
        claim_name,
        &[(
            "gpu.tessera.io",
            SAMPLER_NODE,
            "gpu-2",
            vec![cdi.to_string()],
        )],
    );
}

/// The sampler's settings for a node whose kubelet directory is `<root>/kubelet`.
fn sampler_settings(
    root: &Path,
    kubelet: &support::kubelet::Kubelet,
    state: &Path,
    proc_root: PathBuf,
    client: Option<kube::Client>,
) -> tessera::metrics::sampler::SamplerSettings {
    tessera::metrics::sampler::SamplerSettings {
        node_name: SAMPLER_NODE.into(),
        interval: Duration::from_millis(200),
        forget_after: Duration::from_secs(60),
        team_label: "team".into(),
        pod_resources_socket: kubelet.pod_resources_socket(),
        kubelet_checkpoint: root.join("kubelet/device-plugins/kubelet_internal_checkpoint"),
        alloc_dirs: tessera::shimfiles::AllocDirs::new(state.join("vgpu")),
        client,
        proc_root,
    }
}

/// Per-process memory through the real usage sampler: the stand-in NVML lists each GPU's
/// compute processes with their memory, a `--proc-root` stand-in names each PID's pod in
/// its `cgroup` file (systemd and cgroupfs drivers), and the kubelet double runs a
/// device-plugin container on GPU 1 and a DRA whole-GPU claim on GPU 2 (the L4). Each
/// container's `tessera_container_gpu_memory_used_bytes` on the agent's page is the sum
/// of its own pod's processes on its GPU, not the GPU's used memory (which NVML reports
/// as every process's); a host process, a PID whose cgroup is gone and a process of a
/// pod holding nothing on that GPU are blamed on no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampler_attributes_per_process_memory_to_device_plugin_and_dra_containers() {
    use support::kubelet::Kubelet;
    use tessera::deviceplugin::snapshot::Snapshot;
    use tessera::partition::layout::{Advertisement, Device, Resource, Share, Target};

    const TRAINER: &str = "0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6b";
    const INFER: &str = "7d1e2f3a-4b5c-4d6e-9f0a-1b2c3d4e5f6a";
    const MIB: f64 = 1024.0 * 1024.0;
    let fake = FakeDriver::build(
        "proc 1 1001 3000\n\
         proc 1 1002 1000\n\
         proc 1 1003 500\n\
         proc 1 1004 700\n\
         proc 2 2001 2000\n\
         proc 2 2002 100\n",
    );
    let tmp = tempfile::tempdir().unwrap();
    // The host's /proc as the agent sees it (hostPID): each PID's cgroup file.
    let proc_root = tmp.path().join("proc");
    let systemd = |uid: &str| {
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-4a5b6c.scope\n",
            uid.replace('-', "_")
        )
    };
    let cgroupfs = |uid: &str| {
        format!("12:pids:/user.slice\n11:memory:/kubepods/besteffort/pod{uid}/abcdef\n")
    };
    for (pid, text) in [
        (1001, systemd(TRAINER)),
        (1002, cgroupfs(TRAINER)),
        (1003, "0::/system.slice/containerd.service\n".to_string()),
        (1004, systemd(INFER)),
        (2001, cgroupfs(INFER)),
        // 2002 has no directory: it exited between NVML's list and the read.
    ] {
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup"), text).unwrap();
    }

    // The device plugin advertises GPU 1 whole; the kubelet gave it to `trainer`.
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    kubelet.record_allocation("ml", "trainer", TRAINER, "main", "nvidia.com/gpu", &[B]);
    let snapshot = Snapshot {
        advertisement: Advertisement {
            resources: vec![Resource {
                name: "nvidia.com/gpu".into(),
                fail_requests_greater_than_one: false,
                devices: vec![Device {
                    id: B.into(),
                    gpu_uuid: B.into(),
                    gpu_index: 1,
                    numa_node: None,
                    target: Target::Gpu,
                    share: Share::Exclusive,
                }],
            }],
        },
        ..Default::default()
    };
    // The DRA driver prepared a whole-GPU claim on GPU 2; the kubelet runs `infer` with
    // it (PodResources `dynamic_resources`, and the pod's UID in its DRA checkpoint).
    let state = tmp.path().join("state");
    let cdi = prepare_whole_gpu_claim(&state, "claim-uid-infer", "infer-gpu");
    admit_to_claim(
        &kubelet,
        "infer",
        INFER,
        "claim-uid-infer",
        "infer-gpu",
        &cdi,
    );

    let settings = sampler_settings(tmp.path(), &kubelet, &state, proc_root, None);
    assert_eq!(settings.kubelet_dra_state(), Some(kubelet.dra_state_path()));
    let (metrics, cancel, _tap) = start_sampler(settings, snapshot, &fake);
    let used = "tessera_container_gpu_memory_used_bytes";
    let page = page_when(&metrics, "per-container memory", |page| {
        series(page, used, &[("pod", "trainer")]).len() == 1
            && series(page, used, &[("pod", "infer")]).len() == 1
    })
    .await;
    cancel.cancel();
    // The GPUs' own figures are every process's: 5,200 and 2,100 MiB.
    for (gpu, mib) in [(B, 5200.0), (L4, 2100.0)] {
        assert_eq!(
            series(&page, "tessera_gpu_memory_used_bytes", &[("gpu", gpu)]),
            vec![mib * MIB]
        );
    }
    // Each container: its own pod's processes on its GPU (systemd and cgroupfs paths).
    for (pod, gpu, mib) in [("trainer", B, 4000.0), ("infer", L4, 2000.0)] {
        assert_eq!(
            series(
                &page,
                used,
                &[("pod", pod), ("gpu", gpu), ("mode", "whole")]
            ),
            vec![mib * MIB],
            "{page}"
        );
    }
    // Nobody else has a series: the host process (1003), the PID gone (2002) and
    // `infer`'s process on GPU 1 (1004) are attributed to no container.
    assert_eq!(
        series(&page, used, &[]).len(),
        2,
        "one series per container: {page}"
    );
}

/// Two pods share one DRA whole-GPU claim and hold nothing else: the kubelet's DRA
/// checkpoint records both UIDs for the claim and nothing pairs them with the pods'
/// names, so without the API server each container shows the GPU's whole figure. With the
/// agent's API client (the pods read for their labels), each pod's UID comes from the
/// API server and each container gets its own pod's processes' memory.
#[tokio::test]
async fn pods_sharing_one_dra_claim_get_their_own_processes_memory_from_the_api_servers_uids() {
    use support::apiserver::ApiServer;
    use support::kubelet::Kubelet;
    use tessera::deviceplugin::snapshot::Snapshot;

    const MIB: f64 = 1024.0 * 1024.0;
    let pods = [
        ("a", "5a1e2f3a-4b5c-4d6e-9f0a-1b2c3d4e5f6a", 2001, 1500.0),
        ("b", "6b1e2f3a-4b5c-4d6e-9f0a-1b2c3d4e5f6b", 2002, 600.0),
    ];
    let fake = FakeDriver::build("proc 2 2001 1500\nproc 2 2002 600\n");
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    for (_, uid, pid, _) in pods {
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{uid}/0123abcd\n"),
        )
        .unwrap();
    }
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let state = tmp.path().join("state");
    let cdi = prepare_whole_gpu_claim(&state, "claim-uid-shared", "shared-gpu");
    let api = ApiServer::empty().await;
    for (name, uid, _, _) in pods {
        admit_to_claim(&kubelet, name, uid, "claim-uid-shared", "shared-gpu", &cdi);
        api.put_object(
            "/api/v1/namespaces/ml/pods",
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml", "uid": uid, "labels": {"team": "recs"}},
                "spec": {"containers": [{"name": "main", "image": "x"}]}}),
        );
    }
    let used = "tessera_container_gpu_memory_used_bytes";
    for client in [None, Some(api.client())] {
        let with_api = client.is_some();
        let settings = sampler_settings(tmp.path(), &kubelet, &state, proc_root.clone(), client);
        let (metrics, cancel, _tap) = start_sampler(settings, Snapshot::default(), &fake);
        // Both containers are charged half the GPU either way; wait for their rows.
        let page = page_when(&metrics, "container rows", |page| {
            let rows = page
                .lines()
                .filter(|l| l.starts_with("tessera_container_gpu_allocated_share"))
                .count();
            rows >= 2 && (!with_api || series(page, used, &[("pod", "b")]).len() == 1)
        })
        .await;
        cancel.cancel();
        for (name, _, _, mib) in pods {
            let got = series(&page, used, &[("pod", name), ("gpu", L4)]);
            if with_api {
                assert_eq!(got, vec![mib * MIB], "{name}: {page}");
            } else {
                // No UID: the whole GPU's figure (the mode table's fallback), the same
                // for both.
                assert_eq!(got, vec![2100.0 * MIB], "{name} without its UID: {page}");
            }
        }
    }
}
