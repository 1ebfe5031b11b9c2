//! The `fake` backend: GPUs described by a spec string (`8xH100-80GB`, `2xA100-80GB,1xL4`)
//! or an inventory YAML, so the agent runs on any Linux machine.
//!
//! What it models, as the real driver does: stable UUIDs per GPU (derived from the
//! node-local index and model, so restarts see the same IDs); NUMA placement and NVLink
//! (NVSwitch-style all-to-all for NVLink models given by spec string); MIG mode with the
//! real profile tables (layouts are validated by the catalog, existing MIG devices keep
//! their UUIDs when a layout changes around them); health events (XIDs, ECC, recovery)
//! either scripted in the YAML with delays or injected by tests through [`FakeBackend::inject`].
//!
//! Driver faults ([`Faults`], from the YAML's `faults:` or set by tests with
//! [`FakeBackend::set_faults`]): inventory calls that fail, a health watch that fails to
//! start or ends (its channel closes, as when the driver's event thread dies), a MIG
//! reconfiguration that fails half-way (some instances created, then an error, the
//! created ones left in place as the driver leaves them), and GPUs that disappear
//! ([`FakeBackend::remove_gpu`]).
//!
//! Usage ([`GpuBackend::usage`]): idle, unless the YAML's `usage:` (or a test, with
//! [`FakeBackend::set_usage`]) says what a GPU reports: memory used (default the sum of
//! its processes'), `utilization.gpu`, and compute processes with the memory the driver
//! attributes to each (as the vGPU guard and the usage gauges read it).
//!
//! At most [`MAX_FAKE_GPUS`] GPUs in all, checked before anything is built.
//!
//! ```yaml
//! driverVersion: "570.124.06"
//! cudaVersion: "12.8"
//! gpus:
//!   - { model: A100-80GB, count: 2, numa: 0, nvlink: all, migEnabled: true, mig: [3g.40gb, 3g.40gb] }
//!   - { model: L4, numa: 1 }
//! healthEvents:
//!   - { afterMs: 2000, gpu: 0, xid: 79 }
//!   - { afterMs: 5000, gpu: 0, recovered: true }
//! faults: { inventoryFailures: 2, healthWatchEndsAfterMs: 3000 }
//! usage:
//!   - { gpu: 2, utilizationPercent: 60, processes: [ { pid: 4242, memoryUsedMiB: 9000 } ] }
//!   # a GPU in MIG mode: per MIG device (index into its MIG devices); no
//!   # utilizationPercent on a device = a driver without GPM (utilization unknown)
//!   - { gpu: 1, mig: [ { device: 0, memoryUsedMiB: 4000, utilizationPercent: 35 }, { device: 1 } ] }
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::models::{self, GpuModel};
use super::{
    DriverInfo, Error, GpuBackend, GpuInfo, GpuUsage, HealthEvent, HealthSender, Inventory,
    MigDeviceInfo, MigUsage, ProcessUsage, Result, TimeSlice,
};
use crate::partition::catalog;

/// Most GPUs a fake node may have, over all spec tokens or inventory entries. Real nodes
/// have at most 16 (HGX boards have 8, the largest single-node systems 16), and the
/// driver numbers GPU device nodes `/dev/nvidia0`..`/dev/nvidia254` (minor 255 is
/// `nvidiactl`), so 256 covers any real node with room to spare, and equals the
/// per-token limit (`256xT4` stays valid). The bound keeps a typo from costing memory:
/// all-to-all NVLink wiring stores a peer list per GPU, quadratic in the count.
pub const MAX_FAKE_GPUS: u64 = 256;

/// Most scripted health events in an inventory YAML.
pub const MAX_HEALTH_EVENTS: usize = 10_000;

/// Injectable driver faults (the YAML's `faults:`; [`FakeBackend::set_faults`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Faults {
    /// The next this many `inventory()` calls fail.
    #[serde(default)]
    pub inventory_failures: u32,
    /// The next this many `watch_health()` calls fail.
    #[serde(default)]
    pub health_watch_start_failures: u32,
    /// Every health watch ends this long after it started (its channel closes).
    #[serde(default)]
    pub health_watch_ends_after_ms: Option<u64>,
    /// The next this many MIG reconfigurations that create instances fail half-way.
    #[serde(default)]
    pub mig_create_failures: u32,
    /// How many of its new instances such a reconfiguration creates before failing.
    #[serde(default)]
    pub mig_create_fails_after: u32,
}

/// In-memory GPUs.
pub struct FakeBackend {
    inventory: Mutex<Inventory>,
    /// Live health watches by id: dropping one's sender ends that watch.
    watchers: Arc<Mutex<Vec<(u64, HealthSender)>>>,
    next_watch: Mutex<u64>,
    scripted: Vec<ScriptedEvent>,
    /// Compute time-slice per GPU UUID (absent: the driver default).
    time_slices: Mutex<BTreeMap<String, TimeSlice>>,
    faults: Mutex<Faults>,
    /// Usage set by [`FakeBackend::set_usage`], per GPU UUID (absent: idle).
    usage: Mutex<BTreeMap<String, GpuUsage>>,
}

