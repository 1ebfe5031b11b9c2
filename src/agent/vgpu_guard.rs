//! The vGPU guard (`--vgpu-guard report|kill|off`): every `--vgpu-guard-interval` the
//! agent compares what the driver says each process uses with what the agent gave each
//! pod ([`crate::vgpu::guard`] decides), so a tenant that gets past the shim (an
//! undercounting accounting file, a static binary, raw `ioctl`s) is seen, and with `kill`
//! stopped.
//!
//! - What each pod holds: the device-plugin allocation directories (`dp-*`) with their
//!   units record ([`shimfiles::UNITS_FILE`]), owned by the pod UID the kubelet's device
//!   checkpoint names for them ([`shimfiles::allocation_owners`]). DRA claims' directories
//!   are not guarded yet (the claim's pods are in the kubelet's DRA state, not read here).
//! - Which pod a process runs in: its `/proc/<pid>/cgroup` (the agent needs the host's
//!   PID namespace, `hostPID: true`, to see the PIDs the driver reports).
//! - `report` posts a `VgpuOverLimit` Event on the Node and logs; `kill` also sends
//!   SIGKILL to the pod's processes on that GPU (the container's restart policy decides
//!   what follows). A process in no slice-holding pod is logged, never killed.
//!
//! A sample that cannot be taken (the driver does not answer, the checkpoint cannot be
//! read) decides nothing: the guard never acts on a partial picture.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::EventRecorder;
use crate::gpu::GpuBackend;
use crate::shimfiles::{self, AllocDirs};
use crate::vgpu::guard::{pod_uid_from_cgroup, Finding, GpuProcess, Guard, Holding, Settings};

/// What the guard does about a pod over its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GuardMode {
    /// Not sampled.
    Off,
    /// An Event on the Node and a log line.
    Report,
    /// As `report`, and SIGKILL to the pod's processes on that GPU.
    Kill,
}

/// Where the processes on the GPUs come from (the GPU backend; tests script them).
pub trait ProcessSource: Send + Sync {
    fn processes(&self) -> Result<Vec<GpuProcess>, String>;
}

/// The GPU backend's compute processes ([`GpuBackend::usage`]); processes whose memory
/// the driver does not attribute are left out (nothing to check them against).
pub struct BackendProcesses(pub Arc<dyn GpuBackend>);

impl ProcessSource for BackendProcesses {
    fn processes(&self) -> Result<Vec<GpuProcess>, String> {
        let usage = self.0.usage().map_err(|e| e.to_string())?;
        Ok(usage
            .into_iter()
            .flat_map(|g| {
                let gpu = g.uuid;
                g.processes.into_iter().filter_map(move |p| {
                    p.memory_used_bytes.map(|used_bytes| GpuProcess {
                        gpu: gpu.clone(),
                        pid: p.pid,
                        used_bytes,
                    })
                })
            })
            .collect())
    }
}

/// The guard's settings (from flags).
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub mode: GuardMode,
    pub interval: Duration,
    pub settings: Settings,
    pub alloc_dirs: AllocDirs,
    /// The kubelet's `device-plugins/kubelet_internal_checkpoint`.
    pub kubelet_checkpoint: PathBuf,
    /// `/proc`, or a test's stand-in.
    pub proc_root: PathBuf,
}

/// What each pod holds on each GPU, from the device-plugin allocation directories the
/// kubelet's checkpoint still names. An allocation without a units record (split mode
/// before binding, or written by an older agent) holds nothing the guard can check.
pub fn holdings(dirs: &AllocDirs, checkpoint: &[u8]) -> Result<Vec<Holding>, String> {
    let owners = shimfiles::allocation_owners(checkpoint)?;
    let mut out = Vec::new();
    for (id, pod_uid) in owners {
        let units = match dirs.read_units(&id) {
            Ok(Some(units)) => units,
            Ok(None) => continue,
            Err(e) => {
                warn!(allocation = %id, error = %e, "vGPU guard: allocation record unreadable");
                continue;
            }
        };
        out.extend(units.into_iter().map(|u| Holding {
            pod_uid: pod_uid.clone(),
            gpu: u.gpu,
            limit_bytes: u.memory_mib.saturating_mul(1 << 20),
        }));
    }
    Ok(out)
}

/// The pod a process runs in, from `<proc_root>/<pid>/cgroup` (`None`: gone, or in none).
pub fn pod_of(proc_root: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    pod_uid_from_cgroup(&text)
}

