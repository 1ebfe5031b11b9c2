//! From inventory + config to what the node advertises. Pure: no I/O, no gRPC.
//!
//! Two steps, because MIG layouts must be applied to the hardware in between:
//! 1. [`plan`] decides each GPU's mode and, for MIG, the exact placements to create;
//! 2. [`advertise`] turns the (post-MIG) inventory and the plan into resources and
//!    devices with stable IDs.

use std::collections::BTreeMap;

use serde::Serialize;

use super::catalog;
use super::config::{GpuMode, MigLayout, MigStrategy, NodeConfig, ReplicaDevices, VgpuSlice};
use crate::gpu::{GpuInfo, Inventory, MigDeviceInfo};

/// Why a config cannot be applied to this node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("GPU {index} ({product}): {reason}")]
    Gpu {
        index: u32,
        product: String,
        reason: String,
    },
    #[error("resource {resource}: {reason}")]
    Resource { resource: String, reason: String },
}

pub type Result<T, E = LayoutError> = std::result::Result<T, E>;

/// The mode decided for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "mode")]
pub enum GpuPlan {
    Whole {
        replicas: Option<Replication>,
    },
    /// The MIG devices to have: profile + start slot each. `None`: keep what exists.
    Mig {
        layout: Option<Vec<(String, u8)>>,
    },
    Vgpu {
        resource: String,
        slices: Vec<PlannedSlice>,
    },
    /// Free-form vGPUs: `split` slots of `resource`, sized per pod by the scheduler.
    VgpuSplit {
        resource: String,
        split: u32,
    },
}

/// Replicas of whole GPUs or MIG devices (time-slicing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replication {
    pub replicas: u32,
    /// The resource the replicas are advertised as.
    pub resource: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedSlice {
    pub memory_mib: u64,
    pub cores: u32,
}

impl From<VgpuSlice> for PlannedSlice {
    fn from(s: VgpuSlice) -> Self {
        Self {
            memory_mib: s.memory_mib,
            cores: s.cores,
        }
    }
}

/// Plan for every GPU of the node, keyed by GPU UUID.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NodePlan {
    pub gpus: BTreeMap<String, GpuPlan>,
}

impl NodePlan {
    /// MIG layouts to apply before advertising: GPU UUID → placements.
    pub fn mig_layouts(&self) -> impl Iterator<Item = (&str, &[(String, u8)])> {
        self.gpus.iter().filter_map(|(uuid, p)| match p {
            GpuPlan::Mig {
                layout: Some(layout),
            } => Some((uuid.as_str(), layout.as_slice())),
            _ => None,
        })
    }
}

/// What a device hands the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Target {
    Gpu,
    Mig {
        uuid: String,
        profile: String,
        /// Minor number of the parent GPU (`gpu<minor>` in the MIG capability table).
        gpu_minor: u32,
        gi_id: u32,
        ci_id: u32,
    },
}

/// How the device shares its target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "share")]
pub enum Share {
    Exclusive,
    Replica {
        index: u32,
        of: u32,
    },
    Vgpu {
        index: u32,
        memory_mib: u64,
        cores: u32,
    },
    /// A slot of a split-mode GPU: one of the `of` vGPUs it may hold, sized per pod by
    /// the scheduler extender (the pod's assignment), not by the layout.
    Slot {
        index: u32,
        of: u32,
    },
}

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Stable ID (≤ 63 chars): the GPU or MIG UUID, plus `::<n>` for replicas,
    /// `::v<n>` for vGPU slices and `::s<n>` for the slots of a split-mode GPU.
    pub id: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub numa_node: Option<u32>,
    pub target: Target,
    pub share: Share,
}

impl Device {
    /// The UUID the container runtime exposes (`NVIDIA_VISIBLE_DEVICES`).
    pub fn visible_uuid(&self) -> &str {
        match &self.target {
            Target::Gpu => &self.gpu_uuid,
            Target::Mig { uuid, .. } => uuid,
        }
    }

    /// The physical unit whose replicas/slices compete (GPU or MIG device UUID).
    pub fn unit(&self) -> &str {
        self.visible_uuid()
    }
}