#[derive(Debug, Clone)]
struct ScriptedEvent {
    after: Duration,
    event: HealthEvent,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawInventory {
    driver_version: Option<String>,
    cuda_version: Option<String>,
    gpus: Vec<RawGpu>,
    #[serde(default)]
    health_events: Vec<RawEvent>,
    #[serde(default)]
    faults: Faults,
    /// What [`GpuBackend::usage`] reports, per GPU (others idle).
    #[serde(default)]
    usage: Vec<RawUsage>,
}

/// `usage[]`: one GPU's reported use, as NVML would give it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawUsage {
    /// GPU index.
    gpu: u32,
    /// Device memory in use; defaults to the sum of the processes' memory.
    #[serde(rename = "memoryUsedMiB")]
    memory_used_mib: Option<u64>,
    /// `utilization.gpu`, 0–100 (default 0).
    #[serde(default)]
    utilization_percent: u32,
    #[serde(default)]
    processes: Vec<RawProcess>,
    /// Its MIG devices' use (a GPU in MIG mode); devices not listed are idle.
    #[serde(default)]
    mig: Vec<RawMigUsage>,
}

/// `usage[].mig[]`: one MIG device's use.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMigUsage {
    /// Index into the GPU's MIG devices (in inventory order).
    device: usize,
    #[serde(rename = "memoryUsedMiB", default)]
    memory_used_mib: u64,
    /// GPM's `GRAPHICS_UTIL` since the last read, 0–100; absent: the driver has no GPM
    /// (a GPU before Hopper), so the device's utilization is not known.
    utilization_percent: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProcess {
    pid: u32,
    /// Absent: the driver attributes no memory to the process.
    #[serde(rename = "memoryUsedMiB")]
    memory_used_mib: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpu {
    model: String,
    #[serde(default = "one")]
    count: u32,
    numa: Option<u32>,
    uuid: Option<String>,
    /// `all` (NVSwitch: every other NVLink GPU of the node) or a list of GPU indices.
    nvlink: Option<serde_json::Value>,
    #[serde(default)]
    mig_enabled: bool,
    #[serde(default)]
    mig: Vec<String>,
}

fn one() -> u32 {
    1
}

const MIB: u64 = 1024 * 1024;

/// An idle GPU's MIG devices: nothing used, 0 % busy (a GPM-capable driver's answer).
fn idle_mig(gpu: &GpuInfo) -> Vec<MigUsage> {
    if !gpu.mig_enabled {
        return Vec::new();
    }
    gpu.mig_devices
        .iter()
        .map(|m| MigUsage {
            uuid: m.uuid.clone(),
            memory_used_bytes: 0,
            memory_total_bytes: m.memory_mib * MIB,
            utilization_percent: Some(0.0),
        })
        .collect()
}

/// `usage[i]` checked against the GPUs: an index that exists, at most 100 %, memory
/// within the GPU's, each pid once.
fn scripted_usage(gpus: &[GpuInfo], i: usize, u: &RawUsage) -> Result<GpuUsage> {
    let bad = |field: &str, why: String| Error::FakeSpec(format!("usage[{i}].{field}: {why}"));
    let gpu = gpus
        .get(u.gpu as usize)
        .ok_or_else(|| bad("gpu", format!("no GPU with index {}", u.gpu)))?;
    if gpu.mig_enabled && u.utilization_percent > 0 {
        return Err(bad(
            "utilizationPercent",
            "a GPU in MIG mode reports no utilization: script its `mig` devices".into(),
        ));
    }
    if !gpu.mig_enabled && !u.mig.is_empty() {
        return Err(bad("mig", "the GPU is not in MIG mode".into()));
    }
    let mut mig = idle_mig(gpu);
    for (j, m) in u.mig.iter().enumerate() {
        let dev = gpu.mig_devices.get(m.device).ok_or_else(|| {
            bad(
                &format!("mig[{j}].device"),
                format!("no MIG device {}", m.device),
            )
        })?;
        if m.memory_used_mib > dev.memory_mib {
            return Err(bad(
                &format!("mig[{j}].memoryUsedMiB"),
                format!(
                    "{} MiB used of a {} MiB MIG device",
                    m.memory_used_mib, dev.memory_mib
                ),
            ));
        }
        if m.utilization_percent
            .is_some_and(|p| !(0.0..=100.0).contains(&p))
        {
            return Err(bad(
                &format!("mig[{j}].utilizationPercent"),
                "not within 0–100".into(),
            ));
        }
        mig[m.device].memory_used_bytes = m.memory_used_mib * MIB;
        mig[m.device].utilization_percent = m.utilization_percent;
    }
    if u.utilization_percent > 100 {
        return Err(bad(
            "utilizationPercent",
            format!("{} is above 100", u.utilization_percent),
        ));
    }
    let mut pids = std::collections::BTreeSet::new();
    for (j, p) in u.processes.iter().enumerate() {
        if !pids.insert(p.pid) {
            return Err(bad(
                &format!("processes[{j}].pid"),
                format!("{} twice", p.pid),
            ));
        }
    }
    let by_processes: u64 = u.processes.iter().filter_map(|p| p.memory_used_mib).sum();
    let used = u.memory_used_mib.unwrap_or(by_processes);
    if used > gpu.memory_mib || by_processes > gpu.memory_mib {
        return Err(bad(
            "memoryUsedMiB",
            format!("{used} MiB used of a {} MiB GPU", gpu.memory_mib),
        ));
    }
    Ok(GpuUsage {
        uuid: gpu.uuid.clone(),
        memory_used_bytes: used * MIB,
        memory_total_bytes: gpu.memory_mib * MIB,
        utilization_percent: (!gpu.mig_enabled).then_some(u.utilization_percent),
        mig,
        processes: u
            .processes
            .iter()
            .map(|p| ProcessUsage {
                pid: p.pid,
                memory_used_bytes: p.memory_used_mib.map(|m| m * MIB),
            })
            .collect(),
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEvent {
    #[serde(default)]
    after_ms: u64,
    gpu: u32,
    xid: Option<u64>,
    ecc: Option<u64>,
    #[serde(default)]
    recovered: bool,
}

impl FakeBackend {
    /// `--fake-gpus`: a spec string, or the path of an inventory YAML file.
    pub fn from_arg(arg: &str) -> Result<Self> {
        let path = Path::new(arg);
        if arg.ends_with(".yaml") || arg.ends_with(".yml") || path.is_file() {
            let text = crate::yaml::read_bounded(path, crate::yaml::MAX_BYTES).map_err(|e| {
                Error::FakeInventory {
                    path: arg.to_string(),
                    reason: e.to_string(),
                }
            })?;
            Self::from_yaml(&text).map_err(|e| match e {
                Error::FakeSpec(reason) => Error::FakeInventory {
                    path: arg.to_string(),
                    reason,
                },
                other => other,
            })
        } else {
            Self::from_spec(arg)
        }
    }

    /// `8xH100-80GB` or `2xA100-80GB,1xL4`. NVLink models are connected all-to-all
    /// (NVSwitch); the first half of the GPUs is on NUMA node 0, the rest on node 1.
    pub fn from_spec(spec: &str) -> Result<Self> {
        let parsed = models::parse_fake_spec(spec).map_err(|e| Error::FakeSpec(e.to_string()))?;
        check_total(parsed.iter().map(|(n, _)| *n)).map_err(Error::FakeSpec)?;
        let total = parsed.iter().map(|(n, _)| *n).sum::<u32>();
        let mut gpus = Vec::new();
        let mut links = Vec::new();
        for (count, model) in parsed {
            for _ in 0..count {
                let index = gpus.len() as u32;
                let numa = if total > 1 && index >= total.div_ceil(2) {
                    1
                } else {
                    0
                };
                gpus.push(make_gpu(index, model, Some(numa), None));
                links.push(model.nvlink_links);
            }
        }
        connect_all_nvlink(&mut gpus, &links);
        Ok(Self::new(default_driver(), gpus, Vec::new()))
    }

    /// An inventory YAML (see the module docs).
    pub fn from_yaml(text: &str) -> Result<Self> {
        // Bounded (size, depth, aliases) and without the input's text in errors.
        let raw: RawInventory =
            crate::yaml::from_str(text).map_err(|e| Error::FakeSpec(format!("{}: {e}", e.path)))?;
        check_total(raw.gpus.iter().map(|g| g.count))
            .map_err(|e| Error::FakeSpec(format!("gpus: {e}")))?;
        if raw.health_events.len() > MAX_HEALTH_EVENTS {
            return Err(Error::FakeSpec(format!(
                "healthEvents: {} events; at most {MAX_HEALTH_EVENTS}",
                raw.health_events.len()
            )));
        }
        let mut gpus: Vec<GpuInfo> = Vec::new();
        let mut nvlink_specs = Vec::new();
        let mut mig_layouts = Vec::new();
        for (i, g) in raw.gpus.iter().enumerate() {
            let model = models::find_model(&g.model).ok_or_else(|| {
                Error::FakeSpec(format!("gpus[{i}].model: unknown GPU model {:?}", g.model))
            })?;
            if g.count == 0 {
                return Err(Error::FakeSpec(format!("gpus[{i}].count: must be > 0")));
            }
            if g.uuid.is_some() && g.count != 1 {
                return Err(Error::FakeSpec(format!(
                    "gpus[{i}].uuid: only valid with count 1"
                )));
            }
            if (g.mig_enabled || !g.mig.is_empty()) && !model.mig_capable {
                return Err(Error::FakeSpec(format!(
                    "gpus[{i}]: {} does not support MIG",
                    model.short_name
                )));
            }
            for _ in 0..g.count {
                let index = gpus.len() as u32;
                let mut gpu = make_gpu(index, model, g.numa, g.uuid.clone());
                gpu.mig_enabled = g.mig_enabled || !g.mig.is_empty();
                gpus.push(gpu);
                nvlink_specs.push((i, g.nvlink.clone(), model.nvlink_links));
                mig_layouts.push((i, g.mig.clone()));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &gpus {
            if !seen.insert(g.uuid.clone()) {
                return Err(Error::FakeSpec(format!("duplicate GPU UUID {}", g.uuid)));
            }
        }
        wire_nvlink(&mut gpus, &nvlink_specs)?;
        for (index, (rule, profiles)) in mig_layouts.iter().enumerate() {
            if profiles.is_empty() {
                continue;
            }
            let layout = place_profiles(&gpus[index], profiles)
                .map_err(|e| Error::FakeSpec(format!("gpus[{rule}].mig: {e}")))?;
            gpus[index].mig_devices = build_mig_devices(&gpus[index], &layout, &[]);
        }
        let mut scripted = Vec::new();
        for (i, e) in raw.health_events.iter().enumerate() {
            let gpu = gpus.get(e.gpu as usize).ok_or_else(|| {
                Error::FakeSpec(format!(
                    "healthEvents[{i}].gpu: no GPU with index {}",
                    e.gpu
                ))
            })?;
            let gpu_uuid = gpu.uuid.clone();
            let event = match (e.xid, e.ecc, e.recovered) {
                (Some(xid), None, false) => HealthEvent::Xid { gpu_uuid, xid },
                (None, Some(count), false) => HealthEvent::EccUncorrectable { gpu_uuid, count },
                (None, None, true) => HealthEvent::Recovered { gpu_uuid },
                _ => {
                    return Err(Error::FakeSpec(format!(
                        "healthEvents[{i}]: set exactly one of xid, ecc, recovered"
                    )))
                }
            };
            scripted.push(ScriptedEvent {
                after: Duration::from_millis(e.after_ms),
                event,
            });
        }
        let driver = DriverInfo {
            driver_version: raw
                .driver_version
                .unwrap_or_else(|| default_driver().driver_version),
            cuda_version: raw
                .cuda_version
                .unwrap_or_else(|| default_driver().cuda_version),
        };
        let usage = raw
            .usage
            .iter()
            .enumerate()
            .map(|(i, u)| scripted_usage(&gpus, i, u))
            .collect::<Result<Vec<_>>>()?;
        let backend = Self::new(driver, gpus, scripted);
        backend.set_faults(raw.faults);
        for u in usage {
            backend.set_usage(u);
        }
        Ok(backend)
    }

    /// An in-memory copy of a real inventory: `tessera layout` previews MIG layouts on it
    /// without touching the hardware.
    pub fn from_inventory(inventory: Inventory) -> Self {
        Self::new(inventory.driver, inventory.gpus, Vec::new())
    }

    fn new(driver: DriverInfo, gpus: Vec<GpuInfo>, scripted: Vec<ScriptedEvent>) -> Self {
        Self {
            inventory: Mutex::new(Inventory { driver, gpus }),
            watchers: Arc::default(),
            next_watch: Mutex::new(0),
            scripted,
            time_slices: Mutex::new(BTreeMap::new()),
            faults: Mutex::default(),
            usage: Mutex::default(),
        }
    }

    /// What [`GpuBackend::usage`] reports for GPU `usage.uuid` from now on (tests).
    pub fn set_usage(&self, usage: GpuUsage) {
        lock(&self.usage).insert(usage.uuid.clone(), usage);
    }

    /// Replace the injected faults (tests, chaos drills).
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.faults) = faults;
    }

    /// The faults still pending (counters go down as faults fire).
    pub fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    /// End every health watch now: their channels close, as when the driver's event
    /// stream dies.
    pub fn end_health_watches(&self) {
        lock(&self.watchers).clear();
    }

    /// How many health watches are live.
    pub fn health_watches(&self) -> usize {
        lock(&self.watchers).len()
    }

    /// The GPU falls off the bus: later inventories do not list it.
    pub fn remove_gpu(&self, uuid: &str) -> bool {
        let mut inv = lock(&self.inventory);
        let before = inv.gpus.len();
        inv.gpus.retain(|g| g.uuid != uuid);
        inv.gpus.len() != before
    }

    /// The GPU's current compute time-slice (what `set_time_slice` last set).
    pub fn time_slice(&self, gpu_uuid: &str) -> TimeSlice {
        lock(&self.time_slices)
            .get(gpu_uuid)
            .copied()
            .unwrap_or_default()
    }

    /// Deliver a health event to every watcher now (tests, chaos drills).
    pub fn inject(&self, event: HealthEvent) {
        let mut watchers = lock(&self.watchers);
        watchers.retain(|(_, tx)| tx.send(event.clone()).is_ok());
    }
}

/// Refuse more than [`MAX_FAKE_GPUS`] GPUs in all (summed without overflow, before
/// anything is allocated).
fn check_total(counts: impl Iterator<Item = u32>) -> Result<(), String> {
    let total: u64 = counts.map(u64::from).sum();
    if total > MAX_FAKE_GPUS {
        return Err(format!(
            "{total} GPUs in all; the fake backend models at most {MAX_FAKE_GPUS} GPUs per node"
        ));
    }
    Ok(())
}

/// Take one fault from a counter: true when it fires.
fn take(counter: &mut u32) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the data half-updated (every
    // critical section is a single assignment), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GpuBackend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn inventory(&self) -> Result<Inventory> {
        if take(&mut lock(&self.faults).inventory_failures) {
            return Err(Error::Nvml {
                call: "nvmlDeviceGetCount",
                gpu: "all".into(),
                reason: "injected driver fault: GPU_IS_LOST".into(),
            });
        }
        Ok(lock(&self.inventory).clone())
    }

    /// Idle GPUs (nothing used, 0 %), except those [`FakeBackend::set_usage`] set.
    fn usage(&self) -> Result<Vec<GpuUsage>> {
        let set = lock(&self.usage);
        Ok(lock(&self.inventory)
            .gpus
            .iter()
            .map(|g| {
                set.get(&g.uuid).cloned().unwrap_or_else(|| GpuUsage {
                    uuid: g.uuid.clone(),
                    memory_total_bytes: g.memory_mib * 1024 * 1024,
                    // NVML reports no utilization for a GPU in MIG mode.
                    utilization_percent: (!g.mig_enabled).then_some(0),
                    mig: idle_mig(g),
                    ..GpuUsage::default()
                })
            })
            .collect())
    }

    /// The watch is the sender kept in `watchers`: scripted events and the fault that ends
    /// it look it up by id, so removing it closes the channel.
    fn watch_health(&self, tx: HealthSender) -> Result<()> {
        let ends_after = {
            let mut faults = lock(&self.faults);
            if take(&mut faults.health_watch_start_failures) {
                return Err(Error::Nvml {
                    call: "nvmlEventSetCreate",
                    gpu: "all".into(),
                    reason: "injected driver fault: UNKNOWN".into(),
                });
            }
            faults.health_watch_ends_after_ms.map(Duration::from_millis)
        };
        let id = {
            let mut next = lock(&self.next_watch);
            *next += 1;
            *next
        };
        lock(&self.watchers).push((id, tx));
        let send = move |watchers: &Mutex<Vec<(u64, HealthSender)>>, event: HealthEvent| {
            if let Some((_, tx)) = lock(watchers).iter().find(|(w, _)| *w == id) {
                let _ = tx.send(event);
            }
        };
        if !self.scripted.is_empty() {
            let mut script = self.scripted.clone();
            script.sort_by_key(|s| s.after);
            let watchers = self.watchers.clone();
            std::thread::spawn(move || {
                let mut at = Duration::ZERO;
                for s in script {
                    std::thread::sleep(s.after.saturating_sub(at));
                    at = s.after;
                    send(&watchers, s.event);
                }
            });
        }
        if let Some(after) = ends_after {
            let watchers = self.watchers.clone();
            std::thread::spawn(move || {
                std::thread::sleep(after);
                lock(&watchers).retain(|(w, _)| *w != id);
            });
        }
        Ok(())
    }

    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        layout: &[(String, u8)],
    ) -> Result<Vec<MigDeviceInfo>> {
        let mut inv = lock(&self.inventory);
        let gpu = inv
            .gpus
            .iter_mut()
            .find(|g| g.uuid == gpu_uuid)
            .ok_or_else(|| Error::UnknownGpu(gpu_uuid.to_string()))?;
        if !gpu.mig_capable {
            return Err(Error::Mig {
                gpu: gpu_uuid.to_string(),
                reason: "does not support MIG".into(),
            });
        }
        // Validate like the driver would: the placements must be legal together.
        let model =
            catalog::lookup(&gpu.product_name, gpu.memory_mib).ok_or_else(|| Error::Mig {
                gpu: gpu_uuid.to_string(),
                reason: "no MIG profile table".into(),
            })?;
        check_placements(model, layout).map_err(|reason| Error::Mig {
            gpu: gpu_uuid.to_string(),
            reason,
        })?;
        let devices = build_mig_devices(gpu, layout, &gpu.mig_devices);
        gpu.mig_enabled = true;
        let created: Vec<&MigDeviceInfo> = devices
            .iter()
            .filter(|d| !gpu.mig_devices.iter().any(|e| e.uuid == d.uuid))
            .collect();
        let mut faults = lock(&self.faults);
        if !created.is_empty() && take(&mut faults.mig_create_failures) {
            // Like the driver: what it destroyed stays destroyed and the instances it
            // created before the failure exist; nothing rolls them back here.
            let made = (faults.mig_create_fails_after as usize).min(created.len());
            let mut partial: Vec<MigDeviceInfo> = gpu
                .mig_devices
                .iter()
                .filter(|e| devices.iter().any(|d| d.uuid == e.uuid))
                .cloned()
                .collect();
            partial.extend(created[..made].iter().map(|d| (*d).clone()));
            partial.sort_by_key(|d| d.start);
            let total = created.len();
            gpu.mig_devices = partial;
            return Err(Error::Mig {
                gpu: gpu_uuid.to_string(),
                reason: format!(
                    "injected driver fault: creating MIG instance {} of {total} failed \
                     (INSUFFICIENT_RESOURCES)",
                    made + 1
                ),
            });
        }
        gpu.mig_devices = devices.clone();
        Ok(devices)
    }

    fn set_time_slice(&self, gpu_uuid: &str, interval: TimeSlice) -> Result<()> {
        let inv = lock(&self.inventory);
        let gpu = inv
            .gpu(gpu_uuid)
            .ok_or_else(|| Error::UnknownGpu(gpu_uuid.to_string()))?;
        // Like the driver: the compute policy applies to a whole GPU, not under MIG.
        if gpu.mig_enabled {
            return Err(Error::TimeSlice {
                gpu: gpu_uuid.to_string(),
                reason: "MIG mode is enabled".into(),
            });
        }
        let mut slices = lock(&self.time_slices);
        match interval {
            TimeSlice::Default => slices.remove(gpu_uuid),
            other => slices.insert(gpu_uuid.to_string(), other),
        };
        Ok(())
    }
}

fn default_driver() -> DriverInfo {
    DriverInfo {
        driver_version: "570.124.06".into(),
        cuda_version: "12.8".into(),
    }
}

fn make_gpu(index: u32, model: &GpuModel, numa: Option<u32>, uuid: Option<String>) -> GpuInfo {
    GpuInfo {
        index,
        uuid: uuid.unwrap_or_else(|| fake_uuid("GPU", &format!("{}/{index}", model.short_name))),
        minor: index,
        product_name: model.product_name.to_string(),
        memory_mib: model.memory_mib,
        sm_count: model.sm_count,
        compute_capability: model.compute_capability,
        architecture: model.architecture.to_string(),
        pci_bus_id: format!("0000:{:02X}:00.0", 0x18 + index * 0x10),
        numa_node: numa,
        nvlink_peers: Vec::new(),
        mig_capable: model.mig_capable,
        mig_enabled: false,
        mig_devices: Vec::new(),
    }
}

/// Deterministic UUID-shaped ID from a seed (FNV-1a, twice, for 128 bits).
pub fn fake_uuid(prefix: &str, seed: &str) -> String {
    let fnv = |salt: u64| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
        for b in seed.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let (a, b) = (fnv(0), fnv(0x9e37_79b9_7f4a_7c15));
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// NVSwitch-style wiring: every GPU with `links[i] > 0` reaches every other such GPU,
/// its links spread evenly over the peers.
fn connect_all_nvlink(gpus: &mut [GpuInfo], links: &[u32]) {
    let linked: Vec<usize> = (0..gpus.len()).filter(|i| links[*i] > 0).collect();
    for &i in &linked {
        let peers: Vec<String> = linked
            .iter()
            .filter(|j| **j != i)
            .map(|j| gpus[*j].uuid.clone())
            .collect();
        let per_peer = if peers.is_empty() {
            0
        } else {
            (links[i] as usize / peers.len()).max(1)
        };
        gpus[i].nvlink_peers = peers
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), per_peer))
            .collect();
    }
}

