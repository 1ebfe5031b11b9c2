//! Allocated vs used, per GPU and per container: one sampling tick turned into gauge
//! values and chargeback increments. Pure: the sampler ([`super::sampler`]) reads the
//! kubelet, the backend and the shim's files and passes what it read, and the seconds the
//! tick covers, in.
//!
//! Who holds what comes from the kubelet's PodResources `List` (container → device IDs);
//! what each device is comes from the device plugin's advertisement (whole GPU, MIG
//! device, time-sliced replica, vGPU slice or split-mode slot); how busy each GPU is from
//! the backend ([`GpuUsage`]); what a vGPU container holds against its limit from the
//! shim's accounting and limits files ([`VgpuAccounting`]).
//!
//! | mode | allocated share | busy (0–1 of the share) | container memory used | limit |
//! |---|---|---|---|---|
//! | `whole` | 1 | GPU utilization | its pod's processes' memory on the GPU, else the GPU's used memory | the GPU's memory |
//! | `mig` | `c / C` | the MIG device's GPM utilization (Hopper and later); none where the driver has no GPM | its pod's processes' memory on the GPU, else the MIG device's, when NVML reports it | the MIG device's memory |
//! | `timeslice` | `1 / r` | GPU utilization (shared by all replicas) | its pod's processes' memory on the GPU (NVML per process, PID → pod by cgroup); none while none is listed | not exported |
//! | `vgpu` | `max(m / M, s / 100)` | `min(1, GPU utilization / Σ SM limits on the GPU)` | the shim's total for the slice | the slice's memory |
//!
//! Where the busy fraction is not known (a MIG device without GPM, a GPU whose driver
//! reports no utilization) it is `None`: the container's busy gauge is absent and the
//! tick charges allocated GPU-seconds but no used ones, never a made-up 0.
//!
//! The vGPU busy fraction is an estimate: NVML measures the whole GPU, so the GPU's
//! utilization is split over the vGPU containers on it in proportion to their SM limits
//! (a slice without an SM limit counts its share). A container whose devices the
//! advertisement does not know (another device plugin's) is not reported.
//!
//! DRA claims of Tessera's driver are charged by the same rule: which container uses
//! which claim comes from PodResources `dynamic_resources` ([`ClaimHolder`]), what each
//! device is from the driver's checkpoint and, for a vGPU slice, the claim's units record
//! and accounting file ([`DraClaim`]). A whole GPU is `whole` (`timeslice` when the claim
//! time-slices it), a MIG device `mig`, a vGPU slice `vgpu`; a claim used by `n`
//! containers charges each `1 / n` of its devices, so a shared GPU is charged once.
//! Per-process memory is attributed to their whole-GPU, time-sliced and MIG holds as in
//! the table: their pods' UIDs come from the kubelet's DRA checkpoint
//! ([`add_claim_pod_uids`]) where the device-plugin pods' come from its device checkpoint
//! ([`pod_uids`]); pods neither can name (sharing one claim, holding nothing else) get
//! the UID the API server gives ([`add_api_pod_uids`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;

use crate::chargeback::ledger::ChargeLabels;
use crate::chargeback::rule::{Mode, Slice};
use crate::gpu::{GpuInfo, GpuUsage, Inventory};
use crate::partition::catalog;
use crate::partition::layout::{Advertisement, Device, Share, Target};
use crate::vgpu::slots::Holder;

/// Pod labels naming the pod's LocalQueue, the first present wins.
pub const QUEUE_LABELS: [&str; 2] = ["kueue.x-k8s.io/queue-name", "tessera.io/queue-name"];
/// The default pod label read as the team.
pub const DEFAULT_TEAM_LABEL: &str = "team";
const MIB: f64 = 1024.0 * 1024.0;

/// What the metrics carry from a pod's labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLabels {
    pub queue: String,
    pub team: String,
}

impl PodLabels {
    /// The queue and team of a pod with `labels`; `team_key` is the configured team label.
    pub fn from_labels(labels: &BTreeMap<String, String>, team_key: &str) -> PodLabels {
        PodLabels {
            queue: QUEUE_LABELS
                .iter()
                .find_map(|k| labels.get(*k))
                .cloned()
                .unwrap_or_default(),
            team: labels.get(team_key).cloned().unwrap_or_default(),
        }
    }
}

/// One CUDA ordinal's limits from the container's limits file
/// (the shim's unit limits, converted by the sampler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitLimits {
    pub index: usize,
    pub memory_mib: u64,
    pub cores: u32,
}

/// One vGPU container's files: the devices the kubelet's checkpoint recorded for its
/// allocation (in that order: CUDA ordinal `i` is the `i`-th distinct GPU among them, as
/// Allocate numbered them), the shim's per-ordinal totals and the limits file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VgpuAccounting {
    pub device_ids: Vec<String>,
    /// `None`: no accounting file yet (no CUDA process started): nothing used.
    pub used_bytes: Option<Vec<u64>>,
    pub limits: Vec<UnitLimits>,
}

/// One container's use of a DRA claim, as the kubelet's PodResources API lists it
/// (`dynamic_resources`), with only the devices of Tessera's driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimHolder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub claim_namespace: String,
    pub claim_name: String,
    /// The driver's device names (`gpu-0`, `gpu-1-mig-1g-10gb-0`, `gpu-2-vgpu`).
    pub devices: Vec<String>,
}

/// What one device of a prepared claim is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimTarget {
    /// A whole GPU, by index.
    Gpu { index: u32 },
    /// A MIG device the claim created on `gpu_uuid`.
    Mig {
        gpu_uuid: String,
        profile: String,
        start: u8,
    },
    /// A vGPU slice of GPU `index`; its limits are the claim's units record.
    Vgpu { index: u32 },
}

/// One device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDevice {
    pub name: String,
    pub target: ClaimTarget,
    /// The claim time-slices the GPU (its pods share it).
    pub time_sliced: bool,
}

/// One CUDA ordinal of a vGPU claim's units record: its GPU and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUnit {
    pub index: usize,
    pub gpu: String,
    pub memory_mib: u64,
    pub cores: u32,
}

/// A claim the DRA driver prepared on this node (its checkpoint record), with the vGPU
/// files of its allocation directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DraClaim {
    /// The claim's UID (the key of the driver's checkpoint record).
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub devices: Vec<ClaimDevice>,
    /// The units record (`None`: none written, or unreadable): a vGPU device without its
    /// unit is not charged.
    pub units: Option<Vec<ClaimUnit>>,
    /// The shim's per-ordinal totals (`None`: no CUDA process yet).
    pub used_bytes: Option<Vec<u64>>,
}

/// Everything one tick read.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub node: &'a str,
    pub inventory: &'a Inventory,
    pub advertisement: &'a Advertisement,
    pub holders: &'a [Holder],
    pub usage: &'a [GpuUsage],
    pub vgpu: &'a [VgpuAccounting],
    /// The containers' DRA claims (PodResources `dynamic_resources`).
    pub claim_holders: &'a [ClaimHolder],
    /// The claims the DRA driver prepared.
    pub claims: &'a [DraClaim],
    /// `(namespace, pod)` → its labels; a pod missing here has empty queue and team.
    pub pods: &'a BTreeMap<(String, String), PodLabels>,
    /// The pod UID each GPU process runs in (from `<proc>/<pid>/cgroup`); a process in
    /// no pod is absent.
    pub process_pods: &'a BTreeMap<u32, String>,
    /// `(namespace, pod)` → its UID ([`pod_uids`]).
    pub pod_uids: &'a BTreeMap<(String, String), String>,
}

/// One device-plugin allocation as the kubelet's checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointAllocation {
    pub pod_uid: String,
    pub container: String,
    pub resource: String,
    /// The device IDs in the order the checkpoint lists them.
    pub device_ids: Vec<String>,
}

/// Each pod's UID, by joining the PodResources holders (namespace, pod, container and
/// device IDs) with the kubelet's device checkpoint entries (pod UID, container and
/// device IDs): a device is held by one container at a time.
pub fn pod_uids(
    holders: &[Holder],
    allocations: &[CheckpointAllocation],
) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for a in allocations {
        if let Some(h) = holders.iter().find(|h| {
            h.container == a.container
                && h.resource == a.resource
                && h.device_ids.iter().any(|d| a.device_ids.contains(d))
        }) {
            out.insert((h.namespace.clone(), h.pod.clone()), a.pod_uid.clone());
        }
    }
    out
}

