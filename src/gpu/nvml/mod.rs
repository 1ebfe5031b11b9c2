//! The `nvml` GPU backend: the real NVIDIA driver through NVML.
//!
//! `libnvidia-ml.so.1` is loaded at run time (`nvml-wrapper` uses `libloading`), so the
//! binary has no link-time dependency on the driver and a node without one gets
//! [`Error::NvmlUnavailable`] from [`NvmlBackend::new`], never a panic. The few NVML
//! calls `nvml-wrapper` lacks (MIG instances, NVLink remote types, row remapping) come
//! from the `tessera-nvml-raw` crate, which holds all `unsafe` code.
//!
//! Submodules by concern: [`inventory`] (GPU facts) with pure helpers in [`facts`],
//! [`topology`] (NVLink peers), [`mig`] (profiles and MIG devices), [`layout`] (applying
//! a MIG layout), [`events`] (the health thread) and [`probe`] (recovery decisions).

pub mod events;
pub mod facts;
pub mod inventory;
pub mod layout;
pub mod mig;
pub mod probe;
pub mod topology;
pub mod usage;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::{Error, GpuBackend, HealthSender, Inventory, MigDeviceInfo, Result, TimeSlice};
use probe::ProbeConfig;

/// The library NVML is loaded from when no path is given.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// GPU inventory, health events and MIG management through NVML.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    sysfs_root: PathBuf,
    probe: ProbeConfig,
    /// `nvidia-smi`, for the compute time-slice (NVML has no public call for it).
    nvidia_smi: PathBuf,
    /// Each MIG device's last GPM sample, for its utilization between two usage reads.
    gpm: usage::GpmSamples,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("sysfs_root", &self.sysfs_root)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Load NVML from `lib_path` (default [`DEFAULT_LIBRARY`] on the library path) and
    /// initialise it.
    pub fn new(lib_path: Option<&OsStr>) -> Result<Self> {
        let mut builder = Nvml::builder();
        if let Some(path) = lib_path {
            builder.lib_path(path);
        }
        let nvml = builder
            .init()
            .map_err(|e| Error::NvmlUnavailable(describe_init_error(lib_path, &e)))?;
        Ok(Self {
            nvml: Arc::new(nvml),
            sysfs_root: PathBuf::from("/sys"),
            probe: ProbeConfig::default(),
            nvidia_smi: PathBuf::from("nvidia-smi"),
            gpm: usage::GpmSamples::default(),
        })
    }

    /// Read the NUMA-node fallback from this sysfs root instead of `/sys`.
    pub fn with_sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = root.into();
        self
    }

    /// Run this `nvidia-smi` (default: the one on `PATH`) to set compute time-slices.
    pub fn with_nvidia_smi(mut self, path: impl Into<PathBuf>) -> Self {
        self.nvidia_smi = path.into();
        self
    }

    /// Recovery probe cadence (default: every 5 s, 3 clean probes).
    pub fn with_probe_config(mut self, probe: ProbeConfig) -> Self {
        self.probe = probe;
        self
    }
}

/// A one-line reason NVML could not start, naming the library.
fn describe_init_error(lib_path: Option<&OsStr>, e: &NvmlError) -> String {
    let lib = lib_path.map_or_else(
        || DEFAULT_LIBRARY.to_string(),
        |p| p.to_string_lossy().into_owned(),
    );
    match e {
        NvmlError::LibloadingError(err) => format!("cannot load {lib}: {err}"),
        NvmlError::FailedToLoadSymbol(sym) => {
            format!("{lib} is not a usable NVML library ({sym})")
        }
        NvmlError::DriverNotLoaded => {
            format!("{lib} loaded, but the NVIDIA kernel driver is not loaded")
        }
        NvmlError::NoPermission => format!("{lib} loaded, but NVML may not talk to the driver (permission denied)"),
        NvmlError::LibRmVersionMismatch => format!(
            "{lib} does not match the loaded kernel driver (reload the driver or reboot after an upgrade)"
        ),
        other => format!("nvmlInit via {lib} failed: {other}"),
    }
}