type NvlinkSpec = (usize, Option<serde_json::Value>, u32);

fn wire_nvlink(gpus: &mut [GpuInfo], specs: &[NvlinkSpec]) -> Result<()> {
    use serde_json::Value;
    let all: Vec<u32> = specs
        .iter()
        .map(|(_, s, links)| match s {
            Some(Value::String(v)) if v == "all" => (*links).max(1),
            _ => 0,
        })
        .collect();
    connect_all_nvlink(gpus, &all);
    for (index, (rule, spec, _)) in specs.iter().enumerate() {
        match spec {
            None => {}
            Some(Value::String(s)) if s == "all" => {}
            Some(Value::Array(peers)) => {
                let mut uuids = Vec::new();
                for p in peers {
                    let peer = p
                        .as_u64()
                        .and_then(|p| gpus.get(p as usize))
                        .filter(|g| g.index as usize != index)
                        .ok_or_else(|| {
                            Error::FakeSpec(format!(
                                "gpus[{rule}].nvlink: {p:?} is not another GPU's index"
                            ))
                        })?;
                    uuids.push(peer.uuid.clone());
                }
                gpus[index].nvlink_peers = uuids;
            }
            Some(other) => {
                return Err(Error::FakeSpec(format!(
                    "gpus[{rule}].nvlink: {other:?} is not \"all\" or a list of GPU indices"
                )))
            }
        }
    }
    Ok(())
}

