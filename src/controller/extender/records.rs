//! The records the extender reads and writes on cluster objects, and their meaning:
//!
//! - on a Node, written by the node agent: [`DEVICES_ANNOTATION`], the JSON list of
//!   the node's vGPU-mode GPUs ([`DeviceRecord`]), and [`HEARTBEAT_ANNOTATION`], the
//!   RFC 3339 time the agent last confirmed it; a node whose heartbeat is older than
//!   the window has its GPUs taken out of scheduling ([`heartbeat_problem`]);
//! - on a Pod, written by the extender's bind before the Binding:
//!   [`ASSIGNMENT_ANNOTATION`], per container the GPUs and the memory and cores on each
//!   ([`AssignmentRecord`]). The books are rebuilt from these after a restart.
//!
//! The placement engine also weighs CPU and memory: a Node's `status.allocatable` and
//! every pod's requests on the node it runs on ([`pod_host`]), read as the scheduler
//! reads them.
//!
//! The record types and their encoding are shared with the node agent and live in
//! [`crate::vgpu::record`]; this module reads them off the objects the extender watches.
//!
//! Pure: no I/O, the time is passed in.

use crate::quota::quantity::Quantity;
use crate::vgpu::record::{parse_devices, parse_heartbeat};
use crate::vgpu::share::HostRequest;
use crate::vgpu::{Assignment, GpuRecord};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::time::Duration;

pub use crate::vgpu::record::{
    AssignmentRecord, ContainerRecord, DeviceGrant, DeviceRecord, ASSIGNMENT_ANNOTATION,
    DEVICES_ANNOTATION, HEARTBEAT_ANNOTATION,
};

/// What a Node says about its vGPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub name: String,
    /// The GPUs, or why the annotation cannot be read.
    pub gpus: Result<Vec<GpuRecord>, String>,
    /// The last heartbeat, or why there is none.
    pub heartbeat: Result<Timestamp, String>,
    /// CPU and memory the node offers pods (`status.allocatable`); `None` when it does
    /// not say (the engine then takes them as plentiful).
    pub allocatable: Option<HostRequest>,
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][key].as_str()
}

/// A Node's vGPU state; `None` when the node publishes no vGPU devices.
pub fn node_state(node: &Value) -> Option<NodeState> {
    let name = node["metadata"]["name"].as_str()?.to_string();
    let devices = annotation(node, DEVICES_ANNOTATION)?;
    let gpus = parse_devices(devices)
        .map(|list| list.into_iter().map(GpuRecord::from).collect())
        .map_err(|e| format!("{name}: annotation {DEVICES_ANNOTATION} unreadable: {e}"));
    let heartbeat = match annotation(node, HEARTBEAT_ANNOTATION) {
        None => Err(format!(
            "{name}: no {HEARTBEAT_ANNOTATION}; its GPUs are out of scheduling"
        )),
        Some(t) => {
            parse_heartbeat(t).map_err(|e| format!("{name}: annotation {HEARTBEAT_ANNOTATION} {e}"))
        }
    };
    let allocatable = &node["status"]["allocatable"];
    let allocatable = match (allocatable["cpu"].as_str(), allocatable["memory"].as_str()) {
        (Some(cpu), Some(memory)) => Some(HostRequest {
            cpu_milli: cpu_milli(cpu),
            memory_mib: memory_mib(memory),
        }),
        _ => None,
    };
    Some(NodeState {
        name,
        gpus,
        heartbeat,
        allocatable,
    })
}

/// A CPU quantity in milli-cores (0 when unreadable or negative).
fn cpu_milli(q: &str) -> u32 {
    Quantity::parse(q).map_or(0, |q| u32::try_from(q.0.max(0)).unwrap_or(u32::MAX))
}

/// A memory quantity in MiB, rounded up (0 when unreadable or negative).
fn memory_mib(q: &str) -> u64 {
    Quantity::parse(q).map_or(0, |q| {
        u64::try_from(q.0.max(0)).map_or(0, |milli| milli.div_ceil(1000 << 20))
    })
}

/// A pod as the engine counts its use of a node's CPU and memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHost {
    /// The node it is bound to (`spec.nodeName`), if any.
    pub node: Option<String>,
    /// It has finished (`Succeeded` or `Failed`): it takes nothing.
    pub finished: bool,
    /// Its CPU and memory requests.
    pub request: HostRequest,
}

