//! The node's split-mode GPUs, described for the scheduler extender on the agent's own
//! Node: [`DEVICES_ANNOTATION`] (the GPUs, [`DeviceRecord`]) and [`HEARTBEAT_ANNOTATION`]
//! (when the agent last confirmed them).
//!
//! ```text
//! Agent::publish (config applied, health flip) ─▶ records (watch) ─┐
//!                                                                  ▼
//!   next_write(desired, on the node, heartbeat due?) ─▶ Publish / Remove / nothing
//!        ▲                                                    │ merge PATCH of the Node's
//!        │  every HEARTBEAT_PERIOD; after an error 0.5 s … 30 s│ metadata.annotations
//!        └────────────────────────────────────────────────────┘
//! ```
//!
//! - a record that changed (a GPU's health, a config that changes the split GPUs) is
//!   written at once; an unchanged one is written again every heartbeat period with a
//!   fresh heartbeat ([`HEARTBEAT_PERIOD`], well inside the extender's default 60 s
//!   window, so one or two lost writes do not take the node out);
//! - a node with no split-mode GPUs carries neither annotation: the first write after
//!   the start removes any an earlier run left;
//! - API errors are retried with backoff, never fatal; without a cluster the agent does
//!   not run this at all;
//! - on shutdown nothing is written: the heartbeat goes stale and the extender takes
//!   the GPUs out of scheduling once it is older than its window. A restart (an
//!   upgrade) within the window does not disturb scheduling, and the books of the pods
//!   on the node stay as they are; removing the record at each stop would drop them.
//!
//! [`device_records`] and [`next_write`] are pure; [`keep_published`] is the I/O shell.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::gpu::watch::RetryTimer;
use crate::gpu::Inventory;
use crate::partition::layout::{Advertisement, Share};
use crate::vgpu::record::{
    encode_devices, encode_heartbeat, DeviceRecord, DEVICES_ANNOTATION, HEARTBEAT_ANNOTATION,
};

/// How often an unchanged record is confirmed (the heartbeat is renewed).
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(20);

/// Where and how often the agent publishes its record.
#[derive(Clone)]
pub struct RecordSettings {
    pub client: kube::Client,
    pub node_name: String,
    /// [`HEARTBEAT_PERIOD`] unless a test wants it shorter.
    pub heartbeat: Duration,
}

impl std::fmt::Debug for RecordSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSettings")
            .field("node_name", &self.node_name)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

/// The records of the GPUs `advertisement` lists as split-mode slots, in inventory
/// order; a GPU is healthy unless `unhealthy` names it.
pub fn device_records(
    inventory: &Inventory,
    advertisement: &Advertisement,
    unhealthy: &BTreeMap<String, String>,
) -> Vec<DeviceRecord> {
    let mut slots: BTreeMap<&str, u32> = BTreeMap::new();
    for device in advertisement.resources.iter().flat_map(|r| &r.devices) {
        if let Share::Slot { of, .. } = device.share {
            slots.insert(device.gpu_uuid.as_str(), of);
        }
    }
    inventory
        .gpus
        .iter()
        .filter_map(|gpu| {
            let slots = *slots.get(gpu.uuid.as_str())?;
            let mut peers = gpu.nvlink_peers.clone();
            peers.sort();
            peers.dedup();
            Some(DeviceRecord {
                uuid: gpu.uuid.clone(),
                model: gpu.product_name.clone(),
                memory_mib: gpu.memory_mib,
                sms: (gpu.sm_count > 0).then_some(gpu.sm_count),
                slots,
                numa: gpu.numa_node,
                nvlink_peers: peers,
                healthy: !unhealthy.contains_key(&gpu.uuid),
            })
        })
        .collect()
}

/// What the Node carries, as far as this agent knows: the devices annotation's value,
/// or `None` when it has none.
pub type OnNode = Option<String>;

/// A write of the Node's annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Set the devices annotation to `devices` and renew the heartbeat.
    Publish { devices: String },
    /// Remove both annotations.
    Remove,
}

