//! GPU inventory: what GPUs a node has, behind one [`GpuBackend`] trait with two
//! backends — [`nvml`] (the real driver, loaded at run time) and [`fake`] (any Linux box).
//!
//! The inventory is plain data; the health classification lives in [`health`] as a pure
//! state machine fed by the backend's [`HealthEvent`]s.

pub mod fake;
pub mod health;
pub(crate) mod models;
pub mod nvml;
pub(crate) mod watch;

use serde::Serialize;

/// Errors of the inventory backends.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("NVML is not available: {0} (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)")]
    NvmlUnavailable(String),
    #[error("NVML call {call} failed for GPU {gpu}: {reason}")]
    Nvml {
        call: &'static str,
        gpu: String,
        reason: String,
    },
    #[error("invalid fake GPU spec: {0}")]
    FakeSpec(String),
    #[error("cannot read fake inventory {path}: {reason}")]
    FakeInventory { path: String, reason: String },
    #[error("GPU {gpu}: {reason}")]
    Mig { gpu: String, reason: String },
    #[error("unknown GPU {0}")]
    UnknownGpu(String),
    #[error("GPU {gpu}: cannot set the compute time-slice: {reason}")]
    TimeSlice { gpu: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One physical GPU as the node sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, stable across reboots.
    pub uuid: String,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// As NVML reports it, e.g. `NVIDIA A100-SXM4-80GB`.
    pub product_name: String,
    pub memory_mib: u64,
    pub sm_count: u32,
    pub compute_capability: (u32, u32),
    pub architecture: String,
    /// `0000:3B:00.0` form.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// UUIDs of GPUs reachable over NVLink, one entry per active link.
    pub nvlink_peers: Vec<String>,
    pub mig_capable: bool,
    pub mig_enabled: bool,
    /// MIG devices that exist now (empty when MIG is off).
    pub mig_devices: Vec<MigDeviceInfo>,
}

impl GpuInfo {
    /// Number of NVLink links between `self` and `other` (0: PCIe only).
    pub fn nvlinks_to(&self, other: &GpuInfo) -> usize {
        self.nvlink_peers
            .iter()
            .filter(|p| **p == other.uuid)
            .count()
    }
}

/// One MIG device (a GPU instance with one compute instance spanning it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDeviceInfo {
    /// `MIG-xxxxxxxx-...`.
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    pub gi_id: u32,
    pub ci_id: u32,
    /// First memory slot of the placement.
    pub start: u8,
    pub size: u8,
    pub memory_mib: u64,
    pub sm_count: u32,
}

/// Driver-wide facts.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DriverInfo {
    pub driver_version: String,
    /// e.g. `12.8`.
    pub cuda_version: String,
}

/// Everything the backend found.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Inventory {
    pub driver: DriverInfo,
    pub gpus: Vec<GpuInfo>,
}

impl Inventory {
    pub fn gpu(&self, uuid: &str) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// A raw health signal from the driver. Classification (which XIDs matter, when a GPU is
/// healthy again) is [`health::HealthTracker`]'s job, not the backend's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// An XID error reported for a GPU (or one of its MIG devices).
    Xid { gpu_uuid: String, xid: u64 },
    /// Uncorrectable (double-bit) ECC errors were counted.
    EccUncorrectable { gpu_uuid: String, count: u64 },
    /// The backend's probe found the GPU responsive and error-free again (after a reset or
    /// when the condition cleared).
    Recovered { gpu_uuid: String },
}

impl HealthEvent {
    pub fn gpu_uuid(&self) -> &str {
        match self {
            HealthEvent::Xid { gpu_uuid, .. }
            | HealthEvent::EccUncorrectable { gpu_uuid, .. }
            | HealthEvent::Recovered { gpu_uuid } => gpu_uuid,
        }
    }
}

/// The compute time-slice a GPU gives each context when several share it (what
/// `nvidia-smi compute-policy --set-timeslice` sets: 0 default, 1 short, 2 medium, 3 long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
pub enum TimeSlice {
    #[default]
    Default,
    Short,
    Medium,
    Long,
}

impl TimeSlice {
    /// The driver's numeric setting.
    pub fn code(self) -> u8 {
        match self {
            TimeSlice::Default => 0,
            TimeSlice::Short => 1,
            TimeSlice::Medium => 2,
            TimeSlice::Long => 3,
        }
    }
}

/// What a GPU is doing now ([`GpuBackend::usage`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUsage {
    pub uuid: String,
    /// Device memory in use (NVML `nvmlDeviceGetMemoryInfo`), bytes.
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Percent of the last sample period a kernel ran (NVML `utilization.gpu`, 0–100);
    /// `None` where the driver does not report it (a GPU in MIG mode).
    pub utilization_percent: Option<u32>,
    /// Memory in use per MIG device, where the driver reports it.
    pub mig: Vec<MigUsage>,
    /// Compute processes and their memory, where the driver reports it.
    pub processes: Vec<ProcessUsage>,
}

/// Memory in use on one MIG device, and how busy it was.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigUsage {
    pub uuid: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Percent of the time since the previous read that its GPU instance's graphics or
    /// compute engines were active (NVML GPM `GRAPHICS_UTIL`, Hopper and later), 0–100.
    /// `None` where the driver cannot say: a GPU before Hopper, a driver without GPM, or
    /// the first read (no earlier sample yet). Never a made-up 0.
    pub utilization_percent: Option<f64>,
}

/// One compute process on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessUsage {
    pub pid: u32,
    /// `None`: the driver does not attribute memory to processes here.
    pub memory_used_bytes: Option<u64>,
}

/// Sink for health events; backends push from their own thread or task.
pub type HealthSender = tokio::sync::mpsc::UnboundedSender<HealthEvent>;

/// The one seam between Tessera and the GPU driver.
pub trait GpuBackend: Send + Sync {
    /// `nvml` or `fake`.
    fn name(&self) -> &'static str;

    /// The current inventory (GPUs, MIG devices, driver versions).
    fn inventory(&self) -> Result<Inventory>;

    /// Start delivering health events to `tx` until it is closed. The watch may end on
    /// its own (the driver's event stream dies): the backend then drops `tx`, and the
    /// caller sees the channel close; [`watch::keep_watching`] restarts it.
    fn watch_health(&self, tx: HealthSender) -> Result<()>;

    /// Make the GPU's MIG devices exactly `layout` (profile name + start slot each),
    /// enabling MIG mode if needed, and return the resulting devices. Devices already in
    /// place are kept (same UUID); only the difference is destroyed or created. On an
    /// error the GPU may be left half-way (some instances created, as a driver leaves
    /// them): [`watch::apply_mig_layout_or_restore`] puts it back.
    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        layout: &[(String, u8)],
    ) -> Result<Vec<MigDeviceInfo>>;

    /// Memory and utilization of every GPU now. The default reports every GPU of the
    /// inventory idle with its full memory free (a backend that cannot measure).
    fn usage(&self) -> Result<Vec<GpuUsage>> {
        Ok(self
            .inventory()?
            .gpus
            .into_iter()
            .map(|g| GpuUsage {
                memory_total_bytes: g.memory_mib * 1024 * 1024,
                uuid: g.uuid,
                ..GpuUsage::default()
            })
            .collect())
    }

    /// Set the GPU's compute time-slice (DRA time-slicing). Backends that cannot say so.
    fn set_time_slice(&self, gpu_uuid: &str, interval: TimeSlice) -> Result<()> {
        let _ = interval;
        Err(Error::TimeSlice {
            gpu: gpu_uuid.to_string(),
            reason: format!("the {} backend does not support it", self.name()),
        })
    }
}