impl PodHost {
    /// The node whose CPU and memory the pod takes now.
    pub fn holds(&self) -> Option<&str> {
        self.node.as_deref().filter(|_| !self.finished)
    }
}

/// A pod's UID with its use of a node's CPU and memory; `None` without a UID.
pub fn pod_host(pod: &Value) -> Option<(String, PodHost)> {
    let uid = pod["metadata"]["uid"].as_str()?.to_string();
    let host = PodHost {
        node: pod["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        finished: matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        ),
        request: host_request(&pod["spec"]),
    };
    Some((uid, host))
}

/// A pod spec's effective CPU and memory requests, as the scheduler counts them: the
/// app containers and restartable init containers (sidecars) summed, or the largest
/// plain init container if larger, plus the pod's overhead. A container's request is its
/// limit where no request is written (as the API server defaults it).
pub fn host_request(spec: &Value) -> HostRequest {
    let container = |c: &Value| {
        let resources = &c["resources"];
        let get = |name: &str| {
            resources["requests"][name]
                .as_str()
                .or_else(|| resources["limits"][name].as_str())
        };
        HostRequest {
            cpu_milli: get("cpu").map_or(0, cpu_milli),
            memory_mib: get("memory").map_or(0, memory_mib),
        }
    };
    let list = |key: &str| spec[key].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut running = HostRequest::default();
    for c in list("containers") {
        running = running.plus(container(c));
    }
    let mut init = HostRequest::default();
    for c in list("initContainers") {
        if c["restartPolicy"].as_str() == Some("Always") {
            running = running.plus(container(c));
        } else {
            let c = container(c);
            init.cpu_milli = init.cpu_milli.max(c.cpu_milli);
            init.memory_mib = init.memory_mib.max(c.memory_mib);
        }
    }
    let overhead = HostRequest {
        cpu_milli: spec["overhead"]["cpu"].as_str().map_or(0, cpu_milli),
        memory_mib: spec["overhead"]["memory"].as_str().map_or(0, memory_mib),
    };
    HostRequest {
        cpu_milli: running.cpu_milli.max(init.cpu_milli),
        memory_mib: running.memory_mib.max(init.memory_mib),
    }
    .plus(overhead)
}

/// Why the node's GPUs are out of scheduling at `now`, if they are: no heartbeat, or
/// one older than `window`.
pub fn heartbeat_problem(state: &NodeState, now: Timestamp, window: Duration) -> Option<String> {
    let at = match &state.heartbeat {
        Ok(at) => *at,
        Err(why) => return Some(why.clone()),
    };
    let age_ms = now.as_millisecond().saturating_sub(at.as_millisecond());
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    (age_ms > window_ms).then(|| {
        format!(
            "{}: vGPU agent heartbeat is {} s old (limit {} s); its GPUs are out of scheduling",
            state.name,
            age_ms / 1000,
            window.as_secs()
        )
    })
}

/// A pod's recorded assignment as the books hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAssignment {
    /// `creationTimestamp` (RFC 3339 sorts in time order): the oldest are booked first.
    pub created: String,
    pub assignment: Assignment,
    /// The pod has finished (`Succeeded` or `Failed`): it holds nothing.
    pub finished: bool,
}

