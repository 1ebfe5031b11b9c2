//! The vGPU guard (`--vgpu-guard report|kill|off`): every `--vgpu-guard-interval` the
//! agent compares what the driver says each process uses with what the agent gave each
//! pod ([`crate::vgpu::guard`] decides), so a tenant that gets past the shim (an
//! undercounting accounting file, a static binary, raw `ioctl`s) is seen, and with `kill`
//! stopped.
//!
//! - What each pod holds: the device-plugin allocation directories (`dp-*`) with their
//!   units record ([`shimfiles::UNITS_FILE`]), owned by the pod UID the kubelet's device
//!   checkpoint names for them ([`shimfiles::allocation_owners`]); and the DRA claims'
//!   directories (`claim-<uid>`, the same units record), held by every pod the kubelet's
//!   DRA manager records for the claim (its checkpoint `<kubelet-dir>/dra_manager_state`,
//!   [`kubelet_claim_pods`]). Pods sharing one claim are each checked against the claim's
//!   slice.
//! - Which pod a process runs in: its `/proc/<pid>/cgroup` (the agent needs the host's
//!   PID namespace, `hostPID: true`, to see the PIDs the driver reports).
//! - `report` posts a `VgpuOverLimit` Event on the Node and logs; `kill` also sends
//!   SIGKILL to the pod's processes on that GPU (the container's restart policy decides
//!   what follows). A process in no slice-holding pod is logged, never killed.
//!
//! A sample that cannot be taken (the driver does not answer, a checkpoint cannot be
//! read, vGPU claims are prepared but the kubelet's DRA state is missing or damaged)
//! decides nothing: the guard never acts on a partial picture.

use std::collections::{BTreeMap, BTreeSet};
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

/// The kubelet DRA manager's checkpoint file name, in the kubelet's root directory.
pub const KUBELET_DRA_STATE: &str = "dra_manager_state";

impl GuardConfig {
    /// The kubelet's DRA state: `dra_manager_state` in the kubelet's directory (the one
    /// holding `device-plugins/`, where [`GuardConfig::kubelet_checkpoint`] is).
    pub fn kubelet_dra_state(&self) -> Option<PathBuf> {
        let kubelet_dir = self.kubelet_checkpoint.parent()?.parent()?;
        Some(kubelet_dir.join(KUBELET_DRA_STATE))
    }
}

/// The pods of each claim (claim UID → pod UIDs) in the kubelet DRA manager's checkpoint:
/// `{"Data": "<JSON>", "Checksum": <CRC-32 of Data>}`, the data's claim list under
/// `Entries` (1.32+) or `ClaimInfoStateList` (earlier), each entry's `PodUIDs` a set
/// (an object whose keys are the UIDs). A wrong checksum or layout is an error.
pub fn kubelet_claim_pods(bytes: &[u8]) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(rename = "Data")]
        data: String,
        #[serde(rename = "Checksum")]
        checksum: u64,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(rename = "Entries", alias = "ClaimInfoStateList", default)]
        entries: Option<Vec<Entry>>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(rename = "ClaimUID")]
        claim_uid: String,
        #[serde(rename = "PodUIDs", default)]
        pod_uids: Option<BTreeMap<String, serde_json::Value>>,
    }
    let file: File = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "not the kubelet's DRA checkpoint ({:?} error at line {} column {})",
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    if u64::from(crc32fast::hash(file.data.as_bytes())) != file.checksum {
        return Err("checksum mismatch".into());
    }
    let data: Data = serde_json::from_str(&file.data).map_err(|e| {
        format!(
            "its data is not a DRA checkpoint ({:?} error)",
            e.classify()
        )
    })?;
    Ok(data
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let pods = e.pod_uids.unwrap_or_default().into_keys().collect();
            (e.claim_uid, pods)
        })
        .collect())
}

/// What each pod holds through the DRA claims' directories: every `claim-<uid>` with a
/// units record, held by the pods `claim_pods` names for the claim (a claim prepared
/// but not yet in the kubelet's state holds nothing). `claim_pods` is read only when a
/// claim has units, and an error from it is the sample's (nothing is decided).
pub fn claim_holdings(
    dirs: &AllocDirs,
    claim_pods: impl FnOnce() -> Result<BTreeMap<String, BTreeSet<String>>, String>,
) -> Result<Vec<Holding>, String> {
    let mut units = Vec::new();
    for id in dirs
        .list(shimfiles::CLAIM_PREFIX)
        .map_err(|e| e.to_string())?
    {
        match dirs.read_units(&id) {
            Ok(Some(u)) => units.push((id, u)),
            Ok(None) => {}
            Err(e) => warn!(claim = %id, error = %e, "vGPU guard: claim record unreadable"),
        }
    }
    if units.is_empty() {
        return Ok(Vec::new());
    }
    let pods = claim_pods()?;
    let mut out = Vec::new();
    for (id, units) in units {
        let uid = id.trim_start_matches(shimfiles::CLAIM_PREFIX);
        for pod_uid in pods.get(uid).into_iter().flatten() {
            out.extend(units.iter().map(|u| Holding {
                pod_uid: pod_uid.clone(),
                gpu: u.gpu.clone(),
                limit_bytes: u.memory_mib.saturating_mul(1 << 20),
            }));
        }
    }
    Ok(out)
}