impl Write {
    /// What the Node carries once the write is done.
    pub fn on_node(&self) -> OnNode {
        match self {
            Write::Publish { devices } => Some(devices.clone()),
            Write::Remove => None,
        }
    }

    /// The merge patch of the Node for this write, the heartbeat at `now`.
    pub fn patch(&self, now: Timestamp) -> Value {
        let (devices, heartbeat) = match self {
            Write::Publish { devices } => (json!(devices), json!(encode_heartbeat(now))),
            Write::Remove => (Value::Null, Value::Null),
        };
        json!({"metadata": {"annotations": {
            DEVICES_ANNOTATION: devices,
            HEARTBEAT_ANNOTATION: heartbeat,
        }}})
    }
}

/// The write that brings the Node to `desired`. `on_node`: what the last successful
/// write left (`None` before the first one: the Node may carry anything). An unchanged
/// record is written again only when the heartbeat is due.
pub fn next_write(
    desired: &[DeviceRecord],
    on_node: Option<&OnNode>,
    heartbeat_due: bool,
) -> Option<Write> {
    if desired.is_empty() {
        return match on_node {
            Some(None) => None,
            _ => Some(Write::Remove),
        };
    }
    let devices = encode_devices(desired);
    match on_node {
        Some(Some(current)) if *current == devices && !heartbeat_due => None,
        _ => Some(Write::Publish { devices }),
    }
}

/// Keep the Node's annotations in line with `records` (`None` until the agent has a
/// config in force: nothing is written before) until `cancel` or until the agent drops
/// the sender.
pub async fn keep_published(
    settings: RecordSettings,
    mut records: watch::Receiver<Option<Vec<DeviceRecord>>>,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(settings.client.clone());
    let node = settings.node_name.as_str();
    let mut on_node: Option<OnNode> = None;
    let mut heartbeat_at: Option<tokio::time::Instant> = None;
    let mut retry = RetryTimer::default();
    loop {
        let desired = records.borrow_and_update().clone();
        let now = tokio::time::Instant::now();
        let retry_due = retry.due().is_none_or(|at| at <= now);
        let heartbeat_due = heartbeat_at.is_some_and(|at| at <= now);
        let write = desired
            .as_deref()
            .filter(|_| retry_due)
            .and_then(|d| next_write(d, on_node.as_ref(), heartbeat_due));
        if let Some(write) = write {
            retry.start();
            match patch(&nodes, node, &write).await {
                Ok(()) => {
                    log_write(node, &write, on_node.as_ref());
                    retry.succeeded();
                    heartbeat_at = matches!(write, Write::Publish { .. })
                        .then(|| tokio::time::Instant::now() + settings.heartbeat);
                    on_node = Some(write.on_node());
                }
                Err(e) => {
                    let wait = retry.failed();
                    warn!(%node, error = %e, retry_in = ?wait,
                          "cannot write this node's vGPU record; retrying");
                }
            }
        }
        let wake = retry.due().or(heartbeat_at);
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = records.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(wake.unwrap_or(now)), if wake.is_some() => {}
        }
    }
}

async fn patch(nodes: &Api<Node>, node: &str, write: &Write) -> kube::Result<()> {
    let body = write.patch(Timestamp::now());
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(|_| ())
}

