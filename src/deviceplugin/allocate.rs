//! Allocate, as a pure function: requested device IDs in, what the container gets out.
//!
//! Every device is checked (known, healthy, not twice); then the container gets
//! `NVIDIA_VISIBLE_DEVICES` and the CDI names of the GPUs/MIG devices behind the IDs, and
//! for vGPU slices the shim contract (docs/shim.md "Where limits come from"): the
//! container's allocation directory (agent-written `limits` file) mounted read-only at
//! `/etc/tessera`, its accounting directory read-write at `/var/run/tessera`, the library,
//! and `/etc/ld.so.preload` naming it (or `LD_PRELOAD`, opt-in); the HAMi-core variables
//! `CUDA_DEVICE_MEMORY_LIMIT_<i>`, `CUDA_DEVICE_SM_LIMIT_<i>` and
//! `CUDA_DEVICE_MEMORY_SHARED_CACHE` stay in the environment for tools, but the shim lets
//! them only lower the file's limits. The server refuses a vGPU when the library is not
//! installed or not the one the agent installed ([`crate::shimfiles::ShimLibrary::verify`]).
//!
//! MIG devices also need their GPU-instance and compute-instance access nodes
//! (`/dev/nvidia-caps/nvidia-cap<minor>`): the decision lists them as [`MigUnit`]s, and
//! [`mig_device_specs`] turns them into device specs from the driver's table (the server
//! reads the table once per Allocate; a missing table refuses the allocation).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cdi;
use crate::cdi::migcaps::{MigCaps, MigCapsPaths};
use crate::partition::layout::{Device, Share, Target};
use crate::shimfiles::{self, AllocDirs, ShimLibrary, UnitLimits};
use crate::vgpu::slots::PendingSlots;

use super::snapshot::Snapshot;
use super::{Error, Result};

/// How the shim is injected into vGPU containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PreloadMode {
    /// `LD_PRELOAD=<container lib path>`: opt-in; the container can unset it, so the
    /// limits hold only for processes that keep it.
    Env,
    /// Mount the agent-written list naming the library at `/etc/ld.so.preload` (the
    /// dynamic loader reads it whatever the environment says). The default.
    #[default]
    File,
}

/// Node-level settings Allocate needs (from the agent's flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateSettings {
    /// Add `cdi_devices` to responses.
    pub cdi: bool,
    /// Where the container sees it.
    pub shim_container_path: String,
    pub preload: PreloadMode,
    /// Host directory holding the per-allocation directories ([`crate::shimfiles::AllocDirs`]).
    pub vgpu_state_dir: PathBuf,
    /// The installed library (`<state-dir>/lib/libtessera_cuda.so`) and the preload list
    /// naming it; vGPU allocations are refused while it does not verify.
    pub shim: ShimLibrary,
    /// The driver's MIG capability table (MIG devices' access nodes).
    pub mig_caps: MigCapsPaths,
    /// Where the NVIDIA device nodes are on the host (CDI `hostPath`, `--driver-root`).
    pub host_dev: crate::cdi::devroot::DevRoot,
    /// The agent binds split-mode slots to their pod's assignment (it reaches the API
    /// server and the kubelet's PodResources API); without it slots are refused.
    pub split_binding: bool,
}

impl AllocateSettings {
    pub fn with_state_dir(state_dir: impl Into<PathBuf>) -> Self {
        let state_dir = state_dir.into();
        Self {
            cdi: true,
            shim_container_path: "/usr/local/tessera/lib/libtessera_cuda.so".into(),
            shim: ShimLibrary::new(
                state_dir.join("lib/libtessera_cuda.so"),
                state_dir.join("lib/ld.so.preload"),
            ),
            preload: PreloadMode::File,
            vgpu_state_dir: state_dir.join("vgpu"),
            mig_caps: MigCapsPaths::default(),
            host_dev: crate::cdi::devroot::DevRoot::host(),
            split_binding: false,
        }
    }

    /// The per-allocation directories.
    pub fn alloc_dirs(&self) -> AllocDirs {
        AllocDirs::new(&self.vgpu_state_dir)
    }
}

/// Where the accounting directory is mounted in the container.
pub const CONTAINER_CACHE_DIR: &str = shimfiles::CONTAINER_ACCOUNTING_DIR;

