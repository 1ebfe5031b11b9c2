//! CDI (Container Device Interface) specs for the devices this node advertises.
//!
//! One spec file per node under `--cdi-root` (kind `tessera.io/gpu`): a device per GPU
//! (named by its UUID) and per MIG device (named by its MIG UUID), each with the device
//! nodes it needs (for a MIG device: the parent GPU's node and its GPU-instance and
//! compute-instance access nodes, see [`migcaps`]), plus the control nodes every GPU
//! container needs. The kubelet passes
//! the fully qualified names (`tessera.io/gpu=GPU-…`) from Allocate's `cdi_devices` to
//! the runtime, which applies the edits. Files are replaced with [`crate::fsio::Replace`]:
//! a new temporary file with a unique name (never one a symlink planted in the CDI
//! directory can redirect), fsynced, renamed over the spec, the directory fsynced, so a
//! runtime never reads half a spec and a power loss leaves the old or the new one.
//! [`verify_spec`] compares the spec on disk with the one the agent wrote and rewrites a
//! missing, damaged or edited one (the agent does so on SIGHUP and periodically).
//!
//! Device nodes get a `hostPath` when the NVIDIA driver's nodes are not in the host's
//! `/dev` (a driver container: `--driver-root`, see [`devroot`]); this applies to the node
//! spec and to the DRA driver's per-claim specs alike.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::gpu::Inventory;

pub mod devroot;
pub mod migcaps;

/// The CDI kind (`vendor/class`) of Tessera's devices.
pub const CDI_KIND: &str = "tessera.io/gpu";
/// The newest CDI spec version a spec of ours can need (`hostPath` on device nodes,
/// device names that start with a digit). Specs declare [`minimum_version`] instead, so
/// older CDI consumers read the ones that need less.
pub const CDI_VERSION: &str = "0.5.0";
/// What a spec without any newer field needs.
pub const CDI_VERSION_BASE: &str = "0.3.0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write CDI spec {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode CDI spec: {0}")]
    Encode(#[from] serde_json::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<CdiDevice>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty()
    }
}

/// A bind mount (`options` as mount(8) takes them, e.g. `["ro", "bind"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` for the MIG capability nodes (with `major`/`minor`, so a runtime needs no
    /// host node to create them).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
}

impl DeviceNode {
    /// A node known by its path only (the runtime stats the host's node).
    pub fn at(path: String) -> Self {
        Self {
            path,
            host_path: None,
            r#type: None,
            major: None,
            minor: None,
        }
    }
}

/// The oldest `cdiVersion` that has every field `spec` uses (the CDI rules: a device
/// node's `hostPath` or a device name starting with a digit need 0.5.0; nothing else this
/// model can express needs more than 0.3.0).
pub fn minimum_version(spec: &Spec) -> &'static str {
    let edits = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    let host_path = edits
        .flat_map(|e| &e.device_nodes)
        .any(|n| n.host_path.is_some());
    let digit_name = spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| !c.is_ascii_alphabetic()));
    if host_path || digit_name {
        CDI_VERSION
    } else {
        CDI_VERSION_BASE
    }
}

/// `spec` with `cdiVersion` set to its [`minimum_version`].
pub fn with_minimum_version(mut spec: Spec) -> Spec {
    spec.cdi_version = minimum_version(&spec).to_string();
    spec
}

/// The device nodes every CUDA container needs besides its GPUs' `/dev/nvidia<minor>`.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// Fully qualified CDI name of a device (`tessera.io/gpu=<uuid>`).
pub fn qualified_name(device: &str) -> String {
    format!("{CDI_KIND}={device}")
}

