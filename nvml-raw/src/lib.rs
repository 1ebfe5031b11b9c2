//! Safe wrappers for the few NVML calls the `tessera` node agent needs and
//! `nvml-wrapper` 0.13 does not wrap (or wraps wrongly): MIG GPU/compute instances,
//! GPU-instance profile names and placements, NVLink remote device types, and row
//! remapping.
//!
//! The `tessera` crate forbids `unsafe_code`, so every `unsafe` block of the NVML backend
//! lives here, in one FFI module, the same way the CUDA shim keeps its FFI in one place.
//! Each function resolves its symbol through [`nvml_sym`] (a missing symbol on an old
//! driver is an `NvmlError::FailedToLoadSymbol`, never a panic) and maps the return code
//! with [`nvml_try`].
//!
//! Why not `nvml-wrapper` itself:
//! - `Device::possible_placements` never sets the length of its buffer and always
//!   returns an empty list;
//! - `NvLink::remote_device_type` writes into a temporary and always returns `Unknown`;
//! - GPU/compute instance handles, `nvmlDeviceGetGpuInstanceId`,
//!   `nvmlDeviceGetComputeInstanceId`, `nvmlDeviceGetGpuInstanceProfileInfoV` (profile
//!   names) and `nvmlDeviceGetRemappedRows` are not wrapped at all.

use std::mem;
use std::os::raw::{c_char, c_uint};
use std::ptr;

use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

/// NVML constants callers need without depending on `nvml-wrapper-sys` themselves.
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = sys::NVML_GPU_INSTANCE_PROFILE_COUNT;
pub const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT;
pub const NVLINK_MAX_LINKS: u32 = sys::NVML_NVLINK_MAX_LINKS;
/// `MigMode::current`/`pending` value of an enabled MIG mode.
pub const MIG_ENABLED: u32 = sys::NVML_DEVICE_MIG_ENABLE;

/// What sits at the far end of an NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLinkRemote {
    Gpu,
    /// An NVSwitch: the link reaches every GPU on the switch fabric.
    Switch,
    /// An IBM POWER CPU (NPU).
    IbmNpu,
    Unknown,
}

/// One GPU-instance profile as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfile {
    /// The `NVML_GPU_INSTANCE_PROFILE_*` index this was queried with.
    pub index: u32,
    /// The profile ID used to create instances (`nvidia-smi mig -lgip` "ID").
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub sm_count: u32,
    /// The driver's own name (`1g.10gb`, `1g.10gb+me`), when the driver supports
    /// `nvmlDeviceGetGpuInstanceProfileInfoV`; the `MIG ` prefix is stripped.
    pub name: Option<String>,
}

/// One compute-instance profile of a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiProfile {
    pub index: u32,
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub sm_count: u32,
}

/// Identity and placement of a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

/// Identity of a compute instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
}

/// Row-remapping state of a GPU's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failure: bool,
}

/// `NVML_STRUCT_VERSION(name, ver)`: the struct size with the version in the top byte.
const fn struct_version<T>(ver: u32) -> c_uint {
    (mem::size_of::<T>() as c_uint) | (ver << 24)
}

/// Strip the `MIG ` prefix some drivers put in front of profile names.
pub fn clean_profile_name(raw: &str) -> String {
    raw.trim().trim_start_matches("MIG ").trim().to_string()
}

/// A fixed C char buffer up to its first NUL (or its end), lossily as UTF-8.
fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn dev_handle(dev: &Device<'_>) -> sys::nvmlDevice_t {
    // SAFETY: the handle is only passed back to NVML while `dev` (and so the NVML
    // library it borrows) is alive; no second `Device` owning it is created.
    unsafe { dev.handle() }
}

