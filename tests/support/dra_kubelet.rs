//! A kubelet emulator for DRA drivers, over real unix sockets.
//!
//! Behaviours modelled on the kubelet (plugin watcher + DRA manager, Kubernetes 1.34):
//! - **start**: deletes every ResourceSlice of this node (`spec.nodeName`), whatever the
//!   driver, before any plugin registers — the kubelet does this so a driver that went away
//!   while the kubelet was down leaves no stale devices;
//! - **plugin watcher**: scans `<kubelet-dir>/plugins_registry/` (existing sockets at start,
//!   then new or re-created ones; polling every 5 ms where the kubelet uses inotify), dials
//!   each socket with the socket path as HTTP/2 `:authority` (what grpc-go sends for a
//!   `unix://` target), calls `GetInfo`, accepts only `type: DRAPlugin`, picks the first API
//!   version it supports in the kubelet's own preference order (`v1.DRAPlugin`, then
//!   `v1beta1.DRAPlugin`; a 1.33 kubelet knows only v1beta1), and answers with
//!   `NotifyRegistrationStatus` (true, or false with the reason);
//! - **DRA manager**: one connection per registered driver to the endpoint from `GetInfo`,
//!   again with the socket path as `:authority`; `NodePrepareResources` /
//!   `NodeUnprepareResources` in the chosen version; several pods' requests may be in
//!   flight at once;
//! - **deregistration**: when the registration socket disappears the driver is forgotten
//!   and, unless it registers again within `wipe_grace` (the kubelet waits 30 s), its
//!   ResourceSlices on this node are deleted;
//! - **restart**: the kubelet process goes away (connections dropped, every driver
//!   forgotten), comes back, wipes this node's ResourceSlices and re-scans
//!   `plugins_registry/` — the registration sockets are left in place (unlike
//!   `device-plugins/`, the kubelet does not delete them), so drivers are asked `GetInfo`
//!   again.
//!
//! Not modelled: the kubelet's claim-info checkpoint (tests re-send prepares themselves,
//! as the kubelet does for running pods after a restart), pod admission, the health stream.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams};
use tessera::grpc::connect_unix_with_authority;
use tessera::proto::dra::{v1, v1beta1};
use tessera::proto::pluginregistration as reg;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const DIAL: Duration = Duration::from_secs(2);

/// A registered driver.
#[derive(Debug, Clone)]
pub struct Plugin {
    pub endpoint: PathBuf,
    /// `v1` or `v1beta1`.
    pub version: String,
    pub registrations: u32,
    pub registered_at: Instant,
    channel: Option<Channel>,
}

/// A rejected registration attempt.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub socket: PathBuf,
    pub reason: String,
}

/// One prepared device as the kubelet receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Claim {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// Per-claim outcome: devices, or the driver's error message.
pub type Prepared = BTreeMap<String, Result<Vec<Device>, String>>;

#[derive(Default)]
struct State {
    plugins: BTreeMap<String, Plugin>,
    rejections: Vec<Rejection>,
    /// Registration sockets seen: path → (inode, ctime): a re-created socket differs in
    /// one of them (the inode number alone is often reused at once).
    seen: BTreeMap<PathBuf, (u64, i64, i64)>,
    /// Which driver a registration socket registered.
    socket_driver: BTreeMap<PathBuf, String>,
    /// Registrations per driver in this kubelet's life (kept across deregistration).
    counts: BTreeMap<String, u32>,
    wipes: u32,
}

struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

/// The emulated kubelet.
pub struct DraKubelet {
    pub dir: PathBuf,
    pub node: String,
    api: kube::Client,
    /// API versions this kubelet speaks, most preferred first.
    versions: Vec<&'static str>,
    /// How long a vanished driver's slices survive.
    pub wipe_grace: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

/// One `DRAPlugin` call in API version `$v` (`v1` and `v1beta1` have the same messages in
/// different packages): the request built from `claims`, the answer per claim UID.
macro_rules! dra_call {
    ($v:ident, $channel:expr, $claims:expr, prepare) => {{
        let req = $v::NodePrepareResourcesRequest {
            claims: dra_call!(@claims $v, $claims),
        };
        let resp = $v::dra_plugin_client::DraPluginClient::new($channel)
            .node_prepare_resources(req)
            .await?
            .into_inner();
        Ok(resp
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let out = if r.error.is_empty() {
                    Ok(r.devices
                        .into_iter()
                        .map(|d| Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids,
                        })
                        .collect())
                } else {
                    Err(r.error)
                };
                (uid, out)
            })
            .collect())
    }};
    ($v:ident, $channel:expr, $claims:expr, unprepare) => {{
        let req = $v::NodeUnprepareResourcesRequest {
            claims: dra_call!(@claims $v, $claims),
        };
        let resp = $v::dra_plugin_client::DraPluginClient::new($channel)
            .node_unprepare_resources(req)
            .await?
            .into_inner();
        Ok(resp
            .claims
            .into_iter()
            .map(|(u, r)| (u, if r.error.is_empty() { Ok(()) } else { Err(r.error) }))
            .collect())
    }};
    (@claims $v:ident, $claims:expr) => {
        $claims
            .iter()
            .map(|c| $v::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect()
    };
}

