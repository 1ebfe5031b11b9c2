//! MIG as the driver sees it: the GPU-instance profile table of one GPU (name → profile
//! ID, slices, memory), NVIDIA's profile naming, and the listing of existing MIG devices
//! with their GI/CI IDs and placements.
//!
//! Profile names come from the driver (`nvmlDeviceGetGpuInstanceProfileInfoV`, e.g.
//! `1g.10gb+me`) when it has them; otherwise they are derived the way NVIDIA's tools do:
//! `<slices>g.<GB>gb`, with the memory fraction of the GPU rounded up to eighths and
//! scaled by the GPU's memory in whole GB (so an H200's 16.5 GiB slice is `18gb`).

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;
use tessera_nvml_raw::{self as raw, GiProfile};

use crate::gpu::{MigDeviceInfo, Result};

use super::nvml_err;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Memory of a MIG profile in "marketing" GB, as NVIDIA names profiles.
pub fn mig_memory_gb(total_device_bytes: u64, profile_mib: u64) -> u64 {
    if total_device_bytes == 0 {
        return 0;
    }
    let fraction = (profile_mib * MIB) as f64 / total_device_bytes as f64;
    let fraction = (fraction * 8.0).ceil() / 8.0;
    let total_gb = total_device_bytes.div_ceil(GIB) as f64;
    (fraction * total_gb).round() as u64
}

/// `<gi slices>g.<GB>gb`, prefixed `<ci slices>c.` when the compute instance is
/// smaller than its GPU instance (`1c.3g.40gb`).
pub fn derived_profile_name(
    ci_slices: u32,
    gi_slices: u32,
    profile_mib: u64,
    total_device_bytes: u64,
) -> String {
    let gb = mig_memory_gb(total_device_bytes, profile_mib);
    if ci_slices != 0 && ci_slices < gi_slices {
        format!("{ci_slices}c.{gi_slices}g.{gb}gb")
    } else {
        format!("{gi_slices}g.{gb}gb")
    }
}

/// One GPU-instance profile with its resolved name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    /// Profile ID for creating instances.
    pub id: u32,
    pub slices: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub sm_count: u32,
}

/// The GPU-instance profiles one GPU supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileTable {
    profiles: Vec<Profile>,
}

impl ProfileTable {
    /// Resolve names for the raw profiles (in `NVML_GPU_INSTANCE_PROFILE_*` order). A
    /// derived name that an earlier profile already has (a `+me` variant on a driver
    /// without profile names) is kept for ID lookups but not matched by name.
    pub fn from_raw(raw: &[GiProfile], total_device_bytes: u64) -> Self {
        let profiles = raw
            .iter()
            .filter(|p| p.instance_count > 0 && p.slice_count > 0)
            .map(|p| Profile {
                name: p.name.clone().unwrap_or_else(|| {
                    derived_profile_name(0, p.slice_count, p.memory_mib, total_device_bytes)
                }),
                id: p.id,
                slices: p.slice_count,
                instance_count: p.instance_count,
                memory_mib: p.memory_mib,
                sm_count: p.sm_count,
            })
            .collect();
        Self { profiles }
    }

    /// Query every profile index of `dev`; indices the GPU lacks are skipped.
    pub fn query(dev: &Device<'_>, total_device_bytes: u64) -> Self {
        let raw: Vec<GiProfile> = (0..raw::GPU_INSTANCE_PROFILE_COUNT)
            .filter_map(|index| raw::gi_profile(dev, index).ok())
            .collect();
        Self::from_raw(&raw, total_device_bytes)
    }

    pub fn by_id(&self, id: u32) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The first profile with this name.
    pub fn by_name(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.iter()
    }

    /// Names, for error messages.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }
}

/// The MIG devices that exist on `dev` now, ordered by placement start.
pub fn list_mig_devices(
    dev: &Device<'_>,
    gpu_uuid: &str,
    table: &ProfileTable,
    total_device_bytes: u64,
) -> Result<Vec<MigDeviceInfo>> {
    let max = dev
        .mig_device_count()
        .map_err(nvml_err("nvmlDeviceGetMaxMigDeviceCount", gpu_uuid))?;
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match dev.mig_device_by_index(index) {
            Ok(m) => m,
            // An empty slot in the MIG device index space.
            Err(NvmlError::NotFound) | Err(NvmlError::InvalidArg) => continue,
            Err(e) => return Err(nvml_err("nvmlDeviceGetMigDeviceHandleByIndex", gpu_uuid)(e)),
        };
        out.push(describe_mig_device(
            dev,
            &mig,
            gpu_uuid,
            table,
            total_device_bytes,
        )?);
    }
    out.sort_by_key(|m| (m.start, m.gi_id, m.ci_id));
    Ok(out)
}

