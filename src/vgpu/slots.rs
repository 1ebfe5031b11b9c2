//! Which limits a container holding split-mode slots runs under: the pure half of the
//! node side's late binding (docs/hami.md, "Limits from the assignment").
//!
//! The kubelet's Allocate names slots (`<uuid>::s<n>`) but not the pod, so at Allocate
//! the agent records the request ([`PendingSlots`]) and answers with a CDI device named
//! after the allocation, whose spec does not exist yet. Once the kubelet's PodResources
//! API names the container holding those slots ([`find_holder`]), the agent reads the
//! pod's assignment (written by the scheduler extender's bind) and [`bind`] decides what
//! the container gets: the assigned GPUs, each with the assigned memory and SM share.
//! Then the agent writes the limits file and the CDI spec; the runtime can create the
//! container only after that, so no container ever runs before its limits exist.
//!
//! The slots the kubelet picked only count capacity: the GPUs come from the assignment,
//! so the extender's books and what the containers get agree whatever the kubelet chose.

use serde::{Deserialize, Serialize};

use super::record::{AssignmentRecord, ASSIGNMENT_ANNOTATION};
use super::request::ContainerRequest;

/// What Allocate recorded for a split-mode allocation until its container is known.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingSlots {
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// One container's devices of one resource, as the kubelet's PodResources API lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub resource: String,
    pub device_ids: Vec<String>,
}

/// A split-mode GPU of this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotGpu {
    pub uuid: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    pub memory_mib: u64,
    pub healthy: bool,
}

/// One GPU a container gets, with its limits (CUDA ordinal = position in the list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundUnit {
    pub uuid: String,
    pub minor: u32,
    pub memory_mib: u64,
    /// % of the GPU's SMs; 0 means no SM limit.
    pub cores: u32,
}

/// Why a container's slots cannot be bound to GPUs. The container is never created (its
/// CDI device stays unresolvable): never a GPU without limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    #[error(
        "pod has no {ASSIGNMENT_ANNOTATION} annotation: split-mode vGPUs are placed by the \
         Tessera scheduler (set schedulerName, or let the vgpu-pods admission webhook do it)"
    )]
    NoAssignment,
    #[error("annotation {ASSIGNMENT_ANNOTATION} does not parse: {0}")]
    BadAssignment(String),
    #[error("the assignment is for node {assigned}, but the pod runs on {here}")]
    OtherNode { assigned: String, here: String },
    #[error("the assignment has no entry for container {container:?}")]
    NoContainer { container: String },
    #[error(
        "container {container:?} holds {slots} slot(s) but its assignment names {grants} GPU(s)"
    )]
    CountMismatch {
        container: String,
        slots: usize,
        grants: usize,
    },
    #[error("GPU {uuid} of the assignment is not a split-mode GPU of this node")]
    UnknownGpu { uuid: String },
    #[error("GPU {uuid} of the assignment is unhealthy")]
    UnhealthyGpu { uuid: String },
    #[error("the assignment names GPU {uuid} twice for one container")]
    SameGpuTwice { uuid: String },
    #[error("the assignment gives {want} MiB of GPU {uuid}, which has {have} MiB")]
    Memory { uuid: String, want: u64, have: u64 },
    #[error("the assignment gives {cores} % of the SMs of GPU {uuid} (0-100)")]
    Cores { uuid: String, cores: u32 },
    #[error(
        "the kubelet allocated these slots to pod UID {allocated}, but the pod of that name \
         is now UID {current} (deleted and created again)"
    )]
    OtherPod { allocated: String, current: String },
    #[error("container {container:?} asks for no vGPU in its resources")]
    NoRequest { container: String },
    #[error("the assignment gives {granted} on GPU {uuid}, but the container asks for {asked}")]
    ExceedsRequest {
        uuid: String,
        granted: String,
        asked: String,
    },
}

/// The container the kubelet handed exactly `pending`'s devices to, if it has yet.
pub fn find_holder<'a>(pending: &PendingSlots, holders: &'a [Holder]) -> Option<&'a Holder> {
    let mut want: Vec<&str> = pending.device_ids.iter().map(String::as_str).collect();
    want.sort_unstable();
    holders.iter().find(|h| {
        if h.resource != pending.resource || h.device_ids.len() != want.len() {
            return false;
        }
        let mut got: Vec<&str> = h.device_ids.iter().map(String::as_str).collect();
        got.sort_unstable();
        got == want
    })
}

