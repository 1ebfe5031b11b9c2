//! What each GPU is doing now, from NVML: memory in use, the utilization rate, memory per
//! MIG device and per compute process where the driver reports them. Read once per
//! usage tick by the agent's sampler (`crate::metrics::sampler`).
//!
//! A GPU in MIG mode has no utilization rate (`nvmlDeviceGetUtilizationRates` is not
//! supported there). On Hopper and later the driver's GPU Performance Monitoring (GPM)
//! measures each GPU instance instead: a sample per instance at every read
//! (`nvmlGpmMigSampleGet`), and `NVML_GPM_METRIC_GRAPHICS_UTIL` between it and the
//! previous read's (`nvmlGpmMetricsGet`), so the figure covers the whole interval between
//! two usage ticks, not a short window. Where GPM is not there (`nvmlGpmQueryDeviceSupport`
//! says no, or the driver lacks the symbols) a MIG device's utilization is `None`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tessera_nvml_raw::GpmMigSample;

use super::nvml_err;
use crate::gpu::{GpuUsage, MigUsage, ProcessUsage, Result};

/// The last GPM sample of each MIG device, by MIG UUID (kept between reads).
#[derive(Debug, Default)]
pub struct GpmSamples(Mutex<HashMap<String, GpmMigSample>>);

/// Every GPU's usage. A GPU whose memory cannot be read is left out (logged), so one
/// broken GPU does not hide the others; failing to count GPUs is an error.
pub fn read(nvml: &Arc<Nvml>, gpm: &GpmSamples) -> Result<Vec<GpuUsage>> {
    let mut samples = gpm.0.lock().unwrap_or_else(|e| e.into_inner());
    let mut kept = HashMap::new();
    let count = nvml
        .device_count()
        .map_err(nvml_err("nvmlDeviceGetCount", "*"))?;
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count {
        let dev = nvml.device_by_index(index).map_err(nvml_err(
            "nvmlDeviceGetHandleByIndex",
            format!("index {index}"),
        ))?;
        match gpu_usage(nvml, &dev, index, &mut samples, &mut kept) {
            Ok(u) => out.push(u),
            Err(e) => tracing::warn!(index, error = %e, "GPU usage not read"),
        }
    }
    // MIG devices gone since the last read drop their samples (freed).
    *samples = kept;
    Ok(out)
}

type Samples = HashMap<String, GpmMigSample>;

fn gpu_usage(
    nvml: &Arc<Nvml>,
    dev: &Device<'_>,
    index: u32,
    last: &mut Samples,
    kept: &mut Samples,
) -> Result<GpuUsage> {
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
        mig: mig_usage(nvml, dev, last, kept),
        processes,
        uuid,
    })
}

/// Memory and GPM utilization per MIG device; empty when MIG is off or the driver says
/// nothing.
fn mig_usage(
    nvml: &Arc<Nvml>,
    dev: &Device<'_>,
    last: &mut Samples,
    kept: &mut Samples,
) -> Vec<MigUsage> {
    let Ok(max) = dev.mig_device_count() else {
        return Vec::new();
    };
    let gpm = matches!(dev.gpm_support(), Ok(true));
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match dev.mig_device_by_index(index) {
            Ok(m) => m,
            Err(NvmlError::NotFound) | Err(NvmlError::InvalidArg) => continue,
            Err(_) => break,
        };
        if let (Ok(uuid), Ok(memory)) = (mig.uuid(), mig.memory_info()) {
            let utilization_percent = gpm
                .then(|| instance_utilization(nvml, dev, &mig, &uuid, last, kept))
                .flatten();
            out.push(MigUsage {
                uuid,
                memory_used_bytes: memory.used,
                memory_total_bytes: memory.total,
                utilization_percent,
            });
        }
    }
    out
}

/// GPM's `GRAPHICS_UTIL` of MIG device `mig` since the previous read: a new sample of its
/// GPU instance is kept for the next read; `None` on the first read of the instance or
/// when the driver refuses (logged at debug: an old driver refuses every read).
fn instance_utilization(
    nvml: &Arc<Nvml>,
    parent: &Device<'_>,
    mig: &Device<'_>,
    uuid: &str,
    last: &mut Samples,
    kept: &mut Samples,
) -> Option<f64> {
    let now =
        tessera_nvml_raw::gpu_instance_id(mig).and_then(|gi| GpmMigSample::take(nvml, parent, gi));
    let now = match now {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(mig = uuid, error = %e, "no GPM sample of the MIG device");
            return None;
        }
    };
    let util = last.remove(uuid).and_then(|before| {
        tessera_nvml_raw::gpm_graphics_util(&before, &now)
            .map_err(|e| tracing::debug!(mig = uuid, error = %e, "GPM metrics not read"))
            .ok()
    });
    kept.insert(uuid.to_string(), now);
    util.filter(|u| u.is_finite()).map(|u| u.clamp(0.0, 100.0))
}