/// One extended resource and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    pub name: String,
    /// NVIDIA's `failRequestsGreaterThanOne`: a request for more than one replica fails.
    pub fail_requests_greater_than_one: bool,
    pub devices: Vec<Device>,
}

/// Everything the node advertises, resources sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Advertisement {
    pub resources: Vec<Resource>,
}

impl Advertisement {
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }
}

/// Step 1: decide each GPU's mode. Validates MIG layouts against the catalog and vGPU
/// slices against the GPU's memory.
pub fn plan(inventory: &Inventory, config: &NodeConfig) -> Result<NodePlan> {
    let mut out = NodePlan::default();
    for gpu in &inventory.gpus {
        let mode = config
            .gpu_rules
            .iter()
            .find(|r| r.selector.matches(gpu))
            .map(|r| &r.mode);
        let plan = match mode {
            Some(GpuMode::Whole) => GpuPlan::Whole {
                replicas: nvidia_replication(config, gpu, &config.gpu_resource(&gpu.product_name)),
            },
            Some(GpuMode::Mig(layout)) => plan_mig(gpu, layout)?,
            Some(GpuMode::TimeSlice { replicas, rename }) => GpuPlan::Whole {
                replicas: Some(Replication {
                    replicas: *replicas,
                    resource: rename
                        .clone()
                        .unwrap_or_else(|| config.gpu_resource(&gpu.product_name)),
                }),
            },
            Some(GpuMode::Vgpu { resource, slices }) => plan_vgpu(config, gpu, resource, slices)?,
            Some(GpuMode::VgpuSplit { resource, split }) => GpuPlan::VgpuSplit {
                resource: resource.clone().unwrap_or_else(|| config.resource("gpu")),
                split: *split,
            },
            None if gpu.mig_enabled && config.mig_strategy != MigStrategy::None => {
                GpuPlan::Mig { layout: None }
            }
            None => GpuPlan::Whole {
                replicas: nvidia_replication(config, gpu, &config.gpu_resource(&gpu.product_name)),
            },
        };
        out.gpus.insert(gpu.uuid.clone(), plan);
    }
    Ok(out)
}

/// The resource name a GPU's plan advertises whole GPUs, replicas or single-strategy MIG
/// devices under (`None`: MIG devices under their profiles' names, or vGPU slices).
fn unit_resource(config: &NodeConfig, gpu: &GpuInfo, plan: &GpuPlan) -> Option<String> {
    match plan {
        GpuPlan::Whole { replicas: Some(r) } => Some(r.resource.clone()),
        GpuPlan::Whole { replicas: None } => Some(config.gpu_resource(&gpu.product_name)),
        GpuPlan::Mig { .. } if config.mig_strategy == MigStrategy::Single => {
            Some(config.resource("gpu"))
        }
        GpuPlan::Mig { .. } => None,
        GpuPlan::Vgpu { resource, .. } => Some(resource.clone()),
        GpuPlan::VgpuSplit { .. } => None,
    }
}

/// The config field that decides a GPU's mode: its rule, or the default.
fn rule_field(config: &NodeConfig, gpu: &GpuInfo) -> String {
    match config
        .gpu_rules
        .iter()
        .position(|r| r.selector.matches(gpu))
    {
        Some(i) => format!("tessera.gpus[{i}]"),
        None => "no tessera.gpus rule: whole".to_string(),
    }
}

/// Refuse a layout that gives one resource name two meanings: the slots of split-mode
/// GPUs (sized per pod by the scheduler) under the name of whole GPUs, replicas or
/// fixed slices of other GPUs (e.g. `nvidia.com/gpu`). The error names both rules and
/// the fields that rename either side. Only the GPUs of `plan` count: pass the device
/// plugin's part (a DRA GPU's "whole" mode advertises no extended resource).
/// [`advertise`] checks this first; the agent calls it before changing anything.
pub fn check_split_names(
    inventory: &Inventory,
    config: &NodeConfig,
    plan: &NodePlan,
) -> Result<()> {
    let planned = || {
        inventory
            .gpus
            .iter()
            .filter_map(|g| plan.gpus.get(&g.uuid).map(|p| (g, p)))
    };
    for (split_gpu, split_plan) in planned() {
        let GpuPlan::VgpuSplit { resource, .. } = split_plan else {
            continue;
        };
        let clash = planned()
            .find(|(g, p)| unit_resource(config, g, p).as_deref() == Some(resource.as_str()));
        if let Some((other, _)) = clash {
            return Err(LayoutError::Resource {
                resource: resource.clone(),
                reason: format!(
                    "would mean two things: vGPU slots of GPU {} ({}, vgpu split) and \
                     other devices of GPU {} ({}); set {}.vgpu.resource to another name, or \
                     advertise the other GPUs under another name (resources.gpus, \
                     timeslice.rename, vgpu.resource)",
                    split_gpu.index,
                    rule_field(config, split_gpu),
                    other.index,
                    rule_field(config, other),
                    rule_field(config, split_gpu),
                ),
            });
        }
    }
    Ok(())
}