/// Adds the UIDs of the pods running with DRA claims to `uids` (the device-plugin pods'
/// [`pod_uids`]). PodResources names a claim's pods by namespace and name, the kubelet's
/// DRA checkpoint by UID (`claim_pods`: claim UID → the UIDs of the pods it runs with the
/// claim), and the driver's prepared claims join the two (claim namespace and name → claim
/// UID). A claim that PodResources lists for one pod whose UID is not known yet, and that
/// the kubelet records with one UID not known yet, names that pod's UID: a claim of one
/// pod names its pod; a claim shared by several pods names the last one once the others'
/// UIDs are known (from the device checkpoint or from their own claims). Any other pod
/// stays unknown, and its processes are attributed to no one rather than guessed.
pub fn add_claim_pod_uids(
    uids: &mut BTreeMap<(String, String), String>,
    claim_holders: &[ClaimHolder],
    claims: &[DraClaim],
    claim_pods: &BTreeMap<String, BTreeSet<String>>,
) {
    let claim_uid: BTreeMap<(&str, &str), &str> = claims
        .iter()
        .map(|c| ((c.namespace.as_str(), c.name.as_str()), c.uid.as_str()))
        .collect();
    // Claim UID → the pods PodResources lists with it.
    let mut users: BTreeMap<&str, BTreeSet<(&str, &str)>> = BTreeMap::new();
    for h in claim_holders {
        if let Some(uid) = claim_uid.get(&(h.claim_namespace.as_str(), h.claim_name.as_str())) {
            users
                .entry(uid)
                .or_default()
                .insert((h.namespace.as_str(), h.pod.as_str()));
        }
    }
    let mut known: BTreeSet<String> = uids.values().cloned().collect();
    // Naming one pod can leave a shared claim with one open pod: again until a pass
    // names none.
    loop {
        let mut named = false;
        for (claim, pods) in &users {
            let Some(recorded) = claim_pods.get(*claim) else {
                continue;
            };
            let mut open_pods = pods
                .iter()
                .filter(|(ns, pod)| !uids.contains_key(&(ns.to_string(), pod.to_string())));
            let mut open_uids = recorded.iter().filter(|u| !known.contains(*u));
            if let (Some((ns, pod)), None, Some(uid), None) = (
                open_pods.next(),
                open_pods.next(),
                open_uids.next(),
                open_uids.next(),
            ) {
                uids.insert((ns.to_string(), pod.to_string()), uid.clone());
                known.insert(uid.clone());
                named = true;
            }
        }
        if !named {
            return;
        }
    }
}

/// Adds the UIDs the API server gives for the pods still unknown to `uids` (those the
/// kubelet's checkpoints could not name, such as pods sharing one DRA claim and holding
/// nothing else). What the kubelet's checkpoints name stays: they are read every sample,
/// the API server's answer is kept for a while.
pub fn add_api_pod_uids(
    uids: &mut BTreeMap<(String, String), String>,
    from_api: BTreeMap<(String, String), String>,
) {
    for (pod, uid) in from_api {
        uids.entry(pod).or_insert(uid);
    }
}

/// Labels of the per-GPU gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct GpuLabels {
    pub node: String,
    pub gpu: String,
    pub model: String,
    /// How the device plugin shares the GPU; `dra` when it advertises nothing on it (the
    /// DRA driver's GPUs).
    pub mode: String,
}

/// Labels of the per-container gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ContainerLabels {
    pub node: String,
    pub gpu: String,
    pub model: String,
    pub mode: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub queue: String,
}

/// One GPU's gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRow {
    pub labels: GpuLabels,
    pub index: u32,
    pub product_name: String,
    pub memory_used_bytes: f64,
    pub memory_total_bytes: f64,
    /// `None`: not reported (MIG mode).
    pub utilization_ratio: Option<f64>,
}

/// One container's hold on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRow {
    pub labels: ContainerLabels,
    pub team: String,
    /// The CUDA ordinal of this GPU in the container (vGPU), else the position among the
    /// container's GPUs.
    pub ordinal: usize,
    /// Share of the GPU charged ([`Slice::share`], summed over the container's devices on it).
    pub allocated_share: f64,
    /// `None`: not measured (see the module's table).
    pub busy: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_limit_bytes: Option<f64>,
}

impl ContainerRow {
    pub fn charge_labels(&self) -> ChargeLabels {
        let l = &self.labels;
        ChargeLabels {
            node: l.node.clone(),
            gpu: l.gpu.clone(),
            model: l.model.clone(),
            mode: mode_of(&l.mode),
            namespace: l.namespace.clone(),
            pod: l.pod.clone(),
            container: l.container.clone(),
            queue: l.queue.clone(),
            team: self.team.clone(),
        }
    }
}

fn mode_of(label: &str) -> Mode {
    Mode::ALL
        .into_iter()
        .find(|m| m.as_str() == label)
        .unwrap_or(Mode::Whole)
}

/// What one tick adds to a chargeback series.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    pub labels: ChargeLabels,
    pub share: f64,
    /// `None`: not measured: allocated is charged, used is not.
    pub busy: Option<f64>,
    pub seconds: f64,
}

/// The outcome of one tick.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    pub gpus: Vec<GpuRow>,
    pub containers: Vec<ContainerRow>,
    pub charges: Vec<Charge>,
    /// Devices held but not charged, and why (logged by the sampler).
    pub skipped: Vec<String>,
}

/// The GPU's model label: the short name Tessera knows it by (`H100-80GB`), else the
/// product name without `NVIDIA ` and with `-` for spaces.
pub fn model_label(gpu: &GpuInfo) -> String {
    if let Some(m) = crate::gpu::models::find_model(&gpu.product_name) {
        return m.short_name.to_string();
    }
    if let Some(c) = catalog::lookup(&gpu.product_name, gpu.memory_mib) {
        return c.model.to_string();
    }
    gpu.product_name
        .trim()
        .trim_start_matches("NVIDIA ")
        .replace(' ', "-")
}

fn device_mode(d: &Device) -> Mode {
    match (&d.share, &d.target) {
        (Share::Vgpu { .. } | Share::Slot { .. }, _) => Mode::Vgpu,
        (Share::Replica { .. }, _) => Mode::Timeslice,
        (Share::Exclusive, Target::Mig { .. }) => Mode::Mig,
        (Share::Exclusive, Target::Gpu) => Mode::Whole,
    }
}

fn mig_slices(gpu: &GpuInfo, profile: &str) -> (u32, u32) {
    let cat = catalog::lookup(&gpu.product_name, gpu.memory_mib);
    let whole = cat.map_or(7, |c| u32::from(c.compute_slices));
    let own = cat
        .and_then(|c| c.profile(profile))
        .map(|p| u32::from(p.compute_slices))
        .or_else(|| profile.split('g').next().and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    (own, whole)
}

/// The share of a device, or why it cannot be charged. `limits`: the split-mode slot's
/// unit limits (from its limits file).
fn device_share(d: &Device, gpu: &GpuInfo, limits: Option<&UnitLimits>) -> Result<f64, String> {
    let base = match &d.target {
        Target::Gpu => Slice::Whole,
        Target::Mig { profile, .. } => {
            let (compute_slices, gpu_compute_slices) = mig_slices(gpu, profile);
            Slice::Mig {
                compute_slices,
                gpu_compute_slices,
            }
        }
    };
    let slice = match d.share {
        Share::Exclusive => base,
        Share::Replica { of, .. } => {
            let unit = base.share().map_err(|e| e.to_string())?;
            let r = Slice::Timeslice { replicas: of }
                .share()
                .map_err(|e| e.to_string())?;
            return Ok(unit * r);
        }
        Share::Vgpu {
            memory_mib, cores, ..
        } => Slice::Vgpu {
            memory_mib,
            gpu_memory_mib: gpu.memory_mib,
            cores_percent: cores,
        },
        Share::Slot { .. } => {
            let l = limits.ok_or("a split-mode slot without limits yet")?;
            Slice::Vgpu {
                memory_mib: l.memory_mib,
                gpu_memory_mib: gpu.memory_mib,
                cores_percent: l.cores,
            }
        }
    };
    slice.share().map_err(|e| e.to_string())
}

/// Every advertised device by ID (a device ID names one device node-wide), and by
/// resource first where two resources would share an ID.
struct DeviceIndex<'a> {
    by_id: BTreeMap<(&'a str, &'a str), &'a Device>,
    any: BTreeMap<&'a str, &'a Device>,
}

