//! ResourceSlices (`resource.k8s.io/v1`) for this node's GPUs. Pure: inventory + plan in,
//! API objects out; the publisher (later) only writes them.
//!
//! - Whole GPUs: a device `gpu-<index>` with attributes `type`, `uuid`, `productName`,
//!   `architecture`, `cudaComputeCapability` and `driverVersion` (version-typed),
//!   `resource.kubernetes.io/pciBusID`, `numaNode`, and capacity `memory`/`multiprocessors`.
//! - GPUs in MIG mode are *partitionable*: a counter set `gpu-<index>-counters` holds the
//!   GPU's memory, SMs and one counter per memory slot; the whole GPU consumes everything
//!   and each possible MIG placement (`gpu-0-mig-1g-10gb-3`: profile and start slot)
//!   consumes its slots, SMs and memory, so the scheduler can never hand out overlapping
//!   instances or a whole GPU under a MIG device. Kubernetes 1.35+ wants counter sets in
//!   slices of their own ([`CounterLayout::Separate`]); 1.34 takes them beside the devices
//!   ([`CounterLayout::Inline`]).
//! - GPUs in vGPU mode are one device with `allowMultipleAllocations` and consumable
//!   capacity `memory` and `cores`, each with a default and a valid range.
//!
//! At most 128 devices per slice, 64 when any consumes counters.
//!
//! Health ([`apply_taints`]): devices of an unhealthy GPU carry its taints
//! (`gpu.tessera.io/xid`, `gpu.tessera.io/ecc`, see [`super::health`]) when the cluster
//! has DRADeviceTaints on; when the API server drops them, the same devices are withheld
//! from the slices instead.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::health::TaintMode;
use super::names::{device_gpu, mig_name, vgpu_name, whole_name, DRIVER};
use crate::gpu::{GpuInfo, Inventory};
use crate::partition::catalog;
use crate::partition::layout::{GpuPlan, NodePlan};

/// Device limits per slice (API validation).
pub const MAX_DEVICES: usize = 128;
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;

/// Where counter sets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterLayout {
    /// Kubernetes 1.34: `sharedCounters` in the same slice as the devices consuming them.
    Inline,
    /// Kubernetes 1.35+: counter sets in slices without devices.
    Separate,
}

/// What the slices need besides the hardware.
#[derive(Debug, Clone)]
pub struct SliceOptions {
    pub node_name: String,
    pub generation: i64,
    pub counters: CounterLayout,
    /// Default and minimum vGPU memory per allocation, MiB.
    pub vgpu_min_memory_mib: u64,
    /// Default SM share per vGPU allocation, percent.
    pub vgpu_default_cores: u32,
}

impl SliceOptions {
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            generation: 1,
            counters: CounterLayout::Separate,
            vgpu_min_memory_mib: 1024,
            vgpu_default_cores: 10,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("GPU {index}: {reason}")]
    Gpu { index: u32, reason: String },
}

fn q(v: impl ToString) -> Quantity {
    Quantity(v.to_string())
}

fn mib(v: u64) -> Quantity {
    Quantity(format!("{v}Mi"))
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn version(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(semver(s)),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

/// `12.8` → `12.8.0`, `570.124.06` → `570.124.6` (semver forbids leading zeros).
fn semver(s: &str) -> String {
    let mut parts: Vec<String> = s
        .split('.')
        .map(|p| p.trim_start_matches('0'))
        .map(|p| {
            if p.is_empty() {
                "0".to_string()
            } else {
                p.to_string()
            }
        })
        .take(3)
        .collect();
    while parts.len() < 3 {
        parts.push("0".into());
    }
    parts.join(".")
}

fn gpu_attributes(gpu: &GpuInfo, driver_version: &str) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("type".into(), string("gpu"));
    a.insert("uuid".into(), string(&gpu.uuid));
    a.insert("index".into(), int(i64::from(gpu.index)));
    a.insert("productName".into(), string(&gpu.product_name));
    a.insert("architecture".into(), string(&gpu.architecture));
    let (maj, min) = gpu.compute_capability;
    a.insert(
        "cudaComputeCapability".into(),
        version(&format!("{maj}.{min}")),
    );
    a.insert("driverVersion".into(), version(driver_version));
    a.insert(
        "resource.kubernetes.io/pciBusID".into(),
        string(gpu.pci_bus_id.to_ascii_lowercase()),
    );
    if let Some(n) = gpu.numa_node {
        a.insert("numaNode".into(), int(i64::from(n)));
    }
    a
}

fn capacity(entries: &[(&str, Quantity)]) -> BTreeMap<String, DeviceCapacity> {
    entries
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                DeviceCapacity {
                    value: v.clone(),
                    request_policy: None,
                },
            )
        })
        .collect()
}

