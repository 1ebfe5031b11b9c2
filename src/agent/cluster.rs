//! The agent's two touches of the API server, both optional (the agent runs without a
//! cluster): watching its own Node for the `tessera.io/config` label, and recording an
//! Event on the Node when a layout config is rejected or a GPU cannot move between the
//! kubelet paths because it is in use.
//!
//! ```text
//! GET node ──▶ label ──▶ send if changed ──▶ WATCH node (fieldSelector name=…) from its
//!    ▲                                        resourceVersion; each Added/Modified ─┐
//!    └──────────── stream ended / error: backoff 1 s … 30 s ◀──────────────────────┘
//! ```

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::EventRecorder;
use crate::partition::config::CONFIG_LABEL;
use crate::retry::Backoff;

/// Keep `tx` set to the Node's `tessera.io/config` label (None: no label) until `cancel`.
pub async fn watch_config_label(
    client: Client,
    node: String,
    tx: watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut backoff = Backoff::doubling(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        let round = async {
            let n = nodes.get(&node).await?;
            publish(&tx, &n);
            let version = n.metadata.resource_version.clone().unwrap_or_default();
            let wp = WatchParams::default()
                .fields(&format!("metadata.name={node}"))
                .timeout(290);
            let mut stream = Box::pin(nodes.watch(&wp, &version).await?);
            while let Some(event) = stream.try_next().await? {
                match event {
                    WatchEvent::Added(n) | WatchEvent::Modified(n) => publish(&tx, &n),
                    WatchEvent::Error(e) => {
                        debug!(error = %e.message, "node watch ended by the API server");
                        break;
                    }
                    _ => {}
                }
            }
            Ok::<(), kube::Error>(())
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            result = round => match result {
                Ok(()) => backoff.reset(),
                Err(e) => {
                    warn!(%node, error = %e, "cannot read this node's labels; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
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

/// Records rejected configs as `events.k8s.io/v1` Events on the Node (and in the log).
pub struct KubeEventRecorder {
    client: Client,
    node: String,
    runtime: tokio::runtime::Handle,
}

impl KubeEventRecorder {
    /// Must be created inside the agent's runtime.
    pub fn new(client: Client, node: String) -> Self {
        Self {
            client,
            node,
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

/// The Event a rejected config produces (pure; tested on its own).
pub fn config_rejected_event(
    node: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    node_event(node, "ConfigRejected", "ReloadConfig", message, now)
}

/// The Event of a GPU that stays on its kubelet path because it is in use.
pub fn gpu_move_blocked_event(
    node: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    node_event(node, "GpuMoveBlocked", "MoveGpu", message, now)
}

/// The Event of a GPU whose move off the DRA driver waits long (on neither path).
pub fn gpu_move_stalled_event(
    node: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    node_event(node, "GpuMoveStalled", "MoveGpu", message, now)
}

/// The Event of a pod using more of a GPU than its vGPU slices allow.
pub fn vgpu_over_limit_event(
    node: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    node_event(node, "VgpuOverLimit", "GuardVgpuLimits", message, now)
}

/// The Event of another device plugin competing with Tessera's on the node.
pub fn device_plugin_conflict_event(
    node: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    node_event(
        node,
        "DevicePluginConflict",
        "RegisterDevicePlugin",
        message,
        now,
    )
}

/// A Warning Event about the Node.
fn node_event(
    node: &str,
    reason: &str,
    action: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    warning_event(
        node,
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            uid: Some(node.to_string()),
            ..Default::default()
        },
        format!("{node}.tessera-config-"),
        "default",
        (reason, action, message),
        now,
    )
}

/// A Warning Event about a pod on this node (in the pod's namespace, as the API server
/// requires).
pub fn pod_event(
    node: &str,
    pod: &ObjectReference,
    reason: &str,
    action: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    let namespace = pod.namespace.clone().unwrap_or_default();
    let prefix = format!("{}.tessera-", pod.name.as_deref().unwrap_or("pod"));
    warning_event(
        node,
        pod.clone(),
        prefix,
        &namespace,
        (reason, action, message),
        now,
    )
}

fn warning_event(
    node: &str,
    regarding: ObjectReference,
    generate_name: String,
    namespace: &str,
    (reason, action, message): (&str, &str, &str),
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    // The API server caps `note` at 1 kB.
    let note: String = message.chars().take(1000).collect();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(action.into()),
        reason: Some(reason.into()),
        note: Some(note),
        type_: Some("Warning".into()),
        reporting_controller: Some("tessera.io/node-agent".into()),
        reporting_instance: Some(format!("tessera-node-{node}")),
        regarding: Some(regarding),
        ..Default::default()
    }
}

impl KubeEventRecorder {
    fn post(&self, event: Event) {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        self.runtime.spawn(async move {
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                warn!(error = %e, reason = ?event.reason, "cannot record an Event on the Node");
            }
        });
    }
}

impl EventRecorder for KubeEventRecorder {
    fn config_rejected(&self, message: &str) {
        super::LogRecorder.config_rejected(message);
        let now = k8s_openapi::jiff::Timestamp::now();
        self.post(config_rejected_event(&self.node, message, now));
    }

    fn gpu_move_blocked(&self, message: &str) {
        super::LogRecorder.gpu_move_blocked(message);
        let now = k8s_openapi::jiff::Timestamp::now();
        self.post(gpu_move_blocked_event(&self.node, message, now));
    }

    fn gpu_move_stalled(&self, message: &str) {
        super::LogRecorder.gpu_move_stalled(message);
        let now = k8s_openapi::jiff::Timestamp::now();
        self.post(gpu_move_stalled_event(&self.node, message, now));
    }

    fn device_plugin_conflict(&self, message: &str) {
        super::LogRecorder.device_plugin_conflict(message);
        let now = k8s_openapi::jiff::Timestamp::now();
        self.post(device_plugin_conflict_event(&self.node, message, now));
    }

    fn vgpu_over_limit(&self, message: &str) {
        super::LogRecorder.vgpu_over_limit(message);
        let now = k8s_openapi::jiff::Timestamp::now();
        self.post(vgpu_over_limit_event(&self.node, message, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_the_node_and_truncates_the_note() {
        let long = "x".repeat(5000);
        let e = config_rejected_event("gpu-7", &long, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        assert_eq!(e.note.as_ref().unwrap().len(), 1000);
        let r = e.regarding.unwrap();
        assert_eq!(r.kind.as_deref(), Some("Node"));
        assert_eq!(r.name.as_deref(), Some("gpu-7"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reason.as_deref(), Some("ConfigRejected"));
        let b = gpu_move_blocked_event(
            "gpu-7",
            "GPU 2 stays",
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        assert_eq!(b.reason.as_deref(), Some("GpuMoveBlocked"));
        assert_eq!(b.note.as_deref(), Some("GPU 2 stays"));
        assert_eq!(b.regarding.unwrap().name.as_deref(), Some("gpu-7"));
        let s = gpu_move_stalled_event(
            "gpu-7",
            "GPU 1 waits",
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.reason.as_deref(), Some("GpuMoveStalled"));
        assert_eq!(s.type_.as_deref(), Some("Warning"));
    }
}
