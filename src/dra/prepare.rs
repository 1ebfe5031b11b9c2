//! NodePrepareResources, as a pure decision: an allocated ResourceClaim in, the devices,
//! MIG instances to create, and the claim's CDI spec out. The kubelet-plugin shell fetches
//! the claim, calls [`plan_claim`], records the plan in the checkpoint (phase `Started`),
//! performs the side effects, writes the CDI spec and marks the claim `Completed`.
//!
//! One CDI spec per claim (`tessera.io-claim-<uid>.json`): each device carries only its
//! device nodes; the claim-wide edits carry the environment for all of the claim's devices
//! at once (`NVIDIA_VISIBLE_DEVICES` in allocation order, and for vGPU the shim contract
//! with `CUDA_DEVICE_MEMORY_LIMIT_<i>`/`CUDA_DEVICE_SM_LIMIT_<i>` by that order), so a
//! multi-device claim never ends up with one device's variables overwriting another's.
//! The claim-wide edits also carry the control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
//! `/dev/nvidia-uvm-tools`): a claim's spec is a file of its own, so the node spec's do not
//! apply to it. A MIG device's GPU-instance and compute-instance access nodes are added by
//! the shell once the instance exists (its ids are known only then; see
//! [`crate::cdi::migcaps`]). `cdiVersion` is the minimum the spec's fields need
//! ([`crate::cdi::minimum_version`]: 0.5.0 when the claim UID starts with a digit).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::cdi::{self, CdiDevice, ContainerEdits, DeviceNode, Mount, Spec};
use crate::deviceplugin::allocate::{AllocateSettings, PreloadMode, CONTAINER_CACHE_DIR};
use crate::gpu::Inventory;
use crate::partition::catalog;
use crate::shimfiles::{self, UnitLimits};

use super::checkpoint::CreatedMig;
use super::names::{label, parse_device_name, DeviceKind, DRIVER};
use super::sharing::{self, ConfigError};
use crate::gpu::TimeSlice;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    #[error("claim {claim} is not allocated")]
    NotAllocated { claim: String },
    #[error("claim {claim}: UID {got} does not match the kubelet's {want} (claim was recreated)")]
    UidMismatch {
        claim: String,
        got: String,
        want: String,
    },
    #[error("claim {claim}: device {device} is in pool {pool}, not this node's ({node})")]
    WrongNode {
        claim: String,
        device: String,
        pool: String,
        node: String,
    },
    #[error("claim {claim}: unknown device {device}")]
    UnknownDevice { claim: String, device: String },
    #[error("claim {claim}: device {device}: {reason}")]
    InvalidCapacity {
        claim: String,
        device: String,
        reason: String,
    },
    #[error("claim {claim}: {source}")]
    Config {
        claim: String,
        #[source]
        source: ConfigError,
    },
    #[error(
        "claim {claim}: device {device} is a MIG device; time-slicing applies to whole GPUs \
         and vGPU slices"
    )]
    TimeSliceOnMig { claim: String, device: String },
}

/// A Kubernetes quantity in MiB (`16Gi`, `16384Mi`, `17179869184`, `16G`).
pub fn quantity_mib(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let bytes = match unit {
        "" => n,
        "Ki" => n * 1024.0,
        "Mi" => n * 1024.0 * 1024.0,
        "Gi" => n * 1024.0 * 1024.0 * 1024.0,
        "Ti" => n * 1024.0f64.powi(4),
        "k" => n * 1e3,
        "M" => n * 1e6,
        "G" => n * 1e9,
        "T" => n * 1e12,
        _ => return None,
    };
    (bytes >= 0.0).then(|| (bytes / (1024.0 * 1024.0)).ceil() as u64)
}

