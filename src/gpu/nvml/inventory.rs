//! Reading the inventory from NVML: driver facts, then per GPU its identity, memory,
//! SMs, compute capability, architecture, PCI bus ID, NUMA node, MIG state and MIG
//! devices, then NVLink peers across all GPUs (see [`super::topology`]).
//!
//! Identity and memory calls are required: a GPU where one fails is left out of the
//! inventory with an error log (the others are still reported); the rest degrade:
//! NotSupported means "no such feature" and falls back as documented per field.

use std::path::Path;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tessera_nvml_raw::MIG_ENABLED;

use crate::gpu::{DriverInfo, GpuInfo, Inventory, Result};

use super::facts::{
    architecture_for_cc, format_bus_id, format_cuda_version, parse_numa_node, sm_count_fallback,
    sysfs_bus_id,
};
use super::mig::{list_mig_devices, ProfileTable};
use super::nvml_err;
use super::topology::{resolve_peers, survey, LinkSurvey};

const MIB: u64 = 1024 * 1024;

/// The whole inventory.
pub fn read(nvml: &Nvml, sysfs_root: &Path) -> Result<Inventory> {
    let driver = DriverInfo {
        driver_version: nvml
            .sys_driver_version()
            .map_err(nvml_err("nvmlSystemGetDriverVersion", "*"))?,
        cuda_version: nvml
            .sys_cuda_driver_version()
            .map(format_cuda_version)
            .map_err(nvml_err("nvmlSystemGetCudaDriverVersion_v2", "*"))?,
    };
    let count = nvml
        .device_count()
        .map_err(nvml_err("nvmlDeviceGetCount", "*"))?;
    let mut gpus = Vec::with_capacity(count as usize);
    let mut surveys = Vec::with_capacity(count as usize);
    for index in 0..count {
        let dev = nvml.device_by_index(index).map_err(nvml_err(
            "nvmlDeviceGetHandleByIndex",
            format!("index {index}"),
        ))?;
        // One broken GPU must not hide the others: it is left out, loudly.
        match gpu_info(&dev, index, sysfs_root) {
            Ok(gpu) => {
                surveys.push(survey(&dev, &gpu.uuid, &gpu.pci_bus_id));
                gpus.push(gpu);
            }
            Err(e) => tracing::error!(index, error = %e, "GPU left out of the inventory"),
        }
    }
    attach_peers(&mut gpus, &surveys);
    Ok(Inventory { driver, gpus })
}

fn attach_peers(gpus: &mut [GpuInfo], surveys: &[LinkSurvey]) {
    for (gpu, peers) in gpus.iter_mut().zip(resolve_peers(surveys)) {
        gpu.nvlink_peers = peers;
    }
}

fn gpu_info(dev: &Device<'_>, index: u32, sysfs_root: &Path) -> Result<GpuInfo> {
    let uuid = dev
        .uuid()
        .map_err(nvml_err("nvmlDeviceGetUUID", format!("index {index}")))?;
    let err = |call| nvml_err(call, &uuid);
    let product_name = dev.name().map_err(err("nvmlDeviceGetName"))?;
    let minor = dev
        .minor_number()
        .map_err(err("nvmlDeviceGetMinorNumber"))?;
    let total_bytes = dev
        .memory_info()
        .map_err(err("nvmlDeviceGetMemoryInfo"))?
        .total;
    let cc = dev
        .cuda_compute_capability()
        .map_err(err("nvmlDeviceGetCudaComputeCapability"))?;
    let cc = (
        u32::try_from(cc.major).unwrap_or(0),
        u32::try_from(cc.minor).unwrap_or(0),
    );
    let architecture = match dev.architecture() {
        Ok(a) if a.to_string() != "Unknown" => a.to_string(),
        _ => architecture_for_cc(cc.0, cc.1).to_string(),
    };
    let pci = dev.pci_info().map_err(err("nvmlDeviceGetPciInfo"))?;
    let pci_bus_id = format_bus_id(&pci.bus_id)
        .unwrap_or_else(|| format!("{:04X}:{:02X}:{:02X}.0", pci.domain, pci.bus, pci.device));
    let numa_node = numa_node(dev, &pci_bus_id, sysfs_root);
    let (mig_capable, mig_enabled) = match dev.mig_mode() {
        Ok(m) => (true, m.current == MIG_ENABLED),
        Err(_) => (false, false),
    };
    let sm_count = sm_count(dev, &uuid, &product_name, cc, mig_enabled);
    let mig_devices = if mig_enabled {
        let table = ProfileTable::query(dev, total_bytes);
        list_mig_devices(dev, &uuid, &table, total_bytes)?
    } else {
        Vec::new()
    };
    Ok(GpuInfo {
        index,
        uuid,
        minor,
        product_name,
        memory_mib: total_bytes / MIB,
        sm_count,
        compute_capability: cc,
        architecture,
        pci_bus_id,
        numa_node,
        nvlink_peers: Vec::new(),
        mig_capable,
        mig_enabled,
        mig_devices,
    })
}

