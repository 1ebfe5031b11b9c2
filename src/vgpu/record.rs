//! The records the node agent and the scheduler extender exchange through annotations,
//! and their encoding. Shared by both sides (the agent writes what the extender reads,
//! and the other way round), so it lives here, below both.
//!
//! - on a Node, written by the agent: [`DEVICES_ANNOTATION`], the JSON list of the
//!   node's split-mode GPUs ([`DeviceRecord`]), and [`HEARTBEAT_ANNOTATION`], the
//!   RFC 3339 time the agent last confirmed it;
//! - on a Pod, written by the extender's bind: [`ASSIGNMENT_ANNOTATION`], per container
//!   the GPUs and the memory and cores on each ([`AssignmentRecord`]).
//!
//! **Versioning.** Readers ignore fields they do not know, so a newer writer may add an
//! optional field (as `nvlinkPeers` was added) without an older reader refusing the
//! record and taking the node's GPUs out of scheduling. A change an older reader must
//! not misread (a field whose absence would change the meaning, a unit changed) goes
//! under a new annotation name (`tessera.io/vgpu-devices-v2`), so an older reader sees
//! no record rather than a wrong one. The records are written by programs, not people,
//! so the typo check `deny_unknown_fields` gives elsewhere buys nothing here.
//!
//! Pure: serde and plain types; the time is passed in.

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::books::{Assignment, ContainerAssignment, GpuRecord, Grant};

/// Node annotation: the node's split-mode GPUs (JSON list of [`DeviceRecord`]).
pub const DEVICES_ANNOTATION: &str = "tessera.io/vgpu-devices";
/// Node annotation: when the agent last confirmed the devices (RFC 3339).
pub const HEARTBEAT_ANNOTATION: &str = "tessera.io/vgpu-heartbeat";
/// Pod annotation: the pod's vGPU assignment (JSON [`AssignmentRecord`]).
pub const ASSIGNMENT_ANNOTATION: &str = "tessera.io/vgpu-assignment";

/// One GPU as the agent publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    pub uuid: String,
    pub model: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Streaming multiprocessors, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<u32>,
    /// vGPUs the GPU may hold at once (the split count).
    pub slots: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// UUIDs of the GPUs this one reaches over NVLink (each once), when it has any.
    /// Published for topology-aware placement; the books do not read it yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<String>,
    pub healthy: bool,
}

impl From<DeviceRecord> for GpuRecord {
    fn from(d: DeviceRecord) -> GpuRecord {
        GpuRecord {
            uuid: d.uuid,
            model: d.model,
            memory_mib: d.memory_mib,
            sm_count: d.sms,
            slots: d.slots,
            numa: d.numa,
            healthy: d.healthy,
        }
    }
}

/// Read the value of [`DEVICES_ANNOTATION`].
pub fn parse_devices(text: &str) -> serde_json::Result<Vec<DeviceRecord>> {
    serde_json::from_str(text)
}

/// The value of [`DEVICES_ANNOTATION`] for `devices` (in the order given).
pub fn encode_devices(devices: &[DeviceRecord]) -> String {
    // A Vec of plain structs with string keys always serializes.
    serde_json::to_string(devices).unwrap_or_else(|_| "[]".to_string())
}

/// The value of [`HEARTBEAT_ANNOTATION`] for `at` (RFC 3339, UTC, whole seconds).
pub fn encode_heartbeat(at: Timestamp) -> String {
    Timestamp::from_second(at.as_second())
        .unwrap_or(at)
        .to_string()
}

/// Read the value of [`HEARTBEAT_ANNOTATION`].
pub fn parse_heartbeat(text: &str) -> Result<Timestamp, String> {
    text.parse::<Timestamp>()
        .map_err(|e| format!("{text:?} is not RFC 3339 ({e})"))
}

/// One vGPU of a container, as recorded on the pod.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGrant {
    pub uuid: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// % of the GPU's SMs.
    pub cores: u32,
}

/// One container's vGPUs, as recorded on the pod.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ContainerRecord {
    pub name: String,
    pub devices: Vec<DeviceGrant>,
}