/// The GPU-instance ID of a MIG device handle.
pub fn gpu_instance_id(mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(mig.nvml().lib().nvmlDeviceGetGpuInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: valid device handle, `id` outlives the call.
    nvml_try(unsafe { sym(dev_handle(mig), &mut id) })?;
    Ok(id)
}

/// The compute-instance ID of a MIG device handle.
pub fn compute_instance_id(mig: &Device<'_>) -> Result<u32, NvmlError> {
    let sym = nvml_sym(mig.nvml().lib().nvmlDeviceGetComputeInstanceId.as_ref())?;
    let mut id: c_uint = 0;
    // SAFETY: valid device handle, `id` outlives the call.
    nvml_try(unsafe { sym(dev_handle(mig), &mut id) })?;
    Ok(id)
}

/// What the NVLink `link` of `dev` connects to.
pub fn nvlink_remote(dev: &Device<'_>, link: u32) -> Result<NvLinkRemote, NvmlError> {
    let sym = nvml_sym(
        dev.nvml()
            .lib()
            .nvmlDeviceGetNvLinkRemoteDeviceType
            .as_ref(),
    )?;
    let mut kind: sys::nvmlIntNvLinkDeviceType_t = 0;
    // SAFETY: valid device handle, `kind` outlives the call.
    nvml_try(unsafe { sym(dev_handle(dev), link, &mut kind) })?;
    Ok(match kind {
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU => NvLinkRemote::Gpu,
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH => NvLinkRemote::Switch,
        sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_IBMNPU => NvLinkRemote::IbmNpu,
        _ => NvLinkRemote::Unknown,
    })
}

/// Row-remapping state (Ampere and newer).
pub fn remapped_rows(dev: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let sym = nvml_sym(dev.nvml().lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corr, mut unc, mut pending, mut failure): (c_uint, c_uint, c_uint, c_uint) =
        (0, 0, 0, 0);
    // SAFETY: valid device handle, all out-pointers outlive the call.
    nvml_try(unsafe {
        sym(
            dev_handle(dev),
            &mut corr,
            &mut unc,
            &mut pending,
            &mut failure,
        )
    })?;
    Ok(RemappedRows {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// The GPU-instance profile `index` (`0..GPU_INSTANCE_PROFILE_COUNT`) of `dev`, with the
/// driver's name where the driver has `nvmlDeviceGetGpuInstanceProfileInfoV`.
pub fn gi_profile(dev: &Device<'_>, index: u32) -> Result<GiProfile, NvmlError> {
    let lib = dev.nvml().lib();
    if let Ok(sym) = nvml_sym(lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref()) {
        // SAFETY: an all-zero C struct is a valid value; the version field tells the
        // driver which layout we passed; `info` outlives the call.
        let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { mem::zeroed() };
        info.version = struct_version::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2);
        // SAFETY: as above; valid device handle.
        let rc = unsafe { sym(dev_handle(dev), index, &mut info) };
        // Any failure (an old driver that knows the symbol but not the struct version,
        // or a profile this GPU lacks) falls back to the v1 call below, whose error wins.
        if nvml_try(rc).is_ok() {
            let name = c_chars_to_string(&info.name);
            let name = clean_profile_name(&name);
            return Ok(GiProfile {
                index,
                id: info.id,
                slice_count: info.sliceCount,
                instance_count: info.instanceCount,
                memory_mib: info.memorySizeMB,
                sm_count: info.multiprocessorCount,
                name: (!name.is_empty()).then_some(name),
            });
        }
    }
    let info = dev.profile_info(index)?;
    Ok(GiProfile {
        index,
        id: info.id,
        slice_count: info.slice_count,
        instance_count: info.instance_count,
        memory_mib: info.memory_size_mb,
        sm_count: info.multiprocessor_count,
        name: None,
    })
}

/// Valid `(start, size)` placements of GPU-instance profile `profile_id` on `dev`.
pub fn gi_possible_placements(
    dev: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let sym = nvml_sym(
        dev.nvml()
            .lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref(),
    )?;
    let mut count: c_uint = 0;
    // SAFETY: a NULL buffer asks only for the count.
    nvml_try(unsafe { sym(dev_handle(dev), profile_id, ptr::null_mut(), &mut count) })?;
    let mut buf = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `buf` holds `count` elements, as the driver was told.
    nvml_try(unsafe { sym(dev_handle(dev), profile_id, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate(count as usize);
    Ok(buf.iter().map(|p| (p.start, p.size)).collect())
}

/// A GPU instance (the memory + SM slices of one MIG partition).
#[derive(Debug)]
pub struct GpuInstance<'nvml> {
    handle: sys::nvmlGpuInstance_t,
    nvml: &'nvml Nvml,
}

/// A compute instance inside a GPU instance.
#[derive(Debug)]
pub struct ComputeInstance<'nvml> {
    handle: sys::nvmlComputeInstance_t,
    nvml: &'nvml Nvml,
}

/// All GPU instances of profile `profile_id` on `dev`; `max` is the profile's
/// `instance_count` (the buffer NVML fills must hold that many).
pub fn gpu_instances<'nvml>(
    dev: &Device<'nvml>,
    profile_id: u32,
    max: u32,
) -> Result<Vec<GpuInstance<'nvml>>, NvmlError> {
    let nvml = dev.nvml();
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
    let mut buf: Vec<sys::nvmlGpuInstance_t> = vec![ptr::null_mut(); max.max(1) as usize];
    let mut count: c_uint = 0;
    // SAFETY: `buf` holds at least the profile's instance count of handles.
    nvml_try(unsafe { sym(dev_handle(dev), profile_id, buf.as_mut_ptr(), &mut count) })?;
    buf.truncate((count as usize).min(buf.len()));
    Ok(buf
        .into_iter()
        .map(|handle| GpuInstance { handle, nvml })
        .collect())
}

/// The GPU instance with ID `id` on `dev`.
pub fn gpu_instance_by_id<'nvml>(
    dev: &Device<'nvml>,
    id: u32,
) -> Result<GpuInstance<'nvml>, NvmlError> {
    let nvml = dev.nvml();
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
    let mut handle: sys::nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: valid device handle, `handle` outlives the call.
    nvml_try(unsafe { sym(dev_handle(dev), id, &mut handle) })?;
    Ok(GpuInstance { handle, nvml })
}