/// SM count of the whole GPU. MIG off: `nvmlDeviceGetAttributes`, and where that is
/// NotSupported (older drivers answer it only for MIG devices) the product-name table
/// of [`sm_count_fallback`]. MIG on: the attributes of the parent are not the whole
/// GPU's, so the table comes first and the attributes only for models it lacks. 0 with
/// a warning for a GPU neither knows.
fn sm_count(
    dev: &Device<'_>,
    uuid: &str,
    product_name: &str,
    cc: (u32, u32),
    mig_enabled: bool,
) -> u32 {
    let from_table = || sm_count_fallback(product_name, cc);
    let from_nvml = || match dev.attributes() {
        Ok(a) if a.multiprocessor_count > 0 => Some(a.multiprocessor_count),
        Ok(_) | Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(gpu = uuid, error = %e, "nvmlDeviceGetAttributes failed");
            None
        }
    };
    let found = if mig_enabled {
        from_table().or_else(from_nvml)
    } else {
        from_nvml().or_else(from_table)
    };
    found.unwrap_or_else(|| {
        tracing::warn!(
            gpu = uuid,
            product_name,
            "SM count unknown (NVML has no attributes and the model is not in the table)"
        );
        0
    })
}

/// `nvmlDeviceGetNumaNodeId`, else `<sysfs>/bus/pci/devices/<bus id>/numa_node`.
fn numa_node(dev: &Device<'_>, bus_id: &str, sysfs_root: &Path) -> Option<u32> {
    if let Ok(node) = dev.numa_node_id() {
        // NVML reports "no affinity" as a huge value on some drivers.
        if i32::try_from(node).is_ok() {
            return Some(node);
        }
    }
    sysfs_numa_node(sysfs_root, bus_id)
}

/// `<sysfs>/bus/pci/devices/<bus id, lower case>/numa_node`; missing or `-1` is `None`.
pub fn sysfs_numa_node(sysfs_root: &Path, bus_id: &str) -> Option<u32> {
    let path = sysfs_root
        .join("bus/pci/devices")
        .join(sysfs_bus_id(bus_id))
        .join("numa_node");
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| parse_numa_node(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sysfs fallback against a fake sysfs tree (the NVML half needs a GPU).
    #[test]
    fn sysfs_numa_fallback_reads_the_lower_case_device_dir() {
        let dir = tempfile::tempdir().unwrap();
        for (bus, content) in [("0000:3b:00.0", "1\n"), ("0000:af:00.0", "-1\n")] {
            let d = dir.path().join("bus/pci/devices").join(bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("numa_node"), content).unwrap();
        }
        let read = |bus: &str| sysfs_numa_node(dir.path(), bus);
        assert_eq!(read("0000:3B:00.0"), Some(1));
        assert_eq!(read("0000:AF:00.0"), None);
        assert_eq!(read("0000:00:01.0"), None);
    }
}