fn gpu_err(gpu: &GpuInfo, reason: impl Into<String>) -> LayoutError {
    LayoutError::Gpu {
        index: gpu.index,
        product: gpu.product_name.clone(),
        reason: reason.into(),
    }
}

fn plan_mig(gpu: &GpuInfo, layout: &MigLayout) -> Result<GpuPlan> {
    if !gpu.mig_capable {
        return Err(gpu_err(gpu, "does not support MIG"));
    }
    let model = catalog::lookup(&gpu.product_name, gpu.memory_mib)
        .ok_or_else(|| gpu_err(gpu, "has no MIG profile table in Tessera's catalog"))?;
    let profiles: Vec<String> = match layout {
        MigLayout::Named(name) => model
            .named_layout(name)
            .map_err(|e| gpu_err(gpu, e.to_string()))?
            .into_iter()
            .map(str::to_string)
            .collect(),
        MigLayout::Profiles(p) => p.clone(),
    };
    let refs: Vec<&str> = profiles.iter().map(String::as_str).collect();
    let placements = model
        .place(&refs)
        .map_err(|e| gpu_err(gpu, e.to_string()))?;
    Ok(GpuPlan::Mig {
        layout: Some(
            placements
                .into_iter()
                .map(|p| (p.profile.name.to_string(), p.start))
                .collect(),
        ),
    })
}

fn plan_vgpu(
    config: &NodeConfig,
    gpu: &GpuInfo,
    resource: &Option<String>,
    slices: &[VgpuSlice],
) -> Result<GpuPlan> {
    let memory: u64 = slices.iter().map(|s| s.memory_mib).sum();
    if memory > gpu.memory_mib {
        return Err(gpu_err(
            gpu,
            format!(
                "vGPU slices need {memory} MiB but the GPU has {} MiB",
                gpu.memory_mib
            ),
        ));
    }
    let cores: u32 = slices.iter().map(|s| s.cores).sum();
    if cores > 100 {
        return Err(gpu_err(
            gpu,
            format!("vGPU slices take {cores}% of the SMs; at most 100% fit"),
        ));
    }
    Ok(GpuPlan::Vgpu {
        resource: resource.clone().unwrap_or_else(|| config.resource("vgpu")),
        slices: slices.iter().copied().map(PlannedSlice::from).collect(),
    })
}

/// NVIDIA `sharing.timeSlicing` for a unit (whole GPU or MIG device) of `resource`.
fn nvidia_replication(config: &NodeConfig, gpu: &GpuInfo, resource: &str) -> Option<Replication> {
    replication_for(config, resource, |devices| match devices {
        ReplicaDevices::All => true,
        ReplicaDevices::Count(n) => gpu.index < *n,
        ReplicaDevices::List(refs) => refs
            .iter()
            .any(|r| *r == gpu.index.to_string() || *r == gpu.uuid),
    })
}

fn replication_for(
    config: &NodeConfig,
    resource: &str,
    matches: impl Fn(&ReplicaDevices) -> bool,
) -> Option<Replication> {
    let ts = &config.time_slicing;
    let rule = ts
        .resources
        .iter()
        .find(|r| r.name == resource && matches(&r.devices))?;
    let renamed = match (&rule.rename, ts.rename_by_default) {
        (Some(name), _) => name.clone(),
        (None, true) => format!("{resource}.shared"),
        (None, false) => resource.to_string(),
    };
    Some(Replication {
        replicas: rule.replicas,
        resource: renamed,
    })
}

