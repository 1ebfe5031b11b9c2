//! HAMi's vGPU monitor names (`--hami-metrics`), so dashboards built for HAMi keep
//! working on Tessera nodes. HAMi's `vGPUmonitor` exports these names with
//! `--legacy-metrics` (its current names are `hami_*`); Tessera writes them from the same
//! tick as its own gauges, on the same `/metrics` page, without the `tessera_` prefix:
//!
//! | metric | labels | value |
//! |---|---|---|
//! | `HostGPUMemoryUsage` | nodeid, deviceidx, deviceuuid, devicetype | GPU memory used, bytes |
//! | `HostCoreUtilization` | nodeid, deviceidx, deviceuuid, devicetype | GPU utilization, percent (0–100) |
//! | `vGPU_device_memory_usage_in_bytes` | podnamespace, podname, ctrname, vdeviceid, deviceuuid | a vGPU container's memory used |
//! | `vGPU_device_memory_limit_in_bytes` | podnamespace, podname, ctrname, vdeviceid, deviceuuid | its limit |
//!
//! `devicetype` is `NVIDIA-` + the NVML product name (`NVIDIA-NVIDIA A100-SXM4-80GB`) and `vdeviceid` the CUDA ordinal in the
//! container, as HAMi writes them. Only vGPU containers have the two `vGPU_` series.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::usage::{ContainerRow, GpuRow};

type F64Gauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct HostLabels {
    pub nodeid: String,
    pub deviceidx: String,
    pub deviceuuid: String,
    pub devicetype: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct VgpuLabels {
    pub podnamespace: String,
    pub podname: String,
    pub ctrname: String,
    pub vdeviceid: String,
    pub deviceuuid: String,
}

/// HAMi's families, on a registry of their own (no prefix).
#[derive(Debug)]
pub struct HamiMetrics {
    pub registry: Registry,
    pub host_memory: Family<HostLabels, F64Gauge>,
    pub host_core: Family<HostLabels, F64Gauge>,
    pub vgpu_used: Family<VgpuLabels, F64Gauge>,
    pub vgpu_limit: Family<VgpuLabels, F64Gauge>,
}

impl Default for HamiMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HamiMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<HostLabels, F64Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let host_memory = m(
            &mut registry,
            "HostGPUMemoryUsage",
            "GPU device memory usage",
        );
        let host_core = m(&mut registry, "HostCoreUtilization", "GPU core utilization");
        let v = |registry: &mut Registry, name: &str, help: &str| {
            let f = Family::<VgpuLabels, F64Gauge>::default();
            registry.register(name, help, f.clone());
            f
        };
        let vgpu_used = v(
            &mut registry,
            "vGPU_device_memory_usage_in_bytes",
            "vGPU device usage",
        );
        let vgpu_limit = v(
            &mut registry,
            "vGPU_device_memory_limit_in_bytes",
            "vGPU device limit",
        );
        Self {
            registry,
            host_memory,
            host_core,
            vgpu_used,
            vgpu_limit,
        }
    }
}

pub fn host_labels(row: &GpuRow) -> HostLabels {
    HostLabels {
        nodeid: row.labels.node.clone(),
        deviceidx: row.index.to_string(),
        deviceuuid: row.labels.gpu.clone(),
        devicetype: format!("NVIDIA-{}", row.product_name),
    }
}

/// `None` for containers that hold no vGPU slice.
pub fn vgpu_labels(row: &ContainerRow) -> Option<VgpuLabels> {
    (row.labels.mode == "vgpu").then(|| VgpuLabels {
        podnamespace: row.labels.namespace.clone(),
        podname: row.labels.pod.clone(),
        ctrname: row.labels.container.clone(),
        vdeviceid: row.ordinal.to_string(),
        deviceuuid: row.labels.gpu.clone(),
    })
}