/// The pod's assignment annotation.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct AssignmentRecord {
    pub node: String,
    pub containers: Vec<ContainerRecord>,
}

impl AssignmentRecord {
    /// The record of `assignment`.
    pub fn of(assignment: &Assignment) -> AssignmentRecord {
        AssignmentRecord {
            node: assignment.node.clone(),
            containers: assignment
                .containers
                .iter()
                .map(|c| ContainerRecord {
                    name: c.container.clone(),
                    devices: c
                        .grants
                        .iter()
                        .map(|g| DeviceGrant {
                            uuid: g.uuid.clone(),
                            memory_mib: g.memory_mib,
                            cores: g.cores,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The assignment of pod `pod_uid` this record describes.
    pub fn assignment(self, pod_uid: &str) -> Assignment {
        Assignment {
            pod_uid: pod_uid.to_string(),
            node: self.node,
            containers: self
                .containers
                .into_iter()
                .map(|c| ContainerAssignment {
                    container: c.name,
                    grants: c
                        .devices
                        .into_iter()
                        .map(|d| Grant {
                            uuid: d.uuid,
                            memory_mib: d.memory_mib,
                            cores: d.cores,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> DeviceRecord {
        DeviceRecord {
            uuid: "GPU-0".into(),
            model: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 81_920,
            sms: Some(108),
            slots: 10,
            numa: Some(0),
            nvlink_peers: vec!["GPU-1".into()],
            healthy: true,
        }
    }

    #[test]
    fn devices_round_trip_with_the_documented_field_names() {
        let text = encode_devices(&[a100()]);
        assert_eq!(
            text,
            r#"[{"uuid":"GPU-0","model":"NVIDIA A100-SXM4-80GB","memoryMiB":81920,"sms":108,"slots":10,"numa":0,"nvlinkPeers":["GPU-1"],"healthy":true}]"#
        );
        assert_eq!(parse_devices(&text).expect("readable"), vec![a100()]);
        // Optional fields are left out when unknown, and read back as unknown.
        let bare = DeviceRecord {
            sms: None,
            numa: None,
            nvlink_peers: Vec::new(),
            ..a100()
        };
        let text = encode_devices(std::slice::from_ref(&bare));
        assert!(
            !text.contains("sms") && !text.contains("nvlinkPeers"),
            "{text}"
        );
        assert_eq!(parse_devices(&text).expect("readable"), vec![bare]);
    }

    #[test]
    fn a_newer_writers_optional_fields_are_ignored_a_missing_required_one_is_not() {
        let newer = r#"[{"uuid":"GPU-0","model":"A100","memoryMiB":40960,"slots":4,
            "healthy":true,"mig":{"enabled":false},"eccErrors":0}]"#;
        let read = parse_devices(newer).expect("unknown fields are ignored");
        assert_eq!(read[0].slots, 4);
        let broken = r#"[{"uuid":"GPU-0","model":"A100","memoryMiB":40960,"healthy":true}]"#;
        let e = parse_devices(broken).expect_err("slots is required");
        assert!(e.to_string().contains("slots"), "{e}");
        let newer_pod = r#"{"node":"n1","containers":[{"name":"main","devices":[
            {"uuid":"GPU-0","memoryMiB":1024,"cores":10,"numa":0}]}],"policy":"spread"}"#;
        let read: AssignmentRecord = serde_json::from_str(newer_pod).expect("tolerant");
        assert_eq!(read.containers[0].devices[0].memory_mib, 1024);
    }

    #[test]
    fn heartbeats_are_whole_seconds_in_utc_and_read_back() {
        let at: Timestamp = "2026-12-01T10:00:00.734Z".parse().expect("RFC 3339");
        let text = encode_heartbeat(at);
        assert_eq!(text, "2026-12-01T10:00:00Z");
        assert_eq!(
            parse_heartbeat(&text),
            Ok("2026-12-01T10:00:00Z".parse().expect("RFC 3339"))
        );
        let e = parse_heartbeat("yesterday").expect_err("not a time");
        assert!(e.contains("not RFC 3339"), "{e}");
    }
}