/// The spec for every GPU and MIG device in the inventory. `dev_root` is where the host's
/// `/dev` is visible to the agent (device paths in the container stay `/dev/...`).
///
/// MIG devices get their capability nodes from the driver's table at the default place
/// (`/proc/driver/nvidia-caps/mig-minors`, read only when there is a MIG device); use
/// [`node_spec_with`] to name the table.
pub fn node_spec(inventory: &Inventory, dev_root: &str) -> Spec {
    let has_mig = inventory.gpus.iter().any(|g| !g.mig_devices.is_empty());
    let caps = has_mig
        .then(|| {
            migcaps::MigCaps::load(&migcaps::MigCapsPaths::under(Path::new("/proc"), dev_root))
        })
        .and_then(|r| {
            r.map_err(
                |e| warn!(error = %e, "MIG devices in the CDI spec lack their capability nodes"),
            )
            .ok()
        });
    node_spec_with(inventory, dev_root, caps.as_ref())
}

/// [`node_spec`] with the MIG capability table given. A MIG device whose nodes cannot be
/// resolved (no table, or no entry for it) keeps only its GPU node and is logged:
/// Allocate refuses such a device with the reason, so no container gets it incomplete.
pub fn node_spec_with(
    inventory: &Inventory,
    dev_root: &str,
    caps: Option<&migcaps::MigCaps>,
) -> Spec {
    let host = |p: &str| {
        let root = dev_root.trim_end_matches('/');
        (!root.is_empty() && root != "/dev").then(|| format!("{root}{}", &p[4..]))
    };
    let node = |p: String| DeviceNode {
        host_path: host(&p),
        ..DeviceNode::at(p)
    };
    let mut devices = Vec::new();
    for gpu in &inventory.gpus {
        let gpu_node = node(format!("/dev/nvidia{}", gpu.minor));
        devices.push(CdiDevice {
            name: gpu.uuid.clone(),
            container_edits: ContainerEdits {
                env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", gpu.uuid)],
                device_nodes: vec![gpu_node.clone()],
                mounts: Vec::new(),
            },
        });
        for mig in &gpu.mig_devices {
            let mut device_nodes = vec![gpu_node.clone()];
            match caps.map(|c| c.nodes(gpu.minor, mig.gi_id, mig.ci_id)) {
                Some(Ok(nodes)) => device_nodes.extend(nodes),
                Some(Err(e)) => warn!(mig = %mig.uuid, error = %e, "no MIG capability nodes"),
                None => {}
            }
            devices.push(CdiDevice {
                name: mig.uuid.clone(),
                container_edits: ContainerEdits {
                    env: vec![format!("NVIDIA_VISIBLE_DEVICES={}", mig.uuid)],
                    device_nodes,
                    mounts: Vec::new(),
                },
            });
        }
    }
    let control = CONTROL_NODES;
    with_minimum_version(Spec {
        cdi_version: CDI_VERSION.to_string(),
        kind: CDI_KIND.to_string(),
        devices,
        container_edits: ContainerEdits {
            env: Vec::new(),
            mounts: Vec::new(),
            device_nodes: control
                .iter()
                .map(|p| DeviceNode::at(p.to_string()))
                .map(|mut n| {
                    n.host_path = host(&n.path);
                    n
                })
                .collect(),
        },
    })
}

/// Write `spec` as `<root>/<file_stem>.json`, atomically and durably; returns the path.
pub fn write_spec(root: &Path, file_stem: &str, spec: &Spec) -> Result<PathBuf> {
    let path = spec_path(root, file_stem);
    let body = serde_json::to_vec_pretty(spec)?;
    crate::fsio::Replace::durable(SPEC_MODE)
        .write(&path, &body)
        .map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// Where [`write_spec`] puts a spec.
pub fn spec_path(root: &Path, file_stem: &str) -> PathBuf {
    root.join(format!("{file_stem}.json"))
}

/// Specs are read by the container runtime (root) and by tools that list CDI devices.
const SPEC_MODE: u32 = 0o644;

/// What [`verify_spec`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// The file holds exactly `spec`.
    Intact,
    /// It did not (the reason, never the file's content) and was rewritten.
    Repaired { reason: String },
}

