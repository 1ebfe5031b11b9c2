//! Who holds each GPU right now, read from what the node already records: the DRA
//! driver's checkpoint of prepared claims, and the kubelet's device-manager checkpoint
//! (`<kubelet-dir>/device-plugins/kubelet_internal_checkpoint`) of the device-plugin
//! devices it handed to containers. The agent reads both before moving a GPU between
//! paths ([`super::handover`]).
//!
//! What counts as "in use":
//! - DRA: a claim in the checkpoint in any phase (started, completed, waiting to be
//!   prepared again after a reboot) with a device on the GPU; and, for a GPU about to
//!   leave the DRA driver, a claim the API server has allocated on it that the kubelet has
//!   not asked to prepare yet ([`allocated_holders`], one LIST of ResourceClaims when a
//!   reload would move a GPU off DRA). A claim being prepared whose `Started` record is
//!   not written yet is not in the file: the agent adds those from
//!   [`crate::dra::owned::OwnedDevices::in_flight`], and the split's commit re-checks both
//!   under one lock.
//! - Device plugin: an entry of the kubelet's checkpoint whose device ID is the GPU, one
//!   of its MIG devices, or a replica/slice of either (`<uuid>::<n>`). The kubelet drops
//!   the entries of finished pods when it next admits a pod that needs devices, so a
//!   finished pod can hold a GPU until then.
//!
//! The kubelet's checkpoint also records the devices the device plugin last listed
//! (`RegisteredDevices`, healthy ones): at start, the device plugin's part of the split an
//! earlier run left ([`UsageProbe::device_plugin_registered`], [`super::withdraw`]).
//!
//! A checkpoint that is missing holds nothing; one that cannot be read or decoded is
//! logged and counted as holding nothing (the agent must not stop on it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Deserialize;
use tracing::warn;

use super::ownership::Holders;
use crate::dra::checkpoint::Store;
use crate::dra::names::{parse_device_name, DeviceKind, DRIVER};
use crate::gpu::Inventory;

/// Where usage is read from (a trait so tests can hold GPUs without files).
pub trait UsageProbe: Send + Sync {
    fn holders(&self, inventory: &Inventory) -> Holders;