/// One device of a planned claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub kind: DeviceKind,
    /// `NVIDIA_VISIBLE_DEVICES` entry: the GPU UUID, or for MIG the parent GPU until the
    /// instance exists (the shell substitutes the MIG UUID after creating it).
    pub visible: String,
    /// vGPU share: memory MiB and SM percent.
    pub share: Option<(u64, u32)>,
    pub mig: Option<CreatedMig>,
    /// Compute time-slice asked for by the claim's opaque config (see [`super::sharing`]).
    pub time_slice: Option<TimeSlice>,
}

/// Everything NodePrepareResources must do for one claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimPlan {
    pub devices: Vec<PlannedDevice>,
    pub cdi: Spec,
    /// The CDI spec file name (without `.json`).
    pub cdi_file: String,
}

/// Plan the preparation of `claim` (as fetched from the API server) for the kubelet's
/// request `(namespace, name, uid)` on `node`.
pub fn plan_claim(
    claim: &ResourceClaim,
    want_uid: &str,
    node: &str,
    inventory: &Inventory,
    settings: &AllocateSettings,
) -> Result<ClaimPlan, PrepareError> {
    let name = format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    );
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if uid != want_uid {
        return Err(PrepareError::UidMismatch {
            claim: name,
            got: uid,
            want: want_uid.to_string(),
        });
    }
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .ok_or_else(|| PrepareError::NotAllocated {
            claim: name.clone(),
        })?;
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    let configs = sharing::parse_configs(configs).map_err(|source| PrepareError::Config {
        claim: name.clone(),
        source,
    })?;
    let mut devices = Vec::new();
    for r in results.iter().filter(|r| r.driver == DRIVER) {
        if r.pool != node {
            return Err(PrepareError::WrongNode {
                claim: name,
                device: r.device.clone(),
                pool: r.pool.clone(),
                node: node.to_string(),
            });
        }
        let unknown = || PrepareError::UnknownDevice {
            claim: name.clone(),
            device: r.device.clone(),
        };
        let kind = parse_device_name(&r.device).ok_or_else(unknown)?;
        let gpu_index = match &kind {
            DeviceKind::Whole { gpu } | DeviceKind::Mig { gpu, .. } | DeviceKind::Vgpu { gpu } => {
                *gpu
            }
        };
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.index == gpu_index)
            .ok_or_else(unknown)?;
        let (mut share, mut mig) = (None, None);
        if let DeviceKind::Mig {
            profile_label,
            start,
            ..
        } = &kind
        {
            let model = catalog::lookup(&gpu.product_name, gpu.memory_mib).ok_or_else(unknown)?;
            let profile = model
                .profiles
                .iter()
                .find(|p| label(p.name) == *profile_label && p.placements.contains(start))
                .ok_or_else(unknown)?;
            mig = Some(CreatedMig {
                gpu_uuid: gpu.uuid.clone(),
                profile: profile.name.to_string(),
                start: *start,
            });
        }
        if let DeviceKind::Vgpu { .. } = &kind {
            let consumed = r.consumed_capacity.clone().unwrap_or_default();
            let bad = |reason: String| PrepareError::InvalidCapacity {
                claim: name.clone(),
                device: r.device.clone(),
                reason,
            };
            let memory = match consumed.get("memory") {
                Some(q) => quantity_mib(&q.0).ok_or_else(|| bad(format!("memory {:?}", q.0)))?,
                None => return Err(bad("no consumed memory in the allocation".into())),
            };
            let cores = match consumed.get("cores") {
                Some(q) => {
                    q.0.parse::<u32>()
                        .map_err(|_| bad(format!("cores {:?}", q.0)))?
                }
                None => return Err(bad("no consumed cores in the allocation".into())),
            };
            if memory == 0 || memory > gpu.memory_mib || cores == 0 || cores > 100 {
                return Err(bad(format!("{memory} MiB / {cores}% does not fit the GPU")));
            }
            share = Some((memory, cores));
        }
        let time_slice = sharing::time_slice_for(&configs, &r.request);
        if time_slice.is_some() && mig.is_some() {
            return Err(PrepareError::TimeSliceOnMig {
                claim: name,
                device: r.device.clone(),
            });
        }
        devices.push(PlannedDevice {
            request: r.request.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            kind,
            visible: gpu.uuid.clone(),
            share,
            mig,
            time_slice,
        });
    }
    let cdi = claim_spec(want_uid, inventory, &devices, settings);
    Ok(ClaimPlan {
        devices,
        cdi,
        cdi_file: format!("tessera.io-claim-{want_uid}"),
    })
}