/// One sample: read, decide, act. Returns the findings (for tests and logs).
pub fn sample(
    cfg: &GuardConfig,
    guard: &mut Guard,
    source: &dyn ProcessSource,
    recorder: &dyn EventRecorder,
    now_ms: u64,
) -> Result<Vec<Finding>, String> {
    let checkpoint = match std::fs::read(&cfg.kubelet_checkpoint) {
        Ok(bytes) => bytes,
        // No checkpoint: the kubelet has handed out no devices.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", cfg.kubelet_checkpoint.display())),
    };
    let holdings = holdings(&cfg.alloc_dirs, &checkpoint)
        .map_err(|e| format!("{}: {e}", cfg.kubelet_checkpoint.display()))?;
    if holdings.is_empty() {
        *guard = Guard::new();
        return Ok(Vec::new());
    }
    let processes = source.processes()?;
    let mut cache: BTreeMap<u32, Option<String>> = BTreeMap::new();
    for p in &processes {
        cache
            .entry(p.pid)
            .or_insert_with(|| pod_of(&cfg.proc_root, p.pid));
    }
    let lookup = |pid: u32| cache.get(&pid).cloned().flatten();
    let findings = guard.observe(now_ms, &holdings, &processes, &lookup, cfg.settings);
    for f in &findings {
        act(cfg.mode, f, recorder);
    }
    Ok(findings)
}

fn act(mode: GuardMode, finding: &Finding, recorder: &dyn EventRecorder) {
    match finding {
        Finding::OverLimit {
            pod_uid,
            gpu,
            used_bytes,
            allowed_bytes,
            limit_bytes,
            pids,
            ..
        } => {
            let mib = |b: &u64| b / (1 << 20);
            let killing = mode == GuardMode::Kill;
            let message = format!(
                "pod {pod_uid} uses {} MiB on GPU {gpu}, over its vGPU limit of {} MiB \
                 ({} MiB with the per-process allowance; processes {pids:?}){}",
                mib(used_bytes),
                mib(limit_bytes),
                mib(allowed_bytes),
                if killing { "; killed" } else { "" }
            );
            recorder.vgpu_over_limit(&message);
            if killing {
                for pid in pids {
                    kill(*pid);
                }
            }
        }
        Finding::Unattributed {
            gpu,
            pid,
            pod_uid,
            used_bytes,
        } => {
            debug!(%gpu, pid, pod = ?pod_uid, used_bytes, "process on a vGPU GPU outside any slice")
        }
    }
}

fn kill(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    // PID 0 and 1 would mean this process group or init: never.
    if raw <= 1 {
        return;
    }
    match kill(Pid::from_raw(raw), Signal::SIGKILL) {
        Ok(()) => info!(pid, "vGPU guard killed a process over its pod's limit"),
        Err(e) => warn!(pid, error = %e, "vGPU guard could not kill a process"),
    }
}