/// Step 2: build the advertisement from the inventory (with MIG layouts applied) and the
/// plan. Refuses configs that would put two kinds of device under one resource name.
pub fn advertise(
    inventory: &Inventory,
    config: &NodeConfig,
    plan: &NodePlan,
) -> Result<Advertisement> {
    check_split_names(inventory, config, plan)?;
    let mut builder = Builder::default();
    for gpu in &inventory.gpus {
        let Some(gpu_plan) = plan.gpus.get(&gpu.uuid) else {
            continue;
        };
        match gpu_plan {
            GpuPlan::Whole { replicas } => {
                let base = builder.device(gpu, Target::Gpu, gpu.uuid.clone());
                let resource = config.gpu_resource(&gpu.product_name);
                builder.push_unit(config, &resource, base, replicas.as_ref())?;
            }
            GpuPlan::Mig { .. } => {
                if !gpu.mig_enabled || gpu.mig_devices.is_empty() {
                    // MIG on but no devices yet (or MIG off): nothing to advertise for it.
                    continue;
                }
                check_single_strategy(config, gpu)?;
                for (ordinal, mig) in gpu.mig_devices.iter().enumerate() {
                    let resource = match config.mig_strategy {
                        MigStrategy::Single => config.resource("gpu"),
                        _ => config.mig_resource(&mig.profile),
                    };
                    let replicas = mig_replication(config, gpu, mig, ordinal, &resource);
                    let base = builder.device(gpu, mig_target(gpu, mig), mig.uuid.clone());
                    builder.push_unit(config, &resource, base, replicas.as_ref())?;
                }
            }
            GpuPlan::Vgpu { resource, slices } => {
                for (i, s) in slices.iter().enumerate() {
                    let mut d = builder.device(gpu, Target::Gpu, format!("{}::v{i}", gpu.uuid));
                    d.share = Share::Vgpu {
                        index: i as u32,
                        memory_mib: s.memory_mib,
                        cores: s.cores,
                    };
                    builder.push(resource, d, Kind::Vgpu, false)?;
                }
            }
            GpuPlan::VgpuSplit { resource, split } => {
                for i in 0..*split {
                    let mut d = builder.device(gpu, Target::Gpu, format!("{}::s{i}", gpu.uuid));
                    d.share = Share::Slot {
                        index: i,
                        of: *split,
                    };
                    builder.push(resource, d, Kind::Slot, false)?;
                }
            }
        }
    }
    Ok(builder.finish())
}

fn mig_target(gpu: &GpuInfo, mig: &MigDeviceInfo) -> Target {
    Target::Mig {
        uuid: mig.uuid.clone(),
        profile: mig.profile.clone(),
        gpu_minor: gpu.minor,
        gi_id: mig.gi_id,
        ci_id: mig.ci_id,
    }
}

fn mig_replication(
    config: &NodeConfig,
    gpu: &GpuInfo,
    mig: &MigDeviceInfo,
    ordinal: usize,
    resource: &str,
) -> Option<Replication> {
    let mig_index = format!("{}:{ordinal}", gpu.index);
    replication_for(config, resource, |devices| match devices {
        ReplicaDevices::All => true,
        ReplicaDevices::Count(n) => (ordinal as u32) < *n,
        ReplicaDevices::List(refs) => refs.iter().any(|r| *r == mig_index || *r == mig.uuid),
    })
}

fn check_single_strategy(config: &NodeConfig, gpu: &GpuInfo) -> Result<()> {
    if config.mig_strategy != MigStrategy::Single {
        return Ok(());
    }
    let first = &gpu.mig_devices[0].profile;
    match gpu.mig_devices.iter().find(|m| &m.profile != first) {
        Some(other) => Err(gpu_err(
            gpu,
            format!(
                "migStrategy single needs one MIG profile per GPU, found {first} and {}",
                other.profile
            ),
        )),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Whole,
    Mig,
    Replica,
    Vgpu,
    Slot,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Whole => "whole GPUs",
            Kind::Mig => "MIG devices",
            Kind::Replica => "time-sliced replicas",
            Kind::Vgpu => "vGPU slices",
            Kind::Slot => "vGPU slots (vgpu split)",
        }
    }
}

#[derive(Default)]
struct Builder {
    resources: BTreeMap<String, (Kind, Resource)>,
}