/// Create a GPU instance of `profile_id` at memory slots `start..start+size`.
pub fn create_gpu_instance<'nvml>(
    dev: &Device<'nvml>,
    profile_id: u32,
    start: u32,
    size: u32,
) -> Result<GpuInstance<'nvml>, NvmlError> {
    let nvml = dev.nvml();
    let sym = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
    let placement = sys::nvmlGpuInstancePlacement_t { start, size };
    let mut handle: sys::nvmlGpuInstance_t = ptr::null_mut();
    // SAFETY: `placement` and `handle` outlive the call.
    nvml_try(unsafe { sym(dev_handle(dev), profile_id, &placement, &mut handle) })?;
    Ok(GpuInstance { handle, nvml })
}

impl<'nvml> GpuInstance<'nvml> {
    /// ID, profile and placement (`nvmlGpuInstanceGetInfo`).
    pub fn info(&self) -> Result<GpuInstanceInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        // SAFETY: an all-zero C struct is valid; `info` outlives the call.
        let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: the handle came from NVML and was not destroyed (destroy consumes it).
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(GpuInstanceInfo {
            id: info.id,
            profile_id: info.profileId,
            start: info.placement.start,
            size: info.placement.size,
        })
    }

    /// Compute-instance profile `index` (`0..COMPUTE_INSTANCE_PROFILE_COUNT`) of this
    /// GPU instance, with shared engines.
    pub fn ci_profile(&self, index: u32) -> Result<CiProfile, NvmlError> {
        let sym = nvml_sym(
            self.nvml
                .lib()
                .nvmlGpuInstanceGetComputeInstanceProfileInfo
                .as_ref(),
        )?;
        // SAFETY: an all-zero C struct is valid; `info` outlives the call.
        let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: live GPU-instance handle.
        nvml_try(unsafe {
            sym(
                self.handle,
                index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            )
        })?;
        Ok(CiProfile {
            index,
            id: info.id,
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            sm_count: info.multiprocessorCount,
        })
    }

    /// Compute instances of profile `profile_id`; `max` is that profile's instance count.
    pub fn compute_instances(
        &self,
        profile_id: u32,
        max: u32,
    ) -> Result<Vec<ComputeInstance<'nvml>>, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
        let mut buf: Vec<sys::nvmlComputeInstance_t> = vec![ptr::null_mut(); max.max(1) as usize];
        let mut count: c_uint = 0;
        // SAFETY: `buf` holds the profile's instance count of handles.
        nvml_try(unsafe { sym(self.handle, profile_id, buf.as_mut_ptr(), &mut count) })?;
        buf.truncate((count as usize).min(buf.len()));
        let nvml = self.nvml;
        Ok(buf
            .into_iter()
            .map(|handle| ComputeInstance { handle, nvml })
            .collect())
    }

    /// Create a compute instance of CI profile `profile_id` (a [`CiProfile::id`]).
    pub fn create_compute_instance(
        &self,
        profile_id: u32,
    ) -> Result<ComputeInstance<'nvml>, NvmlError> {
        let sym = nvml_sym(
            self.nvml
                .lib()
                .nvmlGpuInstanceCreateComputeInstance
                .as_ref(),
        )?;
        let mut handle: sys::nvmlComputeInstance_t = ptr::null_mut();
        // SAFETY: live GPU-instance handle; `handle` outlives the call.
        nvml_try(unsafe { sym(self.handle, profile_id, &mut handle) })?;
        Ok(ComputeInstance {
            handle,
            nvml: self.nvml,
        })
    }

    /// Destroy this GPU instance (its compute instances must be gone first).
    pub fn destroy(self) -> Result<(), NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
        // SAFETY: live handle, consumed here so it cannot be used afterwards.
        nvml_try(unsafe { sym(self.handle) })
    }
}

