//! Another device plugin beside Tessera's on the same node: NVIDIA's device plugin, HAMi,
//! or any plugin that advertises this node's GPUs or registers a resource Tessera
//! registers (`nvidia.com/gpu`). The kubelet keeps one endpoint per resource name, the
//! last to register, so two plugins for one resource take it from each other, and two
//! plugins advertising the same GPUs under different names hand one GPU out twice.
//!
//! Two signals, both read from what the kubelet already keeps on the node:
//! - the sockets in `<kubelet-dir>/device-plugins/`: every live socket that is neither the
//!   kubelet's (`kubelet.sock`) nor Tessera's (`tessera-*.sock`) is another plugin; it is
//!   dialed and asked for its device list (`ListAndWatch`, first answer only), whose IDs
//!   are compared with this node's GPU UUIDs. A socket nobody listens on (left
//!   over by a plugin that died) is ignored;
//! - the device manager's checkpoint `<kubelet-dir>/device-plugins/kubelet_internal_checkpoint`
//!   (JSON: `Data.RegisteredDevices`, resource name → device IDs, rewritten by the kubelet
//!   on each device list it gets): the resource whose registered IDs are the other
//!   plugin's names the resource that plugin registered.
//!
//! [`watch`] scans periodically and reports each conflict once while it lasts: an error
//! log, a Warning Event on the Node ([`crate::agent::EventRecorder::device_plugin_conflict`])
//! and the gauge `tessera_device_plugin_conflicts`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::registration::{connect_unix, socket_name};
use crate::proto::deviceplugin as pb;
use crate::proto::deviceplugin::device_plugin_client::DevicePluginClient;

/// The device manager's checkpoint file in the device-plugin directory.
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// The kubelet's registration socket.
const KUBELET_SOCKET: &str = "kubelet.sock";
/// Largest checkpoint read (a node with thousands of pods stays far below).
const MAX_CHECKPOINT: u64 = 16 << 20;
/// How long another plugin has to answer: dial plus its first device list.
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kubelet checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kubelet checkpoint {path} is larger than {MAX_CHECKPOINT} bytes")]
    TooLarge { path: PathBuf },
    #[error("the kubelet checkpoint {path} is not the device manager's JSON: {reason}")]
    Format { path: PathBuf, reason: String },
}

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered_devices: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// The kubelet's registered devices per resource name, from its checkpoint; an empty map
/// when the file does not exist (no plugin has registered since the kubelet started).
pub fn registered_devices(path: &Path) -> Result<BTreeMap<String, BTreeSet<String>>, Error> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(Error::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut text = Vec::new();
    file.take(MAX_CHECKPOINT + 1)
        .read_to_end(&mut text)
        .map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if text.len() as u64 > MAX_CHECKPOINT {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
        });
    }
    // The error names the position only, never the file's content.
    let cp: Checkpoint = serde_json::from_slice(&text).map_err(|e| Error::Format {
        path: path.to_path_buf(),
        reason: format!(
            "line {} column {}: {:?}",
            e.line(),
            e.column(),
            e.classify()
        ),
    })?;
    Ok(cp
        .data
        .registered_devices
        .unwrap_or_default()
        .into_iter()
        .map(|(r, ids)| (r, ids.unwrap_or_default().into_iter().collect()))
        .collect())
}