/// One GPU's devices and, for MIG mode, its counter set.
struct GpuDevices {
    devices: Vec<Device>,
    counters: Option<CounterSet>,
}

fn whole_device(gpu: &GpuInfo, driver_version: &str) -> Device {
    Device {
        name: whole_name(gpu.index),
        attributes: Some(gpu_attributes(gpu, driver_version)),
        capacity: Some(capacity(&[
            ("memory", mib(gpu.memory_mib)),
            ("multiprocessors", q(gpu.sm_count)),
        ])),
        ..Default::default()
    }
}

fn mig_devices(gpu: &GpuInfo, driver_version: &str) -> Result<GpuDevices, SliceError> {
    let model = catalog::lookup(&gpu.product_name, gpu.memory_mib).ok_or(SliceError::Gpu {
        index: gpu.index,
        reason: format!("{} has no MIG profile table", gpu.product_name),
    })?;
    let set = format!("gpu-{}-counters", gpu.index);
    let slot = |i: u8| format!("memory-slice-{i}");
    let mut total = BTreeMap::new();
    total.insert(
        "memory".to_string(),
        Counter {
            value: mib(gpu.memory_mib),
        },
    );
    total.insert(
        "multiprocessors".to_string(),
        Counter {
            value: q(gpu.sm_count),
        },
    );
    for i in 0..model.total_slots {
        total.insert(slot(i), Counter { value: q(1) });
    }
    let mut whole = whole_device(gpu, driver_version);
    whole.consumes_counters = Some(vec![DeviceCounterConsumption {
        counter_set: set.clone(),
        counters: total.clone(),
    }]);
    let mut devices = vec![whole];
    for p in model.profiles {
        for &start in p.placements {
            let mut consumed = BTreeMap::new();
            consumed.insert(
                "memory".to_string(),
                Counter {
                    value: mib(p.memory_mib),
                },
            );
            consumed.insert(
                "multiprocessors".to_string(),
                Counter {
                    value: q(p.sm_count),
                },
            );
            for s in start..start + p.size {
                consumed.insert(slot(s), Counter { value: q(1) });
            }
            let mut attrs = gpu_attributes(gpu, driver_version);
            attrs.insert("type".into(), string("mig"));
            attrs.insert("profile".into(), string(p.name));
            attrs.insert("parentUUID".into(), string(&gpu.uuid));
            attrs.insert("placementStart".into(), int(i64::from(start)));
            attrs.remove("uuid");
            devices.push(Device {
                name: mig_name(gpu.index, p.name, start),
                attributes: Some(attrs),
                capacity: Some(capacity(&[
                    ("memory", mib(p.memory_mib)),
                    ("multiprocessors", q(p.sm_count)),
                ])),
                consumes_counters: Some(vec![DeviceCounterConsumption {
                    counter_set: set.clone(),
                    counters: consumed,
                }]),
                ..Default::default()
            });
        }
    }
    Ok(GpuDevices {
        devices,
        counters: Some(CounterSet {
            name: set,
            counters: total,
        }),
    })
}

fn vgpu_device(gpu: &GpuInfo, driver_version: &str, opts: &SliceOptions) -> Device {
    let mut attrs = gpu_attributes(gpu, driver_version);
    attrs.insert("type".into(), string("vgpu"));
    let min_mem = opts.vgpu_min_memory_mib.min(gpu.memory_mib);
    let mut cap = BTreeMap::new();
    cap.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: mib(gpu.memory_mib),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(mib(min_mem)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: mib(min_mem),
                    max: None,
                    step: None,
                }),
                valid_values: None,
            }),
        },
    );
    cap.insert(
        "cores".to_string(),
        DeviceCapacity {
            value: q(100),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q(opts.vgpu_default_cores.clamp(1, 100))),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q(1),
                    max: Some(q(100)),
                    step: Some(q(1)),
                }),
                valid_values: None,
            }),
        },
    );
    Device {
        name: vgpu_name(gpu.index),
        attributes: Some(attrs),
        capacity: Some(cap),
        allow_multiple_allocations: Some(true),
        ..Default::default()
    }
}