impl<'a> DeviceIndex<'a> {
    fn new(ad: &'a Advertisement) -> Self {
        let mut by_id = BTreeMap::new();
        let mut any = BTreeMap::new();
        for r in &ad.resources {
            for d in &r.devices {
                by_id.insert((r.name.as_str(), d.id.as_str()), d);
                any.entry(d.id.as_str()).or_insert(d);
            }
        }
        DeviceIndex { by_id, any }
    }

    fn find(&self, resource: &str, id: &str) -> Option<&'a Device> {
        self.by_id
            .get(&(resource, id))
            .or_else(|| self.any.get(id))
            .copied()
    }
}

fn sorted_ids(ids: &[String]) -> Vec<&str> {
    let mut v: Vec<&str> = ids.iter().map(String::as_str).collect();
    v.sort_unstable();
    v
}

/// The container holding a device.
#[derive(Clone, Copy)]
struct Who<'a> {
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
}

/// Per container and GPU while building the tick.
struct Hold<'a> {
    who: Who<'a>,
    gpu: &'a GpuInfo,
    mode: Mode,
    ordinal: usize,
    share: f64,
    /// SM limit (0–1) for the vGPU busy split: the slice's cores, else its share.
    sm: f64,
    memory_limit_bytes: Option<f64>,
    memory_used_bytes: Option<f64>,
    /// MIG: Σ share × GPM busy fraction of its MIG devices on this GPU; `None` when one
    /// of them is not measured.
    mig_used: Option<f64>,
}

/// One tick: gauges for every GPU and every container holding a device, and what
/// `seconds` adds to each container's chargeback series.
pub fn tick(s: &Sample<'_>, seconds: f64) -> Tick {
    let mut out = Tick::default();
    let usage: BTreeMap<&str, &GpuUsage> = s.usage.iter().map(|u| (u.uuid.as_str(), u)).collect();
    let mut gpu_modes: BTreeMap<&str, Mode> = BTreeMap::new();
    for d in s.advertisement.resources.iter().flat_map(|r| &r.devices) {
        gpu_modes
            .entry(d.gpu_uuid.as_str())
            .or_insert(device_mode(d));
    }
    for gpu in &s.inventory.gpus {
        let u = usage.get(gpu.uuid.as_str());
        out.gpus.push(GpuRow {
            labels: GpuLabels {
                node: s.node.to_string(),
                gpu: gpu.uuid.clone(),
                model: model_label(gpu),
                mode: gpu_modes
                    .get(gpu.uuid.as_str())
                    .map_or("dra", |m| m.as_str())
                    .to_string(),
            },
            index: gpu.index,
            product_name: gpu.product_name.clone(),
            memory_used_bytes: u.map_or(0.0, |u| u.memory_used_bytes as f64),
            memory_total_bytes: u
                .map_or(gpu.memory_mib as f64 * MIB, |u| u.memory_total_bytes as f64),
            utilization_ratio: u
                .and_then(|u| u.utilization_percent)
                .map(|p| f64::from(p.min(100)) / 100.0),
        });
    }

    let devices = DeviceIndex::new(s.advertisement);
    let accounts: BTreeMap<Vec<&str>, &VgpuAccounting> = s
        .vgpu
        .iter()
        .map(|a| (sorted_ids(&a.device_ids), a))
        .collect();
    let mut holds: Vec<Hold<'_>> = Vec::new();
    for h in s.holders {
        let acct = accounts.get(&sorted_ids(&h.device_ids)).copied();
        // Devices in the allocation's order (the checkpoint's), so ordinals match Allocate's.
        let ordered: Vec<&str> = match acct {
            Some(a) => a.device_ids.iter().map(String::as_str).collect(),
            None => h.device_ids.iter().map(String::as_str).collect(),
        };
        let mut units: Vec<&str> = Vec::new();
        let first = holds.len();
        for id in ordered {
            let Some(d) = devices.find(&h.resource, id) else {
                continue;
            };
            let Some(gpu) = s.inventory.gpu(&d.gpu_uuid) else {
                out.skipped
                    .push(format!("{id}: GPU {} not in the inventory", d.gpu_uuid));
                continue;
            };
            let ordinal = match units.iter().position(|u| *u == d.unit()) {
                Some(i) => i,
                None => {
                    units.push(d.unit());
                    units.len() - 1
                }
            };
            let limits = acct.and_then(|a| a.limits.iter().find(|l| l.index == ordinal));
            let share = match device_share(d, gpu, limits) {
                Ok(share) => share,
                Err(why) => {
                    out.skipped.push(format!(
                        "{}/{}/{} {id}: {why}",
                        h.namespace, h.pod, h.container
                    ));
                    continue;
                }
            };
            let mode = device_mode(d);
            let mig_uuid = match &d.target {
                Target::Mig { uuid, .. } => Some(uuid.as_str()),
                Target::Gpu => None,
            };
            let mig_used = mig_busy(&usage, gpu, mig_uuid).map(|b| b * share);
            let sm = match (&d.share, limits) {
                (Share::Vgpu { cores, .. }, _) if *cores > 0 => f64::from(*cores) / 100.0,
                (Share::Slot { .. }, Some(l)) if l.cores > 0 => f64::from(l.cores) / 100.0,
                _ => share,
            };
            let (memory_used_bytes, memory_limit_bytes) = match mode {
                Mode::Whole => (
                    usage
                        .get(gpu.uuid.as_str())
                        .map(|u| u.memory_used_bytes as f64),
                    Some(
                        usage
                            .get(gpu.uuid.as_str())
                            .map_or(gpu.memory_mib as f64 * MIB, |u| u.memory_total_bytes as f64),
                    ),
                ),
                Mode::Mig => {
                    let used = usage.get(gpu.uuid.as_str()).and_then(|u| {
                        u.mig
                            .iter()
                            .find(|m| Some(m.uuid.as_str()) == mig_uuid)
                            .map(|m| m.memory_used_bytes as f64)
                    });
                    let limit = gpu
                        .mig_devices
                        .iter()
                        .find(|m| Some(m.uuid.as_str()) == mig_uuid)
                        .map(|m| m.memory_mib as f64 * MIB);
                    (used, limit)
                }
                Mode::Timeslice => (None, None),
                Mode::Vgpu => {
                    let limit = match (&d.share, limits) {
                        (_, Some(l)) => Some(l.memory_mib as f64 * MIB),
                        (Share::Vgpu { memory_mib, .. }, None) => Some(*memory_mib as f64 * MIB),
                        _ => None,
                    };
                    let used = acct.map(|a| {
                        a.used_bytes
                            .as_ref()
                            .and_then(|u| u.get(ordinal).copied())
                            .unwrap_or(0) as f64
                    });
                    (used, limit)
                }
            };
            // Several devices of one container on one GPU (two replicas, two slices): one row.
            if let Some(prev) = holds[first..]
                .iter_mut()
                .find(|p| p.gpu.uuid == gpu.uuid && p.mode == mode)
            {
                prev.share = (prev.share + share).min(1.0);
                prev.sm = (prev.sm + sm).min(1.0);
                prev.mig_used = prev.mig_used.zip(mig_used).map(|(a, b)| a + b);
                if mode == Mode::Vgpu {
                    continue;
                }
                prev.memory_used_bytes = sum(prev.memory_used_bytes, memory_used_bytes);
                prev.memory_limit_bytes = sum(prev.memory_limit_bytes, memory_limit_bytes);
                continue;
            }
            holds.push(Hold {
                who: Who {
                    namespace: &h.namespace,
                    pod: &h.pod,
                    container: &h.container,
                },
                gpu,
                mode,
                ordinal,
                share,
                sm,
                memory_limit_bytes,
                memory_used_bytes,
                mig_used,
            });
        }
    }

    holds.extend(claim_holds(s, &usage, &mut out.skipped));
    attribute_processes(s, &usage, &mut holds);

    // Σ SM limits of the vGPU holds per GPU: the GPU's utilization is split over them.
    let mut vgpu_sm: BTreeMap<&str, f64> = BTreeMap::new();
    for h in holds.iter().filter(|h| h.mode == Mode::Vgpu) {
        *vgpu_sm.entry(h.gpu.uuid.as_str()).or_default() += h.sm;
    }
    for h in holds {
        let util = usage
            .get(h.gpu.uuid.as_str())
            .and_then(|u| u.utilization_percent)
            .map(|p| f64::from(p.min(100)) / 100.0);
        let busy = match h.mode {
            Mode::Whole | Mode::Timeslice => util,
            Mode::Mig if h.share > 0.0 => h.mig_used.map(|u| (u / h.share).min(1.0)),
            Mode::Mig => None,
            Mode::Vgpu => {
                let total = vgpu_sm.get(h.gpu.uuid.as_str()).copied().unwrap_or(0.0);
                util.map(|u| {
                    if total > 0.0 {
                        (u / total).min(1.0)
                    } else {
                        0.0
                    }
                })
            }
        };
        let pod = s
            .pods
            .get(&(h.who.namespace.to_string(), h.who.pod.to_string()))
            .cloned()
            .unwrap_or_default();
        let row = ContainerRow {
            labels: ContainerLabels {
                node: s.node.to_string(),
                gpu: h.gpu.uuid.clone(),
                model: model_label(h.gpu),
                mode: h.mode.as_str().to_string(),
                namespace: h.who.namespace.to_string(),
                pod: h.who.pod.to_string(),
                container: h.who.container.to_string(),
                queue: pod.queue,
            },
            team: pod.team,
            ordinal: h.ordinal,
            allocated_share: h.share,
            busy,
            memory_used_bytes: h.memory_used_bytes,
            memory_limit_bytes: h.memory_limit_bytes,
        };
        out.charges.push(Charge {
            labels: row.charge_labels(),
            share: row.allocated_share,
            busy,
            seconds,
        });
        out.containers.push(row);
    }
    out
}