fn describe_mig_device(
    parent: &Device<'_>,
    mig: &Device<'_>,
    gpu_uuid: &str,
    table: &ProfileTable,
    total_device_bytes: u64,
) -> Result<MigDeviceInfo> {
    let uuid = mig
        .uuid()
        .map_err(nvml_err("nvmlDeviceGetUUID (MIG)", gpu_uuid))?;
    let attrs = mig
        .attributes()
        .map_err(nvml_err("nvmlDeviceGetAttributes (MIG)", &uuid))?;
    let gi_id = raw::gpu_instance_id(mig).map_err(nvml_err("nvmlDeviceGetGpuInstanceId", &uuid))?;
    let ci_id =
        raw::compute_instance_id(mig).map_err(nvml_err("nvmlDeviceGetComputeInstanceId", &uuid))?;
    let gi_info = raw::gpu_instance_by_id(parent, gi_id)
        .and_then(|gi| gi.info())
        .map_err(nvml_err("nvmlGpuInstanceGetInfo", &uuid))?;
    let profile = match table.by_id(gi_info.profile_id) {
        Some(p) if attrs.compute_instance_slice_count >= p.slices => p.name.clone(),
        Some(p) => format!("{}c.{}", attrs.compute_instance_slice_count, p.name),
        None => derived_profile_name(
            attrs.compute_instance_slice_count,
            attrs.gpu_instance_slice_count,
            attrs.memory_size_mb,
            total_device_bytes,
        ),
    };
    Ok(MigDeviceInfo {
        uuid,
        profile,
        gi_id,
        ci_id,
        start: slot(gi_info.start, "placement start", gpu_uuid)?,
        size: slot(gi_info.size, "placement size", gpu_uuid)?,
        memory_mib: attrs.memory_size_mb,
        sm_count: attrs.multiprocessor_count,
    })
}

fn slot(value: u32, what: &str, gpu_uuid: &str) -> Result<u8> {
    u8::try_from(value).map_err(|_| crate::gpu::Error::Mig {
        gpu: gpu_uuid.to_string(),
        reason: format!("MIG {what} {value} is out of range"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    fn raw(index: u32, id: u32, slices: u32, mib: u64, name: Option<&str>) -> GiProfile {
        GiProfile {
            index,
            id,
            slice_count: slices,
            instance_count: 7 / slices.max(1),
            memory_mib: mib,
            sm_count: 14 * slices,
            name: name.map(str::to_string),
        }
    }

    /// (GPU total memory in MiB as NVML reports it, profile memory MiB, slices, name).
    /// Memory sizes as `nvidia-smi mig -lgip` prints them on these GPUs.
    #[test]
    fn derived_names_match_nvidia_names() {
        let cases = [
            (40960, 4864, 1, "1g.5gb"),
            (40960, 9984, 2, "2g.10gb"),
            (40960, 19968, 3, "3g.20gb"),
            (40960, 40192, 7, "7g.40gb"),
            (81920, 9728, 1, "1g.10gb"),
            (81920, 19968, 1, "1g.20gb"),
            (81920, 40192, 3, "3g.40gb"),
            (81920, 80384, 7, "7g.80gb"),
            (24576, 5836, 1, "1g.6gb"),
            (24576, 11672, 2, "2g.12gb"),
            (24576, 23344, 4, "4g.24gb"),
            (143771, 16384, 1, "1g.18gb"),
            (143771, 32768, 1, "1g.35gb"),
            (143771, 69632, 3, "3g.71gb"),
            (143771, 139264, 7, "7g.141gb"),
        ];
        for (total_mib, mib, slices, want) in cases {
            assert_eq!(
                derived_profile_name(0, slices, mib, total_mib * MIB),
                want,
                "{total_mib} MiB GPU, {mib} MiB profile"
            );
        }
    }

    #[test]
    fn smaller_compute_instances_get_a_c_prefix() {
        let total = 81920 * MIB;
        assert_eq!(derived_profile_name(1, 3, 40192, total), "1c.3g.40gb");
        assert_eq!(derived_profile_name(3, 3, 40192, total), "3g.40gb");
        assert_eq!(mig_memory_gb(0, 10), 0);
        assert_eq!(mig_memory_gb(80 * GB, 0), 0);
    }

    #[test]
    fn table_prefers_driver_names_and_skips_absent_profiles() {
        let total = 81920 * MIB;
        let t = ProfileTable::from_raw(
            &[
                raw(0, 19, 1, 9728, None),
                raw(7, 20, 1, 9728, Some("1g.10gb+me")),
                raw(4, 0, 7, 80384, Some("7g.80gb")),
                GiProfile {
                    instance_count: 0,
                    ..raw(5, 99, 8, 1, None)
                },
            ],
            total,
        );
        assert_eq!(t.by_name("1g.10gb").map(|p| p.id), Some(19));
        assert_eq!(t.by_name("1g.10gb+me").map(|p| p.id), Some(20));
        assert_eq!(t.by_id(0).map(|p| p.name.as_str()), Some("7g.80gb"));
        assert_eq!(t.by_id(99), None, "profiles with no instances are skipped");
        assert_eq!(t.names(), vec!["1g.10gb", "1g.10gb+me", "7g.80gb"]);
    }

    #[test]
    fn duplicate_derived_names_match_the_first_profile() {
        let t = ProfileTable::from_raw(
            &[raw(0, 19, 1, 9728, None), raw(7, 20, 1, 9728, None)],
            81920 * MIB,
        );
        assert_eq!(t.by_name("1g.10gb").map(|p| p.id), Some(19));
        assert_eq!(t.by_id(20).map(|p| p.name.as_str()), Some("1g.10gb"));
    }
}