fn place_profiles(gpu: &GpuInfo, profiles: &[String]) -> Result<Vec<(String, u8)>, String> {
    let model = catalog::lookup(&gpu.product_name, gpu.memory_mib)
        .ok_or_else(|| format!("{} has no MIG profile table", gpu.product_name))?;
    let refs: Vec<&str> = profiles.iter().map(String::as_str).collect();
    let placed = model.place(&refs).map_err(|e| e.to_string())?;
    Ok(placed
        .into_iter()
        .map(|p| (p.profile.name.to_string(), p.start))
        .collect())
}

/// Check a layout of explicit placements: known profiles, legal start slots, no overlap.
fn check_placements(model: &catalog::ModelCatalog, layout: &[(String, u8)]) -> Result<(), String> {
    let mut used = vec![false; model.total_slots as usize];
    for (name, start) in layout {
        let p = model
            .profile(name)
            .ok_or_else(|| format!("{} has no MIG profile {name}", model.model))?;
        if !p.placements.contains(start) {
            return Err(format!(
                "{name} cannot start at slot {start} (valid: {:?})",
                p.placements
            ));
        }
        for slot in *start..start + p.size {
            let cell = used
                .get_mut(slot as usize)
                .ok_or_else(|| format!("{name}@{start} runs past the last slot"))?;
            if *cell {
                return Err(format!("{name}@{start} overlaps another MIG device"));
            }
            *cell = true;
        }
    }
    Ok(())
}