/// The devices of `claim`'s allocation that this driver prepares on `node` (driver
/// `gpu.tessera.io`, pool = the node's), in allocation order; empty when not allocated.
pub fn devices_here(claim: &ResourceClaim, node: &str) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|r| r.driver == DRIVER && r.pool == node)
        .map(|r| r.device.clone())
        .collect()
}

/// The claim's allocation directory name under the vGPU state directory.
pub fn claim_dir_id(claim_uid: &str) -> String {
    format!("{}{claim_uid}", shimfiles::CLAIM_PREFIX)
}

/// The GPUs of a planned claim in `NVIDIA_VISIBLE_DEVICES` order: each once, in the order
/// of their first device.
fn visible_order(devices: &[PlannedDevice]) -> Vec<&str> {
    let mut visible: Vec<&str> = Vec::new();
    for d in devices {
        if !visible.contains(&d.visible.as_str()) {
            visible.push(&d.visible);
        }
    }
    visible
}

/// The vGPU limits of a planned claim, per CUDA ordinal (the order of
/// `NVIDIA_VISIBLE_DEVICES`; shares of one GPU add up, cores at most 100).
pub fn claim_limits(devices: &[PlannedDevice]) -> Vec<UnitLimits> {
    let visible = visible_order(devices);
    let mut shares: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for d in devices {
        let pos = visible
            .iter()
            .position(|v| *v == d.visible)
            .unwrap_or_default();
        if let Some((m, c)) = d.share {
            let e = shares.entry(pos).or_insert((0, 0));
            e.0 += m;
            e.1 = (e.1 + c).min(100);
        }
    }
    shares
        .into_iter()
        .map(|(index, (memory_mib, cores))| UnitLimits {
            index,
            // A vGPU share's visible entry is its GPU's UUID.
            gpu: visible
                .get(index)
                .map(|v| v.to_string())
                .unwrap_or_default(),
            memory_mib,
            cores,
        })
        .collect()
}

/// Before a vGPU claim's CDI spec is written: check the installed shim library (fail
/// closed), create the claim's allocation directory and write its limits file.
pub fn write_claim_files(
    settings: &AllocateSettings,
    claim_uid: &str,
    devices: &[PlannedDevice],
) -> Result<(), shimfiles::Error> {
    let limits = claim_limits(devices);
    if limits.is_empty() {
        return Ok(());
    }
    settings.shim.verify()?;
    let dirs = settings.alloc_dirs();
    let id = claim_dir_id(claim_uid);
    dirs.create(&id)?;
    dirs.write_limits(&id, &limits)
}

/// At unprepare: remove the claim's allocation directory (limits and accounting).
pub fn remove_claim_files(
    settings: &AllocateSettings,
    claim_uid: &str,
) -> Result<(), shimfiles::Error> {
    match settings.alloc_dirs().remove(&claim_dir_id(claim_uid)) {
        // A UID no directory can be named after never had one.
        Err(shimfiles::Error::BadId(_)) => Ok(()),
        other => other,
    }
}