/// Socket files in `plugin_dir` that belong neither to the kubelet nor to Tessera.
pub fn foreign_sockets(plugin_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    for entry in std::fs::read_dir(plugin_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == KUBELET_SOCKET || name.starts_with("tessera-") {
            continue;
        }
        if entry.file_type()?.is_socket() {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// The device IDs a plugin advertises: its first `ListAndWatch` answer. `None` when
/// nothing answers on the socket within [`DIAL_TIMEOUT`] (a stale socket, or not a
/// device plugin).
pub async fn advertised(socket: &Path) -> Option<Vec<String>> {
    let ask = async {
        let channel = connect_unix(socket, DIAL_TIMEOUT).await.ok()?;
        let mut client = DevicePluginClient::new(channel);
        let mut stream = client.list_and_watch(pb::Empty {}).await.ok()?.into_inner();
        let first = stream.message().await.ok()??;
        Some(first.devices.into_iter().map(|d| d.id).collect())
    };
    tokio::time::timeout(DIAL_TIMEOUT, ask).await.ok().flatten()
}

/// One other plugin in conflict with Tessera.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// Its socket's file name, e.g. `nvidia-gpu.sock`.
    pub socket: String,
    /// The resource it registered, when the kubelet's checkpoint tells.
    pub resource: Option<String>,
    /// Whether Tessera registers that resource too (its socket is present).
    pub same_resource: bool,
    /// This node's GPU UUIDs found in its device IDs.
    pub shared_gpus: Vec<String>,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "another device plugin (socket {})", self.socket)?;
        if let Some(r) = &self.resource {
            write!(f, " registered {r}")?;
            if self.same_resource {
                write!(
                    f,
                    ", which Tessera registers too: the kubelet keeps only the last registration"
                )?;
            }
        }
        if !self.shared_gpus.is_empty() {
            let n = self.shared_gpus.len();
            let first = &self.shared_gpus[0];
            write!(
                f,
                "; it advertises {n} GPU(s) Tessera also serves ({first}{})",
                if n > 1 { ", ..." } else { "" }
            )?;
        }
        write!(
            f,
            "; run one GPU device plugin per node (docs/migrate-from-nvidia.md, docs/migrate-from-hami.md)"
        )
    }
}

/// The plugins beside Tessera's in `plugin_dir` that register a resource Tessera
/// registers or advertise one of `gpu_ids` (this node's GPU UUIDs). Plugins for
/// other hardware are not conflicts and are left out.
pub async fn scan(plugin_dir: &Path, gpu_ids: &[String]) -> Vec<Conflict> {
    let sockets = match foreign_sockets(plugin_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(dir = %plugin_dir.display(), error = %e,
                            "cannot list the device-plugin directory");
            return Vec::new();
        }
    };
    if sockets.is_empty() {
        return Vec::new();
    }
    let registered = registered_devices(&plugin_dir.join(CHECKPOINT)).unwrap_or_else(|e| {
        tracing::debug!(error = %e, "kubelet checkpoint not used");
        BTreeMap::new()
    });
    let mut out = Vec::new();
    for socket in sockets {
        let Some(ids) = advertised(&socket).await else {
            continue;
        };
        let name = socket
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let resource = resource_of(&registered, &ids);
        let same_resource = resource
            .as_deref()
            .is_some_and(|r| plugin_dir.join(socket_name(r)).exists());
        let shared_gpus: Vec<String> = gpu_ids
            .iter()
            .filter(|g| ids.iter().any(|id| id.contains(g.as_str())))
            .cloned()
            .collect();
        if same_resource || !shared_gpus.is_empty() {
            out.push(Conflict {
                socket: name,
                resource,
                same_resource,
                shared_gpus,
            });
        }
    }
    out
}

/// The resource whose registered device IDs are exactly `ids` (the plugin that
/// advertises them is the one the kubelet holds for it).
fn resource_of(registered: &BTreeMap<String, BTreeSet<String>>, ids: &[String]) -> Option<String> {
    if ids.is_empty() {
        return None;
    }
    let ids: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    registered
        .iter()
        .find(|(_, reg)| reg.len() == ids.len() && reg.iter().all(|r| ids.contains(r.as_str())))
        .map(|(r, _)| r.clone())
}

/// Where [`watch`] reports.
pub trait ConflictSink: Send + Sync {
    /// A conflict seen for the first time (or again after it went away).
    fn conflict(&self, conflict: &Conflict);
    /// How many conflicts the last scan found.
    fn current(&self, count: usize);
}