impl Builder {
    fn device(&self, gpu: &GpuInfo, target: Target, id: String) -> Device {
        Device {
            id,
            gpu_uuid: gpu.uuid.clone(),
            gpu_index: gpu.index,
            numa_node: gpu.numa_node,
            target,
            share: Share::Exclusive,
        }
    }

    /// A whole GPU or MIG device, replicated or not.
    fn push_unit(
        &mut self,
        config: &NodeConfig,
        resource: &str,
        base: Device,
        replicas: Option<&Replication>,
    ) -> Result<()> {
        let exclusive_kind = match base.target {
            Target::Gpu => Kind::Whole,
            Target::Mig { .. } => Kind::Mig,
        };
        match replicas {
            None => self.push(resource, base, exclusive_kind, false),
            Some(rep) => {
                let fail_gt1 = config.time_slicing.fail_requests_greater_than_one;
                for r in 0..rep.replicas {
                    let mut d = base.clone();
                    d.id = format!("{}::{r}", base.id);
                    d.share = Share::Replica {
                        index: r,
                        of: rep.replicas,
                    };
                    self.push(&rep.resource, d, Kind::Replica, fail_gt1)?;
                }
                Ok(())
            }
        }
    }

    fn push(&mut self, resource: &str, device: Device, kind: Kind, fail_gt1: bool) -> Result<()> {
        if device.id.len() > 63 {
            return Err(LayoutError::Resource {
                resource: resource.to_string(),
                reason: format!("device ID {:?} is longer than 63 characters", device.id),
            });
        }
        let (existing_kind, res) = self.resources.entry(resource.to_string()).or_insert((
            kind,
            Resource {
                name: resource.to_string(),
                fail_requests_greater_than_one: fail_gt1,
                devices: Vec::new(),
            },
        ));
        let compatible = *existing_kind == kind
            || matches!(
                (*existing_kind, kind),
                (Kind::Whole, Kind::Mig) | (Kind::Mig, Kind::Whole)
            );
        if !compatible {
            return Err(LayoutError::Resource {
                resource: resource.to_string(),
                reason: format!(
                    "would mix {} and {} (GPU {}); rename one of them",
                    existing_kind.describe(),
                    kind.describe(),
                    device.gpu_index
                ),
            });
        }
        res.devices.push(device);
        Ok(())
    }