    /// UUIDs of the GPUs the device plugin last advertised as far as the kubelet recorded
    /// it (its checkpoint's `RegisteredDevices`): at start, the device plugin's part of
    /// the split an earlier run left. Empty when not known.
    fn device_plugin_registered(&self, _inventory: &Inventory) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// Reads the two checkpoints on this node.
#[derive(Debug, Clone)]
pub struct LocalUsage {
    /// The kubelet's `device-plugins/kubelet_internal_checkpoint`.
    pub kubelet_checkpoint: PathBuf,
    /// The DRA driver's checkpoint directory (`None`: the DRA path is off).
    pub dra_checkpoint_dir: Option<PathBuf>,
}

impl LocalUsage {
    /// The kubelet's checkpoint under `kubelet_dir`.
    pub fn under(kubelet_dir: &std::path::Path, dra_checkpoint_dir: Option<PathBuf>) -> Self {
        Self {
            kubelet_checkpoint: kubelet_dir.join("device-plugins/kubelet_internal_checkpoint"),
            dra_checkpoint_dir,
        }
    }
}

impl UsageProbe for LocalUsage {
    fn holders(&self, inventory: &Inventory) -> Holders {
        let mut out = Holders::default();
        match std::fs::read(&self.kubelet_checkpoint) {
            Ok(bytes) => match device_plugin_holders(&bytes, inventory) {
                Ok(h) => out.device_plugin = h,
                Err(e) => warn!(path = %self.kubelet_checkpoint.display(), error = %e,
                    "cannot read the kubelet's device checkpoint; assuming no device-plugin GPU is in use"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(path = %self.kubelet_checkpoint.display(), error = %e,
                "cannot read the kubelet's device checkpoint; assuming no device-plugin GPU is in use"),
        }
        if let Some(dir) = &self.dra_checkpoint_dir {
            // A missing checkpoint reads as empty.
            match Store::new(dir).read() {
                Ok(data) => out.dra = dra_holders(&data, inventory),
                Err(e) => {
                    warn!(error = %e, "cannot read the DRA checkpoint; assuming no DRA GPU is in use")
                }
            }
        }
        out
    }

    fn device_plugin_registered(&self, inventory: &Inventory) -> BTreeSet<String> {
        match std::fs::read(&self.kubelet_checkpoint) {
            Ok(bytes) => registered_gpus(&bytes, inventory).unwrap_or_else(|e| {
                warn!(path = %self.kubelet_checkpoint.display(), error = %e,
                    "cannot read the kubelet's device checkpoint; the device plugin's devices before this start are not known");
                BTreeSet::new()
            }),
            Err(_) => BTreeSet::new(),
        }
    }
}

/// Record `who` as a holder of the GPU a device name of this driver lives on (names
/// that are not ours, or of a GPU no longer in the inventory, hold nothing).
fn add_holder(
    out: &mut BTreeMap<String, Vec<String>>,
    inventory: &Inventory,
    device: &str,
    who: &str,
) {
    let index = match parse_device_name(device) {
        Some(
            DeviceKind::Whole { gpu } | DeviceKind::Vgpu { gpu } | DeviceKind::Mig { gpu, .. },
        ) => gpu,
        None => return,
    };
    let Some(gpu) = inventory.gpus.iter().find(|g| g.index == index) else {
        return;
    };
    let list = out.entry(gpu.uuid.clone()).or_default();
    if !list.iter().any(|w| w == who) {
        list.push(who.to_string());
    }
}

/// GPU UUID → `claim <ns>/<name> (uid <uid>)` for every checkpointed claim.
pub fn dra_holders(
    data: &crate::dra::checkpoint::Data,
    inventory: &Inventory,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (uid, claim) in &data.claims {
        let who = format!("claim {}/{} (uid {uid})", claim.namespace, claim.name);
        for d in &claim.devices {
            add_holder(&mut out, inventory, &d.device, &who);
        }
    }
    out
}

/// GPU UUID → `claim <ns>/<name> (uid <uid>, allocated)` for every claim allocated a
/// device of this node's pool (driver `gpu.tessera.io`, pool = node name). Pure.
pub fn allocated_holders(
    claims: &[ResourceClaim],
    node: &str,
    inventory: &Inventory,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in claims {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        let who = format!(
            "claim {}/{} (uid {}, allocated)",
            c.metadata.namespace.as_deref().unwrap_or_default(),
            c.metadata.name.as_deref().unwrap_or_default(),
            c.metadata.uid.as_deref().unwrap_or_default()
        );
        for r in results
            .iter()
            .filter(|r| r.driver == DRIVER && r.pool == node)
        {
            add_holder(&mut out, inventory, &r.device, &who);
        }
    }
    out
}

/// [`allocated_holders`] from one cluster-wide LIST of ResourceClaims (bounded by
/// `timeout`).
pub async fn list_allocated(
    client: kube::Client,
    node: &str,
    inventory: &Inventory,
    timeout: std::time::Duration,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let api: kube::Api<ResourceClaim> = kube::Api::all(client);
    let list = tokio::time::timeout(timeout, api.list(&kube::api::ListParams::default()))
        .await
        .map_err(|_| format!("listing ResourceClaims timed out after {timeout:?}"))?
        .map_err(|e| format!("cannot list ResourceClaims: {e}"))?;
    Ok(allocated_holders(&list.items, node, inventory))
}

/// The kubelet's device-manager checkpoint (only the fields used here). `DeviceIDs` is a
/// map NUMA node → IDs since Kubernetes 1.20, a plain list before.
#[derive(Deserialize)]
struct KubeletCheckpoint {
    #[serde(rename = "Data")]
    data: KubeletData,
}

#[derive(Deserialize)]
struct KubeletData {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<PodDevices>>,
    /// Resource name → the device IDs its plugin last listed as healthy.
    #[serde(rename = "RegisteredDevices", default)]
    registered: Option<BTreeMap<String, Option<Vec<String>>>>,
}

#[derive(Deserialize)]
struct PodDevices {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName", default)]
    container: String,
    #[serde(rename = "ResourceName", default)]
    resource: String,
    #[serde(rename = "DeviceIDs")]
    device_ids: DeviceIds,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DeviceIds {
    ByNuma(BTreeMap<String, Option<Vec<String>>>),
    Flat(Option<Vec<String>>),
}

/// Any device ID of ours starts with a GPU or MIG UUID (`<uuid>` or `<uuid>::<n>`): unit
/// UUID → GPU UUID.
fn unit_to_gpu(inventory: &Inventory) -> BTreeMap<&str, &str> {
    let mut out: BTreeMap<&str, &str> = BTreeMap::new();
    for g in &inventory.gpus {
        out.insert(&g.uuid, &g.uuid);
        for m in &g.mig_devices {
            out.insert(&m.uuid, &g.uuid);
        }
    }
    out
}

/// UUIDs of the GPUs a device ID of the kubelet checkpoint's `RegisteredDevices` lives on
/// (any resource: whole GPUs, MIG devices, replicas).
pub fn registered_gpus(
    bytes: &[u8],
    inventory: &Inventory,
) -> Result<BTreeSet<String>, serde_json::Error> {
    let cp: KubeletCheckpoint = serde_json::from_slice(bytes)?;
    let units = unit_to_gpu(inventory);
    Ok(cp
        .data
        .registered
        .unwrap_or_default()
        .into_values()
        .flatten()
        .flatten()
        .filter_map(|id| {
            let unit = id.split("::").next().unwrap_or_default();
            units.get(unit).map(|g| g.to_string())
        })
        .collect())
}

/// GPU UUID → `pod <uid> container <name> (<resource>)` from the kubelet's checkpoint.
pub fn device_plugin_holders(
    bytes: &[u8],
    inventory: &Inventory,
) -> Result<BTreeMap<String, Vec<String>>, serde_json::Error> {
    let cp: KubeletCheckpoint = serde_json::from_slice(bytes)?;
    let unit_to_gpu = unit_to_gpu(inventory);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in cp.data.entries.unwrap_or_default() {
        let ids: Vec<String> = match e.device_ids {
            DeviceIds::ByNuma(m) => m.into_values().flatten().flatten().collect(),
            DeviceIds::Flat(l) => l.unwrap_or_default(),
        };
        let who = format!(
            "pod {} container {} ({})",
            e.pod_uid, e.container, e.resource
        );
        for id in ids {
            let unit = id.split("::").next().unwrap_or_default();
            let Some(gpu) = unit_to_gpu.get(unit) else {
                continue;
            };
            let list = out.entry(gpu.to_string()).or_default();
            if !list.contains(&who) {
                list.push(who.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::checkpoint::{Data, Phase, PreparedClaim, PreparedDevice};
    use crate::gpu::fake::FakeBackend;
    use crate::gpu::GpuBackend;

    fn inv() -> Inventory {
        FakeBackend::from_yaml(
            "gpus: [ { model: A100-80GB, count: 3, migEnabled: true, mig: [3g.40gb] } ]",
        )
        .unwrap()
        .inventory()
        .unwrap()
    }

    #[test]
    fn kubelet_checkpoint_both_formats_replicas_and_mig() {
        let inv = inv();
        let (g0, g1) = (&inv.gpus[0], &inv.gpus[1]);
        let mig1 = &g1.mig_devices[0].uuid;
        let text = format!(
            r#"{{"Data": {{"PodDeviceEntries": [
                {{"PodUID": "p-a", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                  "DeviceIDs": {{"-1": ["{}::2"]}}, "AllocResp": "AA=="}},
                {{"PodUID": "p-b", "ContainerName": "d", "ResourceName": "nvidia.com/mig-3g.40gb",
                  "DeviceIDs": ["{mig1}"]}},
                {{"PodUID": "p-c", "ContainerName": "e", "ResourceName": "example.com/nic",
                  "DeviceIDs": {{"0": ["eth1"], "1": null}}}}
              ], "RegisteredDevices": {{}}}}, "Checksum": 1}}"#,
            g0.uuid
        );
        let h = device_plugin_holders(text.as_bytes(), &inv).unwrap();
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[&g0.uuid], vec!["pod p-a container c (nvidia.com/gpu)"]);
        assert!(h[&g1.uuid][0].starts_with("pod p-b container d"));
        // An empty kubelet checkpoint (no entries yet) holds nothing.
        let empty =
            br#"{"Data": {"PodDeviceEntries": null, "RegisteredDevices": null}, "Checksum": 0}"#;
        assert!(device_plugin_holders(empty, &inv).unwrap().is_empty());
        assert!(device_plugin_holders(b"{", &inv).is_err());
    }

    #[test]
    fn registered_devices_of_the_kubelet_checkpoint() {
        let inv = inv();
        let (g0, g1) = (&inv.gpus[0], &inv.gpus[1]);
        let mig1 = &g1.mig_devices[0].uuid;
        let doc = |registered: &str| {
            format!(
                r#"{{"Data": {{"PodDeviceEntries": null, "RegisteredDevices": {registered}}}, "Checksum": 1}}"#
            )
        };
        let uuids = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
        let cases: Vec<(String, BTreeSet<String>)> = vec![
            ("null".into(), uuids(&[])),
            ("{}".into(), uuids(&[])),
            (
                format!(
                    r#"{{"nvidia.com/gpu": ["{}::0", "{}::1"], "example.com/nic": ["eth0"]}}"#,
                    g0.uuid, g0.uuid
                ),
                uuids(&[&g0.uuid]),
            ),
            (
                format!(r#"{{"nvidia.com/mig-3g.40gb": ["{mig1}"], "nvidia.com/gpu": null}}"#),
                uuids(&[&g1.uuid]),
            ),
        ];
        for (registered, want) in cases {
            let got = registered_gpus(doc(&registered).as_bytes(), &inv).unwrap();
            assert_eq!(got, want, "{registered}");
        }
        assert!(registered_gpus(b"[]", &inv).is_err());
    }

    #[test]
    fn dra_checkpoint_claims_in_any_phase() {
        let inv = inv();
        let dev = |name: &str| PreparedDevice {
            pool: "n".into(),
            device: name.into(),
            request_names: vec![],
            cdi_device_ids: vec![],
            mig: None,
            time_slice: None,
        };
        let mut data = Data::default();
        for (uid, phase, devices) in [
            (
                "u1",
                Phase::Completed,
                vec![dev("gpu-0-mig-3g-40gb-4"), dev("gpu-2")],
            ),
            ("u2", Phase::Started, vec![dev("gpu-2-vgpu")]),
            (
                "u3",
                Phase::NeedsReprepare,
                vec![dev("gpu-9"), dev("bogus")],
            ),
        ] {
            data.claims.insert(
                uid.into(),
                PreparedClaim {
                    namespace: "ml".into(),
                    name: format!("c-{uid}"),
                    phase,
                    devices,
                },
            );
        }
        let h = dra_holders(&data, &inv);
        assert_eq!(h[&inv.gpus[0].uuid], vec!["claim ml/c-u1 (uid u1)"]);
        assert_eq!(h[&inv.gpus[2].uuid].len(), 2);
        assert!(!h.contains_key(&inv.gpus[1].uuid));
    }

    #[test]
    fn allocated_claims_on_this_nodes_pool() {
        let inv = inv();
        let claim = |name: &str, results: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}")},
                "spec": {},
                "status": {"allocation": {"devices": {"results": results}}}
            }))
            .unwrap()
        };
        let r = |driver: &str, pool: &str, device: &str| serde_json::json!({"request": "r", "driver": driver, "pool": pool, "device": device});
        let claims = vec![
            claim(
                "a",
                serde_json::json!([r(DRIVER, "n1", "gpu-1"), r(DRIVER, "n1", "gpu-2-vgpu")]),
            ),
            claim("b", serde_json::json!([r(DRIVER, "n2", "gpu-0")])),
            claim(
                "c",
                serde_json::json!([r("other.example.com", "n1", "gpu-0")]),
            ),
            claim("d", serde_json::json!([])),
        ];
        let h = allocated_holders(&claims, "n1", &inv);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(
            h[&inv.gpus[1].uuid],
            vec!["claim ml/a (uid u-a, allocated)"]
        );
        assert!(h.contains_key(&inv.gpus[2].uuid));
    }

    #[test]
    fn missing_or_bad_files_hold_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let probe = LocalUsage::under(dir.path(), Some(dir.path().join("dra")));
        assert_eq!(probe.holders(&inv()), Holders::default());
        std::fs::create_dir_all(dir.path().join("device-plugins")).unwrap();
        std::fs::write(&probe.kubelet_checkpoint, "garbage").unwrap();
        assert_eq!(probe.holders(&inv()), Holders::default());
    }
}