/// All ResourceSlices of this node's pool.
pub fn build_slices(
    inventory: &Inventory,
    plan: &NodePlan,
    opts: &SliceOptions,
) -> Result<Vec<ResourceSlice>, SliceError> {
    let driver_version = &inventory.driver.driver_version;
    let mut plain: Vec<Device> = Vec::new();
    let mut partitioned: Vec<GpuDevices> = Vec::new();
    for gpu in &inventory.gpus {
        match plan.gpus.get(&gpu.uuid) {
            Some(GpuPlan::Mig { .. }) => partitioned.push(mig_devices(gpu, driver_version)?),
            Some(GpuPlan::Vgpu { .. } | GpuPlan::VgpuSplit { .. }) => {
                plain.push(vgpu_device(gpu, driver_version, opts))
            }
            Some(GpuPlan::Whole { .. }) | None => plain.push(whole_device(gpu, driver_version)),
        }
    }

    // Slice contents: (devices, counter sets).
    let mut contents: Vec<(Vec<Device>, Vec<CounterSet>)> = Vec::new();
    for chunk in plain.chunks(MAX_DEVICES) {
        contents.push((chunk.to_vec(), Vec::new()));
    }
    match opts.counters {
        CounterLayout::Separate => {
            let sets: Vec<CounterSet> = partitioned
                .iter()
                .filter_map(|g| g.counters.clone())
                .collect();
            // A counter set holds at most 32 counters; a slice at most 8 sets here, which
            // keeps every slice far below the object size limit.
            for chunk in sets.chunks(8) {
                contents.push((Vec::new(), chunk.to_vec()));
            }
            let devices: Vec<Device> = partitioned.into_iter().flat_map(|g| g.devices).collect();
            for chunk in devices.chunks(MAX_DEVICES_WITH_COUNTERS) {
                contents.push((chunk.to_vec(), Vec::new()));
            }
        }
        CounterLayout::Inline => {
            // Devices must sit with their counter set: one GPU's devices never split.
            let mut cur: (Vec<Device>, Vec<CounterSet>) = (Vec::new(), Vec::new());
            for g in partitioned {
                if g.devices.len() > MAX_DEVICES_WITH_COUNTERS {
                    return Err(SliceError::Gpu {
                        index: 0,
                        reason: format!("{} MIG devices do not fit one slice", g.devices.len()),
                    });
                }
                if cur.0.len() + g.devices.len() > MAX_DEVICES_WITH_COUNTERS {
                    contents.push(std::mem::take(&mut cur));
                }
                cur.0.extend(g.devices);
                cur.1.extend(g.counters);
            }
            if !cur.0.is_empty() {
                contents.push(cur);
            }
        }
    }
    if contents.is_empty() {
        // An empty pool is still published, so the scheduler knows the node has no GPUs.
        contents.push((Vec::new(), Vec::new()));
    }
    let count = contents.len() as i64;
    Ok(contents
        .into_iter()
        .enumerate()
        .map(|(i, (devices, sets))| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}-{}-{i}",
                    opts.node_name,
                    DRIVER.replace('.', "-")
                )),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: DRIVER.to_string(),
                node_name: Some(opts.node_name.clone()),
                pool: ResourcePool {
                    name: opts.node_name.clone(),
                    generation: opts.generation,
                    resource_slice_count: count,
                },
                devices: (!devices.is_empty()).then_some(devices),
                shared_counters: (!sets.is_empty()).then_some(sets),
                ..Default::default()
            },
        })
        .collect())
}

