//! The agent's two touches of the API server, both optional (the agent runs without a
//! cluster): watching its own Node for the `tessera.io/config` label, and recording an
//! Event on the Node when a layout config is rejected or a GPU cannot move between the
//! kubelet paths because it is in use.
//!
//! The label watch is kube-runtime's `watch_object` (a LIST and WATCH of the one Node by
//! field selector, resumed, re-LISTed after 410, with the watcher's default backoff on
//! errors); each version of the Node publishes its label when it changed. A Node that is
//! not found keeps the label last seen (the kubelet registers it again).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use std::collections::HashMap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::EventRecorder;
use crate::partition::config::CONFIG_LABEL;

/// Keep `tx` set to the Node's `tessera.io/config` label (None: no label) until `cancel`.
pub async fn watch_config_label(
    client: Client,
    node: String,
    tx: watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let versions = watcher::watch_object(nodes, &node).default_backoff();
    futures::pin_mut!(versions);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            next = versions.next() => next,
        };
        match next {
            Some(Ok(Some(n))) => publish(&tx, &n),
            Some(Ok(None)) => debug!(%node, "this node is not found; its last label stays"),
            Some(Err(e)) => warn!(%node, error = %e, "cannot read this node's labels; retrying"),
            None => return,
        }
    }
}

fn publish(tx: &watch::Sender<Option<String>>, node: &Node) {
    let label = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONFIG_LABEL))
        .cloned();
    tx.send_if_modified(|cur| {
        if *cur != label {
            *cur = label;
            true
        } else {
            false
        }
    });
}

/// Records the agent's warnings as `events.k8s.io/v1` Events on the Node (and in the
/// log), through kube-runtime's event recorder: the same warning (reason and note)
/// repeated within the recorder's window (6 min) becomes one Event whose `series` counts
/// the repeats (a PATCH), not a new object each time. kube-runtime keys repeats without
/// the note, so a new message would be counted as a repeat of the old one's text: each
/// distinct (reason, note) gets a recorder of its own.
pub struct KubeEventRecorder {
    client: Client,
    node: String,
    recorders: std::sync::Mutex<HashMap<(String, Option<String>), Recorder>>,
    runtime: tokio::runtime::Handle,
}

/// Distinct warnings whose recorders are kept (then they start afresh).
const RECORDERS_KEPT: usize = 256;

/// The recorder the agent on `node` writes Events with.
pub fn agent_recorder(client: Client, node: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "tessera.io/node-agent".into(),
            instance: Some(format!("tessera-node-{node}")),
        },
    )
}

impl KubeEventRecorder {
    /// Must be created inside the agent's runtime.
    pub fn new(client: Client, node: String) -> Self {
        Self {
            client,
            node,
            recorders: Default::default(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn recorder_for(&self, event: &Event) -> Recorder {
        // A panic elsewhere while holding the lock leaves plain data behind: keep going.
        let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
        if recorders.len() >= RECORDERS_KEPT {
            recorders.clear();
        }
        recorders
            .entry((event.reason.clone(), event.note.clone()))
            .or_insert_with(|| agent_recorder(self.client.clone(), &self.node))
            .clone()
    }

    fn post(&self, event: Event) {
        let (recorder, node) = (self.recorder_for(&event), node_reference(&self.node));
        self.runtime.spawn(async move {
            if let Err(e) = recorder.publish(&event, &node).await {
                warn!(error = %e, reason = %event.reason, "cannot record an Event on the Node");
            }
        });
    }
}

/// The Node as an Event's `regarding` (a cluster-scoped object: its Events go to the
/// `default` namespace).
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}

/// The Event a rejected config produces (pure; tested on its own).
pub fn config_rejected_event(message: &str) -> Event {
    warning("ConfigRejected", "ReloadConfig", message)
}

/// The Event of a GPU that stays on its kubelet path because it is in use.
pub fn gpu_move_blocked_event(message: &str) -> Event {
    warning("GpuMoveBlocked", "MoveGpu", message)
}

/// The Event of a GPU whose move off the DRA driver waits long (on neither path).
pub fn gpu_move_stalled_event(message: &str) -> Event {
    warning("GpuMoveStalled", "MoveGpu", message)
}

/// The Event of a pod using more of a GPU than its vGPU slices allow.
pub fn vgpu_over_limit_event(message: &str) -> Event {
    warning("VgpuOverLimit", "GuardVgpuLimits", message)
}

/// The Event of another device plugin competing with Tessera's on the node.
pub fn device_plugin_conflict_event(message: &str) -> Event {
    warning("DevicePluginConflict", "RegisterDevicePlugin", message)
}

/// A Warning Event (`note` capped at the API server's 1 kB).
pub fn warning(reason: &str, action: &str, message: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    }
}

impl EventRecorder for KubeEventRecorder {
    fn config_rejected(&self, message: &str) {
        super::LogRecorder.config_rejected(message);
        self.post(config_rejected_event(message));
    }

    fn gpu_move_blocked(&self, message: &str) {
        super::LogRecorder.gpu_move_blocked(message);
        self.post(gpu_move_blocked_event(message));
    }

    fn gpu_move_stalled(&self, message: &str) {
        super::LogRecorder.gpu_move_stalled(message);
        self.post(gpu_move_stalled_event(message));
    }

    fn device_plugin_conflict(&self, message: &str) {
        super::LogRecorder.device_plugin_conflict(message);
        self.post(device_plugin_conflict_event(message));
    }

    fn vgpu_over_limit(&self, message: &str) {
        super::LogRecorder.vgpu_over_limit(message);
        self.post(vgpu_over_limit_event(message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_warnings_with_the_note_capped() {
        let long = "x".repeat(5000);
        let e = config_rejected_event(&long);
        assert_eq!(e.note.as_ref().unwrap().len(), 1000);
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.reason, "ConfigRejected");
        let b = gpu_move_blocked_event("GPU 2 stays");
        assert_eq!(b.reason, "GpuMoveBlocked");
        assert_eq!(b.note.as_deref(), Some("GPU 2 stays"));
        assert_eq!(
            gpu_move_stalled_event("GPU 1 waits").reason,
            "GpuMoveStalled"
        );
        let r = node_reference("gpu-7");
        assert_eq!(r.kind.as_deref(), Some("Node"));
        assert_eq!(r.name.as_deref(), Some("gpu-7"));
    }
}