/// MIG devices for `layout`, reusing the UUIDs and instance IDs of `existing` devices with
/// the same profile and start slot (the driver does not touch instances that stay).
fn build_mig_devices(
    gpu: &GpuInfo,
    layout: &[(String, u8)],
    existing: &[MigDeviceInfo],
) -> Vec<MigDeviceInfo> {
    let model = catalog::lookup(&gpu.product_name, gpu.memory_mib);
    let mut next_gi = existing.iter().map(|d| d.gi_id).max().unwrap_or(0) + 1;
    let mut out = Vec::new();
    for (name, start) in layout {
        if let Some(d) = existing
            .iter()
            .find(|d| d.profile == *name && d.start == *start)
        {
            out.push(d.clone());
            continue;
        }
        let profile = model.and_then(|m| m.profile(name));
        out.push(MigDeviceInfo {
            uuid: fake_uuid("MIG", &format!("{}/{name}@{start}", gpu.uuid)),
            profile: name.clone(),
            gi_id: next_gi,
            ci_id: 0,
            start: *start,
            size: profile.map(|p| p.size).unwrap_or(1),
            memory_mib: profile.map(|p| p.memory_mib).unwrap_or(0),
            sm_count: profile.map(|p| p.sm_count).unwrap_or(0),
        });
        next_gi += 1;
    }
    out.sort_by_key(|d| d.start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mig_gpu_reports_per_device_use_and_no_gpu_utilization() {
        let spec = "gpus: [ { model: A100-80GB, migEnabled: true, mig: [3g.40gb, 1g.10gb] }, { model: L4 } ]\n";
        let b = FakeBackend::from_yaml(&format!(
            "{spec}usage:\n- {{ gpu: 0, mig: [ {{ device: 0, memoryUsedMiB: 4000, utilizationPercent: 35.5 }}, {{ device: 1 }} ] }}\n"
        ))
        .unwrap();
        let usage = b.usage().unwrap();
        let inv = b.inventory().unwrap();
        assert_eq!(
            usage[0].utilization_percent, None,
            "MIG mode: no GPU figure"
        );
        let mig: Vec<_> = usage[0]
            .mig
            .iter()
            .map(|m| (m.uuid.as_str(), m.memory_used_bytes, m.utilization_percent))
            .collect();
        assert_eq!(
            mig,
            vec![
                (
                    inv.gpus[0].mig_devices[0].uuid.as_str(),
                    4000 * MIB,
                    Some(35.5)
                ),
                // Listed without a figure: a driver without GPM.
                (inv.gpus[0].mig_devices[1].uuid.as_str(), 0, None),
            ]
        );
        // Unscripted: idle, measured 0 % (a GPM-capable driver's answer).
        let idle = FakeBackend::from_yaml(spec).unwrap().usage().unwrap();
        assert_eq!(idle[0].utilization_percent, None);
        assert_eq!(idle[0].mig.len(), 2);
        assert!(idle[0]
            .mig
            .iter()
            .all(|m| m.utilization_percent == Some(0.0)));
        assert_eq!(idle[1].utilization_percent, Some(0));
        for (usage, want) in [
            (
                "[ { gpu: 0, mig: [ { device: 2 } ] } ]",
                "usage[0].mig[0].device: no MIG device 2",
            ),
            (
                "[ { gpu: 0, mig: [ { device: 0, utilizationPercent: 101 } ] } ]",
                "usage[0].mig[0].utilizationPercent",
            ),
            (
                "[ { gpu: 0, mig: [ { device: 1, memoryUsedMiB: 99999 } ] } ]",
                "usage[0].mig[0].memoryUsedMiB",
            ),
            (
                "[ { gpu: 0, utilizationPercent: 10 } ]",
                "usage[0].utilizationPercent: a GPU in MIG mode",
            ),
            (
                "[ { gpu: 1, mig: [ { device: 0 } ] } ]",
                "usage[0].mig: the GPU is not in MIG mode",
            ),
        ] {
            let err = FakeBackend::from_yaml(&format!("{spec}usage: {usage}\n"))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(want), "{usage}: {err}");
        }
    }

    #[test]
    fn an_inventory_scripts_what_usage_reports_and_bad_usage_names_the_field() {
        let b = FakeBackend::from_yaml(
            "gpus: [ { model: L4, count: 2 } ]\nusage:\n- gpu: 1\n  utilizationPercent: 40\n  processes: [ { pid: 4242, memoryUsedMiB: 2048 }, { pid: 7 } ]\n",
        )
        .unwrap();
        let usage = b.usage().unwrap();
        assert_eq!(usage[0].memory_used_bytes, 0, "GPU 0 idle");
        let u = &usage[1];
        assert_eq!(u.memory_used_bytes, 2048 * MIB, "the processes' sum");
        assert_eq!(u.utilization_percent, Some(40));
        assert_eq!(
            u.processes,
            [
                ProcessUsage {
                    pid: 4242,
                    memory_used_bytes: Some(2048 * MIB)
                },
                ProcessUsage {
                    pid: 7,
                    memory_used_bytes: None
                }
            ]
        );
        for (usage, want) in [
            ("[ { gpu: 2 } ]", "usage[0].gpu: no GPU with index 2"),
            (
                "[ { gpu: 0, utilizationPercent: 101 } ]",
                "usage[0].utilizationPercent",
            ),
            (
                "[ { gpu: 0, memoryUsedMiB: 999999 } ]",
                "usage[0].memoryUsedMiB",
            ),
            (
                "[ { gpu: 0, processes: [ { pid: 1 }, { pid: 1 } ] } ]",
                "usage[0].processes[1].pid: 1 twice",
            ),
            ("[ { gpu: 0, memoryUsed: 1 } ]", "memoryUsed"),
        ] {
            let err = FakeBackend::from_yaml(&format!(
                "gpus: [ {{ model: L4, count: 2 }} ]\nusage: {usage}\n"
            ))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
            assert!(err.contains(want), "{usage}: {err}");
        }
    }

    #[test]
    fn the_total_is_bounded_not_each_token() {
        // 40 tokens of 256 each: every token is valid, the total is not.
        let spec = vec!["256xH100-80GB"; 40].join(",");
        let err = FakeBackend::from_spec(&spec).err().unwrap().to_string();
        assert!(err.contains("10240 GPUs in all"), "{err}");
        assert!(err.contains(&MAX_FAKE_GPUS.to_string()), "{err}");
        assert!(FakeBackend::from_spec("256xT4").is_ok());
        assert!(FakeBackend::from_spec("128xT4,128xL4").is_ok());
        assert!(FakeBackend::from_spec("128xT4,129xL4").is_err());
        // Checked before anything is built: this would not fit in memory otherwise.
        let err = FakeBackend::from_yaml("gpus: [ { model: L4, count: 4294967295 } ]")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("gpus: 4294967295 GPUs in all") && err.contains("at most 256"),
            "{err}"
        );
        let err = FakeBackend::from_yaml(
            "gpus: [ { model: L4, count: 4294967295 }, { model: L4, count: 4294967295 } ]",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("8589934590 GPUs in all"), "no overflow: {err}");
    }

    #[test]
    fn an_inventory_file_is_parsed_bounded_and_never_quoted() {
        let deep = format!("gpus: {}{}", "[".repeat(10_000), "]".repeat(10_000));
        let t = std::time::Instant::now();
        let err = FakeBackend::from_yaml(&deep).err().unwrap().to_string();
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "{err}");
        assert!(err.contains("recursion limit"), "{err}");
        let err = FakeBackend::from_yaml("gpus: [ { model: L4, count: s3cr3t-value } ]")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("gpus[0].count"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        let big = format!("# {}\ngpus: []\n", "x".repeat(2 << 20));
        let err = FakeBackend::from_yaml(&big).err().unwrap().to_string();
        assert!(err.contains("limit"), "{err}");
    }

    #[test]
    fn inventory_faults_fire_then_clear() {
        let b = FakeBackend::from_yaml(
            "gpus: [ { model: L4, count: 2 } ]\nfaults: { inventoryFailures: 2 }",
        )
        .unwrap();
        assert!(b.inventory().is_err());
        assert!(b.inventory().is_err());
        assert_eq!(b.inventory().unwrap().gpus.len(), 2);
        let uuid = b.inventory().unwrap().gpus[0].uuid.clone();
        assert!(b.remove_gpu(&uuid));
        assert_eq!(b.inventory().unwrap().gpus.len(), 1);
        assert!(FakeBackend::from_yaml("gpus: [ { model: L4 } ]\nfaults: { bogus: 1 }").is_err());
    }

    #[tokio::test]
    async fn a_health_watch_can_fail_to_start_and_end() {
        let b = FakeBackend::from_spec("1xL4").unwrap();
        b.set_faults(Faults {
            health_watch_start_failures: 1,
            health_watch_ends_after_ms: Some(50),
            ..Faults::default()
        });
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        assert!(b.watch_health(tx).is_err());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        b.watch_health(tx).unwrap();
        let uuid = b.inventory().unwrap().gpus[0].uuid.clone();
        b.inject(HealthEvent::Recovered {
            gpu_uuid: uuid.clone(),
        });
        assert!(rx.recv().await.is_some());
        let ended = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(ended.unwrap(), None, "the watch ended: its channel closed");
        assert_eq!(b.health_watches(), 0);
        // Ended at once on request.
        b.set_faults(Faults::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        b.watch_health(tx).unwrap();
        b.end_health_watches();
        assert_eq!(rx.recv().await, None);
    }

    #[test]
    fn a_mig_create_can_fail_half_way() {
        let b = FakeBackend::from_yaml("gpus: [ { model: A100-80GB, migEnabled: true } ]").unwrap();
        let uuid = b.inventory().unwrap().gpus[0].uuid.clone();
        b.set_faults(Faults {
            mig_create_failures: 1,
            mig_create_fails_after: 1,
            ..Faults::default()
        });
        let layout = vec![("3g.40gb".to_string(), 0), ("3g.40gb".to_string(), 4)];
        let err = b.apply_mig_layout(&uuid, &layout).unwrap_err().to_string();
        assert!(err.contains("creating MIG instance 2 of 2 failed"), "{err}");
        let left = &b.inventory().unwrap().gpus[0].mig_devices;
        assert_eq!(left.len(), 1, "the first instance was created: {left:?}");
        // The fault fired once: the same request now works and keeps that instance.
        let devices = b.apply_mig_layout(&uuid, &layout).unwrap();
        assert_eq!(devices.len(), 2);
        assert!(devices.iter().any(|d| d.uuid == left[0].uuid));
    }
}