impl ComputeInstance<'_> {
    /// ID and profile (`nvmlComputeInstanceGetInfo_v2`).
    pub fn info(&self) -> Result<ComputeInstanceInfo, NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
        // SAFETY: an all-zero C struct is valid; `info` outlives the call.
        let mut info: sys::nvmlComputeInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: live compute-instance handle.
        nvml_try(unsafe { sym(self.handle, &mut info) })?;
        Ok(ComputeInstanceInfo {
            id: info.id,
            profile_id: info.profileId,
        })
    }

    /// Destroy this compute instance.
    pub fn destroy(self) -> Result<(), NvmlError> {
        let sym = nvml_sym(self.nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
        // SAFETY: live handle, consumed here.
        nvml_try(unsafe { sym(self.handle) })
    }
}

/// A GPM sample of one MIG GPU instance (`nvmlGpmMigSampleGet`), kept from one usage
/// read to the next so the activity between them can be computed
/// ([`gpm_graphics_util`]). `nvml-wrapper`'s `GpmSample` borrows its `Nvml`, which the
/// backend cannot keep next to the `Nvml` it borrows; this one holds the `Arc` and the
/// raw handle, and frees the sample (`nvmlGpmSampleFree`) when dropped.
pub struct GpmMigSample {
    nvml: std::sync::Arc<Nvml>,
    handle: sys::nvmlGpmSample_t,
}

// The handle is only used through `&self` methods that NVML serialises per sample, and
// the backend keeps each sample behind a mutex.
unsafe impl Send for GpmMigSample {}

impl std::fmt::Debug for GpmMigSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmMigSample").finish_non_exhaustive()
    }
}

impl GpmMigSample {
    /// Samples GPU instance `gpu_instance_id` of `parent` (the whole GPU's handle) now.
    /// `NotSupported` before Hopper or on a driver without GPM; a driver without the
    /// GPM symbols is `FailedToLoadSymbol`.
    pub fn take(
        nvml: &std::sync::Arc<Nvml>,
        parent: &Device<'_>,
        gpu_instance_id: u32,
    ) -> Result<Self, NvmlError> {
        let sample = parent.gpm_mig_sample(gpu_instance_id)?;
        Ok(Self {
            nvml: std::sync::Arc::clone(nvml),
            handle: sample.into_handle(),
        })
    }

    /// The sample as `nvml-wrapper` sees it, not freed when dropped.
    fn borrowed(&self) -> mem::ManuallyDrop<nvml_wrapper::GpmSample<'_>> {
        // SAFETY: `handle` came from `into_handle` of a sample of this `Nvml` and is
        // freed only by `Drop` below; the `ManuallyDrop` keeps the borrowed wrapper from
        // freeing it too.
        mem::ManuallyDrop::new(unsafe {
            nvml_wrapper::GpmSample::from_handle(&self.nvml, self.handle)
        })
    }
}

impl Drop for GpmMigSample {
    fn drop(&mut self) {
        // SAFETY: as in `borrowed`; this is the one place the handle is freed.
        drop(unsafe { nvml_wrapper::GpmSample::from_handle(&self.nvml, self.handle) });
    }
}

/// `NVML_GPM_METRIC_GRAPHICS_UTIL` between two samples of one GPU instance: the percent
/// of the time between them that any graphics or compute engine was active (the GPM
/// counterpart of `nvmlDeviceGetUtilizationRates().gpu`), 0–100.
pub fn gpm_graphics_util(earlier: &GpmMigSample, later: &GpmMigSample) -> Result<f64, NvmlError> {
    use nvml_wrapper::enums::gpm::GpmMetricId;
    let (a, b) = (earlier.borrowed(), later.borrowed());
    let results =
        nvml_wrapper::gpm::gpm_metrics_get(&earlier.nvml, &a, &b, &[GpmMetricId::GraphicsUtil])?;
    match results.into_iter().next() {
        Some(r) => r.map(|m| m.value),
        None => Err(NvmlError::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_version_puts_version_in_top_byte() {
        let v = struct_version::<sys::nvmlGpuInstanceProfileInfo_v2_t>(2);
        assert_eq!(v >> 24, 2);
        assert_eq!(
            (v & 0x00ff_ffff) as usize,
            mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>()
        );
    }

    #[test]
    fn c_names_stop_at_nul_or_buffer_end() {
        let mut buf = [0 as c_char; 8];
        for (i, b) in b"MIG 1g".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(c_chars_to_string(&buf), "MIG 1g");
        let full = [b'a' as c_char; 4];
        assert_eq!(c_chars_to_string(&full), "aaaa");
    }

    #[test]
    fn profile_names_lose_the_mig_prefix() {
        for (raw, want) in [
            ("MIG 1g.10gb", "1g.10gb"),
            ("1g.10gb+me", "1g.10gb+me"),
            ("  MIG 7g.80gb ", "7g.80gb"),
            ("", ""),
        ] {
            assert_eq!(clean_profile_name(raw), want, "{raw:?}");
        }
    }
}