/// A host-path mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// A device node passed to the runtime by the kubelet (`DeviceSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// A MIG device the container gets: what its capability nodes are looked up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigUnit {
    pub uuid: String,
    pub gpu_minor: u32,
    pub gi_id: u32,
    pub ci_id: u32,
}

/// What one container gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerAllocation {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    /// MIG devices among the units, in request order (their access nodes go in `devices`).
    pub mig_units: Vec<MigUnit>,
    pub devices: Vec<DeviceSpec>,
    pub cdi_devices: Vec<String>,
    pub annotations: BTreeMap<String, String>,
    /// vGPU: the allocation directory to create and the limits to write in it before
    /// answering.
    pub vgpu: Option<VgpuFiles>,
}

/// The files a vGPU container's answer refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuFiles {
    /// The allocation directory's name under [`AllocateSettings::vgpu_state_dir`].
    pub id: String,
    pub units: Vec<UnitLimits>,
    /// Split-mode slots: the limits are not known yet. The server records this request
    /// instead of a limits file; the agent writes the limits and the allocation's CDI
    /// spec once it knows the container ([`crate::vgpu::slots`]).
    pub pending: Option<PendingSlots>,
}

/// Decide the allocation of `ids` from `resource` for one container. `alloc_id` names the
/// accounting directory of vGPU containers and must be unique per container.
pub fn allocate_container(
    snapshot: &Snapshot,
    resource: &str,
    ids: &[String],
    settings: &AllocateSettings,
    alloc_id: &str,
) -> Result<ContainerAllocation> {
    let res = snapshot
        .resource(resource)
        .ok_or_else(|| Error::UnknownResource {
            resource: resource.to_string(),
        })?;
    if ids.is_empty() {
        return Err(Error::InvalidRequest(format!(
            "resource {resource}: container request names no devices"
        )));
    }
    let mut devices: Vec<&Device> = Vec::with_capacity(ids.len());
    for id in ids {
        let device =
            res.devices
                .iter()
                .find(|d| &d.id == id)
                .ok_or_else(|| Error::UnknownDevice {
                    resource: resource.to_string(),
                    id: id.clone(),
                })?;
        if devices.iter().any(|d| d.id == *id) {
            return Err(Error::DuplicateDevice {
                resource: resource.to_string(),
                id: id.clone(),
            });
        }
        if let Some(reason) = snapshot.unhealthy_reason(device) {
            return Err(Error::UnhealthyDevice {
                resource: resource.to_string(),
                id: id.clone(),
                reason: reason.to_string(),
            });
        }
        devices.push(device);
    }
    let shared = devices.iter().any(|d| {
        matches!(
            d.share,
            Share::Replica { .. } | Share::Vgpu { .. } | Share::Slot { .. }
        )
    });
    if shared && res.fail_requests_greater_than_one && devices.len() > 1 {
        return Err(Error::RequestRefused {
            resource: resource.to_string(),
            count: devices.len(),
            reason: "the maximum request size for shared resources is 1 \
                     (failRequestsGreaterThanOne)"
                .into(),
        });
    }

    if devices
        .iter()
        .any(|d| matches!(d.share, Share::Slot { .. }))
    {
        return allocate_slots(resource, ids, settings, alloc_id);
    }

    // Units (GPU or MIG device) in first-requested order; vGPU limits summed per unit.
    let mut units: Vec<(&str, Option<(u64, u32)>)> = Vec::new();
    for d in &devices {
        let slice = match d.share {
            Share::Vgpu {
                memory_mib, cores, ..
            } => Some((memory_mib, cores)),
            _ => None,
        };
        match units.iter_mut().find(|(u, _)| *u == d.unit()) {
            Some((_, acc)) => {
                if shared && snapshot.allocation.distinct_gpus {
                    return Err(Error::RequestRefused {
                        resource: resource.to_string(),
                        count: devices.len(),
                        reason: format!(
                            "two shares of {} in one container, but distinctGpus is set",
                            d.unit()
                        ),
                    });
                }
                if let (Some((m, c)), Some((m2, c2))) = (acc.as_mut(), slice) {
                    *m += m2;
                    *c = (*c + c2).min(100);
                }
            }
            None => units.push((d.unit(), slice)),
        }
    }

    let mut out = ContainerAllocation::default();
    for d in &devices {
        if let Target::Mig {
            uuid,
            gpu_minor,
            gi_id,
            ci_id,
            ..
        } = &d.target
        {
            if !out.mig_units.iter().any(|m| m.uuid == *uuid) {
                out.mig_units.push(MigUnit {
                    uuid: uuid.clone(),
                    gpu_minor: *gpu_minor,
                    gi_id: *gi_id,
                    ci_id: *ci_id,
                });
            }
        }
    }
    let visible: Vec<&str> = units.iter().map(|(u, _)| *u).collect();
    out.envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.join(","));
    if settings.cdi {
        out.cdi_devices = visible.iter().map(|u| cdi::qualified_name(u)).collect();
    }
    if units.iter().any(|(_, s)| s.is_some()) {
        add_shim_contract(&mut out, &units, settings, alloc_id);
    }
    Ok(out)
}