/// The holds of the containers' DRA claims: each claim's devices per GPU, the share split
/// evenly between the containers that use the claim (a claim shared by `n` containers
/// charges each `1 / n` of its devices, so the GPU is charged once).
fn claim_holds<'a>(
    s: &Sample<'a>,
    usage: &BTreeMap<&str, &GpuUsage>,
    skipped: &mut Vec<String>,
) -> Vec<Hold<'a>> {
    let key = |ns: &'a str, name: &'a str| (ns, name);
    let claims: BTreeMap<(&str, &str), &DraClaim> = s
        .claims
        .iter()
        .map(|c| (key(&c.namespace, &c.name), c))
        .collect();
    let mut consumers: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for h in s.claim_holders {
        *consumers
            .entry(key(&h.claim_namespace, &h.claim_name))
            .or_default() += 1;
    }
    let mut holds: Vec<Hold<'a>> = Vec::new();
    for h in s.claim_holders {
        let k = key(&h.claim_namespace, &h.claim_name);
        let Some(claim) = claims.get(&k) else {
            skipped.push(format!(
                "{}/{}/{}: claim {}/{} is not prepared by this node's driver",
                h.namespace, h.pod, h.container, h.claim_namespace, h.claim_name
            ));
            continue;
        };
        let who = Who {
            namespace: &h.namespace,
            pod: &h.pod,
            container: &h.container,
        };
        let split = consumers.get(&k).copied().unwrap_or(1).max(1) as f64;
        let first = holds.len();
        for d in claim.devices.iter().filter(|d| h.devices.contains(&d.name)) {
            let hold = match claim_device_hold(s, usage, claim, d, who) {
                Ok(hold) => hold,
                Err(why) => {
                    skipped.push(format!(
                        "{}/{}/{} claim {}/{} {}: {why}",
                        h.namespace, h.pod, h.container, claim.namespace, claim.name, d.name
                    ));
                    continue;
                }
            };
            // Devices of one claim on one GPU in one mode: one row (a vGPU unit already
            // sums the GPU's slices).
            if let Some(prev) = holds[first..]
                .iter_mut()
                .find(|p| p.gpu.uuid == hold.gpu.uuid && p.mode == hold.mode)
            {
                if hold.mode != Mode::Vgpu {
                    prev.share = (prev.share + hold.share).min(1.0);
                    prev.sm = (prev.sm + hold.sm).min(1.0);
                    prev.memory_used_bytes = sum(prev.memory_used_bytes, hold.memory_used_bytes);
                    prev.memory_limit_bytes = sum(prev.memory_limit_bytes, hold.memory_limit_bytes);
                }
                continue;
            }
            holds.push(hold);
        }
        for hold in &mut holds[first..] {
            hold.share /= split;
            hold.sm /= split;
            hold.mig_used = hold.mig_used.map(|u| u / split);
        }
    }
    holds
}

/// One device of a prepared claim as a hold of `who` (before the split between the
/// claim's containers), or why it cannot be charged.
fn claim_device_hold<'a>(
    s: &Sample<'a>,
    usage: &BTreeMap<&str, &GpuUsage>,
    claim: &'a DraClaim,
    d: &ClaimDevice,
    who: Who<'a>,
) -> Result<Hold<'a>, String> {
    let by_index = |index: u32| {
        s.inventory
            .gpus
            .iter()
            .find(|g| g.index == index)
            .ok_or(format!("GPU {index} not in the inventory"))
    };
    let gpu_usage = |gpu: &GpuInfo| usage.get(gpu.uuid.as_str()).copied();
    let hold =
        |gpu: &'a GpuInfo, mode: Mode, share: f64, memory: (Option<f64>, Option<f64>)| Hold {
            who,
            gpu,
            mode,
            ordinal: 0,
            share,
            sm: share,
            memory_used_bytes: memory.0,
            memory_limit_bytes: memory.1,
            mig_used: None,
        };
    match &d.target {
        ClaimTarget::Gpu { index } => {
            let gpu = by_index(*index)?;
            if d.time_sliced {
                return Ok(hold(gpu, Mode::Timeslice, 1.0, (None, None)));
            }
            let u = gpu_usage(gpu);
            let memory = (
                u.map(|u| u.memory_used_bytes as f64),
                Some(u.map_or(gpu.memory_mib as f64 * MIB, |u| u.memory_total_bytes as f64)),
            );
            Ok(hold(gpu, Mode::Whole, 1.0, memory))
        }
        ClaimTarget::Mig {
            gpu_uuid,
            profile,
            start,
        } => {
            let gpu = s
                .inventory
                .gpu(gpu_uuid)
                .ok_or(format!("GPU {gpu_uuid} not in the inventory"))?;
            let mig = gpu
                .mig_devices
                .iter()
                .find(|m| m.profile == *profile && m.start == *start)
                .ok_or(format!("no MIG {profile} at {start} on {gpu_uuid}"))?;
            let (compute_slices, gpu_compute_slices) = mig_slices(gpu, profile);
            let share = Slice::Mig {
                compute_slices,
                gpu_compute_slices,
            }
            .share()
            .map_err(|e| e.to_string())?;
            let used = gpu_usage(gpu).and_then(|u| {
                u.mig
                    .iter()
                    .find(|m| m.uuid == mig.uuid)
                    .map(|m| m.memory_used_bytes as f64)
            });
            let memory = (used, Some(mig.memory_mib as f64 * MIB));
            let mut h = hold(gpu, Mode::Mig, share, memory);
            h.mig_used = mig_busy(usage, gpu, Some(mig.uuid.as_str())).map(|b| b * share);
            Ok(h)
        }
        ClaimTarget::Vgpu { index } => {
            let gpu = by_index(*index)?;
            let unit = claim
                .units
                .as_ref()
                .and_then(|units| units.iter().find(|u| u.gpu == gpu.uuid))
                .ok_or("a vGPU claim without its units record")?;
            let share = Slice::Vgpu {
                memory_mib: unit.memory_mib,
                gpu_memory_mib: gpu.memory_mib,
                cores_percent: unit.cores,
            }
            .share()
            .map_err(|e| e.to_string())?;
            let used = claim
                .used_bytes
                .as_ref()
                .and_then(|u| u.get(unit.index).copied())
                .unwrap_or(0) as f64;
            let memory = (Some(used), Some(unit.memory_mib as f64 * MIB));
            let mut h = hold(gpu, Mode::Vgpu, share, memory);
            h.ordinal = unit.index;
            if unit.cores > 0 {
                h.sm = f64::from(unit.cores) / 100.0;
            }
            Ok(h)
        }
    }
}