fn log_write(node: &str, write: &Write, before: Option<&OnNode>) {
    let changed = before.map(|b| *b != write.on_node()).unwrap_or(true);
    match (write, changed) {
        (Write::Publish { devices }, true) => {
            info!(%node, %devices, "vGPU record published on the Node")
        }
        (Write::Publish { .. }, false) => debug!(%node, "vGPU heartbeat renewed"),
        (Write::Remove, _) => info!(%node, "no split-mode GPUs: vGPU record removed from the Node"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;
    use crate::partition::{config, layout};

    fn records(spec: &str, yaml: &str, unhealthy: &[usize]) -> Vec<DeviceRecord> {
        let inventory = FakeBackend::from_spec(spec)
            .expect("fake spec")
            .inventory()
            .expect("inventory");
        let cfg = config::parse_config("t", yaml).expect("valid config");
        let plan = layout::plan(&inventory, &cfg).expect("plans");
        let ad = layout::advertise(&inventory, &cfg, &plan).expect("advertises");
        let sick = unhealthy
            .iter()
            .map(|i| (inventory.gpus[*i].uuid.clone(), "XID 79".to_string()))
            .collect();
        device_records(&inventory, &ad, &sick)
    }

    #[test]
    fn only_split_gpus_are_described_with_their_facts() {
        let yaml = "resources: { gpus: [ { pattern: \"*\", name: whole-gpu } ] }\n\
                    tessera: { gpus: [ { match: { index: [1, 2] }, mode: vgpu, vgpu: { split: 10 } } ] }";
        let got = records("4xA100-80GB", yaml, &[2]);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(got[0].memory_mib, 81_920);
        assert_eq!(got[0].sms, Some(108));
        assert_eq!(got[0].slots, 10);
        assert!(got[0].numa.is_some());
        assert!(got[0].healthy);
        assert!(!got[1].healthy, "GPU 2 is unhealthy");
        // NVLink peers once each, never the GPU itself.
        let mut peers = got[0].nvlink_peers.clone();
        peers.dedup();
        assert_eq!(peers, got[0].nvlink_peers);
        assert!(!got[0].nvlink_peers.is_empty(), "A100s are linked");
        assert!(!got[0].nvlink_peers.contains(&got[0].uuid));
        assert!(records("2xA100-80GB", "version: v1", &[]).is_empty());
    }

    #[test]
    fn writes_follow_changes_and_the_heartbeat() {
        let a = records(
            "1xA100-80GB",
            "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { split: 4 } } ] }",
            &[],
        );
        let text = encode_devices(&a);
        let publish = Some(Write::Publish {
            devices: text.clone(),
        });
        let mut sick = a.clone();
        sick[0].healthy = false;
        // (what, desired, on the node, heartbeat due, write)
        type Case<'a> = (
            &'a str,
            &'a [DeviceRecord],
            Option<&'a OnNode>,
            bool,
            Option<Write>,
        );
        let cases: &[Case] = &[
            ("start, split GPUs", &a, None, false, publish.clone()),
            (
                "start, none: remove a stale record",
                &[],
                None,
                false,
                Some(Write::Remove),
            ),
            ("none, already removed", &[], Some(&None), true, None),
            (
                "none any more",
                &[],
                Some(&Some(text.clone())),
                false,
                Some(Write::Remove),
            ),
            ("unchanged", &a, Some(&Some(text.clone())), false, None),
            (
                "unchanged, heartbeat due",
                &a,
                Some(&Some(text.clone())),
                true,
                publish.clone(),
            ),
            (
                "health flip",
                &sick,
                Some(&Some(text.clone())),
                false,
                Some(Write::Publish {
                    devices: encode_devices(&sick),
                }),
            ),
            ("split GPUs again", &a, Some(&None), false, publish.clone()),
        ];
        for (what, desired, on_node, due, want) in cases {
            assert_eq!(&next_write(desired, *on_node, *due), want, "{what}");
        }
    }

    #[test]
    fn the_patch_sets_or_removes_both_annotations() {
        let now: Timestamp = "2026-12-03T15:00:00.5Z".parse().expect("RFC 3339");
        let publish = Write::Publish {
            devices: "[]".into(),
        };
        assert_eq!(
            publish.patch(now),
            json!({"metadata": {"annotations": {
                "tessera.io/vgpu-devices": "[]",
                "tessera.io/vgpu-heartbeat": "2026-12-03T15:00:00Z"}}})
        );
        assert_eq!(
            Write::Remove.patch(now),
            json!({"metadata": {"annotations": {
                "tessera.io/vgpu-devices": null,
                "tessera.io/vgpu-heartbeat": null}}})
        );
    }
}
