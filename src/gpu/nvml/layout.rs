//! Applying a MIG layout to one GPU: a pure diff ([`plan_layout`]) of the GPU instances
//! that exist against the wanted `(profile, start)` list, then the NVML calls that carry
//! it out (enable MIG mode, destroy what is not wanted, create what is missing with a
//! full-size compute instance each).
//!
//! ```text
//! apply ─▶ MIG mode on? ──no──▶ nvmlDeviceSetMigMode ─▶ still pending? ─▶ Error (reset needed)
//!            │yes
//!            ▼
//!      profile table + existing GIs ─▶ plan_layout ─▶ destroy CIs+GIs ─▶ create GIs (placement)
//!                                                                    └▶ create full CIs
//! ```

use std::collections::BTreeMap;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tessera_nvml_raw::{self as raw, CiProfile, GpuInstance, MIG_ENABLED};

use crate::gpu::{Error, MigDeviceInfo, Result};

use super::mig::{list_mig_devices, ProfileTable};
use super::nvml_err;

/// `NVML_ERROR_INSUFFICIENT_RESOURCES`, which `nvml-wrapper` has no variant for.
const INSUFFICIENT_RESOURCES: u32 = 23;

/// Compute instances inside an existing GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CiState {
    /// None: the GPU instance is not usable as a MIG device yet.
    Empty,
    /// Exactly one compute instance spanning the whole GPU instance.
    Full,
    /// Anything else (several or smaller compute instances).
    Other,
}

/// A GPU instance that exists now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingGi {
    pub gi_id: u32,
    pub profile: String,
    pub start: u32,
    pub ci: CiState,
}

/// What to do to reach the wanted layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutPlan {
    /// GPU instances already in place (same UUID afterwards).
    pub keep: Vec<u32>,
    /// Kept GPU instances that still need their full-size compute instance.
    pub add_ci: Vec<u32>,
    /// GPU instances to destroy (with their compute instances).
    pub destroy: Vec<u32>,
    /// `(profile, start)` to create.
    pub create: Vec<(String, u32)>,
}

/// Diff the existing GPU instances against `wanted`. A GPU instance is kept when an
/// unmatched wanted entry has its profile and start and its compute instances are empty
/// or one full-size one; everything else existing is destroyed. Duplicate wanted entries
/// are refused (two instances cannot start at one slot).
pub fn plan_layout(
    existing: &[ExistingGi],
    wanted: &[(String, u8)],
) -> std::result::Result<LayoutPlan, String> {
    let mut want: BTreeMap<(&str, u32), bool> = BTreeMap::new();
    for (profile, start) in wanted {
        if want
            .insert((profile.as_str(), u32::from(*start)), false)
            .is_some()
        {
            return Err(format!(
                "layout lists {profile} at slot {start} more than once"
            ));
        }
    }
    let mut plan = LayoutPlan::default();
    let mut sorted: Vec<&ExistingGi> = existing.iter().collect();
    sorted.sort_by_key(|g| (g.start, g.gi_id));
    for gi in sorted {
        let matched = want.get_mut(&(gi.profile.as_str(), gi.start));
        match (matched, gi.ci) {
            (Some(taken @ false), CiState::Full | CiState::Empty) => {
                *taken = true;
                plan.keep.push(gi.gi_id);
                if gi.ci == CiState::Empty {
                    plan.add_ci.push(gi.gi_id);
                }
            }
            _ => plan.destroy.push(gi.gi_id),
        }
    }
    plan.create = want
        .into_iter()
        .filter(|(_, taken)| !taken)
        .map(|((profile, start), _)| (profile.to_string(), start))
        .collect();
    plan.create.sort_by_key(|(p, s)| (*s, p.clone()));
    Ok(plan)
}

/// The compute-instance profile spanning a whole GPU instance of `gi_slices` slices:
/// the first profile (in `NVML_COMPUTE_INSTANCE_PROFILE_*` order, so the plain one
/// before `_REV1`) with that slice count.
pub fn full_ci_profile(profiles: &[CiProfile], gi_slices: u32) -> Option<&CiProfile> {
    profiles
        .iter()
        .filter(|p| p.instance_count > 0)
        .find(|p| p.slice_count == gi_slices)
}

