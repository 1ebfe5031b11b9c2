//! What the node's two kubelet paths show, seen from the tests: this node's DRA pool on
//! the API-server double, the device plugin's latest GPU list, the `GpuMoveBlocked`
//! Events, and the kubelet's device checkpoint the agent reads.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::apiserver::ApiServer;
use super::dra_agent::{NodeDirs, NODE};
use super::dra_kubelet::DraKubelet;
use super::kubelet::Kubelet;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;

pub const DRIVER: &str = "gpu.tessera.io";
pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
pub const GPU: &str = "nvidia.com/gpu";
/// How long the `wait_*` helpers here wait before failing the test.
pub const WAIT: Duration = Duration::from_secs(10);

/// This node's ResourceSlices of the Tessera driver.
/// The UUIDs of `backend`'s GPUs, in inventory order.
pub fn gpu_uuids(backend: &dyn GpuBackend) -> Vec<String> {
    backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect()
}

pub fn our_slices(api: &ApiServer) -> Vec<Value> {
    api.objects(SLICES)
        .into_iter()
        .filter(|s| s["spec"]["nodeName"] == NODE && s["spec"]["driver"] == DRIVER)
        .collect()
}

/// Our slices once the pool is complete: one generation, `resourceSliceCount` slices (a
/// publish in progress shows a partial pool). `None` with no slice at all.
pub fn complete_pool(api: &ApiServer) -> Option<Vec<Value>> {
    let now = our_slices(api);
    let gens: BTreeSet<i64> = now
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap_or(0))
        .collect();
    let count = now.first()?["spec"]["pool"]["resourceSliceCount"].as_i64()?;
    (gens.len() == 1 && now.len() as i64 == count).then_some(now)
}

/// The device names the slices publish.
pub fn device_names(slices: &[Value]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(String::from))
        .collect()
}

/// The DRA pool's device names once the pool is complete (one generation, all slices);
/// no slice at all is an empty pool.
pub fn dra_devices(api: &ApiServer) -> Option<BTreeSet<String>> {
    if our_slices(api).is_empty() {
        return Some(BTreeSet::new());
    }
    complete_pool(api).map(|s| device_names(&s))
}

/// Whether the wait for a pool also needs slices on the API server (an empty `want`
/// then means a published pool without devices, not a withdrawn driver).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Slices {
    MayBeAbsent,
    Published,
}

/// Waits until the complete pool publishes exactly `want`.
pub async fn wait_dra(api: &ApiServer, want: &[&str], slices: Slices) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let start = Instant::now();
    loop {
        let got = dra_devices(api);
        let published = slices == Slices::MayBeAbsent || !our_slices(api).is_empty();
        if got.as_ref() == Some(&want) && published {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "DRA pool: want {want:?}, have {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the device plugin's latest `nvidia.com/gpu` list is the GPUs at indices
/// `want` of `uuids`.
pub async fn wait_dp(plugins: &Kubelet, uuids: &[String], want: &[usize]) {
    let want: BTreeSet<String> = want.iter().map(|i| uuids[*i].clone()).collect();
    plugins
        .wait_until(WAIT, &format!("device plugin lists {want:?}"), |m| {
            m.get(GPU)
                .and_then(|s| s.lists.last())
                .is_some_and(|l| l.iter().map(|d| d.id.clone()).collect::<BTreeSet<_>>() == want)
        })
        .await;
}

/// Whether any `nvidia.com/gpu` list the device plugin sent from list `from` on named `uuid`.
pub fn dp_ever_listed(plugins: &Kubelet, from: usize, uuid: &str) -> bool {
    plugins.state(GPU).is_some_and(|s| {
        s.lists[from.min(s.lists.len())..]
            .iter()
            .any(|l| l.iter().any(|d| d.id == uuid))
    })
}

/// The notes of the `GpuMoveBlocked` Events so far.
pub fn blocked_events(api: &ApiServer) -> Vec<String> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == "GpuMoveBlocked")
        .filter_map(|e| e["note"].as_str().map(String::from))
        .collect()
}

/// What the kubelet's device manager records after Allocate (v2 format: NUMA → IDs).
pub fn write_kubelet_checkpoint(dirs: &NodeDirs, entries: &[(&str, &str)]) {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(pod, id)| {
            json!({"PodUID": pod, "ContainerName": "main", "ResourceName": GPU,
                   "DeviceIDs": {"-1": [id]}, "AllocResp": ""})
        })
        .collect();
    let body =
        json!({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 0});
    let path = dirs
        .kubelet_dir
        .join("device-plugins/kubelet_internal_checkpoint");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body.to_string()).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

/// Waits for a `GpuMoveBlocked` Event on GPU `gpu` naming `holder`, and returns its note.
pub async fn wait_blocked(api: &ApiServer, gpu: usize, holder: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(e) = blocked_events(api)
            .into_iter()
            .find(|e| e.contains(&format!("GPU {gpu} ")) && e.contains(holder))
        {
            return e;
        }
        assert!(start.elapsed() < WAIT, "events: {:?}", blocked_events(api));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A node with the device-plugin and DRA kubelet emulators, the API-server double
/// (answering cluster-wide LISTs) and fake GPUs, in a directory the node owns.
pub struct Node {
    pub api: ApiServer,
    pub dirs: NodeDirs,
    pub plugins: Kubelet,
    pub kubelet: DraKubelet,
    pub uuids: Vec<String>,
    _tmp: tempfile::TempDir,
}

/// Starts [`Node`] on the fake GPUs `gpus` (a `FakeBackend` spec such as `3xL4`).
pub async fn node(gpus: &str) -> (Node, Arc<FakeBackend>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("TESSERA_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let api = ApiServer::start(NODE).await;
    api.list_across_namespaces();
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let plugins = Kubelet::start(&dirs.kubelet_dir.join("device-plugins")).await;
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec(gpus).unwrap());
    let uuids = gpu_uuids(backend.as_ref());
    let node = Node {
        api,
        dirs,
        plugins,
        kubelet,
        uuids,
        _tmp: tmp,
    };
    (node, backend)
}