/// Split-mode slots: which GPUs and limits the container gets depends on its pod's
/// assignment, which Allocate cannot see. The answer names a CDI device after the
/// allocation (its spec is written once the agent knows the container, so the runtime
/// cannot create the container before its limits exist), hides any GPU an image's
/// `NVIDIA_VISIBLE_DEVICES` would ask for, and carries the shim contract.
fn allocate_slots(
    resource: &str,
    ids: &[String],
    settings: &AllocateSettings,
    alloc_id: &str,
) -> Result<ContainerAllocation> {
    let refused = |reason: &str| Error::RequestRefused {
        resource: resource.to_string(),
        count: ids.len(),
        reason: reason.to_string(),
    };
    if !settings.cdi {
        return Err(refused(
            "split-mode vGPUs reach the container through CDI, which is off (--cdi)",
        ));
    }
    if !settings.split_binding {
        return Err(refused(
            "split-mode vGPUs need the agent to read the pod's assignment (API server) and \
             the kubelet's PodResources API; neither is configured",
        ));
    }
    let mut out = ContainerAllocation::default();
    out.envs
        .insert("NVIDIA_VISIBLE_DEVICES".into(), "void".into());
    out.cdi_devices = vec![cdi::qualified_name(alloc_id)];
    add_shim_contract(&mut out, &[], settings, alloc_id);
    if let Some(v) = out.vgpu.as_mut() {
        v.pending = Some(PendingSlots {
            resource: resource.to_string(),
            device_ids: ids.to_vec(),
        });
    }
    Ok(out)
}

/// The access nodes of `units` (GPU instance, then compute instance, per unit) as device
/// specs, from the driver's table `caps`. A device the table does not list is an error.
pub fn mig_device_specs(units: &[MigUnit], caps: &MigCaps) -> Result<Vec<DeviceSpec>> {
    let mut out = Vec::new();
    for u in units {
        let nodes = caps
            .nodes(u.gpu_minor, u.gi_id, u.ci_id)
            .map_err(|source| Error::MigCaps {
                device: u.uuid.clone(),
                source,
            })?;
        out.extend(nodes.into_iter().map(|n| DeviceSpec {
            host_path: n.host_path.unwrap_or_else(|| n.path.clone()),
            container_path: n.path,
            permissions: "rw".into(),
        }));
    }
    Ok(out)
}

/// The GPU a unit ID lies on: a slice or replica is `<gpu uuid>::<n>`.
fn gpu_of_unit(unit: &str) -> &str {
    unit.split("::").next().unwrap_or(unit)
}