fn mig_err(gpu: &str, reason: impl Into<String>) -> Error {
    Error::Mig {
        gpu: gpu.to_string(),
        reason: reason.into(),
    }
}

fn ci_profiles(gi: &GpuInstance<'_>) -> Vec<CiProfile> {
    (0..raw::COMPUTE_INSTANCE_PROFILE_COUNT)
        .filter_map(|i| gi.ci_profile(i).ok())
        .collect()
}

fn ci_state(gi: &GpuInstance<'_>, gi_slices: u32) -> CiState {
    let mut cis = Vec::new();
    for p in ci_profiles(gi) {
        if let Ok(found) = gi.compute_instances(p.id, p.instance_count) {
            cis.extend(found.iter().map(|_| p.slice_count));
        }
    }
    match cis.as_slice() {
        [] => CiState::Empty,
        [slices] if *slices == gi_slices => CiState::Full,
        _ => CiState::Other,
    }
}

fn existing_gis(dev: &Device<'_>, table: &ProfileTable, gpu: &str) -> Result<Vec<ExistingGi>> {
    let mut out = Vec::new();
    for p in table.iter() {
        let gis = match raw::gpu_instances(dev, p.id, p.instance_count) {
            Ok(gis) => gis,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(nvml_err("nvmlDeviceGetGpuInstances", gpu)(e)),
        };
        for gi in gis {
            let info = gi.info().map_err(nvml_err("nvmlGpuInstanceGetInfo", gpu))?;
            out.push(ExistingGi {
                gi_id: info.id,
                profile: p.name.clone(),
                start: info.start,
                ci: ci_state(&gi, p.slices),
            });
        }
    }
    Ok(out)
}

fn destroy_gi(dev: &Device<'_>, gi_id: u32, gpu: &str) -> Result<()> {
    let gi = raw::gpu_instance_by_id(dev, gi_id)
        .map_err(nvml_err("nvmlDeviceGetGpuInstanceById", gpu))?;
    for p in ci_profiles(&gi) {
        for ci in gi
            .compute_instances(p.id, p.instance_count)
            .unwrap_or_default()
        {
            ci.destroy().map_err(|e| match e {
                NvmlError::InUse => mig_err(
                    gpu,
                    format!("GPU instance {gi_id} is in use by a process; stop it first"),
                ),
                e => nvml_err("nvmlComputeInstanceDestroy", gpu)(e),
            })?;
        }
    }
    gi.destroy().map_err(|e| match e {
        NvmlError::InUse => mig_err(
            gpu,
            format!("GPU instance {gi_id} is in use by a process; stop it first"),
        ),
        e => nvml_err("nvmlGpuInstanceDestroy", gpu)(e),
    })
}

fn create_full_ci(gi: &GpuInstance<'_>, gi_slices: u32, gpu: &str) -> Result<()> {
    let profiles = ci_profiles(gi);
    let p = full_ci_profile(&profiles, gi_slices).ok_or_else(|| {
        mig_err(
            gpu,
            format!("no compute-instance profile spans a {gi_slices}-slice GPU instance"),
        )
    })?;
    gi.create_compute_instance(p.id)
        .map_err(nvml_err("nvmlGpuInstanceCreateComputeInstance", gpu))?;
    Ok(())
}

/// Make MIG mode current on `dev`, or explain why it is not.
fn ensure_mig_mode(dev: &Device<'_>, gpu: &str) -> Result<()> {
    let mode = dev.mig_mode().map_err(|e| match e {
        NvmlError::NotSupported => mig_err(gpu, "this GPU does not support MIG"),
        e => nvml_err("nvmlDeviceGetMigMode", gpu)(e),
    })?;
    if mode.current == MIG_ENABLED {
        return Ok(());
    }
    if mode.pending != MIG_ENABLED {
        dev.set_mig_mode(true).map_err(|e| match e {
            NvmlError::InUse => mig_err(
                gpu,
                "cannot enable MIG mode: the GPU is in use (stop its processes first)",
            ),
            NvmlError::NoPermission => {
                mig_err(gpu, "cannot enable MIG mode: needs root (CAP_SYS_ADMIN)")
            }
            e => nvml_err("nvmlDeviceSetMigMode", gpu)(e),
        })?;
    }
    let mode = dev
        .mig_mode()
        .map_err(nvml_err("nvmlDeviceGetMigMode", gpu))?;
    if mode.current != MIG_ENABLED {
        let index = dev
            .index()
            .map(|i| i.to_string())
            .unwrap_or_else(|_| "<index>".into());
        return Err(mig_err(
            gpu,
            format!(
                "MIG mode is enabled but pending a GPU reset; stop all processes on the \
                 GPU and run `nvidia-smi -r -i {index}` (or reboot), then apply again"
            ),
        ));
    }
    Ok(())
}