/// A Pod's recorded assignment: `None` without the annotation, an error naming the
/// pod when it is unreadable.
pub fn pod_assignment(pod: &Value) -> Option<Result<PodAssignment, String>> {
    let text = annotation(pod, ASSIGNMENT_ANNOTATION)?;
    let meta = &pod["metadata"];
    let uid = meta["uid"].as_str().unwrap_or("");
    let record = serde_json::from_str::<AssignmentRecord>(text).map_err(|e| {
        format!(
            "pod {}/{}: annotation {ASSIGNMENT_ANNOTATION} unreadable: {e}",
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or("")
        )
    });
    Some(record.map(|r| PodAssignment {
        created: meta["creationTimestamp"].as_str().unwrap_or("").to_string(),
        assignment: r.assignment(uid),
        finished: matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vgpu::books::{ContainerAssignment, Grant};
    use serde_json::json;

    fn node(annotations: Value) -> Value {
        json!({"metadata": {"name": "n1", "annotations": annotations}})
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("RFC 3339")
    }

    #[test]
    fn a_node_record_reads_into_gpu_records() {
        let devices = json!([{"uuid": "GPU-0", "model": "NVIDIA A100", "memoryMiB": 40960,
            "sms": 108, "slots": 10, "numa": 0, "healthy": true}]);
        let state = node_state(&node(json!({
            DEVICES_ANNOTATION: devices.to_string(),
            HEARTBEAT_ANNOTATION: "2026-12-01T10:00:00Z"})))
        .expect("a vGPU node");
        let gpus = state.gpus.clone().expect("readable");
        assert_eq!(gpus[0].memory_mib, 40_960);
        assert_eq!(gpus[0].sm_count, Some(108));
        let window = Duration::from_secs(60);
        assert_eq!(
            heartbeat_problem(&state, at("2026-12-01T10:01:00Z"), window),
            None
        );
        assert_eq!(
            heartbeat_problem(&state, at("2026-12-01T10:01:35Z"), window).as_deref(),
            Some(
                "n1: vGPU agent heartbeat is 95 s old (limit 60 s); its GPUs are out of scheduling"
            )
        );
    }

    #[test]
    fn unreadable_or_missing_annotations_are_reasons_not_panics() {
        assert_eq!(node_state(&node(json!({}))), None);
        let state = node_state(&node(json!({DEVICES_ANNOTATION: "[{\"uuid\": 1}]",
            HEARTBEAT_ANNOTATION: "yesterday"})))
        .expect("a vGPU node");
        assert!(state.gpus.is_err());
        let why = heartbeat_problem(&state, at("2026-12-01T10:00:00Z"), Duration::from_secs(60))
            .expect("no usable heartbeat");
        assert!(why.contains("not RFC 3339"), "{why}");
        let pod = json!({"metadata": {"name": "p", "namespace": "ns",
            "annotations": {ASSIGNMENT_ANNOTATION: "{"}}});
        let err = pod_assignment(&pod)
            .expect("annotated")
            .expect_err("unreadable");
        assert!(err.starts_with("pod ns/p: annotation"), "{err}");
    }

    #[test]
    fn cpu_and_memory_are_read_as_the_scheduler_counts_them() {
        let n = json!({"metadata": {"name": "n1", "annotations": {
            DEVICES_ANNOTATION: "[]", HEARTBEAT_ANNOTATION: "2026-12-01T10:00:00Z"}},
            "status": {"allocatable": {"cpu": "63500m", "memory": "256Gi"}}});
        let state = node_state(&n).expect("a vGPU node");
        assert_eq!(
            state.allocatable,
            Some(HostRequest {
                cpu_milli: 63_500,
                memory_mib: 262_144
            })
        );
        let pod = json!({"metadata": {"uid": "u1"},
            "spec": {"nodeName": "n1",
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "1000000"}}}],
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "4", "memory": "64Mi"}}},
                    {"name": "proxy", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m"}}}],
                "overhead": {"cpu": "250m"}},
            "status": {"phase": "Running"}});
        let (uid, host) = pod_host(&pod).expect("has a UID");
        assert_eq!((uid.as_str(), host.holds()), ("u1", Some("n1")));
        // CPU: the init container's 4 beats 2 + 0.5 + 0.1; memory: 1024 + 1 (rounded up).
        assert_eq!(
            host.request,
            HostRequest {
                cpu_milli: 4_250,
                memory_mib: 1_025
            }
        );
        let mut done = pod.clone();
        done["status"]["phase"] = json!("Succeeded");
        assert_eq!(pod_host(&done).expect("has a UID").1.holds(), None);
        assert_eq!(pod_host(&json!({"metadata": {}})), None);
    }

    #[test]
    fn an_assignment_survives_the_round_trip_through_the_annotation() {
        let assignment = Assignment {
            pod_uid: "u1".into(),
            node: "n1".into(),
            containers: vec![ContainerAssignment {
                container: "main".into(),
                grants: vec![Grant {
                    uuid: "GPU-0".into(),
                    memory_mib: 10_240,
                    cores: 30,
                }],
            }],
        };
        let text = serde_json::to_string(&AssignmentRecord::of(&assignment)).expect("encodes");
        assert_eq!(
            text,
            r#"{"node":"n1","containers":[{"name":"main","devices":[{"uuid":"GPU-0","memoryMiB":10240,"cores":30}]}]}"#
        );
        let pod = json!({"metadata": {"uid": "u1", "creationTimestamp": "2026-12-01T00:00:00Z",
            "annotations": {ASSIGNMENT_ANNOTATION: text}}, "status": {"phase": "Succeeded"}});
        let read = pod_assignment(&pod).expect("annotated").expect("readable");
        assert_eq!(read.assignment, assignment);
        assert!(read.finished);
    }
}