impl DraKubelet {
    /// A 1.34 kubelet (v1, then v1beta1) for `node`, using `api` for ResourceSlices.
    pub async fn start(dir: &Path, node: &str, api: kube::Client) -> DraKubelet {
        Self::start_with(dir, node, api, &["v1", "v1beta1"]).await
    }

    /// A kubelet speaking only `versions` (e.g. `["v1beta1"]` for 1.32/1.33).
    pub async fn start_with(
        dir: &Path,
        node: &str,
        api: kube::Client,
        versions: &[&'static str],
    ) -> DraKubelet {
        std::fs::create_dir_all(dir.join("plugins_registry")).unwrap();
        let k = DraKubelet {
            dir: dir.to_path_buf(),
            node: node.to_string(),
            api,
            versions: versions.to_vec(),
            wipe_grace: Duration::from_secs(30),
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changed: Notify::new(),
            }),
            stop: CancellationToken::new(),
        };
        k.boot().await;
        k
    }

    async fn boot(&self) {
        wipe_slices(&self.api, &self.node, None).await;
        self.shared.state.lock().unwrap().wipes += 1;
        tokio::spawn(watch_registry(
            self.dir.join("plugins_registry"),
            self.node.clone(),
            self.api.clone(),
            self.versions.clone(),
            self.wipe_grace,
            self.shared.clone(),
            self.stop.clone(),
        ));
    }

    /// What a kubelet restart does (see the module doc).
    pub async fn restart(&mut self) {
        self.stop.cancel();
        {
            let mut st = self.shared.state.lock().unwrap();
            st.plugins.clear();
            st.seen.clear();
            st.socket_driver.clear();
            st.counts.clear();
        }
        self.stop = CancellationToken::new();
        self.boot().await;
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }

    pub fn plugin(&self, driver: &str) -> Option<Plugin> {
        self.shared
            .state
            .lock()
            .unwrap()
            .plugins
            .get(driver)
            .cloned()
    }

    pub fn rejections(&self) -> Vec<Rejection> {
        self.shared.state.lock().unwrap().rejections.clone()
    }

    /// How many times this node's slices were wiped at (re)start.
    pub fn wipes(&self) -> u32 {
        self.shared.state.lock().unwrap().wipes
    }

    /// Wait until `driver` is registered (at least `times` registrations in this kubelet's
    /// life), or panic after `timeout`.
    pub async fn wait_registered(&self, driver: &str, times: u32, timeout: Duration) -> Plugin {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(p) = self.plugin(driver).filter(|p| p.registrations >= times) {
                return p;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out after {timeout:?} waiting for {driver} to register {times}x; \
                 rejections: {:?}",
                self.rejections()
            );
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), notified).await;
        }
    }

    /// Wait until `driver` is not registered (its registration socket went away), or
    /// panic after `timeout`.
    pub async fn wait_unregistered(&self, driver: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.plugin(driver).is_some() {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {driver} to unregister"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn channel(&self, driver: &str) -> Result<(Channel, String), tonic::Status> {
        let plugin = self
            .plugin(driver)
            .ok_or_else(|| tonic::Status::unavailable(format!("{driver} is not registered")))?;
        if let Some(c) = plugin.channel {
            return Ok((c, plugin.version));
        }
        let endpoint = plugin.endpoint.display().to_string();
        let channel = connect_unix_with_authority(&plugin.endpoint, &endpoint, DIAL)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        if let Some(p) = self.shared.state.lock().unwrap().plugins.get_mut(driver) {
            p.channel = Some(channel.clone());
        }
        Ok((channel, plugin.version))
    }

    /// `NodePrepareResources` for `claims`, in the version chosen at registration.
    pub async fn prepare(&self, driver: &str, claims: &[Claim]) -> Result<Prepared, tonic::Status> {
        let (channel, version) = self.channel(driver).await?;
        if version == "v1" {
            dra_call!(v1, channel, claims, prepare)
        } else {
            dra_call!(v1beta1, channel, claims, prepare)
        }
    }

    /// `NodeWatchResources` (v1beta1 health, as a 1.35 kubelet dials it).
    #[allow(dead_code)]
    pub async fn watch_health(
        &self,
        driver: &str,
    ) -> Result<
        tonic::Streaming<tessera::proto::dra_health::v1beta1::NodeWatchResourcesResponse>,
        tonic::Status,
    > {
        use tessera::proto::dra_health::v1beta1 as health;
        let (channel, _) = self.channel(driver).await?;
        Ok(
            health::dra_resource_health_client::DraResourceHealthClient::new(channel)
                .node_watch_resources(health::NodeWatchResourcesRequest {})
                .await?
                .into_inner(),
        )
    }

    /// `NodeUnprepareResources` for `claims`.
    pub async fn unprepare(
        &self,
        driver: &str,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, Result<(), String>>, tonic::Status> {
        let (channel, version) = self.channel(driver).await?;
        if version == "v1" {
            dra_call!(v1, channel, claims, unprepare)
        } else {
            dra_call!(v1beta1, channel, claims, unprepare)
        }
    }
}

impl Drop for DraKubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Delete this node's ResourceSlices (of one driver, or all).
async fn wipe_slices(api: &kube::Client, node: &str, driver: Option<&str>) {
    let slices: Api<ResourceSlice> = Api::all(api.clone());
    let mut selector = format!("spec.nodeName={node}");
    if let Some(d) = driver {
        selector.push_str(&format!(",spec.driver={d}"));
    }
    let Ok(list) = slices.list(&ListParams::default().fields(&selector)).await else {
        return;
    };
    for s in list.items {
        if let Some(name) = s.metadata.name {
            let _ = slices.delete(&name, &DeleteParams::default()).await;
        }
    }
}

async fn watch_registry(
    dir: PathBuf,
    node: String,
    api: kube::Client,
    versions: Vec<&'static str>,
    wipe_grace: Duration,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    loop {
        let mut present = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let path = e.path();
                if let Ok(md) = std::fs::symlink_metadata(&path) {
                    use std::os::unix::fs::FileTypeExt;
                    if md.file_type().is_socket() {
                        present.insert(path, (md.ino(), md.ctime(), md.ctime_nsec()));
                    }
                }
            }
        }
        let (new, gone): (Vec<PathBuf>, Vec<PathBuf>) = {
            let mut st = shared.state.lock().unwrap();
            let new = present
                .iter()
                .filter(|(p, ino)| st.seen.get(*p) != Some(ino))
                .map(|(p, _)| p.clone())
                .collect();
            let gone: Vec<PathBuf> = st
                .seen
                .keys()
                .filter(|p| !present.contains_key(*p))
                .cloned()
                .collect();
            for p in &gone {
                st.seen.remove(p);
            }
            for (p, ino) in &present {
                st.seen.insert(p.clone(), *ino);
            }
            (new, gone)
        };
        for socket in gone {
            let driver = shared.state.lock().unwrap().socket_driver.remove(&socket);
            if let Some(driver) = driver {
                shared.state.lock().unwrap().plugins.remove(&driver);
                shared.changed.notify_waiters();
                // The kubelet wipes a vanished driver's slices unless it comes back.
                let (api, node, shared, stop) =
                    (api.clone(), node.clone(), shared.clone(), stop.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(wipe_grace) => {}
                    }
                    let back = shared.state.lock().unwrap().plugins.contains_key(&driver);
                    if !back {
                        wipe_slices(&api, &node, Some(&driver)).await;
                    }
                });
            }
        }
        for socket in new {
            register(&socket, &versions, &shared).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

/// One registration round: `GetInfo`, validate, `NotifyRegistrationStatus`.
async fn register(socket: &Path, versions: &[&'static str], shared: &Shared) {
    let authority = socket.display().to_string();
    let reject = |reason: String| {
        shared.state.lock().unwrap().rejections.push(Rejection {
            socket: socket.to_path_buf(),
            reason,
        });
        shared.changed.notify_waiters();
    };
    let channel = match connect_unix_with_authority(socket, &authority, DIAL).await {
        Ok(c) => c,
        Err(e) => {
            // A socket file nobody listens on yet (or any more): forget it, so the next
            // scan tries again.
            shared.state.lock().unwrap().seen.remove(socket);
            return reject(e.to_string());
        }
    };
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    let info = match client.get_info(reg::InfoRequest {}).await {
        Ok(i) => i.into_inner(),
        Err(e) => {
            shared.state.lock().unwrap().seen.remove(socket);
            return reject(format!("GetInfo: {e}"));
        }
    };
    let chosen = versions.iter().find(|v| {
        info.supported_versions
            .iter()
            .any(|s| *s == format!("{v}.DRAPlugin"))
    });
    let verdict = match (info.r#type.as_str(), chosen) {
        ("DRAPlugin", Some(v)) => Ok(v.to_string()),
        ("DRAPlugin", None) => Err(format!(
            "none of the versions {:?} is supported by this kubelet ({versions:?})",
            info.supported_versions
        )),
        (other, _) => Err(format!("plugin type {other:?} is not DRAPlugin")),
    };
    let status = reg::RegistrationStatus {
        plugin_registered: verdict.is_ok(),
        error: verdict.as_ref().err().cloned().unwrap_or_default(),
    };
    let _ = client.notify_registration_status(status).await;
    match verdict {
        Ok(version) => {
            let mut st = shared.state.lock().unwrap();
            let count = st.counts.entry(info.name.clone()).or_default();
            *count += 1;
            let registrations = *count;
            st.plugins.insert(
                info.name.clone(),
                Plugin {
                    endpoint: PathBuf::from(&info.endpoint),
                    version,
                    registrations,
                    registered_at: Instant::now(),
                    channel: None,
                },
            );
            st.socket_driver.insert(socket.to_path_buf(), info.name);
            drop(st);
            shared.changed.notify_waiters();
        }
        Err(reason) => reject(reason),
    }
}