/// The driver's per-process memory, attributed to the containers whose pod the process
/// runs in (whole GPUs, time-sliced replicas and MIG devices; vGPU slices keep the
/// shim's accounting). A hold gets the sum of its pod's processes on its GPU when its
/// pod has no other container holding that GPU (two containers of one pod on one GPU
/// cannot be told apart: neither is given the processes). A process in no pod, or in
/// a pod that holds nothing on that GPU, is blamed on no one. Where no process of a
/// hold's pod is listed: a whole GPU or MIG device keeps the device's used memory, a
/// time-sliced replica reports none (never a made-up 0).
fn attribute_processes(s: &Sample<'_>, usage: &BTreeMap<&str, &GpuUsage>, holds: &mut [Hold<'_>]) {
    let mut per_pod_gpu: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
    for h in holds.iter().filter(|h| h.mode != Mode::Vgpu) {
        *per_pod_gpu
            .entry((h.who.namespace, h.who.pod, h.gpu.uuid.as_str()))
            .or_default() += 1;
    }
    for h in holds.iter_mut().filter(|h| h.mode != Mode::Vgpu) {
        if per_pod_gpu.get(&(h.who.namespace, h.who.pod, h.gpu.uuid.as_str())) != Some(&1) {
            continue;
        }
        let Some(uid) = s
            .pod_uids
            .get(&(h.who.namespace.to_string(), h.who.pod.to_string()))
        else {
            continue;
        };
        let Some(u) = usage.get(h.gpu.uuid.as_str()) else {
            continue;
        };
        let mine: Vec<u64> = u
            .processes
            .iter()
            .filter(|p| s.process_pods.get(&p.pid) == Some(uid))
            .filter_map(|p| p.memory_used_bytes)
            .collect();
        if !mine.is_empty() {
            h.memory_used_bytes = Some(mine.iter().sum::<u64>() as f64);
        }
    }
}

/// The GPM busy fraction (0–1) of MIG device `mig_uuid` on `gpu`, where the driver
/// measured it.
fn mig_busy(
    usage: &BTreeMap<&str, &GpuUsage>,
    gpu: &GpuInfo,
    mig_uuid: Option<&str>,
) -> Option<f64> {
    let mig_uuid = mig_uuid?;
    usage
        .get(gpu.uuid.as_str())?
        .mig
        .iter()
        .find(|m| m.uuid == mig_uuid)?
        .utilization_percent
        .map(|p| p.clamp(0.0, 100.0) / 100.0)
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// When each chargeback series was last charged, to forget the series of containers gone
/// for longer than `--chargeback-forget-after` (time passed in: a monotonic offset).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    last: BTreeMap<ChargeLabels, Duration>,
}

impl Seen {
    pub fn observe<'a>(
        &mut self,
        labels: impl IntoIterator<Item = &'a ChargeLabels>,
        now: Duration,
    ) {
        for l in labels {
            match self.last.get_mut(l) {
                Some(at) => *at = now,
                None => {
                    self.last.insert(l.clone(), now);
                }
            }
        }
    }

    /// The series last charged more than `after` before `now`, removed from the book.
    pub fn expired(&mut self, now: Duration, after: Duration) -> Vec<ChargeLabels> {
        let gone: Vec<ChargeLabels> = self
            .last
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) > after)
            .map(|(l, _)| l.clone())
            .collect();
        for l in &gone {
            self.last.remove(l);
        }
        gone
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// The gauge series of the last successful tick, to remove those a new tick lacks.
pub fn vanished<T: Ord + Clone>(before: &BTreeSet<T>, now: &BTreeSet<T>) -> Vec<T> {
    before.difference(now).cloned().collect()
}

/// A failure streak of the PodResources call: the first failure and the recovery are
/// logged, the ones between are not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streak {
    failing: bool,
}

impl Streak {
    /// A failed call: `true` when it starts a streak (log it).
    pub fn fail(&mut self) -> bool {
        !std::mem::replace(&mut self.failing, true)
    }