/// Make the MIG devices of GPU `gpu_uuid` exactly `layout`.
pub fn apply(nvml: &Nvml, gpu_uuid: &str, layout: &[(String, u8)]) -> Result<Vec<MigDeviceInfo>> {
    let dev = nvml.device_by_uuid(gpu_uuid).map_err(|e| match e {
        NvmlError::NotFound | NvmlError::InvalidArg => Error::UnknownGpu(gpu_uuid.to_string()),
        e => nvml_err("nvmlDeviceGetHandleByUUID", gpu_uuid)(e),
    })?;
    let gpu = gpu_uuid;
    if layout.is_empty() {
        match dev.mig_mode() {
            Ok(m) if m.current == MIG_ENABLED => {}
            // MIG off (or unsupported) and no MIG devices wanted: nothing to do.
            _ => return Ok(Vec::new()),
        }
    } else {
        ensure_mig_mode(&dev, gpu)?;
    }
    let total = dev
        .memory_info()
        .map_err(nvml_err("nvmlDeviceGetMemoryInfo", gpu))?
        .total;
    let table = ProfileTable::query(&dev, total);
    for (name, _) in layout {
        if table.by_name(name).is_none() {
            return Err(mig_err(
                gpu,
                format!(
                    "unknown MIG profile {name}; this GPU has: {}",
                    table.names().join(", ")
                ),
            ));
        }
    }
    let existing = existing_gis(&dev, &table, gpu)?;
    let plan = plan_layout(&existing, layout).map_err(|r| mig_err(gpu, r))?;
    tracing::info!(gpu, ?plan, "applying MIG layout");
    for gi_id in &plan.destroy {
        destroy_gi(&dev, *gi_id, gpu)?;
    }
    for gi_id in &plan.add_ci {
        let gi = raw::gpu_instance_by_id(&dev, *gi_id)
            .map_err(nvml_err("nvmlDeviceGetGpuInstanceById", gpu))?;
        let info = gi.info().map_err(nvml_err("nvmlGpuInstanceGetInfo", gpu))?;
        let slices = table.by_id(info.profile_id).map_or(0, |p| p.slices);
        create_full_ci(&gi, slices, gpu)?;
    }
    for (name, start) in &plan.create {
        let Some(p) = table.by_name(name) else {
            continue; // validated above
        };
        let placements = raw::gi_possible_placements(&dev, p.id).map_err(nvml_err(
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
            gpu,
        ))?;
        let Some(&(_, size)) = placements.iter().find(|(s, _)| s == start) else {
            let starts: Vec<String> = placements.iter().map(|(s, _)| s.to_string()).collect();
            return Err(mig_err(
                gpu,
                format!(
                    "{name} cannot start at slot {start}; valid starts: {}",
                    starts.join(", ")
                ),
            ));
        };
        let gi = raw::create_gpu_instance(&dev, p.id, *start, size).map_err(|e| match e {
            NvmlError::UnexpectedVariant(INSUFFICIENT_RESOURCES) | NvmlError::InUse => mig_err(
                gpu,
                format!("{name} at slot {start} overlaps an existing MIG instance"),
            ),
            e => nvml_err("nvmlDeviceCreateGpuInstanceWithPlacement", gpu)(e),
        })?;
        create_full_ci(&gi, p.slices, gpu)?;
    }
    list_mig_devices(&dev, gpu, &table, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gi(gi_id: u32, profile: &str, start: u32, ci: CiState) -> ExistingGi {
        ExistingGi {
            gi_id,
            profile: profile.into(),
            start,
            ci,
        }
    }

    fn want(items: &[(&str, u8)]) -> Vec<(String, u8)> {
        items.iter().map(|(p, s)| (p.to_string(), *s)).collect()
    }

    #[test]
    fn empty_gpu_creates_everything() {
        let plan = plan_layout(&[], &want(&[("3g.40gb", 4), ("3g.40gb", 0)])).unwrap();
        assert_eq!(
            plan,
            LayoutPlan {
                create: vec![("3g.40gb".into(), 0), ("3g.40gb".into(), 4)],
                ..Default::default()
            }
        );
    }

    #[test]
    fn matching_instances_are_kept_and_the_rest_destroyed() {
        let existing = [
            gi(1, "3g.40gb", 0, CiState::Full),
            gi(2, "2g.20gb", 4, CiState::Full),
            gi(3, "1g.10gb", 6, CiState::Full),
        ];
        let plan = plan_layout(
            &existing,
            &want(&[
                ("3g.40gb", 0),
                ("1g.10gb", 4),
                ("1g.10gb", 5),
                ("1g.10gb", 6),
            ]),
        )
        .unwrap();
        assert_eq!(plan.keep, vec![1, 3]);
        assert_eq!(plan.destroy, vec![2]);
        assert_eq!(
            plan.create,
            vec![("1g.10gb".into(), 4), ("1g.10gb".into(), 5)]
        );
        assert!(plan.add_ci.is_empty());
    }

    #[test]
    fn compute_instances_decide_keep_fix_or_rebuild() {
        let existing = [
            gi(1, "3g.40gb", 0, CiState::Empty),
            gi(2, "3g.40gb", 4, CiState::Other),
        ];
        let plan = plan_layout(&existing, &want(&[("3g.40gb", 0), ("3g.40gb", 4)])).unwrap();
        assert_eq!(plan.keep, vec![1]);
        assert_eq!(plan.add_ci, vec![1]);
        assert_eq!(plan.destroy, vec![2]);
        assert_eq!(plan.create, vec![("3g.40gb".into(), 4)]);
    }

    #[test]
    fn same_start_other_profile_is_replaced_and_empty_layout_clears() {
        let existing = [gi(7, "7g.80gb", 0, CiState::Full)];
        let plan = plan_layout(&existing, &want(&[("4g.40gb", 0)])).unwrap();
        assert_eq!(plan.destroy, vec![7]);
        assert_eq!(plan.create, vec![("4g.40gb".into(), 0)]);
        let clear = plan_layout(&existing, &[]).unwrap();
        assert_eq!(clear.destroy, vec![7]);
        assert!(clear.create.is_empty() && clear.keep.is_empty());
    }

    #[test]
    fn unchanged_layout_is_a_no_op() {
        let existing = [
            gi(2, "1g.10gb", 1, CiState::Full),
            gi(1, "1g.10gb", 0, CiState::Full),
        ];
        let plan = plan_layout(&existing, &want(&[("1g.10gb", 0), ("1g.10gb", 1)])).unwrap();
        assert_eq!(plan.keep, vec![1, 2]);
        assert!(plan.destroy.is_empty() && plan.create.is_empty() && plan.add_ci.is_empty());
    }

    #[test]
    fn duplicate_wanted_entries_are_refused() {
        let err = plan_layout(&[], &want(&[("1g.10gb", 0), ("1g.10gb", 0)])).unwrap_err();
        assert!(err.contains("1g.10gb at slot 0 more than once"), "{err}");
    }

    #[test]
    fn full_ci_is_the_first_profile_with_the_gi_slice_count() {
        let ci = |index, id, slices, count| CiProfile {
            index,
            id,
            slice_count: slices,
            instance_count: count,
            sm_count: 14 * slices,
        };
        let profiles = [
            ci(0, 0, 1, 3),
            ci(1, 1, 2, 1),
            ci(2, 2, 3, 1),
            ci(7, 7, 1, 0),
        ];
        assert_eq!(full_ci_profile(&profiles, 3).map(|p| p.id), Some(2));
        assert_eq!(full_ci_profile(&profiles, 1).map(|p| p.id), Some(0));
        assert_eq!(full_ci_profile(&profiles, 7), None);
    }
}
