//! What each GPU is doing now, from NVML: memory in use, the utilization rate, memory per
//! MIG device and per compute process where the driver reports them. Read once per
//! usage tick by the agent's sampler (`crate::metrics::sampler`).

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::nvml_err;
use crate::gpu::{GpuUsage, MigUsage, ProcessUsage, Result};

/// Every GPU's usage. A GPU whose memory cannot be read is left out (logged), so one
/// broken GPU does not hide the others; failing to count GPUs is an error.
pub fn read(nvml: &Nvml) -> Result<Vec<GpuUsage>> {
    let count = nvml
        .device_count()
        .map_err(nvml_err("nvmlDeviceGetCount", "*"))?;
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count {
        let dev = nvml.device_by_index(index).map_err(nvml_err(
            "nvmlDeviceGetHandleByIndex",
            format!("index {index}"),
        ))?;
        match gpu_usage(&dev, index) {
            Ok(u) => out.push(u),
            Err(e) => tracing::warn!(index, error = %e, "GPU usage not read"),
        }
    }
    Ok(out)
}

fn gpu_usage(dev: &Device<'_>, index: u32) -> Result<GpuUsage> {
    let uuid = dev
        .uuid()
        .map_err(nvml_err("nvmlDeviceGetUUID", format!("index {index}")))?;
    let memory = dev
        .memory_info()
        .map_err(nvml_err("nvmlDeviceGetMemoryInfo", &uuid))?;
    // Not supported on a GPU in MIG mode: no utilization then, not 0 %.
    let utilization_percent = dev.utilization_rates().ok().map(|u| u.gpu.min(100));
    let processes = match dev.running_compute_processes() {
        Ok(list) => list
            .into_iter()
            .map(|p| ProcessUsage {
                pid: p.pid,
                memory_used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    Ok(GpuUsage {
        memory_used_bytes: memory.used,
        memory_total_bytes: memory.total,
        utilization_percent,
        mig: mig_usage(dev),
        processes,
        uuid,
    })
}

/// Memory per MIG device; empty when MIG is off or the driver says nothing.
fn mig_usage(dev: &Device<'_>) -> Vec<MigUsage> {
    let Ok(max) = dev.mig_device_count() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match dev.mig_device_by_index(index) {
            Ok(m) => m,
            Err(NvmlError::NotFound) | Err(NvmlError::InvalidArg) => continue,
            Err(_) => break,
        };
        if let (Ok(uuid), Ok(memory)) = (mig.uuid(), mig.memory_info()) {
            out.push(MigUsage {
                uuid,
                memory_used_bytes: memory.used,
                memory_total_bytes: memory.total,
            });
        }
    }
    out
}