/// Read the kubelet's DRA state at `path` ([`kubelet_claim_pods`]).
fn read_claim_pods(path: Option<&Path>) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let path = path.ok_or("vGPU claims are prepared but the kubelet's directory is unknown")?;
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "vGPU claims are prepared but the kubelet's DRA state {} cannot be read ({}): \
             their pods are unknown",
            path.display(),
            e.kind()
        )
    })?;
    kubelet_claim_pods(&bytes).map_err(|e| format!("{}: {e}", path.display()))
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
    let mut holdings = match std::fs::read(&cfg.kubelet_checkpoint) {
        Ok(bytes) => holdings(&cfg.alloc_dirs, &bytes)
            .map_err(|e| format!("{}: {e}", cfg.kubelet_checkpoint.display()))?,
        // No checkpoint: the kubelet has handed out no devices.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", cfg.kubelet_checkpoint.display())),
    };
    let dra_state = cfg.kubelet_dra_state();
    holdings.extend(claim_holdings(&cfg.alloc_dirs, || {
        read_claim_pods(dra_state.as_deref())
    })?);
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

    const CLAIM_UID: &str = "5c0e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";

    /// The kubelet DRA manager's checkpoint naming `pods` for `claim`, in the layout whose
    /// claim list is under `list` (`Entries` or `ClaimInfoStateList`).
    fn dra_state(list: &str, claim: &str, pods: &[&str]) -> Vec<u8> {
        let pod_uids: serde_json::Map<String, serde_json::Value> = pods
            .iter()
            .map(|p| (p.to_string(), serde_json::json!({})))
            .collect();
        let data = serde_json::json!({
            "kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
            list: [{"ClaimUID": claim, "ClaimName": "slice", "Namespace": "ml",
                "PodUIDs": pod_uids, "DriverState": {"gpu.tessera.io": {"Devices": []}}}],
        })
        .to_string();
        serde_json::to_vec(&serde_json::json!({
            "Data": data, "Checksum": crc32fast::hash(data.as_bytes()),
        }))
        .unwrap()
    }

    /// A DRA claim's vGPU directory (16 GiB on GPU-a) and the kubelet's DRA state naming
    /// the pod of [`setup`]'s process 4242 for it; no device-plugin allocation.
    fn setup_claim(tmp: &Path) -> GuardConfig {
        let mut cfg = setup(tmp);
        cfg.alloc_dirs.remove("dp-1").unwrap();
        let id = format!("claim-{CLAIM_UID}");
        cfg.alloc_dirs.create(&id).unwrap();
        cfg.alloc_dirs
            .write_limits(
                &id,
                &[shimfiles::UnitLimits {
                    index: 0,
                    gpu: "GPU-a".into(),
                    memory_mib: 16 * 1024,
                    cores: 25,
                }],
            )
            .unwrap();
        let kubelet = tmp.join("kubelet");
        std::fs::create_dir_all(kubelet.join("device-plugins")).unwrap();
        cfg.kubelet_checkpoint = kubelet.join("device-plugins/kubelet_internal_checkpoint");
        std::fs::write(
            kubelet.join(KUBELET_DRA_STATE),
            dra_state("Entries", CLAIM_UID, &[UID]),
        )
        .unwrap();
        cfg
    }

    #[test]
    fn a_pod_over_its_dra_claims_slice_is_reported_and_a_process_of_no_pod_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup_claim(tmp.path());
        let rec = Recorded::default();
        let mut guard = Guard::new();
        assert_eq!(
            sample(&cfg, &mut guard, &using(16), &rec, 0).unwrap(),
            vec![]
        );
        let source = Scripted(Mutex::new(Ok(vec![
            GpuProcess {
                gpu: "GPU-a".into(),
                pid: 4242,
                used_bytes: 40 << 30,
            },
            GpuProcess {
                gpu: "GPU-a".into(),
                pid: 5151,
                used_bytes: 2 << 30,
            },
        ])));
        let found = sample(&cfg, &mut guard, &source, &rec, 1).unwrap();
        assert!(
            matches!(&found[..], [
                Finding::Unattributed { pid: 5151, pod_uid: None, .. },
                Finding::OverLimit { pod_uid, pids, limit_bytes, .. },
            ] if pod_uid == UID && pids == &[4242] && *limit_bytes == 16 << 30),
            "{found:?}"
        );
        let events = rec.0.lock().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].contains("limit of 16384 MiB"), "{}", events[0]);
    }

    #[test]
    fn a_claim_without_pods_in_the_kubelets_state_holds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup_claim(tmp.path());
        let state = cfg.kubelet_dra_state().unwrap();
        std::fs::write(&state, dra_state("Entries", "another-claim", &[UID])).unwrap();
        let rec = Recorded::default();
        let found = sample(&cfg, &mut Guard::new(), &using(40), &rec, 0).unwrap();
        assert_eq!(found, vec![]);
    }

    #[test]
    fn vgpu_claims_with_their_pods_unknown_decide_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = setup_claim(tmp.path());
        let state = cfg.kubelet_dra_state().unwrap();
        let rec = Recorded::default();
        let mut guard = Guard::new();
        let mut damaged = dra_state("Entries", CLAIM_UID, &[UID]);
        let at = damaged.iter().position(|b| *b == b'5').unwrap();
        damaged[at] = b'6';
        for (what, bytes) in [
            ("checksum", Some(damaged)),
            ("not the kubelet's", Some(b"{not json".to_vec())),
            ("cannot be read", None),
        ] {
            match bytes {
                Some(b) => std::fs::write(&state, b).unwrap(),
                None => std::fs::remove_file(&state).unwrap(),
            }
            let e = sample(&cfg, &mut guard, &using(40), &rec, 0).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        assert!(rec.0.lock().unwrap().is_empty());
    }

    #[test]
    fn both_layouts_of_the_kubelets_dra_state_are_read() {
        for list in ["Entries", "ClaimInfoStateList"] {
            let pods = kubelet_claim_pods(&dra_state(list, CLAIM_UID, &[UID, "p2"])).unwrap();
            let want: BTreeSet<String> = [UID.to_string(), "p2".to_string()].into();
            assert_eq!(pods.get(CLAIM_UID), Some(&want), "{list}");
        }
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