    fn finish(self) -> Advertisement {
        Advertisement {
            resources: self.resources.into_values().map(|(_, r)| r).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;
    use crate::partition::config::parse_config;

    fn build(spec: &str, yaml: &str) -> Result<Advertisement> {
        let inventory = FakeBackend::from_spec(spec)
            .expect("fake spec")
            .inventory()
            .expect("inventory");
        let config = parse_config("t", yaml).expect("valid config");
        let plan = plan(&inventory, &config)?;
        advertise(&inventory, &config, &plan)
    }

    #[test]
    fn split_gpus_are_advertised_as_gpu_slots_naming_their_gpu() {
        let ad = build(
            "2xA100-80GB",
            "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4 } } ] }",
        )
        .expect("builds");
        assert_eq!(ad.resources.len(), 1);
        let gpu = ad
            .resource("nvidia.com/gpu")
            .expect("slots under nvidia.com/gpu");
        assert_eq!(gpu.devices.len(), 8);
        for (n, d) in gpu.devices.iter().enumerate() {
            let i = (n % 4) as u32;
            assert_eq!(d.id, format!("{}::s{i}", d.gpu_uuid));
            assert_eq!(d.share, Share::Slot { index: i, of: 4 });
            assert_eq!(d.target, Target::Gpu);
            assert_eq!(d.gpu_index, (n / 4) as u32);
        }
    }

    #[test]
    fn one_resource_name_with_two_meanings_is_refused() {
        let split0 = "{ match: { index: [0] }, mode: vgpu, vgpu: { split: 4 } }";
        let cases: &[(&str, &[&str])] = &[
            (
                &format!("tessera: {{ gpus: [ {split0} ] }}"),
                &["nvidia.com/gpu", "GPU 0 (tessera.gpus[0], vgpu split)", "GPU 1 (no tessera.gpus rule: whole)", "set tessera.gpus[0].vgpu.resource"],
            ),
            (
                &format!("tessera: {{ gpus: [ {split0}, {{ match: all, mode: whole }} ] }}"),
                &["GPU 1 (tessera.gpus[1])"],
            ),
            (
                &format!("tessera: {{ gpus: [ {split0}, {{ match: all, mode: timeslice, timeslice: {{ replicas: 2 }} }} ] }}"),
                &["GPU 1 (tessera.gpus[1])"],
            ),
            (
                &format!("sharing: {{ timeSlicing: {{ resources: [ {{ name: nvidia.com/gpu, replicas: 2 }} ] }} }}\ntessera: {{ gpus: [ {split0} ] }}"),
                &["GPU 1 (no tessera.gpus rule: whole)"],
            ),
            (
                &format!("tessera: {{ gpus: [ {split0}, {{ match: all, mode: vgpu, vgpu: {{ count: 2, memory: 10g, cores: 50, resource: nvidia.com/gpu }} }} ] }}"),
                &["GPU 1 (tessera.gpus[1])"],
            ),
        ];
        for (yaml, wanted) in cases {
            let e = build("2xA100-80GB", yaml).expect_err(yaml);
            let text = e.to_string();
            assert!(
                text.starts_with("resource nvidia.com/gpu: would mean two things"),
                "{text}"
            );
            for w in *wanted {
                assert!(text.contains(w), "{yaml}: {text} lacks {w}");
            }
        }
    }

    #[test]
    fn only_the_gpus_of_the_plan_count_for_the_names() {
        // GPU 0 whole (no rule), GPU 1 split: a clash when both are the device plugin's,
        // none when GPU 0 is the DRA driver's (left out of the device plugin's plan).
        let inventory = FakeBackend::from_spec("2xA100-80GB")
            .expect("fake spec")
            .inventory()
            .expect("inventory");
        let config = parse_config(
            "t",
            "tessera: { gpus: [ { match: { index: [1] }, mode: vgpu, vgpu: { split: 4 } } ] }",
        )
        .expect("valid config");
        let mut plan = plan(&inventory, &config).expect("plans");
        assert!(check_split_names(&inventory, &config, &plan).is_err());
        plan.gpus.remove(&inventory.gpus[0].uuid);
        assert_eq!(check_split_names(&inventory, &config, &plan), Ok(()));
        let ad = advertise(&inventory, &config, &plan).expect("advertises");
        assert_eq!(
            ad.resource("nvidia.com/gpu").map(|r| r.devices.len()),
            Some(4)
        );
    }

    #[test]
    fn split_slots_beside_other_gpus_under_another_name_are_allowed() {
        let split0 = "{ match: { index: [0] }, mode: vgpu, vgpu: { split: 4 } }";
        let cases: &[(String, &[(&str, usize)])] = &[
            (
                format!("resources: {{ gpus: [ {{ pattern: \"*\", name: whole-gpu }} ] }}\ntessera: {{ gpus: [ {split0} ] }}"),
                &[("nvidia.com/gpu", 4), ("nvidia.com/whole-gpu", 1)],
            ),
            (
                "tessera: { gpus: [ { match: { index: [0] }, mode: vgpu, vgpu: { split: 4, resource: nvidia.com/vgpu-slot } } ] }".to_string(),
                &[("nvidia.com/gpu", 1), ("nvidia.com/vgpu-slot", 4)],
            ),
            (
                format!("tessera: {{ gpus: [ {split0}, {{ match: all, mode: timeslice, timeslice: {{ replicas: 2, rename: nvidia.com/gpu.shared }} }} ] }}"),
                &[("nvidia.com/gpu", 4), ("nvidia.com/gpu.shared", 2)],
            ),
            (
                format!("tessera: {{ gpus: [ {split0}, {{ match: all, mode: vgpu, vgpu: {{ split: 2 }} }} ] }}"),
                &[("nvidia.com/gpu", 6)],
            ),
        ];
        for (yaml, want) in cases {
            let ad = build("2xA100-80GB", yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            let got: Vec<(&str, usize)> = ad
                .resources
                .iter()
                .map(|r| (r.name.as_str(), r.devices.len()))
                .collect();
            assert_eq!(&got, want, "{yaml}");
        }
    }
}