/// What `holder` gets on node `node`, from its pod's assignment annotation `assignment`
/// (the value, if the pod has one), the container's own request (from its resources,
/// which cannot change once the pod exists) and this node's split-mode GPUs.
///
/// The annotation is checked against the request, so a forged or edited annotation
/// cannot give a container more than its resources ask: memory at most what it asks
/// (its `gpumem`, its percentage of the GPU, or the GPU's memory when unset) and exactly
/// the SM share it asks when it asks for one (an SM share of 0 would lift the limit).
pub fn bind(
    holder: &Holder,
    assignment: Option<&str>,
    request: Option<&ContainerRequest>,
    node: &str,
    gpus: &[SlotGpu],
) -> Result<Vec<BoundUnit>, BindError> {
    let request = request.ok_or_else(|| BindError::NoRequest {
        container: holder.container.clone(),
    })?;
    let value = assignment.ok_or(BindError::NoAssignment)?;
    let record: AssignmentRecord =
        serde_json::from_str(value).map_err(|e| BindError::BadAssignment(e.to_string()))?;
    if record.node != node {
        return Err(BindError::OtherNode {
            assigned: record.node,
            here: node.to_string(),
        });
    }
    let container = record
        .containers
        .iter()
        .find(|c| c.name == holder.container)
        .ok_or_else(|| BindError::NoContainer {
            container: holder.container.clone(),
        })?;
    if container.devices.len() != holder.device_ids.len() {
        return Err(BindError::CountMismatch {
            container: holder.container.clone(),
            slots: holder.device_ids.len(),
            grants: container.devices.len(),
        });
    }
    let mut units: Vec<BoundUnit> = Vec::with_capacity(container.devices.len());
    for grant in &container.devices {
        let gpu =
            gpus.iter()
                .find(|g| g.uuid == grant.uuid)
                .ok_or_else(|| BindError::UnknownGpu {
                    uuid: grant.uuid.clone(),
                })?;
        if !gpu.healthy {
            return Err(BindError::UnhealthyGpu {
                uuid: gpu.uuid.clone(),
            });
        }
        if units.iter().any(|u| u.uuid == gpu.uuid) {
            return Err(BindError::SameGpuTwice {
                uuid: gpu.uuid.clone(),
            });
        }
        if grant.memory_mib == 0 || grant.memory_mib > gpu.memory_mib {
            return Err(BindError::Memory {
                uuid: gpu.uuid.clone(),
                want: grant.memory_mib,
                have: gpu.memory_mib,
            });
        }
        if grant.cores > 100 {
            return Err(BindError::Cores {
                uuid: gpu.uuid.clone(),
                cores: grant.cores,
            });
        }
        within_request(request, gpu, grant.memory_mib, grant.cores)?;
        units.push(BoundUnit {
            uuid: gpu.uuid.clone(),
            minor: gpu.minor,
            memory_mib: grant.memory_mib,
            cores: grant.cores,
        });
    }
    Ok(units)
}