/// Check that `<root>/<file_stem>.json` is a regular file holding exactly `spec` (parsed,
/// not compared byte for byte); rewrite it when it is missing, not a regular file (a
/// symlink is replaced, never followed), does not parse, or differs.
pub fn verify_spec(root: &Path, file_stem: &str, spec: &Spec) -> Result<Verified> {
    let path = spec_path(root, file_stem);
    let problem = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("missing".to_string()),
        Err(e) => Some(format!("cannot be inspected ({})", e.kind())),
        Ok(m) if !m.file_type().is_file() => Some("not a regular file".to_string()),
        Ok(_) => match std::fs::read(&path) {
            Err(e) => Some(format!("cannot be read ({})", e.kind())),
            // Where it fails, never what it holds (serde's messages can quote values).
            Ok(bytes) => match serde_json::from_slice::<Spec>(&bytes) {
                Err(e) => Some(format!(
                    "not a valid CDI spec ({:?} error at line {} column {})",
                    e.classify(),
                    e.line(),
                    e.column()
                )),
                Ok(found) if found != *spec => {
                    Some("differs from the spec the agent wrote".to_string())
                }
                Ok(_) => None,
            },
        },
    };
    match problem {
        None => Ok(Verified::Intact),
        Some(reason) => {
            write_spec(root, file_stem, spec)?;
            Ok(Verified::Repaired { reason })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;

    #[test]
    fn spec_names_every_gpu_and_is_written_atomically() {
        let inv = FakeBackend::from_spec("2xA100-80GB")
            .unwrap()
            .inventory()
            .unwrap();
        let spec = node_spec(&inv, "/dev");
        assert_eq!(spec.kind, CDI_KIND);
        assert_eq!(spec.devices.len(), 2);
        assert_eq!(
            spec.devices[1].container_edits.device_nodes[0].path,
            "/dev/nvidia1"
        );
        assert_eq!(
            spec.devices[1].container_edits.device_nodes[0].host_path,
            None
        );
        let dir = tempfile::tempdir().unwrap();
        let path = write_spec(dir.path(), "tessera.io-gpu", &spec).unwrap();
        let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["tessera.io-gpu.json"], "no temporary file left");
    }

    #[test]
    fn symlinks_planted_in_the_cdi_root_are_not_followed() {
        let inv = FakeBackend::from_spec("1xL4").unwrap().inventory().unwrap();
        let spec = node_spec(&inv, "/dev");
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("shadow");
        std::fs::write(&victim, "root:secret\n").unwrap();
        let root = dir.path().join("cdi");
        std::fs::create_dir(&root).unwrap();
        // The fixed temporary name of earlier releases, and the spec itself.
        std::os::unix::fs::symlink(&victim, root.join(".tessera.io-gpu.json.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("tessera.io-gpu.json")).unwrap();
        let path = write_spec(&root, "tessera.io-gpu", &spec).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root:secret\n");
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_file());
        let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn verify_rewrites_a_damaged_edited_missing_or_linked_spec() {
        let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
        let spec = node_spec(&inv, "/dev");
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let path = write_spec(root, "n", &spec).unwrap();
        assert_eq!(verify_spec(root, "n", &spec).unwrap(), Verified::Intact);
        let mut edited = spec.clone();
        edited.devices.pop();
        let victim = dir.path().join("victim.json");
        std::fs::write(&victim, serde_json::to_vec(&spec).unwrap()).unwrap();
        type Damage<'a> = (&'static str, Box<dyn Fn() + 'a>);
        let damage: Vec<Damage> = vec![
            (
                "not a valid CDI spec",
                Box::new(|| std::fs::write(&path, "{ garbage").unwrap()),
            ),
            (
                "differs",
                Box::new(|| std::fs::write(&path, serde_json::to_vec(&edited).unwrap()).unwrap()),
            ),
            ("missing", Box::new(|| std::fs::remove_file(&path).unwrap())),
            (
                "not a regular file",
                Box::new(|| {
                    std::fs::remove_file(&path).unwrap();
                    std::os::unix::fs::symlink(&victim, &path).unwrap();
                }),
            ),
        ];
        for (want, damage) in damage {
            damage();
            match verify_spec(root, "n", &spec).unwrap() {
                Verified::Repaired { reason } => {
                    assert!(reason.contains(want), "{want}: {reason}");
                    assert!(!reason.contains("garbage"), "no file content: {reason}");
                }
                other => panic!("{want}: {other:?}"),
            }
            assert!(std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_file());
            let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            assert_eq!(back, spec, "{want}");
            assert_eq!(verify_spec(root, "n", &spec).unwrap(), Verified::Intact);
        }
        // A pretty-printed spec equal to the expected one is intact (parsed, not bytes).
        std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
        assert_eq!(verify_spec(root, "n", &spec).unwrap(), Verified::Intact);
    }

    #[test]
    fn host_dev_root_is_mapped() {
        let inv = FakeBackend::from_spec("1xL4").unwrap().inventory().unwrap();
        let spec = node_spec(&inv, "/host/dev");
        let n = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(n.path, "/dev/nvidia0");
        assert_eq!(n.host_path.as_deref(), Some("/host/dev/nvidia0"));
        assert_eq!(spec.cdi_version, "0.5.0", "hostPath needs 0.5.0");
        assert_eq!(node_spec(&inv, "/dev").cdi_version, "0.3.0");
    }

    #[test]
    fn minimum_version_follows_the_fields() {
        let inv = FakeBackend::from_spec("1xL4").unwrap().inventory().unwrap();
        let mut spec = node_spec(&inv, "/dev");
        assert_eq!(minimum_version(&spec), "0.3.0");
        spec.devices[0].name = "0b2f-gpu-0".into();
        assert_eq!(minimum_version(&spec), "0.5.0", "name starts with a digit");
    }

    #[test]
    fn mig_devices_get_their_access_nodes() {
        let inv = FakeBackend::from_yaml(
            "gpus: [ { model: A100-80GB, count: 2, migEnabled: true, mig: [3g.40gb, 1g.10gb] } ]",
        )
        .unwrap()
        .inventory()
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for (dev_root, version) in [("/dev", "0.3.0"), ("/host/dev", "0.5.0")] {
            let mut paths = migcaps::write_synthetic(dir.path(), 2, 508).unwrap();
            paths.host_dev_dir = format!("{dev_root}/nvidia-caps");
            let caps = migcaps::MigCaps::load(&paths).unwrap();
            let spec = node_spec_with(&inv, dev_root, Some(&caps));
            assert_eq!(
                spec.cdi_version, version,
                "type/major/minor need nothing newer"
            );
            for gpu in &inv.gpus {
                for mig in &gpu.mig_devices {
                    let d = spec.devices.iter().find(|d| d.name == mig.uuid).unwrap();
                    let nodes = &d.container_edits.device_nodes;
                    let gi = 3 + 135 * gpu.minor + 9 * mig.gi_id;
                    let ci = gi + 1 + mig.ci_id;
                    let got: Vec<_> = nodes.iter().map(|n| (n.path.as_str(), n.minor)).collect();
                    let (gi_path, ci_path) = (
                        format!("/dev/nvidia-caps/nvidia-cap{gi}"),
                        format!("/dev/nvidia-caps/nvidia-cap{ci}"),
                    );
                    let gpu_path = format!("/dev/nvidia{}", gpu.minor);
                    assert_eq!(
                        got,
                        vec![
                            (gpu_path.as_str(), None),
                            (gi_path.as_str(), Some(gi)),
                            (ci_path.as_str(), Some(ci))
                        ]
                    );
                    let host = nodes[2].host_path.as_deref();
                    match dev_root {
                        "/dev" => assert_eq!(host, None),
                        _ => assert_eq!(
                            host,
                            Some(&*format!("/host/dev/nvidia-caps/nvidia-cap{ci}"))
                        ),
                    }
                }
            }
            // Whole GPUs never get capability nodes.
            let whole = spec
                .devices
                .iter()
                .find(|d| d.name == inv.gpus[0].uuid)
                .unwrap();
            assert_eq!(whole.container_edits.device_nodes.len(), 1);
        }
        // Without the table a MIG device keeps only its GPU node (Allocate refuses it).
        let spec = node_spec_with(&inv, "/dev", None);
        let mig = &inv.gpus[0].mig_devices[0];
        let d = spec.devices.iter().find(|d| d.name == mig.uuid).unwrap();
        assert_eq!(d.container_edits.device_nodes.len(), 1);
    }
}
