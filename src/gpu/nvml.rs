//! The `nvml` backend (being built; see issue 2).

use std::ffi::OsStr;

use super::{Error, GpuBackend, HealthSender, Inventory, MigDeviceInfo, Result};

/// GPUs through NVML.
pub struct NvmlBackend;

impl NvmlBackend {
    pub fn new(_lib_path: Option<&OsStr>) -> Result<Self> {
        Err(Error::NvmlUnavailable(
            "the NVML backend is not built yet".into(),
        ))
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }
    fn inventory(&self) -> Result<Inventory> {
        Err(Error::NvmlUnavailable("not built yet".into()))
    }
    fn watch_health(&self, _tx: HealthSender) -> Result<()> {
        Err(Error::NvmlUnavailable("not built yet".into()))
    }
    fn apply_mig_layout(&self, _: &str, _: &[(String, u8)]) -> Result<Vec<MigDeviceInfo>> {
        Err(Error::NvmlUnavailable("not built yet".into()))
    }
}