fn within_request(
    request: &ContainerRequest,
    gpu: &SlotGpu,
    memory_mib: u64,
    cores: u32,
) -> Result<(), BindError> {
    let asked = request.memory.mib_on(gpu.memory_mib);
    if memory_mib > asked {
        return Err(BindError::ExceedsRequest {
            uuid: gpu.uuid.clone(),
            granted: format!("{memory_mib} MiB"),
            asked: format!("{asked} MiB ({})", request.memory),
        });
    }
    if request.cores > 0 && cores != request.cores {
        return Err(BindError::ExceedsRequest {
            uuid: gpu.uuid.clone(),
            granted: format!("{cores} % of the SMs"),
            asked: format!("{} %", request.cores),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::request::{ContainerKind, MemoryRequest};
    use serde_json::json;

    /// What `gpumem: 90000, gpucores: 30` style limits parse to.
    fn asks(memory: MemoryRequest, cores: u32) -> ContainerRequest {
        ContainerRequest {
            name: "main".into(),
            kind: ContainerKind::App,
            count: 1,
            memory,
            cores,
        }
    }

    /// A request that allows any grant the GPU can hold (`nvidia.com/gpu: 1` alone).
    fn whole() -> ContainerRequest {
        asks(MemoryRequest::Percent(100), 0)
    }

    fn gpus() -> Vec<SlotGpu> {
        (0..3)
            .map(|i| SlotGpu {
                uuid: format!("GPU-{i}"),
                minor: i,
                memory_mib: 81_920,
                healthy: i != 2,
            })
            .collect()
    }

    fn holder(container: &str, ids: &[&str]) -> Holder {
        Holder {
            namespace: "ml".into(),
            pod: "infer".into(),
            container: container.into(),
            resource: "nvidia.com/gpu".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn assignment(node: &str, grants: serde_json::Value) -> String {
        json!({"node": node, "containers": [{"name": "main", "devices": grants}]}).to_string()
    }

    #[test]
    fn the_holder_is_the_container_with_exactly_those_slots() {
        let pending = PendingSlots {
            resource: "nvidia.com/gpu".into(),
            device_ids: vec!["GPU-1::s0".into(), "GPU-0::s3".into()],
        };
        let holders = vec![
            holder("a", &["GPU-0::s3"]),
            holder("b", &["GPU-0::s3", "GPU-1::s0", "GPU-1::s1"]),
            holder("c", &["GPU-0::s3", "GPU-1::s0"]),
        ];
        assert_eq!(find_holder(&pending, &holders).unwrap().container, "c");
        let mut other = holders[2].clone();
        other.resource = "nvidia.com/vgpu".into();
        assert!(find_holder(&pending, &[other]).is_none());
        assert!(find_holder(&pending, &holders[..2]).is_none());
    }

    #[test]
    fn the_gpus_and_limits_come_from_the_assignment_not_the_slots() {
        // The kubelet picked slots of GPU-0; the extender assigned GPU-1: GPU-1 it is.
        let a = assignment(
            "n1",
            json!([{"uuid": "GPU-1", "memoryMiB": 10240, "cores": 30}]),
        );
        let request = asks(MemoryRequest::Mib(10240), 30);
        let units = bind(
            &holder("main", &["GPU-0::s1"]),
            Some(&a),
            Some(&request),
            "n1",
            &gpus(),
        )
        .unwrap();
        assert_eq!(
            units,
            vec![BoundUnit {
                uuid: "GPU-1".into(),
                minor: 1,
                memory_mib: 10240,
                cores: 30
            }]
        );
    }

    #[test]
    fn every_inconsistency_is_refused_with_its_reason() {
        let g = gpus();
        let one = |grants| assignment("n1", grants);
        let h = holder("main", &["GPU-0::s0"]);
        let cases: Vec<(Option<String>, Holder, &str)> = vec![
            (
                None,
                h.clone(),
                "has no tessera.io/vgpu-assignment annotation",
            ),
            (Some("{".into()), h.clone(), "does not parse"),
            (
                Some(assignment(
                    "n2",
                    json!([{"uuid": "GPU-0", "memoryMiB": 1, "cores": 0}]),
                )),
                h.clone(),
                "for node n2, but the pod runs on n1",
            ),
            (
                Some(one(json!([{"uuid": "GPU-0", "memoryMiB": 1, "cores": 0}]))),
                holder("side", &["GPU-0::s0"]),
                "no entry for container \"side\"",
            ),
            (
                Some(one(json!([{"uuid": "GPU-0", "memoryMiB": 1, "cores": 0}]))),
                holder("main", &["GPU-0::s0", "GPU-1::s0"]),
                "holds 2 slot(s) but its assignment names 1 GPU(s)",
            ),
            (
                Some(one(json!([{"uuid": "GPU-9", "memoryMiB": 1, "cores": 0}]))),
                h.clone(),
                "GPU GPU-9 of the assignment is not a split-mode GPU",
            ),
            (
                Some(one(json!([{"uuid": "GPU-2", "memoryMiB": 1, "cores": 0}]))),
                h.clone(),
                "GPU GPU-2 of the assignment is unhealthy",
            ),
            (
                Some(one(json!([
                    {"uuid": "GPU-0", "memoryMiB": 1, "cores": 0},
                    {"uuid": "GPU-0", "memoryMiB": 1, "cores": 0}
                ]))),
                holder("main", &["GPU-0::s0", "GPU-0::s1"]),
                "names GPU GPU-0 twice",
            ),
            (
                Some(one(
                    json!([{"uuid": "GPU-0", "memoryMiB": 90000, "cores": 0}]),
                )),
                h.clone(),
                "gives 90000 MiB of GPU GPU-0, which has 81920 MiB",
            ),
            (
                Some(one(json!([{"uuid": "GPU-0", "memoryMiB": 0, "cores": 0}]))),
                h.clone(),
                "gives 0 MiB",
            ),
            (
                Some(one(
                    json!([{"uuid": "GPU-0", "memoryMiB": 1, "cores": 101}]),
                )),
                h.clone(),
                "gives 101 % of the SMs",
            ),
        ];
        for (annotation, holder, want) in cases {
            let e = bind(&holder, annotation.as_deref(), Some(&whole()), "n1", &g).unwrap_err();
            assert!(e.to_string().contains(want), "{want:?} not in {e}");
        }
        let e = bind(&h, None, None, "n1", &g).unwrap_err();
        assert!(e.to_string().contains("asks for no vGPU"), "{e}");
    }

    #[test]
    fn a_forged_assignment_cannot_give_more_than_the_container_asks() {
        let g = gpus();
        let h = holder("main", &["GPU-0::s0"]);
        let grant = |memory: u64, cores: u32| {
            assignment(
                "n1",
                json!([{"uuid": "GPU-0", "memoryMiB": memory, "cores": cores}]),
            )
        };
        let bind_with = |a: String, r: ContainerRequest| bind(&h, Some(&a), Some(&r), "n1", &g);
        // Asked 10240 MiB and 30 %: more memory, or no SM limit (0), is refused.
        let asked = asks(MemoryRequest::Mib(10240), 30);
        let e = bind_with(grant(20480, 30), asked.clone()).unwrap_err();
        assert!(
            e.to_string()
                .contains("gives 20480 MiB on GPU GPU-0, but the container asks for 10240 MiB"),
            "{e}"
        );
        let e = bind_with(grant(10240, 0), asked.clone()).unwrap_err();
        assert!(e.to_string().contains("gives 0 % of the SMs"), "{e}");
        assert!(bind_with(grant(10240, 30), asked).is_ok());
        // A percentage is of the GPU the container lands on.
        let quarter = asks(MemoryRequest::Percent(25), 0);
        assert!(bind_with(grant(20480, 0), quarter.clone()).is_ok());
        assert!(bind_with(grant(20481, 0), quarter).is_err());
    }
}