    /// A successful call: `true` when it ends a streak (log the recovery).
    pub fn ok(&mut self) -> bool {
        std::mem::replace(&mut self.failing, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chargeback::ledger::charge_of;
    use crate::gpu::{MigDeviceInfo, MigUsage};
    use crate::partition::layout::Resource;

    const GIB: u64 = 1 << 30;

    fn gpu(i: u32) -> GpuInfo {
        GpuInfo {
            index: i,
            uuid: format!("GPU-{i}"),
            minor: i,
            product_name: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            sm_count: 108,
            compute_capability: (8, 0),
            architecture: "Ampere".into(),
            pci_bus_id: String::new(),
            numa_node: None,
            nvlink_peers: vec![],
            mig_capable: true,
            mig_enabled: i == 1,
            mig_devices: if i == 1 {
                vec![MigDeviceInfo {
                    uuid: "MIG-a".into(),
                    profile: "1g.10gb".into(),
                    gi_id: 9,
                    ci_id: 0,
                    start: 0,
                    size: 1,
                    memory_mib: 9_856,
                    sm_count: 14,
                }]
            } else {
                vec![]
            },
        }
    }

    fn device(id: &str, gpu: u32, target: Target, share: Share) -> Device {
        Device {
            id: id.into(),
            gpu_uuid: format!("GPU-{gpu}"),
            gpu_index: gpu,
            numa_node: None,
            target,
            share,
        }
    }

    /// GPU 0 whole, GPU 1 MIG, GPU 2 four time-sliced replicas, GPU 3 vGPU slices.
    fn advertisement() -> Advertisement {
        let mig = Target::Mig {
            uuid: "MIG-a".into(),
            profile: "1g.10gb".into(),
            gpu_minor: 1,
            gi_id: 9,
            ci_id: 0,
        };
        let vgpu = |n, memory_mib, cores| {
            device(
                &format!("GPU-3::v{n}"),
                3,
                Target::Gpu,
                Share::Vgpu {
                    index: n,
                    memory_mib,
                    cores,
                },
            )
        };
        let resource = |name: &str, devices| Resource {
            name: name.into(),
            fail_requests_greater_than_one: false,
            devices,
        };
        Advertisement {
            resources: vec![
                resource(
                    "nvidia.com/gpu",
                    vec![
                        device("GPU-0", 0, Target::Gpu, Share::Exclusive),
                        device(
                            "GPU-2::0",
                            2,
                            Target::Gpu,
                            Share::Replica { index: 0, of: 4 },
                        ),
                        device(
                            "GPU-2::1",
                            2,
                            Target::Gpu,
                            Share::Replica { index: 1, of: 4 },
                        ),
                        vgpu(0, 20_480, 30),
                        vgpu(1, 8_192, 50),
                    ],
                ),
                resource(
                    "nvidia.com/mig-1g.10gb",
                    vec![device("MIG-a", 1, mig, Share::Exclusive)],
                ),
            ],
        }
    }

    fn holder(pod: &str, resource: &str, ids: &[&str]) -> Holder {
        Holder {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn usage(i: u32, used: u64, util: Option<u32>) -> GpuUsage {
        GpuUsage {
            uuid: format!("GPU-{i}"),
            memory_used_bytes: used,
            memory_total_bytes: 80 * GIB,
            utilization_percent: util,
            mig: if i == 1 {
                vec![MigUsage {
                    uuid: "MIG-a".into(),
                    memory_used_bytes: 2 * GIB,
                    memory_total_bytes: 9 * GIB,
                    utilization_percent: Some(70.0),
                }]
            } else {
                vec![]
            },
            processes: vec![],
        }
    }

    struct World {
        inventory: Inventory,
        ad: Advertisement,
        holders: Vec<Holder>,
        usage: Vec<GpuUsage>,
        vgpu: Vec<VgpuAccounting>,
        claim_holders: Vec<ClaimHolder>,
        claims: Vec<DraClaim>,
        pods: BTreeMap<(String, String), PodLabels>,
        process_pods: BTreeMap<u32, String>,
        pod_uids: BTreeMap<(String, String), String>,
    }

    fn world() -> World {
        let mut pods = BTreeMap::new();
        let labels: BTreeMap<String, String> = [
            ("kueue.x-k8s.io/queue-name", "research"),
            ("team", "vision"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        pods.insert(
            ("ml".to_string(), "whole".to_string()),
            PodLabels::from_labels(&labels, DEFAULT_TEAM_LABEL),
        );
        World {
            inventory: Inventory {
                driver: Default::default(),
                gpus: (0..5).map(gpu).collect(),
            },
            ad: advertisement(),
            holders: vec![
                holder("whole", "nvidia.com/gpu", &["GPU-0"]),
                holder("mig", "nvidia.com/mig-1g.10gb", &["MIG-a"]),
                holder("ts", "nvidia.com/gpu", &["GPU-2::1"]),
                holder("v30", "nvidia.com/gpu", &["GPU-3::v0"]),
                holder("v50", "nvidia.com/gpu", &["GPU-3::v1"]),
                holder("cpu", "example.com/fpga", &["fpga-0"]),
            ],
            usage: vec![
                usage(0, 10 * GIB, Some(50)),
                usage(1, 2 * GIB, None),
                usage(2, 4 * GIB, Some(80)),
                usage(3, 12 * GIB, Some(40)),
            ],
            vgpu: vec![VgpuAccounting {
                device_ids: vec!["GPU-3::v0".into()],
                used_bytes: Some(vec![3 * GIB]),
                limits: vec![UnitLimits {
                    index: 0,
                    memory_mib: 20_480,
                    cores: 30,
                }],
            }],
            claim_holders: vec![],
            claims: vec![],
            pods,
            process_pods: BTreeMap::new(),
            pod_uids: BTreeMap::new(),
        }
    }

    fn run(w: &World, seconds: f64) -> Tick {
        tick(
            &Sample {
                node: "n1",
                inventory: &w.inventory,
                advertisement: &w.ad,
                holders: &w.holders,
                usage: &w.usage,
                vgpu: &w.vgpu,
                claim_holders: &w.claim_holders,
                claims: &w.claims,
                pods: &w.pods,
                process_pods: &w.process_pods,
                pod_uids: &w.pod_uids,
            },
            seconds,
        )
    }

    fn row<'a>(t: &'a Tick, pod: &str) -> &'a ContainerRow {
        t.containers
            .iter()
            .find(|r| r.labels.pod == pod)
            .unwrap_or_else(|| panic!("no row for {pod}: {t:#?}"))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn each_mode_gets_its_share_busy_fraction_and_memory() {
        let w = world();
        let t = run(&w, 15.0);
        // (pod, mode, share, busy, used bytes, limit bytes)
        let g = GIB as f64;
        type Case<'a> = (&'a str, &'a str, f64, f64, Option<f64>, Option<f64>);
        let cases: [Case; 5] = [
            ("whole", "whole", 1.0, 0.5, Some(10.0 * g), Some(80.0 * g)),
            // The MIG device's own GPM figure.
            (
                "mig",
                "mig",
                1.0 / 7.0,
                0.7,
                Some(2.0 * g),
                Some(9_856.0 * MIB),
            ),
            ("ts", "timeslice", 0.25, 0.8, None, None),
            // 40 % of the GPU over 0.3 + 0.5 of SM limits: each slice busy half its share.
            ("v30", "vgpu", 0.3, 0.5, Some(3.0 * g), Some(20.0 * g)),
            // No accounting read for it: limit from the advertisement, nothing used known.
            ("v50", "vgpu", 0.5, 0.5, None, Some(8.0 * g)),
        ];
        for (pod, mode, share, busy, used, limit) in cases {
            let r = row(&t, pod);
            assert_eq!(r.labels.mode, mode, "{pod}");
            assert!(close(r.allocated_share, share), "{pod}: {r:?}");
            assert!(r.busy.is_some_and(|b| close(b, busy)), "{pod}: {r:?}");
            assert_eq!(r.memory_used_bytes, used, "{pod}");
            assert_eq!(r.memory_limit_bytes, limit, "{pod}");
        }
        assert_eq!(t.containers.len(), 5, "the FPGA holder is not ours");
        let whole = row(&t, "whole");
        assert_eq!(
            (whole.labels.queue.as_str(), whole.team.as_str()),
            ("research", "vision")
        );
        assert_eq!(whole.labels.model, "A100-80GB");
        assert_eq!(row(&t, "ts").labels.queue, "", "a pod without labels");
        // Chargeback: what 15 s adds, by the ledger's arithmetic.
        let c = t.charges.iter().find(|c| c.labels.pod == "v30").unwrap();
        let add = charge_of(c.share, c.busy.unwrap_or(f64::NAN), c.seconds);
        assert!(
            close(add.allocated_seconds, 4.5) && close(add.used_seconds, 2.25),
            "{add:?}"
        );
        assert_eq!(c.labels.mode, Mode::Vgpu);
        assert_eq!(t.charges.len(), 5);
        assert!(t.skipped.is_empty(), "{:?}", t.skipped);
    }

    #[test]
    fn a_mig_device_without_gpm_is_charged_allocated_but_no_used_and_no_busy() {
        let mut w = world();
        // The driver has no GPM (a GPU before Hopper): the MIG device's figure is unknown.
        w.usage[1].mig[0].utilization_percent = None;
        // And a whole GPU whose driver reports no utilization is not measured either.
        w.usage[0].utilization_percent = None;
        let t = run(&w, 14.0);
        for pod in ["mig", "whole"] {
            assert_eq!(row(&t, pod).busy, None, "{pod}: never a made-up 0");
            let c = t.charges.iter().find(|c| c.labels.pod == pod).unwrap();
            assert_eq!(c.busy, None, "{pod}");
        }
        let c = t.charges.iter().find(|c| c.labels.pod == "mig").unwrap();
        assert!(close(c.share * c.seconds, 2.0), "{c:?}");
        // The counters: allocated grows, the used series is never created.
        let mut page = String::new();
        let mut reg = prometheus_client::registry::Registry::default();
        let m = crate::chargeback::metrics::ChargebackMetrics::register(&mut reg);
        m.charge(&c.labels, c.share, c.busy, c.seconds);
        prometheus_client::encoding::text::encode(&mut page, &reg).unwrap();
        assert!(
            page.contains("chargeback_gpu_allocated_seconds_total{"),
            "{page}"
        );
        assert!(
            !page.contains("chargeback_gpu_used_seconds_total{"),
            "{page}"
        );
        // With GPM, busy is the device's own figure, not the GPU's.
        let mut w = world();
        w.usage[1].mig[0].utilization_percent = Some(25.0);
        let t = run(&w, 14.0);
        assert_eq!(row(&t, "mig").busy, Some(0.25));
    }

    #[test]
    fn per_process_memory_goes_to_the_container_whose_pod_runs_the_process() {
        use crate::gpu::ProcessUsage;
        let proc_ = |pid, mib: u64| ProcessUsage {
            pid,
            memory_used_bytes: Some(mib * 1024 * 1024),
        };
        let mut w = world();
        // GPU 2 is time-sliced: `ts` holds a replica; a second pod `ts2` another. GPU 0
        // is `whole`'s.
        w.holders
            .push(holder("ts2", "nvidia.com/gpu", &["GPU-2::0"]));
        w.usage[2].processes = vec![
            proc_(100, 1000), // ts
            proc_(101, 500),  // ts, a second process
            proc_(200, 3000), // ts2
            proc_(300, 7000), // in no pod (a host process): nobody's
            proc_(400, 9000), // in a pod holding nothing on this GPU: nobody's
            ProcessUsage {
                pid: 102,
                memory_used_bytes: None,
            }, // ts, no figure
        ];
        w.usage[0].processes = vec![proc_(500, 6000)];
        for (pid, uid) in [
            (100, "uid-ts"),
            (101, "uid-ts"),
            (102, "uid-ts"),
            (200, "uid-ts2"),
            (400, "uid-whole"),
            (500, "uid-whole"),
        ] {
            w.process_pods.insert(pid, uid.to_string());
        }
        for (pod, uid) in [("ts", "uid-ts"), ("ts2", "uid-ts2"), ("whole", "uid-whole")] {
            w.pod_uids
                .insert(("ml".to_string(), pod.to_string()), uid.to_string());
        }
        let t = run(&w, 15.0);
        let mib = 1024.0 * 1024.0;
        assert_eq!(row(&t, "ts").memory_used_bytes, Some(1500.0 * mib));
        assert_eq!(row(&t, "ts2").memory_used_bytes, Some(3000.0 * mib));
        // A whole GPU: its pod's processes, not the GPU's used memory (10 GiB).
        assert_eq!(row(&t, "whole").memory_used_bytes, Some(6000.0 * mib));
        // vGPU containers keep the shim's accounting.
        assert_eq!(row(&t, "v30").memory_used_bytes, Some(3.0 * GIB as f64));
        // Without the pod's UID (not in the checkpoint), nothing is attributed: a replica
        // reports none rather than 0, a whole GPU its used memory.
        w.pod_uids.clear();
        let t = run(&w, 15.0);
        assert_eq!(row(&t, "ts").memory_used_bytes, None);
        assert_eq!(row(&t, "whole").memory_used_bytes, Some(10.0 * GIB as f64));
    }

    #[test]
    fn two_containers_of_one_pod_on_one_gpu_are_not_told_apart() {
        use crate::gpu::ProcessUsage;
        let mut w = world();
        let mut second = holder("ts", "nvidia.com/gpu", &["GPU-2::0"]);
        second.container = "sidecar".into();
        w.holders.push(second);
        w.usage[2].processes = vec![ProcessUsage {
            pid: 100,
            memory_used_bytes: Some(1 << 30),
        }];
        w.process_pods.insert(100, "uid-ts".into());
        w.pod_uids
            .insert(("ml".into(), "ts".into()), "uid-ts".into());
        let t = run(&w, 15.0);
        let rows: Vec<_> = t
            .containers
            .iter()
            .filter(|r| r.labels.pod == "ts")
            .collect();
        assert_eq!(rows.len(), 2);
        assert!(
            rows.iter().all(|r| r.memory_used_bytes.is_none()),
            "{rows:?}"
        );
    }

    #[test]
    fn pod_uids_join_pod_resources_with_the_checkpoint_by_device() {
        let holders = vec![
            holder("a", "nvidia.com/gpu", &["GPU-2::0"]),
            holder("b", "nvidia.com/gpu", &["GPU-2::1"]),
        ];
        let alloc = |uid: &str, id: &str| CheckpointAllocation {
            pod_uid: uid.into(),
            container: "main".into(),
            resource: "nvidia.com/gpu".into(),
            device_ids: vec![id.into()],
        };
        let got = pod_uids(
            &holders,
            &[alloc("uid-b", "GPU-2::1"), alloc("uid-x", "GPU-9")],
        );
        assert_eq!(
            got.into_iter().collect::<Vec<_>>(),
            vec![(("ml".to_string(), "b".to_string()), "uid-b".to_string())]
        );
    }

    #[test]
    fn gpus_report_memory_utilization_and_their_mode() {
        let t = run(&world(), 15.0);
        let modes: Vec<(&str, &str, Option<f64>)> = t
            .gpus
            .iter()
            .map(|g| {
                (
                    g.labels.gpu.as_str(),
                    g.labels.mode.as_str(),
                    g.utilization_ratio,
                )
            })
            .collect();
        assert_eq!(
            modes,
            [
                ("GPU-0", "whole", Some(0.5)),
                ("GPU-1", "mig", None),
                ("GPU-2", "timeslice", Some(0.8)),
                ("GPU-3", "vgpu", Some(0.4)),
                ("GPU-4", "dra", None),
            ]
        );
        assert_eq!(t.gpus[0].memory_used_bytes, 10.0 * GIB as f64);
        assert_eq!(
            t.gpus[4].memory_total_bytes,
            81_920.0 * MIB,
            "no usage read: inventory"
        );
    }

    #[test]
    fn two_devices_of_one_container_on_one_gpu_are_one_row() {
        let mut w = world();
        w.holders = vec![holder("ts2", "nvidia.com/gpu", &["GPU-2::0", "GPU-2::1"])];
        let t = run(&w, 10.0);
        assert_eq!(t.containers.len(), 1);
        assert!(close(t.containers[0].allocated_share, 0.5));
    }

    #[test]
    fn a_slot_without_limits_is_skipped_not_charged_nothing() {
        let mut w = world();
        w.ad.resources[0].devices.push(device(
            "GPU-4::s0",
            4,
            Target::Gpu,
            Share::Slot { index: 0, of: 4 },
        ));
        w.holders = vec![holder("slot", "nvidia.com/gpu", &["GPU-4::s0"])];
        let t = run(&w, 10.0);
        assert!(t.charges.is_empty());
        assert_eq!(t.skipped.len(), 1, "{:?}", t.skipped);
        w.vgpu = vec![VgpuAccounting {
            device_ids: vec!["GPU-4::s0".into()],
            used_bytes: None,
            limits: vec![UnitLimits {
                index: 0,
                memory_mib: 40_960,
                cores: 10,
            }],
        }];
        let t = run(&w, 10.0);
        let r = row(&t, "slot");
        assert!(close(r.allocated_share, 0.5), "{r:?}");
        assert_eq!(
            r.memory_used_bytes,
            Some(0.0),
            "no process yet: nothing used"
        );
    }

    fn claim_holder(pod: &str, container: &str, claim: &str, devices: &[&str]) -> ClaimHolder {
        ClaimHolder {
            namespace: "ml".into(),
            pod: pod.into(),
            container: container.into(),
            claim_namespace: "ml".into(),
            claim_name: claim.into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn claim(name: &str, devices: Vec<ClaimDevice>) -> DraClaim {
        DraClaim {
            uid: format!("claim-uid-{name}"),
            namespace: "ml".into(),
            name: name.into(),
            devices,
            ..Default::default()
        }
    }

    fn claim_device(name: &str, target: ClaimTarget, time_sliced: bool) -> ClaimDevice {
        ClaimDevice {
            name: name.into(),
            target,
            time_sliced,
        }
    }

    /// DRA claims on GPUs 4-6 (the device plugin advertises nothing there): a whole GPU,
    /// a time-sliced GPU shared by two pods, a vGPU slice; and a MIG device on GPU 1.
    fn dra_world() -> World {
        let mut w = world();
        w.holders.clear();
        w.vgpu.clear();
        w.inventory.gpus.extend([gpu(5), gpu(6)]);
        w.usage = vec![
            usage(1, 2 * GIB, None),
            usage(4, 30 * GIB, Some(60)),
            usage(5, 8 * GIB, Some(40)),
            usage(6, 9 * GIB, Some(50)),
        ];
        w.claims = vec![
            claim(
                "train",
                vec![claim_device("gpu-4", ClaimTarget::Gpu { index: 4 }, false)],
            ),
            claim(
                "shared",
                vec![claim_device("gpu-5", ClaimTarget::Gpu { index: 5 }, true)],
            ),
            DraClaim {
                units: Some(vec![ClaimUnit {
                    index: 0,
                    gpu: "GPU-6".into(),
                    memory_mib: 20_480,
                    cores: 25,
                }]),
                used_bytes: Some(vec![2 * GIB]),
                ..claim(
                    "slice",
                    vec![claim_device(
                        "gpu-6-vgpu",
                        ClaimTarget::Vgpu { index: 6 },
                        false,
                    )],
                )
            },
            claim(
                "mig",
                vec![claim_device(
                    "gpu-1-mig-1g-10gb-0",
                    ClaimTarget::Mig {
                        gpu_uuid: "GPU-1".into(),
                        profile: "1g.10gb".into(),
                        start: 0,
                    },
                    false,
                )],
            ),
        ];
        w.claim_holders = vec![
            claim_holder("trainer", "main", "train", &["gpu-4"]),
            claim_holder("ts-a", "main", "shared", &["gpu-5"]),
            claim_holder("ts-b", "main", "shared", &["gpu-5"]),
            claim_holder("infer", "main", "slice", &["gpu-6-vgpu"]),
            claim_holder("small", "main", "mig", &["gpu-1-mig-1g-10gb-0"]),
        ];
        w
    }

    #[test]
    fn dra_claims_are_charged_by_the_same_rule_as_device_plugin_devices() {
        let w = dra_world();
        let t = run(&w, 10.0);
        let g = GIB as f64;
        type Case<'a> = (&'a str, &'a str, f64, f64, Option<f64>, Option<f64>);
        let cases: [Case; 5] = [
            ("trainer", "whole", 1.0, 0.6, Some(30.0 * g), Some(80.0 * g)),
            // One time-sliced GPU, two pods: half each, the GPU's utilization each.
            ("ts-a", "timeslice", 0.5, 0.4, None, None),
            ("ts-b", "timeslice", 0.5, 0.4, None, None),
            // max(20 GiB / 80 GiB, 25 %); 50 % of the GPU over a 25 % SM limit: busy.
            ("infer", "vgpu", 0.25, 1.0, Some(2.0 * g), Some(20.0 * g)),
            // The claim's MIG device's own GPM figure.
            (
                "small",
                "mig",
                1.0 / 7.0,
                0.7,
                Some(2.0 * g),
                Some(9_856.0 * MIB),
            ),
        ];
        for (pod, mode, share, busy, used, limit) in cases {
            let r = row(&t, pod);
            assert_eq!(r.labels.mode, mode, "{pod}");
            assert!(close(r.allocated_share, share), "{pod}: {r:?}");
            assert!(r.busy.is_some_and(|b| close(b, busy)), "{pod}: {r:?}");
            assert_eq!(r.memory_used_bytes, used, "{pod}");
            assert_eq!(r.memory_limit_bytes, limit, "{pod}");
        }
        assert_eq!(row(&t, "infer").labels.gpu, "GPU-6");
        assert_eq!(t.charges.len(), 5);
        // The shared GPU is charged once in all: 10 s of one GPU.
        let shared: f64 = t
            .charges
            .iter()
            .filter(|c| c.labels.mode == Mode::Timeslice)
            .map(|c| charge_of(c.share, c.busy.unwrap_or(0.0), c.seconds).allocated_seconds)
            .sum();
        assert!(close(shared, 10.0), "{shared}");
        assert!(t.skipped.is_empty(), "{:?}", t.skipped);
        // The GPUs keep their `dra` mode label.
        let gpu6 = t.gpus.iter().find(|g| g.labels.gpu == "GPU-6").unwrap();
        assert_eq!(gpu6.labels.mode, "dra");
    }

    /// The kubelet's DRA state of [`dra_world`]'s claims: claim UID → pod UIDs.
    fn claim_pods(entries: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        entries
            .iter()
            .map(|(claim, pods)| {
                (
                    format!("claim-uid-{claim}"),
                    pods.iter().map(|p| p.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn dra_claim_containers_get_their_pods_processes_memory() {
        use crate::gpu::ProcessUsage;
        let proc_ = |pid, mib: u64| ProcessUsage {
            pid,
            memory_used_bytes: Some(mib * 1024 * 1024),
        };
        let mut w = dra_world();
        // GPU 4 is `trainer`'s whole-GPU claim; GPU 5 the time-sliced claim of `ts-a`
        // and `ts-b`; GPU 1 holds `small`'s MIG device.
        w.usage[1].processes = vec![
            proc_(100, 4000), // trainer
            proc_(101, 1000), // trainer
            proc_(300, 7000), // in no pod: nobody's
            proc_(400, 9000), // ts-a's, which holds nothing on GPU 4: nobody's
        ];
        w.usage[2].processes = vec![proc_(400, 2000), proc_(500, 3000)];
        w.usage[0].processes = vec![proc_(600, 1500)];
        for (pid, uid) in [
            (100, "uid-trainer"),
            (101, "uid-trainer"),
            (400, "uid-ts-a"),
            (500, "uid-ts-b"),
            (600, "uid-small"),
        ] {
            w.process_pods.insert(pid, uid.to_string());
        }
        // The kubelet records the shared claim with both pods; `ts-b` is known from
        // the device checkpoint (it also holds a device-plugin device), so the shared
        // claim's other UID is `ts-a`'s.
        let recorded = claim_pods(&[
            ("train", &["uid-trainer"]),
            ("shared", &["uid-ts-a", "uid-ts-b"]),
            ("mig", &["uid-small"]),
            ("slice", &["uid-infer"]),
        ]);
        w.pod_uids
            .insert(("ml".into(), "ts-b".into()), "uid-ts-b".into());
        add_claim_pod_uids(&mut w.pod_uids, &w.claim_holders, &w.claims, &recorded);
        let named = |pod: &str| {
            w.pod_uids
                .get(&("ml".to_string(), pod.to_string()))
                .cloned()
        };
        assert_eq!(named("trainer").as_deref(), Some("uid-trainer"));
        assert_eq!(named("ts-a").as_deref(), Some("uid-ts-a"));
        assert_eq!(named("infer").as_deref(), Some("uid-infer"));

        let t = run(&w, 10.0);
        let mib = 1024.0 * 1024.0;
        // A whole GPU: its pod's processes (5000 MiB), not the GPU's used 30 GiB.
        assert_eq!(row(&t, "trainer").memory_used_bytes, Some(5000.0 * mib));
        assert_eq!(row(&t, "ts-a").memory_used_bytes, Some(2000.0 * mib));
        assert_eq!(row(&t, "ts-b").memory_used_bytes, Some(3000.0 * mib));
        assert_eq!(row(&t, "small").memory_used_bytes, Some(1500.0 * mib));
        // The vGPU claim keeps the shim's accounting.
        assert_eq!(row(&t, "infer").memory_used_bytes, Some(2.0 * GIB as f64));

        // A shared claim whose pods are all unknown cannot be split by UID: neither pod
        // is named (a time-sliced hold then reports none), never a guess.
        let mut w2 = dra_world();
        add_claim_pod_uids(&mut w2.pod_uids, &w2.claim_holders, &w2.claims, &recorded);
        assert!(!w2.pod_uids.contains_key(&("ml".into(), "ts-a".into())));
        assert!(!w2.pod_uids.contains_key(&("ml".into(), "ts-b".into())));
        // Neither is a claim whose kubelet record is missing or names another pod too
        // (a pod of the claim that PodResources does not list).
        let mut w3 = dra_world();
        let odd = claim_pods(&[("train", &["uid-trainer", "uid-gone"])]);
        add_claim_pod_uids(&mut w3.pod_uids, &w3.claim_holders, &w3.claims, &odd);
        assert!(w3.pod_uids.is_empty(), "{:?}", w3.pod_uids);
    }

    #[test]
    fn a_dra_claim_shared_by_two_containers_of_one_pod_on_one_gpu_is_not_attributed() {
        use crate::gpu::ProcessUsage;
        let mut w = dra_world();
        w.claim_holders
            .push(claim_holder("trainer", "sidecar", "train", &["gpu-4"]));
        w.usage[1].processes = vec![ProcessUsage {
            pid: 100,
            memory_used_bytes: Some(GIB),
        }];
        w.process_pods.insert(100, "uid-trainer".into());
        let recorded = claim_pods(&[("train", &["uid-trainer"])]);
        add_claim_pod_uids(&mut w.pod_uids, &w.claim_holders, &w.claims, &recorded);
        assert_eq!(
            w.pod_uids.get(&("ml".to_string(), "trainer".to_string())),
            Some(&"uid-trainer".to_string()),
            "one pod, one UID"
        );
        let t = run(&w, 10.0);
        let rows: Vec<_> = t
            .containers
            .iter()
            .filter(|r| r.labels.pod == "trainer")
            .collect();
        assert_eq!(rows.len(), 2);
        // Neither container is given the process: both keep the GPU's used memory.
        assert!(
            rows.iter()
                .all(|r| r.memory_used_bytes == Some(30.0 * GIB as f64)),
            "{rows:?}"
        );
    }

    #[test]
    fn a_dra_claim_that_cannot_be_charged_is_skipped_with_the_reason() {
        let mut w = dra_world();
        // The vGPU claim's units record is gone; a container names a claim this node's
        // driver did not prepare; a device gone from the inventory.
        w.claims[2].units = None;
        w.claim_holders
            .push(claim_holder("stranger", "main", "elsewhere", &["gpu-0"]));
        w.claims[0].devices[0].target = ClaimTarget::Gpu { index: 9 };
        let t = run(&w, 10.0);
        for pod in ["infer", "stranger", "trainer"] {
            assert!(
                t.containers.iter().all(|r| r.labels.pod != pod),
                "{pod} charged: {t:#?}"
            );
        }
        assert_eq!(t.skipped.len(), 3, "{:?}", t.skipped);
        assert!(t.skipped.iter().any(|s| s.contains("units record")));
        assert!(t.skipped.iter().any(|s| s.contains("not prepared")));
        assert!(t.skipped.iter().any(|s| s.contains("GPU 9")));
        assert_eq!(t.charges.len(), 3, "the others are still charged");
    }

    #[test]
    fn a_container_gone_is_forgotten_only_after_the_delay() {
        let w = world();
        let mut seen = Seen::default();
        let t = run(&w, 15.0);
        let labels: Vec<ChargeLabels> = t.charges.iter().map(|c| c.labels.clone()).collect();
        seen.observe(&labels, Duration::from_secs(0));
        // The "whole" pod goes away; the others are charged again.
        seen.observe(
            labels.iter().filter(|l| l.pod != "whole"),
            Duration::from_secs(60),
        );
        assert!(seen
            .expired(Duration::from_secs(100), Duration::from_secs(120))
            .is_empty());
        let gone = seen.expired(Duration::from_secs(121), Duration::from_secs(120));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].pod, "whole");
        assert_eq!(seen.len(), 4);
        let before: BTreeSet<u32> = [1, 2, 3].into();
        assert_eq!(vanished(&before, &[2].into()), [1, 3]);
    }

    #[test]
    fn a_failing_pod_resources_socket_is_logged_once_per_streak() {
        let mut s = Streak::default();
        assert!(!s.ok(), "no streak to end");
        assert!(s.fail());
        assert!(!s.fail());
        assert!(!s.fail());
        assert!(s.ok());
        assert!(s.fail(), "a new streak");
    }
}