/// Put GPU health into built slices: with [`TaintMode::Taint`] every device of a GPU in
/// `taints` (by GPU UUID, e.g. [`super::health::HealthState::taints`]) gets those taints;
/// with [`TaintMode::Withhold`] such devices are removed. Counter sets stay (a set without
/// consumers is valid), as do the pool's slice count and generation.
pub fn apply_taints(
    slices: &mut [ResourceSlice],
    inventory: &Inventory,
    taints: &BTreeMap<String, Vec<DeviceTaint>>,
    mode: TaintMode,
) {
    let of = |d: &Device| {
        device_gpu(&d.name, inventory)
            .and_then(|g| taints.get(&g.uuid))
            .filter(|t| !t.is_empty())
    };
    for slice in slices {
        let Some(devices) = slice.spec.devices.as_mut() else {
            continue;
        };
        match mode {
            TaintMode::Taint => {
                for d in devices.iter_mut() {
                    d.taints = of(d).cloned();
                }
            }
            TaintMode::Withhold => {
                devices.retain(|d| of(d).is_none());
                for d in devices.iter_mut() {
                    d.taints = None;
                }
                if devices.is_empty() {
                    slice.spec.devices = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;
    use crate::partition::{config, layout};

    fn slices(spec: &str, yaml: &str, counters: CounterLayout) -> Vec<ResourceSlice> {
        let inv = FakeBackend::from_spec(spec).unwrap().inventory().unwrap();
        let cfg = config::parse_config("t", yaml).unwrap();
        let plan = layout::plan(&inv, &cfg).unwrap();
        let mut opts = SliceOptions::new("node-a");
        opts.counters = counters;
        build_slices(&inv, &plan, &opts).unwrap()
    }

    fn devices(s: &[ResourceSlice]) -> Vec<&Device> {
        s.iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect()
    }

    #[test]
    fn whole_gpus_carry_the_attributes() {
        let s = slices("2xH100-80GB", "version: v1", CounterLayout::Separate);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].spec.pool.resource_slice_count, 1);
        let d = devices(&s);
        assert_eq!(d.len(), 2);
        let a = d[0].attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("gpu"));
        assert_eq!(a["cudaComputeCapability"].version.as_deref(), Some("9.0.0"));
        assert_eq!(a["driverVersion"].version.as_deref(), Some("570.124.6"));
        assert!(a["resource.kubernetes.io/pciBusID"]
            .string
            .as_ref()
            .unwrap()
            .starts_with("0000:"));
        assert_eq!(d[0].capacity.as_ref().unwrap()["memory"].value.0, "81559Mi");
    }

    #[test]
    fn mig_gpus_are_partitionable_with_counters() {
        let yaml = "tessera: { gpus: [ { match: all, mode: mig, mig: { layout: all-1g.10gb } } ] }";
        for layout in [CounterLayout::Separate, CounterLayout::Inline] {
            let s = slices("2xA100-80GB", yaml, layout);
            let d = devices(&s);
            // Whole GPU + every placement of every profile, per GPU.
            let per_gpu = d.iter().filter(|d| d.name.starts_with("gpu-0")).count();
            let model = catalog::lookup("NVIDIA A100-SXM4-80GB", 81920).unwrap();
            let placements: usize = model.profiles.iter().map(|p| p.placements.len()).sum();
            assert_eq!(per_gpu, 1 + placements);
            let whole = d.iter().find(|d| d.name == "gpu-0").unwrap();
            let used = &whole.consumes_counters.as_ref().unwrap()[0];
            assert_eq!(used.counter_set, "gpu-0-counters");
            assert_eq!(used.counters.len(), 2 + model.total_slots as usize);
            let m = d.iter().find(|d| d.name == "gpu-1-mig-3g-40gb-4").unwrap();
            let c = &m.consumes_counters.as_ref().unwrap()[0].counters;
            assert!(c.contains_key("memory-slice-4") && c.contains_key("memory-slice-7"));
            assert!(!c.contains_key("memory-slice-3"));
            for slice in &s {
                let n = slice.spec.devices.as_ref().map_or(0, Vec::len);
                assert!(n <= MAX_DEVICES_WITH_COUNTERS);
                if layout == CounterLayout::Separate {
                    assert!(slice.spec.devices.is_none() || slice.spec.shared_counters.is_none());
                }
            }
            assert!(s
                .iter()
                .all(|x| x.spec.pool.resource_slice_count == s.len() as i64));
        }
    }

    #[test]
    fn vgpu_is_consumable_capacity() {
        let yaml = "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 50 } } ] }";
        let s = slices("1xL4", yaml, CounterLayout::Separate);
        let d = devices(&s);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].allow_multiple_allocations, Some(true));
        let cores = &d[0].capacity.as_ref().unwrap()["cores"];
        assert_eq!(cores.value.0, "100");
        assert_eq!(
            cores
                .request_policy
                .as_ref()
                .unwrap()
                .default
                .as_ref()
                .unwrap()
                .0,
            "10"
        );
    }

    #[test]
    fn names_are_dns_labels() {
        use crate::dra::names::label;
        assert_eq!(label("1g.10gb+me"), "1g-10gb-me");
        assert_eq!(semver("12.8"), "12.8.0");
        assert_eq!(semver("570.124.06"), "570.124.6");
    }
}