/// At start-up: remove the vGPU directories of claims `prepared` does not hold (records
/// lost in a crash, or claims unprepared while the agent was down). Returns their names.
pub fn remove_orphan_claim_files(
    settings: &AllocateSettings,
    prepared: impl Fn(&str) -> bool,
) -> Result<Vec<String>, shimfiles::Error> {
    let dirs = settings.alloc_dirs();
    let mut removed = Vec::new();
    for name in dirs.list(shimfiles::CLAIM_PREFIX)? {
        let uid = name.trim_start_matches(shimfiles::CLAIM_PREFIX);
        if !prepared(uid) {
            dirs.remove(&name)?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// CDI device name of a claim's device: unique per claim.
pub fn cdi_device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

fn claim_spec(
    uid: &str,
    inventory: &Inventory,
    devices: &[PlannedDevice],
    settings: &AllocateSettings,
) -> Spec {
    claim_spec_with(uid, inventory, devices, &claim_limits(devices), settings)
}

/// The CDI spec of a claim's `devices` with the vGPU `limits` given (what
/// [`claim_limits`] made of them at prepare, read back from the claim's units record when
/// the spec is checked), before the MIG instances' edits ([`with_mig_instance`]).
pub fn claim_spec_with(
    uid: &str,
    inventory: &Inventory,
    devices: &[PlannedDevice],
    limits: &[UnitLimits],
    settings: &AllocateSettings,
) -> Spec {
    let visible = visible_order(devices);
    let mut cdi_devices = Vec::new();
    for d in devices {
        let minor = inventory
            .gpus
            .iter()
            .find(|g| g.uuid == d.visible)
            .map(|g| g.minor)
            .unwrap_or_default();
        cdi_devices.push(CdiDevice {
            name: cdi_device_name(uid, &d.device),
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode::at(format!("/dev/nvidia{minor}"))],
                ..Default::default()
            },
        });
    }
    let mut env = vec![format!("NVIDIA_VISIBLE_DEVICES={}", visible.join(","))];
    let mut mounts = Vec::new();
    if !limits.is_empty() {
        for l in limits {
            env.push(format!(
                "CUDA_DEVICE_MEMORY_LIMIT_{}={}m",
                l.index, l.memory_mib
            ));
            env.push(format!("CUDA_DEVICE_SM_LIMIT_{}={}", l.index, l.cores));
        }
        env.push(format!(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE={CONTAINER_CACHE_DIR}/{}",
            shimfiles::ACCOUNTING_FILE
        ));
        let dirs = settings.alloc_dirs();
        let id = claim_dir_id(uid);
        mounts.push(Mount {
            host_path: dirs.dir(&id).display().to_string(),
            container_path: shimfiles::CONTAINER_LIMITS_DIR.into(),
            options: vec!["ro".into(), "bind".into()],
        });
        mounts.push(Mount {
            host_path: dirs.accounting_dir(&id).display().to_string(),
            container_path: CONTAINER_CACHE_DIR.into(),
            options: vec!["rw".into(), "bind".into()],
        });
        mounts.push(Mount {
            host_path: settings.shim.host_path.display().to_string(),
            container_path: settings.shim_container_path.clone(),
            options: vec!["ro".into(), "bind".into()],
        });
        match settings.preload {
            PreloadMode::Env => env.push(format!("LD_PRELOAD={}", settings.shim_container_path)),
            PreloadMode::File => mounts.push(Mount {
                host_path: settings.shim.preload_list.display().to_string(),
                container_path: shimfiles::CONTAINER_PRELOAD_LIST.into(),
                options: vec!["ro".into(), "bind".into()],
            }),
        }
    }
    cdi::with_minimum_version(Spec {
        cdi_version: String::new(),
        kind: cdi::CDI_KIND.to_string(),
        devices: cdi_devices,
        container_edits: ContainerEdits {
            env,
            // A claim's spec is its own file: the node spec's control nodes do not apply.
            device_nodes: cdi::CONTROL_NODES
                .iter()
                .map(|p| DeviceNode::at(p.to_string()))
                .collect(),
            mounts,
        },
    })
}

/// A MIG instance created for the claim's device `device` in its spec: the instance's
/// access `nodes` join the device's edits and its UUID replaces the parent GPU's in
/// `NVIDIA_VISIBLE_DEVICES`.
pub fn with_mig_instance(
    spec: &mut Spec,
    uid: &str,
    device: &str,
    parent_uuid: &str,
    mig_uuid: &str,
    nodes: Vec<DeviceNode>,
) {
    let name = cdi_device_name(uid, device);
    if let Some(dev) = spec.devices.iter_mut().find(|x| x.name == name) {
        dev.container_edits.device_nodes.extend(nodes);
    }
    for e in &mut spec.container_edits.env {
        if let Some(list) = e.strip_prefix("NVIDIA_VISIBLE_DEVICES=") {
            let replaced: Vec<&str> = list
                .split(',')
                .map(|v| if v == parent_uuid { mig_uuid } else { v })
                .collect();
            *e = format!("NVIDIA_VISIBLE_DEVICES={}", replaced.join(","));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    /// (pool, device, consumed (memory, cores)).
    type Result3<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>);

    fn claim(uid: &str, results: Vec<Result3<'_>>) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("c".into()),
                namespace: Some("ml".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Default::default(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(
                            results
                                .into_iter()
                                .map(|(pool, device, cap)| DeviceRequestAllocationResult {
                                    driver: DRIVER.into(),
                                    pool: pool.into(),
                                    device: device.into(),
                                    request: "gpu".into(),
                                    consumed_capacity: cap.map(|(m, c)| {
                                        [
                                            ("memory".to_string(), Quantity(m.into())),
                                            ("cores".to_string(), Quantity(c.into())),
                                        ]
                                        .into_iter()
                                        .collect()
                                    }),
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    fn inv() -> Inventory {
        FakeBackend::from_spec("2xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap()
    }

    fn settings() -> AllocateSettings {
        AllocateSettings::with_state_dir("/var/lib/tessera")
    }

    #[test]
    fn device_names_and_quantities() {
        assert_eq!(
            parse_device_name("gpu-3"),
            Some(DeviceKind::Whole { gpu: 3 })
        );
        assert_eq!(
            parse_device_name("gpu-2-vgpu"),
            Some(DeviceKind::Vgpu { gpu: 2 })
        );
        assert_eq!(
            parse_device_name("gpu-0-mig-1g-10gb-me-4"),
            Some(DeviceKind::Mig {
                gpu: 0,
                profile_label: "1g-10gb-me".into(),
                start: 4
            })
        );
        assert_eq!(parse_device_name("cpu-1"), None);
        assert_eq!(parse_device_name("gpu-x"), None);
        assert_eq!(quantity_mib("16Gi"), Some(16384));
        assert_eq!(quantity_mib("1024Mi"), Some(1024));
        assert_eq!(quantity_mib("1073741824"), Some(1024));
        assert_eq!(quantity_mib("1G"), Some(954));
        assert_eq!(quantity_mib("12Qi"), None);
    }

    #[test]
    fn plans_whole_mig_and_vgpu_devices() {
        let c = claim(
            "u1",
            vec![
                ("node-a", "gpu-0-mig-3g-40gb-4", None),
                ("node-a", "gpu-1-vgpu", Some(("16Gi", "25"))),
            ],
        );
        let plan = plan_claim(&c, "u1", "node-a", &inv(), &settings()).unwrap();
        assert_eq!(plan.devices.len(), 2);
        let mig = plan.devices[0].mig.as_ref().unwrap();
        assert_eq!((mig.profile.as_str(), mig.start), ("3g.40gb", 4));
        assert_eq!(plan.devices[1].share, Some((16384, 25)));
        let env = &plan.cdi.container_edits.env;
        assert!(
            env.iter().any(|e| e == "CUDA_DEVICE_MEMORY_LIMIT_1=16384m"),
            "{env:?}"
        );
        assert!(
            env.iter().any(|e| e == "CUDA_DEVICE_SM_LIMIT_1=25"),
            "{env:?}"
        );
        // Preloaded through the mounted list, limits from the read-only claim directory.
        assert!(!env.iter().any(|e| e.starts_with("LD_PRELOAD=")));
        let mounts: Vec<(&str, &str, &str)> = plan
            .cdi
            .container_edits
            .mounts
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    m.host_path.as_str(),
                    m.options[0].as_str(),
                )
            })
            .collect();
        for want in [
            ("/etc/tessera", "/var/lib/tessera/vgpu/claim-u1", "ro"),
            (
                "/var/run/tessera",
                "/var/lib/tessera/vgpu/claim-u1/acct",
                "rw",
            ),
            (
                "/etc/ld.so.preload",
                "/var/lib/tessera/lib/ld.so.preload",
                "ro",
            ),
        ] {
            assert!(mounts.contains(&want), "{want:?} not in {mounts:?}");
        }
        assert_eq!(
            claim_limits(&plan.devices),
            vec![UnitLimits {
                index: 1,
                gpu: plan.devices[1].visible.clone(),
                memory_mib: 16384,
                cores: 25
            }]
        );
        // Without the installed library the claim's files are refused.
        let tmp = tempfile::tempdir().unwrap();
        let s = AllocateSettings::with_state_dir(tmp.path());
        let e = write_claim_files(&s, "u1", &plan.devices).unwrap_err();
        assert!(e.to_string().contains("not installed"), "{e}");
        assert!(!tmp.path().join("vgpu/claim-u1").exists());
        // Start-up sweep: only the directories of prepared claims stay.
        let dirs = s.alloc_dirs();
        for id in ["claim-kept", "claim-lost", "dp-1"] {
            dirs.create(id).unwrap();
        }
        let removed = remove_orphan_claim_files(&s, |uid| uid == "kept").unwrap();
        assert_eq!(removed, vec!["claim-lost".to_string()]);
        assert!(dirs.dir("claim-kept").exists() && dirs.dir("dp-1").exists());
        assert_eq!(plan.cdi.devices[0].name, "u1-gpu-0-mig-3g-40gb-4");
        assert_eq!(plan.cdi_file, "tessera.io-claim-u1");
    }

    #[test]
    fn devices_here_are_this_drivers_in_this_pool() {
        let mut c = claim(
            "u1",
            vec![
                ("node-a", "gpu-0", None),
                ("node-b", "gpu-1", None),
                ("node-a", "gpu-1-vgpu", None),
            ],
        );
        if let Some(r) = c
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
        {
            r[0].driver = "nic.example.com".into();
        }
        assert_eq!(devices_here(&c, "node-a"), vec!["gpu-1-vgpu"]);
        c.status = None;
        assert!(devices_here(&c, "node-a").is_empty());
    }

    #[test]
    fn refuses_what_it_must() {
        let c = claim("u1", vec![("node-a", "gpu-0", None)]);
        assert!(matches!(
            plan_claim(&c, "u2", "node-a", &inv(), &settings()),
            Err(PrepareError::UidMismatch { .. })
        ));
        assert!(matches!(
            plan_claim(&c, "u1", "node-b", &inv(), &settings()),
            Err(PrepareError::WrongNode { .. })
        ));
        let c = claim("u1", vec![("node-a", "gpu-9", None)]);
        assert!(matches!(
            plan_claim(&c, "u1", "node-a", &inv(), &settings()),
            Err(PrepareError::UnknownDevice { .. })
        ));
        // A placement the model does not have.
        let c = claim("u1", vec![("node-a", "gpu-0-mig-3g-40gb-1", None)]);
        assert!(plan_claim(&c, "u1", "node-a", &inv(), &settings()).is_err());
        let c = claim("u1", vec![("node-a", "gpu-0-vgpu", Some(("900Gi", "25")))]);
        assert!(matches!(
            plan_claim(&c, "u1", "node-a", &inv(), &settings()),
            Err(PrepareError::InvalidCapacity { .. })
        ));
        let mut c = claim("u1", vec![]);
        c.status = None;
        assert!(matches!(
            plan_claim(&c, "u1", "node-a", &inv(), &settings()),
            Err(PrepareError::NotAllocated { .. })
        ));
    }
}