/// Scans `plugin_dir` every `interval` until `cancel`, reporting each conflict once while
/// it lasts.
pub async fn watch(
    plugin_dir: PathBuf,
    gpu_ids: Vec<String>,
    sink: Arc<dyn ConflictSink>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut known: BTreeSet<(String, Option<String>)> = BTreeSet::new();
    loop {
        let found = scan(&plugin_dir, &gpu_ids).await;
        sink.current(found.len());
        let now: BTreeSet<(String, Option<String>)> = found
            .iter()
            .map(|c| (c.socket.clone(), c.resource.clone()))
            .collect();
        for c in &found {
            if !known.contains(&(c.socket.clone(), c.resource.clone())) {
                sink.conflict(c);
            }
        }
        known = now;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Reports to the log, the Node's Events and the agent's metrics.
pub struct AgentSink {
    pub recorder: Arc<dyn crate::agent::EventRecorder>,
    pub metrics: Arc<crate::metrics::NodeMetrics>,
}

impl ConflictSink for AgentSink {
    fn conflict(&self, conflict: &Conflict) {
        self.recorder.device_plugin_conflict(&conflict.to_string());
    }

    fn current(&self, count: usize) {
        self.metrics
            .device_plugin_conflicts
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

/// This node's GPU UUIDs, what another plugin's device IDs are compared with (NVIDIA's
/// plugin names whole GPUs, and their time-sliced replicas, after them).
pub fn node_gpu_ids(inventory: &crate::gpu::Inventory) -> Vec<String> {
    inventory.gpus.iter().map(|g| g.uuid.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_registered_devices_of_a_real_checkpoint_layout() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(CHECKPOINT);
        std::fs::write(
            &p,
            r#"{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c",
            "ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-a"]},"AllocResp":"Cg=="}],
            "RegisteredDevices":{"nvidia.com/gpu":["GPU-a","GPU-b"],"example.com/nic":null}},
            "Checksum":1234}"#,
        )
        .unwrap();
        let r = registered_devices(&p).unwrap();
        assert_eq!(
            r["nvidia.com/gpu"],
            ["GPU-a", "GPU-b"].map(String::from).into_iter().collect()
        );
        assert!(r["example.com/nic"].is_empty());
        assert!(registered_devices(&dir.path().join("none"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_bad_checkpoint_is_named_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(CHECKPOINT);
        std::fs::write(&p, "root:x:0:0:secret-line").unwrap();
        let e = registered_devices(&p).unwrap_err().to_string();
        assert!(e.contains(CHECKPOINT), "{e}");
        assert!(!e.contains("secret-line"), "{e}");
    }

    #[test]
    fn only_sockets_of_other_plugins_are_foreign() {
        let dir = tempfile::tempdir().unwrap();
        let keep = [
            "kubelet.sock",
            "tessera-nvidia.com-gpu.sock",
            "nvidia-gpu.sock",
        ];
        let _listeners: Vec<_> = keep
            .iter()
            .map(|n| std::os::unix::net::UnixListener::bind(dir.path().join(n)).unwrap())
            .collect();
        std::fs::write(dir.path().join(CHECKPOINT), "{}").unwrap();
        std::fs::write(dir.path().join("not-a-socket.sock"), "").unwrap();
        let f = foreign_sockets(dir.path()).unwrap();
        assert_eq!(f, vec![dir.path().join("nvidia-gpu.sock")]);
    }

    #[test]
    fn the_resource_is_the_one_whose_registered_ids_match() {
        let reg: BTreeMap<String, BTreeSet<String>> = [
            ("nvidia.com/gpu".to_string(), ["GPU-a::0", "GPU-a::1"]),
            ("example.com/x".to_string(), ["x0", "x1"]),
        ]
        .into_iter()
        .map(|(r, ids)| (r, ids.map(String::from).into_iter().collect()))
        .collect();
        let ids = ["GPU-a::1", "GPU-a::0"].map(String::from);
        assert_eq!(resource_of(&reg, &ids).as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(resource_of(&reg, &ids[..1]), None);
        assert_eq!(resource_of(&reg, &[]), None);
    }

    #[test]
    fn the_message_names_socket_resource_and_gpu() {
        let c = Conflict {
            socket: "nvidia-gpu.sock".into(),
            resource: Some("nvidia.com/gpu".into()),
            same_resource: true,
            shared_gpus: vec!["GPU-1".into(), "GPU-2".into()],
        };
        let m = c.to_string();
        for want in [
            "nvidia-gpu.sock",
            "registered nvidia.com/gpu",
            "Tessera registers too",
            "2 GPU(s)",
            "GPU-1",
        ] {
            assert!(m.contains(want), "{m}");
        }
    }
}