fn add_shim_contract(
    out: &mut ContainerAllocation,
    units: &[(&str, Option<(u64, u32)>)],
    settings: &AllocateSettings,
    alloc_id: &str,
) {
    let mut limits = Vec::new();
    for (i, (unit, slice)) in units.iter().enumerate() {
        if let Some((memory_mib, cores)) = slice {
            // For tools only: the shim reads the limits file and lets these only lower it.
            out.envs.insert(
                format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"),
                format!("{memory_mib}m"),
            );
            out.envs
                .insert(format!("CUDA_DEVICE_SM_LIMIT_{i}"), cores.to_string());
            limits.push(UnitLimits {
                index: i,
                gpu: gpu_of_unit(unit).to_string(),
                memory_mib: *memory_mib,
                cores: *cores,
            });
        }
    }
    let dirs = settings.alloc_dirs();
    out.envs.insert(
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
        format!("{CONTAINER_CACHE_DIR}/{}", shimfiles::ACCOUNTING_FILE),
    );
    out.mounts.push(Mount {
        container_path: shimfiles::CONTAINER_LIMITS_DIR.into(),
        host_path: dirs.dir(alloc_id).display().to_string(),
        read_only: true,
    });
    out.mounts.push(Mount {
        container_path: CONTAINER_CACHE_DIR.into(),
        host_path: dirs.accounting_dir(alloc_id).display().to_string(),
        read_only: false,
    });
    out.mounts.push(Mount {
        container_path: settings.shim_container_path.clone(),
        host_path: settings.shim.host_path.display().to_string(),
        read_only: true,
    });
    match settings.preload {
        PreloadMode::Env => {
            out.envs
                .insert("LD_PRELOAD".into(), settings.shim_container_path.clone());
        }
        PreloadMode::File => out.mounts.push(Mount {
            container_path: shimfiles::CONTAINER_PRELOAD_LIST.into(),
            host_path: settings.shim.preload_list.display().to_string(),
            read_only: true,
        }),
    }
    out.annotations.insert(
        shimfiles::ALLOCATION_ANNOTATION.into(),
        alloc_id.to_string(),
    );
    out.vgpu = Some(VgpuFiles {
        id: alloc_id.to_string(),
        units: limits,
        pending: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{fake::FakeBackend, GpuBackend};
    use crate::partition::{config, layout};

    fn snapshot(spec: &str, yaml: &str) -> Snapshot {
        let inv = FakeBackend::from_spec(spec).unwrap().inventory().unwrap();
        let cfg = config::parse_config("t", yaml).unwrap();
        let plan = layout::plan(&inv, &cfg).unwrap();
        Snapshot {
            generation: 1,
            advertisement: layout::advertise(&inv, &cfg, &plan).unwrap(),
            unhealthy: Default::default(),
            allocation: cfg.allocation.clone(),
            topology: Default::default(),
        }
    }

    fn ids(s: &Snapshot, resource: &str, n: usize) -> Vec<String> {
        s.resource(resource).unwrap().devices[..n]
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    fn settings() -> AllocateSettings {
        AllocateSettings::with_state_dir("/var/lib/tessera")
    }

    #[test]
    fn whole_gpus_get_visible_devices_and_cdi_names() {
        let s = snapshot("2xA100-80GB", "version: v1");
        let req = ids(&s, "nvidia.com/gpu", 2);
        let a = allocate_container(&s, "nvidia.com/gpu", &req, &settings(), "x").unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], req.join(","));
        assert_eq!(a.cdi_devices[0], format!("tessera.io/gpu={}", req[0]));
        assert!(a.mounts.is_empty());
        assert!(!a.envs.contains_key("LD_PRELOAD"));
    }

    #[test]
    fn unknown_unhealthy_and_duplicate_ids_are_refused() {
        let mut s = snapshot("2xA100-80GB", "version: v1");
        let req = ids(&s, "nvidia.com/gpu", 1);
        let e = allocate_container(&s, "nvidia.com/gpu", &["GPU-nope".into()], &settings(), "x");
        assert!(matches!(e, Err(Error::UnknownDevice { .. })), "{e:?}");
        let dup = vec![req[0].clone(), req[0].clone()];
        let e = allocate_container(&s, "nvidia.com/gpu", &dup, &settings(), "x");
        assert!(matches!(e, Err(Error::DuplicateDevice { .. })), "{e:?}");
        s.unhealthy.insert(req[0].clone(), "XID 79".into());
        let e = allocate_container(&s, "nvidia.com/gpu", &req, &settings(), "x").unwrap_err();
        assert!(e.to_string().contains("XID 79"), "{e}");
        let status: tonic::Status = e.into();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        let e = allocate_container(&s, "nvidia.com/other", &req, &settings(), "x");
        assert!(matches!(e, Err(Error::UnknownResource { .. })));
    }

    #[test]
    fn split_slots_wait_for_their_pod_behind_a_cdi_device() {
        let s = snapshot(
            "2xA100-80GB",
            "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4 } } ] }",
        );
        let req = ids(&s, "nvidia.com/gpu", 2);
        // Without the binder (no cluster), refused: never a GPU without limits.
        let e = allocate_container(&s, "nvidia.com/gpu", &req, &settings(), "dp-1").unwrap_err();
        assert!(e.to_string().contains("PodResources"), "{e}");
        let mut with_binding = settings();
        with_binding.split_binding = true;
        let a = allocate_container(&s, "nvidia.com/gpu", &req, &with_binding, "dp-1").unwrap();
        // No GPU in the answer itself (an image's NVIDIA_VISIBLE_DEVICES=all hidden); the
        // GPUs come with the CDI device, whose spec the binder writes.
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"], "void");
        assert_eq!(a.cdi_devices, ["tessera.io/gpu=dp-1"]);
        assert!(a.devices.is_empty());
        assert!(!a
            .envs
            .keys()
            .any(|k| k.starts_with("CUDA_DEVICE_MEMORY_LIMIT")));
        let limits = a
            .mounts
            .iter()
            .find(|m| m.container_path == "/etc/tessera")
            .unwrap();
        assert!(limits.read_only && limits.host_path.ends_with("/vgpu/dp-1"));
        let v = a.vgpu.unwrap();
        assert!(v.units.is_empty());
        assert_eq!(v.pending.unwrap().device_ids, req);
        with_binding.cdi = false;
        let e = allocate_container(&s, "nvidia.com/gpu", &req, &with_binding, "dp-1").unwrap_err();
        assert!(e.to_string().contains("CDI"), "{e}");
    }

    #[test]
    fn vgpu_slices_get_the_shim_contract() {
        let s = snapshot(
            "1xH100-80GB",
            "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 4, memory: 10g, cores: 25 } } ] }",
        );
        let req = ids(&s, "nvidia.com/vgpu", 1);
        let a = allocate_container(&s, "nvidia.com/vgpu", &req, &settings(), "a1").unwrap();
        assert_eq!(a.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "10240m");
        assert_eq!(a.envs["CUDA_DEVICE_SM_LIMIT_0"], "25");
        assert_eq!(
            a.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
            "/var/run/tessera/cuda.cache"
        );
        // Preloaded through /etc/ld.so.preload by default, not the environment.
        assert!(!a.envs.contains_key("LD_PRELOAD"));
        let mount = |path: &str| {
            a.mounts
                .iter()
                .find(|m| m.container_path == path)
                .cloned()
                .unwrap_or_else(|| panic!("no mount at {path}: {:?}", a.mounts))
        };
        assert_eq!(
            mount("/etc/ld.so.preload"),
            Mount {
                container_path: "/etc/ld.so.preload".into(),
                host_path: "/var/lib/tessera/lib/ld.so.preload".into(),
                read_only: true,
            }
        );
        assert_eq!(
            mount("/etc/tessera"),
            Mount {
                container_path: "/etc/tessera".into(),
                host_path: "/var/lib/tessera/vgpu/a1".into(),
                read_only: true,
            }
        );
        assert_eq!(
            mount(CONTAINER_CACHE_DIR),
            Mount {
                container_path: CONTAINER_CACHE_DIR.into(),
                host_path: "/var/lib/tessera/vgpu/a1/acct".into(),
                read_only: false,
            }
        );
        assert!(mount("/usr/local/tessera/lib/libtessera_cuda.so").read_only);
        assert_eq!(
            a.vgpu,
            Some(VgpuFiles {
                id: "a1".into(),
                units: vec![UnitLimits {
                    index: 0,
                    gpu: req[0].split("::").next().unwrap().to_string(),
                    memory_mib: 10240,
                    cores: 25
                }],
                pending: None,
            })
        );

        // Two slices of the same GPU in one container: limits add up.
        let two = ids(&s, "nvidia.com/vgpu", 2);
        let mut env_mode = settings();
        env_mode.preload = PreloadMode::Env;
        let a = allocate_container(&s, "nvidia.com/vgpu", &two, &env_mode, "a2").unwrap();
        assert_eq!(a.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "20480m");
        assert_eq!(a.envs["CUDA_DEVICE_SM_LIMIT_0"], "50");
        assert_eq!(
            a.envs["LD_PRELOAD"],
            "/usr/local/tessera/lib/libtessera_cuda.so"
        );
        assert!(!a
            .mounts
            .iter()
            .any(|m| m.container_path == "/etc/ld.so.preload"));
        assert_eq!(a.vgpu.map(|v| v.units[0].memory_mib), Some(20480));
    }

    #[test]
    fn sharing_options_are_enforced() {
        let s = snapshot(
            "2xA100-80GB",
            "sharing: { timeSlicing: { failRequestsGreaterThanOne: true, resources: [ { name: nvidia.com/gpu, replicas: 4 } ] } }",
        );
        let req = ids(&s, "nvidia.com/gpu", 2);
        let e = allocate_container(&s, "nvidia.com/gpu", &req, &settings(), "x").unwrap_err();
        assert!(e.to_string().contains("failRequestsGreaterThanOne"), "{e}");

        let s = snapshot(
            "2xA100-80GB",
            "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 4 } ] } }\ntessera: { allocation: { distinctGpus: true } }",
        );
        let same_gpu = ids(&s, "nvidia.com/gpu", 2);
        let e = allocate_container(&s, "nvidia.com/gpu", &same_gpu, &settings(), "x").unwrap_err();
        assert!(e.to_string().contains("distinctGpus"), "{e}");
        let devs = &s.resource("nvidia.com/gpu").unwrap().devices;
        let spread = vec![devs[0].id.clone(), devs[4].id.clone()];
        let a = allocate_container(&s, "nvidia.com/gpu", &spread, &settings(), "x").unwrap();
        assert_eq!(a.envs["NVIDIA_VISIBLE_DEVICES"].split(',').count(), 2);
    }

    #[test]
    fn mig_devices_get_their_access_nodes() {
        let inv = FakeBackend::from_yaml(
            "gpus: [ { model: A100-80GB, count: 2, migEnabled: true, mig: [1g.10gb, 1g.10gb] } ]",
        )
        .unwrap()
        .inventory()
        .unwrap();
        let cfg = config::parse_config("t", "flags: { migStrategy: mixed }").unwrap();
        let plan = layout::plan(&inv, &cfg).unwrap();
        let s = Snapshot {
            advertisement: layout::advertise(&inv, &cfg, &plan).unwrap(),
            ..snapshot("1xL4", "version: v1")
        };
        let devs = &s.resource("nvidia.com/mig-1g.10gb").unwrap().devices;
        let on_gpu1 = devs.iter().find(|d| d.gpu_index == 1).unwrap();
        let a = allocate_container(
            &s,
            "nvidia.com/mig-1g.10gb",
            std::slice::from_ref(&on_gpu1.id),
            &settings(),
            "x",
        )
        .unwrap();
        let Target::Mig { gi_id, ci_id, .. } = on_gpu1.target else {
            panic!("not MIG")
        };
        assert_eq!(a.mig_units.len(), 1);
        assert_eq!((a.mig_units[0].gpu_minor, a.mig_units[0].gi_id), (1, gi_id));

        let dir = tempfile::tempdir().unwrap();
        let paths = crate::cdi::migcaps::write_synthetic(dir.path(), 2, 508).unwrap();
        let caps = MigCaps::load(&paths).unwrap();
        let specs = mig_device_specs(&a.mig_units, &caps).unwrap();
        let gi = 3 + 135 + 9 * gi_id;
        let want: Vec<String> = [gi, gi + 1 + ci_id]
            .iter()
            .map(|m| format!("/dev/nvidia-caps/nvidia-cap{m}"))
            .collect();
        let got: Vec<String> = specs.iter().map(|d| d.container_path.clone()).collect();
        assert_eq!(got, want);
        assert!(specs
            .iter()
            .all(|d| d.host_path == d.container_path && d.permissions == "rw"));

        // A table without this GPU: refused, naming the device and the entry.
        let paths = crate::cdi::migcaps::write_synthetic(dir.path(), 1, 508).unwrap();
        let e = mig_device_specs(&a.mig_units, &MigCaps::load(&paths).unwrap()).unwrap_err();
        assert!(
            e.to_string().contains(&on_gpu1.id) && e.to_string().contains("gpu1/gi"),
            "{e}"
        );
        let status: tonic::Status = e.into();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);

        // Whole GPUs have none.
        let s = snapshot("1xA100-80GB", "version: v1");
        let req = ids(&s, "nvidia.com/gpu", 1);
        let a = allocate_container(&s, "nvidia.com/gpu", &req, &settings(), "x").unwrap();
        assert!(a.mig_units.is_empty());
    }
}