/// Samples until `shutdown`; `clock` gives milliseconds since the epoch.
pub async fn run(
    cfg: GuardConfig,
    source: Arc<dyn ProcessSource>,
    recorder: Arc<dyn EventRecorder>,
    clock: impl Fn() -> u64 + Send + 'static,
    shutdown: CancellationToken,
) {
    if cfg.mode == GuardMode::Off || cfg.interval.is_zero() {
        return;
    }
    let mut guard = Guard::new();
    let mut failing = false;
    loop {
        let cfg2 = cfg.clone();
        let source2 = source.clone();
        let recorder2 = recorder.clone();
        let now = clock();
        let mut g = std::mem::take(&mut guard);
        // NVML and /proc are blocking calls.
        let result = tokio::task::spawn_blocking(move || {
            let r = sample(&cfg2, &mut g, source2.as_ref(), recorder2.as_ref(), now);
            (g, r)
        })
        .await;
        match result {
            Ok((g, Ok(_))) => {
                guard = g;
                failing = false;
            }
            Ok((g, Err(e))) => {
                guard = g;
                if !failing {
                    warn!(error = %e, "vGPU guard: sample failed; nothing decided until one succeeds");
                }
                failing = true;
            }
            Err(e) => warn!(error = %e, "vGPU guard: sample task failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const UID: &str = "0b8f6c1e-2a3d-4f5e-8a9b-1c2d3e4f5a6b";

    struct Scripted(Mutex<Result<Vec<GpuProcess>, String>>);
    impl ProcessSource for Scripted {
        fn processes(&self) -> Result<Vec<GpuProcess>, String> {
            self.0.lock().unwrap().clone()
        }
    }

    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);
    impl EventRecorder for Recorded {
        fn config_rejected(&self, _: &str) {}
        fn vgpu_over_limit(&self, message: &str) {
            self.0.lock().unwrap().push(message.to_string());
        }
    }

    /// A kubelet checkpoint with one entry whose AllocResp names allocation `id`.
    fn checkpoint(id: &str, pod_uid: &str) -> Vec<u8> {
        use base64::Engine as _;
        use prost::Message as _;
        let resp = crate::proto::deviceplugin::ContainerAllocateResponse {
            annotations: [(shimfiles::ALLOCATION_ANNOTATION.to_string(), id.to_string())].into(),
            ..Default::default()
        };
        let b64 = base64::engine::general_purpose::STANDARD.encode(resp.encode_to_vec());
        serde_json::to_vec(&serde_json::json!({
            "Data": {"PodDeviceEntries": [{"PodUID": pod_uid, "ContainerName": "c",
                "ResourceName": "nvidia.com/vgpu", "DeviceIDs": {"-1": ["GPU-a::0"]},
                "AllocResp": b64}], "RegisteredDevices": {}},
            "Checksum": 0
        }))
        .unwrap()
    }

    fn setup(tmp: &Path) -> GuardConfig {
        let dirs = AllocDirs::new(tmp.join("vgpu"));
        dirs.create("dp-1").unwrap();
        dirs.write_limits(
            "dp-1",
            &[shimfiles::UnitLimits {
                index: 0,
                gpu: "GPU-a".into(),
                memory_mib: 16 * 1024,
                cores: 50,
            }],
        )
        .unwrap();
        std::fs::write(tmp.join("checkpoint"), checkpoint("dp-1", UID)).unwrap();
        let proc_pid = tmp.join("proc/4242");
        std::fs::create_dir_all(&proc_pid).unwrap();
        std::fs::write(
            proc_pid.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-1.scope\n",
                UID.replace('-', "_")
            ),
        )
        .unwrap();
        GuardConfig {
            mode: GuardMode::Report,
            interval: Duration::from_secs(5),
            settings: Settings {
                tolerance_per_process_bytes: 512 << 20,
                grace_ms: 0,
            },
            alloc_dirs: dirs,
            kubelet_checkpoint: tmp.join("checkpoint"),
            proc_root: tmp.join("proc"),
        }
    }

    fn using(gib: u64) -> Scripted {
        Scripted(Mutex::new(Ok(vec![GpuProcess {
            gpu: "GPU-a".into(),
            pid: 4242,
            used_bytes: gib << 30,
        }])))
    }

    #[test]
    fn a_pod_over_its_written_limits_is_reported_with_its_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup(tmp.path());
        let rec = Recorded::default();
        let mut guard = Guard::new();
        let fine = sample(&cfg, &mut guard, &using(16), &rec, 0).unwrap();
        assert_eq!(fine, vec![]);
        let over = sample(&cfg, &mut guard, &using(40), &rec, 1).unwrap();
        assert!(
            matches!(&over[..], [Finding::OverLimit { pod_uid, pids, .. }] if pod_uid == UID && pids == &[4242]),
            "{over:?}"
        );
        let events = rec.0.lock().unwrap();
        assert_eq!(events.len(), 1);
        assert!(
            events[0].contains("40960 MiB on GPU GPU-a"),
            "{}",
            events[0]
        );
        assert!(events[0].contains("limit of 16384 MiB"), "{}", events[0]);
    }

    #[test]
    fn nothing_is_decided_on_a_partial_picture() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup(tmp.path());
        let rec = Recorded::default();
        let mut guard = Guard::new();
        let broken = Scripted(Mutex::new(Err("NVML: driver not loaded".into())));
        assert!(sample(&cfg, &mut guard, &broken, &rec, 0).is_err());
        std::fs::write(&cfg.kubelet_checkpoint, b"{not json").unwrap();
        let e = sample(&cfg, &mut guard, &using(40), &rec, 0).unwrap_err();
        assert!(e.contains("checkpoint"), "{e}");
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn an_allocation_the_checkpoint_no_longer_names_holds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup(tmp.path());
        std::fs::write(&cfg.kubelet_checkpoint, checkpoint("dp-9", UID)).unwrap();
        let rec = Recorded::default();
        let found = sample(&cfg, &mut Guard::new(), &using(40), &rec, 0).unwrap();
        assert_eq!(found, vec![]);
    }

    #[test]
    fn kill_mode_kills_the_pods_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = setup(tmp.path());
        cfg.mode = GuardMode::Kill;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let proc_pid = tmp.path().join(format!("proc/{pid}"));
        std::fs::create_dir_all(&proc_pid).unwrap();
        std::fs::copy(tmp.path().join("proc/4242/cgroup"), proc_pid.join("cgroup")).unwrap();
        let source = Scripted(Mutex::new(Ok(vec![GpuProcess {
            gpu: "GPU-a".into(),
            pid,
            used_bytes: 40 << 30,
        }])));
        let rec = Recorded::default();
        sample(&cfg, &mut Guard::new(), &source, &rec, 0).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        assert!(rec.0.lock().unwrap()[0].ends_with("; killed"));
    }
}