/// Map an NVML error of `call` on `gpu` to the backend error.
pub(crate) fn nvml_err(
    call: &'static str,
    gpu: impl std::fmt::Display,
) -> impl FnOnce(NvmlError) -> Error {
    let gpu = gpu.to_string();
    move |e| Error::Nvml {
        call,
        gpu,
        reason: e.to_string(),
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<Inventory> {
        inventory::read(&self.nvml, &self.sysfs_root)
    }

    fn usage(&self) -> Result<Vec<crate::gpu::GpuUsage>> {
        usage::read(&self.nvml, &self.gpm)
    }

    fn watch_health(&self, tx: HealthSender) -> Result<()> {
        events::spawn(Arc::clone(&self.nvml), tx, self.probe)
    }

    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        layout: &[(String, u8)],
    ) -> Result<Vec<MigDeviceInfo>> {
        layout::apply(&self.nvml, gpu_uuid, layout)
    }

    /// `nvidia-smi compute-policy -i <uuid> --set-timeslice=<0..3>`: the compute policy
    /// has no public NVML entry point (NVIDIA's own DRA driver shells out the same way).
    fn set_time_slice(&self, gpu_uuid: &str, interval: TimeSlice) -> Result<()> {
        set_time_slice_with(&self.nvidia_smi, gpu_uuid, interval)
    }
}

/// Run `nvidia_smi compute-policy -i <uuid> --set-timeslice=<code>`; a non-zero exit is an
/// error carrying the tool's output.
fn set_time_slice_with(
    nvidia_smi: &std::path::Path,
    gpu_uuid: &str,
    interval: TimeSlice,
) -> Result<()> {
    let err = |reason: String| Error::TimeSlice {
        gpu: gpu_uuid.to_string(),
        reason,
    };
    let out = std::process::Command::new(nvidia_smi)
        .args(["compute-policy", "-i", gpu_uuid])
        .arg(format!("--set-timeslice={}", interval.code()))
        .output()
        .map_err(|e| err(format!("cannot run {}: {e}", nvidia_smi.display())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(err(format!(
            "{} exited with {}: {}{}",
            nvidia_smi.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable_reason(lib: Option<&OsStr>) -> String {
        match NvmlBackend::new(lib) {
            Err(Error::NvmlUnavailable(reason)) => {
                eprintln!("NvmlUnavailable: {reason}");
                reason
            }
            Err(e) => panic!("expected NvmlUnavailable, got {e}"),
            Ok(_) => panic!("NVML initialised; run this test where there is no NVIDIA driver"),
        }
    }

    fn has_nvidia_driver() -> bool {
        std::path::Path::new("/proc/driver/nvidia/version").exists()
    }

    #[test]
    fn missing_library_path_is_a_clear_error() {
        let reason = unavailable_reason(Some(OsStr::new("/nonexistent/libnvidia-ml.so.1")));
        assert!(
            reason.contains("cannot load /nonexistent/libnvidia-ml.so.1"),
            "{reason}"
        );
        let shown = Error::NvmlUnavailable(reason).to_string();
        assert!(shown.contains("NVML is not available"), "{shown}");
    }

    #[test]
    fn a_file_that_is_not_a_library_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(&fake, b"not an ELF file").unwrap();
        let reason = unavailable_reason(Some(fake.as_os_str()));
        assert!(reason.starts_with("cannot load "), "{reason}");
        assert!(reason.contains("libnvidia-ml.so.1"), "{reason}");
    }

    #[test]
    fn a_library_without_nvml_symbols_is_a_clear_error() {
        // Any real shared library that is not NVML: libc is always there.
        let reason = unavailable_reason(Some(OsStr::new("libc.so.6")));
        assert!(
            reason.contains("libc.so.6 is not a usable NVML library"),
            "{reason}"
        );
        assert!(reason.contains("nvmlInit"), "{reason}");
    }

    #[test]
    fn default_library_without_a_driver_is_a_clear_error() {
        if has_nvidia_driver() {
            return; // covered by the GPU tests below
        }
        let reason = unavailable_reason(None);
        assert!(reason.contains(DEFAULT_LIBRARY), "{reason}");
    }

    #[test]
    fn time_slice_runs_nvidia_smi_compute_policy() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("args");
        let tool = dir.path().join("nvidia-smi");
        std::fs::write(
            &tool,
            format!(
                "#!/bin/sh\necho \"$@\" > {}\n[ \"$3\" = GPU-bad ] && {{ echo 'Not supported'; exit 3; }}\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        set_time_slice_with(&tool, "GPU-a", TimeSlice::Medium).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap().trim(),
            "compute-policy -i GPU-a --set-timeslice=2"
        );
        let e = set_time_slice_with(&tool, "GPU-bad", TimeSlice::Default).unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.contains("GPU-bad") && shown.contains("Not supported"),
            "{shown}"
        );
        let missing = set_time_slice_with(&dir.path().join("none"), "GPU-a", TimeSlice::Long);
        assert!(missing.unwrap_err().to_string().contains("cannot run"));
    }

    #[test]
    fn nvml_errors_name_the_call_and_gpu() {
        let e = nvml_err("nvmlDeviceGetUUID", "GPU-a")(NvmlError::GpuLost);
        let shown = e.to_string();
        assert!(shown.contains("nvmlDeviceGetUUID"), "{shown}");
        assert!(shown.contains("GPU-a"), "{shown}");
        assert!(shown.contains("fell off the bus"), "{shown}");
    }

    // ---- Real-GPU checks, run by hack/gpu-check.sh (`cargo test -- --ignored`). ----

    fn backend() -> NvmlBackend {
        NvmlBackend::new(None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    #[ignore = "needs GPU"]
    fn gpu_inventory_is_well_formed() {
        let inv = backend().inventory().unwrap();
        assert!(!inv.gpus.is_empty(), "no GPUs found");
        assert!(!inv.driver.driver_version.is_empty());
        let (major, minor) = inv.driver.cuda_version.split_once('.').unwrap();
        assert!(
            major.parse::<u32>().unwrap() >= 11,
            "{}",
            inv.driver.cuda_version
        );
        assert!(minor.parse::<u32>().is_ok());
        for (i, g) in inv.gpus.iter().enumerate() {
            assert_eq!(g.index as usize, i);
            assert!(g.uuid.starts_with("GPU-"), "{}", g.uuid);
            assert_eq!(
                facts::format_bus_id(&g.pci_bus_id).as_deref(),
                Some(g.pci_bus_id.as_str())
            );
            assert!(g.memory_mib > 1024, "{g:?}");
            assert!(g.sm_count > 0, "{g:?}");
            assert!(g.compute_capability.0 >= 7, "{g:?}");
            assert_ne!(g.architecture, "Unknown");
            assert!(!g.nvlink_peers.contains(&g.uuid), "own peer: {g:?}");
            for p in &g.nvlink_peers {
                assert!(inv.gpu(p).is_some(), "peer {p} is not a GPU of this node");
            }
            if !g.mig_enabled {
                assert!(g.mig_devices.is_empty());
            }
            for m in &g.mig_devices {
                assert!(m.uuid.starts_with("MIG-"), "{m:?}");
                assert!(m.profile.contains('g') && m.profile.contains("gb"), "{m:?}");
                assert!(m.memory_mib > 0 && m.sm_count > 0 && m.size > 0, "{m:?}");
            }
        }
        println!("{}", serde_json::to_string_pretty(&inv).unwrap());
    }

    #[test]
    #[ignore = "needs GPU"]
    fn gpu_health_watch_starts_and_stops_with_its_channel() {
        let b = backend();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        b.watch_health(tx).unwrap();
        drop(rx); // the thread notices the closed channel within a second and exits
        std::thread::sleep(std::time::Duration::from_millis(1500));
    }

    #[test]
    #[ignore = "needs GPU"]
    fn gpu_probe_of_a_healthy_gpu_is_clean() {
        let b = backend();
        let inv = b.inventory().unwrap();
        for g in &inv.gpus {
            let s = events::probe(&b.nvml, &g.uuid);
            assert!(s.is_clean(), "{}: {s:?}", g.uuid);
        }
        assert!(!events::probe(&b.nvml, "GPU-00000000-0000-0000-0000-000000000000").is_clean());
    }

    /// Changes the compute time-slice of the GPU named by `TESSERA_TIMESLICE_TEST_GPU` (a
    /// UUID, not in MIG mode) to Short and back to Default. Skipped unless that is set.
    #[test]
    #[ignore = "needs GPU"]
    fn gpu_time_slice_round_trip() {
        let Ok(uuid) = std::env::var("TESSERA_TIMESLICE_TEST_GPU") else {
            eprintln!("TESSERA_TIMESLICE_TEST_GPU not set: skipping the time-slice test");
            return;
        };
        let b = backend();
        b.set_time_slice(&uuid, TimeSlice::Short)
            .unwrap_or_else(|e| panic!("{e}"));
        b.set_time_slice(&uuid, TimeSlice::Default)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Destructive: re-partitions the GPU named by `TESSERA_MIG_TEST_GPU` (a UUID) and
    /// restores its MIG devices afterwards. Skipped unless that variable is set.
    #[test]
    #[ignore = "needs GPU"]
    fn gpu_apply_mig_layout_round_trip() {
        let Ok(uuid) = std::env::var("TESSERA_MIG_TEST_GPU") else {
            eprintln!("TESSERA_MIG_TEST_GPU not set: skipping the destructive MIG test");
            return;
        };
        let b = backend();
        let before = b.inventory().unwrap();
        let gpu = before
            .gpu(&uuid)
            .expect("TESSERA_MIG_TEST_GPU is not a GPU here");
        let restore: Vec<(String, u8)> = gpu
            .mig_devices
            .iter()
            .map(|m| (m.profile.clone(), m.start))
            .collect();
        let smallest = b
            .nvml
            .device_by_uuid(uuid.as_str())
            .ok()
            .map(|d| mig::ProfileTable::query(&d, d.memory_info().unwrap().total))
            .and_then(|t| t.iter().min_by_key(|p| (p.slices, p.memory_mib)).cloned())
            .expect("no MIG profiles");
        let layout = vec![(smallest.name.clone(), 0), (smallest.name.clone(), 1)];
        let made = b.apply_mig_layout(&uuid, &layout).unwrap();
        let got: Vec<(String, u8)> = made.iter().map(|m| (m.profile.clone(), m.start)).collect();
        assert_eq!(got, layout);
        // Applying again keeps the same devices (same UUIDs).
        let again = b.apply_mig_layout(&uuid, &layout).unwrap();
        assert_eq!(again, made);
        let restored = b.apply_mig_layout(&uuid, &restore).unwrap();
        assert_eq!(restored.len(), restore.len());
    }

    #[test]
    #[ignore = "needs GPU"]
    fn gpu_mig_capability_table_covers_the_mig_devices() {
        use crate::cdi::migcaps::{Capability, MigCaps, MigCapsPaths};
        let inv = backend().inventory().unwrap();
        let paths = MigCapsPaths::default();
        if !inv.gpus.iter().any(|g| g.mig_capable) && !paths.mig_minors.exists() {
            println!(
                "no MIG-capable GPU and no {}: nothing to check",
                paths.mig_minors.display()
            );
            return;
        }
        let caps = MigCaps::load(&paths).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "nvidia-caps major {}, {} entries",
            caps.major,
            caps.minors.minors.len()
        );
        for g in inv.gpus.iter().filter(|g| g.mig_capable) {
            let gpu = g.minor;
            assert!(
                caps.minors
                    .get(Capability::GpuInstance { gpu, gi: 1 })
                    .is_some(),
                "no gpu{gpu}/gi1/access for {}",
                g.uuid
            );
            for m in &g.mig_devices {
                let nodes = caps
                    .nodes(gpu, m.gi_id, m.ci_id)
                    .unwrap_or_else(|e| panic!("{e}"));
                println!(
                    "{} -> {:?}",
                    m.uuid,
                    nodes.iter().map(|n| &n.path).collect::<Vec<_>>()
                );
            }
        }
    }
}
