//! A kubelet emulator for the device-plugin API, over real unix sockets.
//!
//! Behaviours modelled on the kubelet's device manager:
//! - serves `v1beta1.Registration` on `<dir>/kubelet.sock`; refuses versions other than
//!   `v1beta1` and resource names that are not extended resource names
//!   (`<domain>/<name>`, not `kubernetes.io/…`);
//! - on Register, dials the plugin's endpoint (`<dir>/<endpoint>`) back, calls
//!   `GetDevicePluginOptions`, and keeps a `ListAndWatch` stream open, recording every list;
//!   a second registration of a resource replaces the first endpoint;
//! - `restart()` is what a kubelet restart does to the directory: the old socket goes away,
//!   every other socket file in the directory is deleted, and `kubelet.sock` is created anew;
//! - on every device list received, the device manager's checkpoint
//!   `kubelet_internal_checkpoint` is rewritten in the kubelet's JSON layout
//!   (`Data.RegisteredDevices`: resource name → the IDs of its latest list). The emulator
//!   makes no allocations of its own: tests record pods' devices by writing
//!   `Data.PodDeviceEntries` into the file, and each rewrite keeps those entries, as the
//!   kubelet keeps its pod allocations across device updates;
//! - [`Kubelet::admit`] is the device manager's part of admitting a pod: per container in
//!   the order given (the kubelet's: init containers, then app containers), the healthy
//!   devices no container holds are offered to `GetPreferredAllocation` (when the plugin
//!   registered it), its answer is used when it is a valid choice (else the first free
//!   devices, as the kubelet falls back), `Allocate` is called, and only after it
//!   answered are the devices recorded for the container: in the checkpoint's
//!   `PodDeviceEntries` (with the answer as `AllocResp`) and in the PodResources API;
//!   too few free devices fails the admission (the kubelet's UnexpectedAdmissionError);
//! - serves the PodResources API v1 (`List`, `Get`) on
//!   `<dir>/../pod-resources/kubelet.sock`, listing the admitted pods' devices;
//!   [`Kubelet::remove_pod`] drops a pod from it and from the checkpoint;
//! - [`Kubelet::admit_claim`] is the DRA manager's part, after the driver prepared the
//!   claim: the container's claim is listed in PodResources `dynamic_resources` (claim
//!   name and namespace, per device the driver, pool, device name and the CDI IDs the
//!   driver answered), as the kubelet does with `KubeletPodResourcesDynamicResources`
//!   on; and the pod's UID is recorded for the claim in the DRA manager's checkpoint
//!   `<kubelet-dir>/dra_manager_state` (the 1.32+ layout: `Data` holding
//!   `{kind: DRACheckpoint, apiVersion: checkpoint.dra.kubelet.k8s.io/v1, Entries: [...]}`
//!   as a string, `Checksum` its CRC-32).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera::deviceplugin::registration::connect_unix;
use tessera::proto::deviceplugin as pb;
use tessera::proto::deviceplugin::device_plugin_client::DevicePluginClient;
use tessera::proto::deviceplugin::registration_server::{Registration, RegistrationServer};
use tessera::proto::podresources as pr;
use tessera::proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use tokio::net::UnixListener;
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// What the emulator knows about one registered resource.
#[derive(Debug, Clone, Default)]
pub struct ResourceState {
    pub endpoint: String,
    pub options: Option<pb::DevicePluginOptions>,
    /// Every ListAndWatch message received, in order.
    pub lists: Vec<Vec<pb::Device>>,
    pub registrations: u32,
    pub registered_at: Option<Instant>,
    /// The ListAndWatch stream ended (plugin went away).
    pub stream_ended: bool,
    /// Which registration the stream belongs to (older streams' events are ignored).
    pub epoch: u64,
}

#[derive(Default)]
struct Shared {
    epochs: std::sync::atomic::AtomicU64,
    resources: Mutex<BTreeMap<String, ResourceState>>,
    changed: Notify,
    pods: Mutex<Vec<AdmittedPod>>,
}

/// A pod the emulator admitted, with each container's devices.
#[derive(Debug, Clone)]
pub struct AdmittedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// (container, resource, device IDs, the plugin's answer).
    pub containers: Vec<(String, String, Vec<String>, pb::ContainerAllocateResponse)>,
    /// (container, claim UID, the claim as PodResources lists it).
    pub claims: Vec<(String, String, pr::DynamicResource)>,
}

/// The index of pod `uid` in `pods`, added (with no containers or claims) when it is not
/// there yet.
fn pod_index(pods: &mut Vec<AdmittedPod>, namespace: &str, name: &str, uid: &str) -> usize {
    if let Some(pos) = pods.iter().position(|p| p.uid == uid) {
        return pos;
    }
    pods.push(AdmittedPod {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
        containers: Vec::new(),
        claims: Vec::new(),
    });
    pods.len() - 1
}

/// What a container asks the device manager for: (container, resource, count).
pub type ContainerAsk<'a> = (&'a str, &'a str, usize);

/// The emulated kubelet.
pub struct Kubelet {
    pub dir: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct RegistrationService {
    dir: PathBuf,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

fn is_extended_resource_name(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, rest)) => {
            !domain.is_empty()
                && !rest.is_empty()
                && !domain.ends_with("kubernetes.io")
                && rest.len() <= 63
                && rest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        }
        None => false,
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let req = request.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}",
                req.version
            )));
        }
        if !is_extended_resource_name(&req.resource_name) {
            return Err(Status::invalid_argument(format!(
                "invalid extended resource name {:?}",
                req.resource_name
            )));
        }
        let epoch = self
            .shared
            .epochs
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        {
            let mut map = self.shared.resources.lock().unwrap();
            let st = map.entry(req.resource_name.clone()).or_default();
            st.endpoint = req.endpoint.clone();
            st.options = req.options;
            st.registrations += 1;
            st.registered_at = Some(Instant::now());
            st.stream_ended = false;
            st.epoch = epoch;
            // A new registration starts a new endpoint: its devices come from its own stream.
            st.lists.clear();
        }
        self.shared.changed.notify_waiters();
        // Like the kubelet: dial back asynchronously, after answering Register.
        let socket = self.dir.join(&req.endpoint);
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        let resource = req.resource_name;
        tokio::spawn(async move {
            let _ = watch_plugin(socket, resource, epoch, shared, stop).await;
        });
        Ok(Response::new(pb::Empty {}))
    }
}

async fn watch_plugin(
    socket: PathBuf,
    resource: String,
    epoch: u64,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let result = stream_devices(socket, &resource, epoch, &shared, stop).await;
    // Whether the dial failed or the stream ended, this endpoint is gone.
    if let Some(st) = shared
        .resources
        .lock()
        .unwrap()
        .get_mut(&resource)
        .filter(|s| s.epoch == epoch)
    {
        st.stream_ended = true;
    }
    shared.changed.notify_waiters();
    result
}

async fn stream_devices(
    socket: PathBuf,
    resource: &str,
    epoch: u64,
    shared: &Shared,
    stop: CancellationToken,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let channel = connect_unix(&socket, Duration::from_secs(2)).await?;
    let mut client = DevicePluginClient::new(channel);
    client.get_device_plugin_options(pb::Empty {}).await?;
    let mut stream = client.list_and_watch(pb::Empty {}).await?.into_inner();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            msg = stream.next() => match msg {
                Some(Ok(list)) => {
                    let mut map = shared.resources.lock().unwrap();
                    if let Some(st) = map.get_mut(resource).filter(|s| s.epoch == epoch) {
                        st.lists.push(list.devices);
                    }
                    if let Some(dir) = socket.parent() {
                        write_checkpoint(dir, &map);
                    }
                    drop(map);
                    shared.changed.notify_waiters();
                }
                _ => break,
            }
        }
    }
    Ok(())
}

/// `RegisteredDevices`: each resource's IDs in its latest list.
fn registered(resources: &BTreeMap<String, ResourceState>) -> BTreeMap<&str, Vec<&str>> {
    resources
        .iter()
        .map(|(r, st)| {
            let ids = st
                .lists
                .last()
                .map(|l| l.iter().map(|d| d.id.as_str()).collect())
                .unwrap_or_default();
            (r.as_str(), ids)
        })
        .collect()
}

/// The device manager's checkpoint, as the kubelet writes it after each device update.
fn write_checkpoint(dir: &Path, resources: &BTreeMap<String, ResourceState>) {
    let registered = registered(resources);
    let path = dir.join("kubelet_internal_checkpoint");
    let pod_entries = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.pointer("/Data/PodDeviceEntries").cloned())
        .unwrap_or(serde_json::Value::Null);
    write_checkpoint_with(dir, registered, pod_entries);
}

fn write_checkpoint_with(
    dir: &Path,
    registered: BTreeMap<&str, Vec<&str>>,
    pod_entries: serde_json::Value,
) {
    let path = dir.join("kubelet_internal_checkpoint");
    let body = serde_json::json!({
        "Data": {"PodDeviceEntries": pod_entries, "RegisteredDevices": registered},
        "Checksum": 0,
    });
    let tmp = dir.join(".kubelet_internal_checkpoint.tmp");
    if std::fs::write(&tmp, body.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

impl Kubelet {
    /// Start serving on `<dir>/kubelet.sock`.
    pub async fn start(dir: &Path) -> Kubelet {
        std::fs::create_dir_all(dir).unwrap();
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        serve(dir, shared.clone(), stop.clone());
        serve_pod_resources(&pod_resources_socket(dir), shared.clone(), stop.clone());
        Kubelet {
            dir: dir.to_path_buf(),
            shared,
            stop,
        }
    }

    /// What a kubelet restart does: stop, wipe the plugin sockets, come back.
    pub async fn restart(&mut self) {
        self.stop.cancel();
        tokio::time::sleep(Duration::from_millis(20)).await;
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir()
                || path
                    .file_name()
                    .is_some_and(|n| n == "kubelet_internal_checkpoint")
            {
                continue;
            }
            let _ = std::fs::remove_file(path);
        }
        // A fresh kubelet knows no plugins.
        self.shared.resources.lock().unwrap().clear();
        self.stop = CancellationToken::new();
        serve(&self.dir, self.shared.clone(), self.stop.clone());
        serve_pod_resources(
            &pod_resources_socket(&self.dir),
            self.shared.clone(),
            self.stop.clone(),
        );
    }

    /// The PodResources socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        pod_resources_socket(&self.dir)
    }

    /// Admit a pod: allocate each container's devices in the order given (see the module
    /// doc). Returns each container's answer, or why the admission failed (containers
    /// allocated before the failure keep their devices, as in the kubelet).
    pub async fn admit(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        asks: &[ContainerAsk<'_>],
    ) -> Result<Vec<pb::ContainerAllocateResponse>, String> {
        let mut answers = Vec::new();
        for (container, resource, count) in asks {
            let state = self
                .state(resource)
                .ok_or(format!("{resource}: not registered"))?;
            let held: Vec<String> = self
                .shared
                .pods
                .lock()
                .unwrap()
                .iter()
                .flat_map(|p| &p.containers)
                .filter(|c| c.1 == *resource)
                .flat_map(|c| c.2.clone())
                .collect();
            let free: Vec<String> = state
                .lists
                .last()
                .map(|l| {
                    l.iter()
                        .filter(|d| d.health == "Healthy" && !held.contains(&d.id))
                        .map(|d| d.id.clone())
                        .collect()
                })
                .unwrap_or_default();
            if free.len() < *count {
                return Err(format!(
                    "UnexpectedAdmissionError: {resource}: requested {count}, available {}",
                    free.len()
                ));
            }
            let mut client = self.client(resource).await;
            let preferred_available = state
                .options
                .as_ref()
                .is_some_and(|o| o.get_preferred_allocation_available);
            let mut ids: Vec<String> = free[..*count].to_vec();
            if preferred_available {
                let answer = client
                    .get_preferred_allocation(pb::PreferredAllocationRequest {
                        container_requests: vec![pb::ContainerPreferredAllocationRequest {
                            available_device_i_ds: free.clone(),
                            must_include_device_i_ds: vec![],
                            allocation_size: *count as i32,
                        }],
                    })
                    .await
                    .map_err(|s| format!("GetPreferredAllocation: {}", s.message()))?
                    .into_inner();
                let chosen = answer.container_responses[0].device_i_ds.clone();
                if chosen.len() == *count && chosen.iter().all(|id| free.contains(id)) {
                    ids = chosen;
                }
            }
            let answer = client
                .allocate(pb::AllocateRequest {
                    container_requests: vec![pb::ContainerAllocateRequest {
                        devices_ids: ids.clone(),
                    }],
                })
                .await
                .map_err(|s| format!("Allocate: {}", s.message()))?
                .into_inner()
                .container_responses
                .remove(0);
            {
                let mut pods = self.shared.pods.lock().unwrap();
                let pos = pod_index(&mut pods, namespace, name, uid);
                pods[pos].containers.push((
                    container.to_string(),
                    resource.to_string(),
                    ids,
                    answer.clone(),
                ));
                self.write_pod_entries(&pods);
            }
            answers.push(answer);
        }
        Ok(answers)
    }

    /// A container's devices recorded as [`Kubelet::admit`] records them once `Allocate`
    /// answered (PodResources and the checkpoint's `PodDeviceEntries`), without calling a
    /// plugin: for tests whose device plugin is not served (the answer recorded is empty).
    pub fn record_allocation(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        container: &str,
        resource: &str,
        ids: &[&str],
    ) {
        let mut pods = self.shared.pods.lock().unwrap();
        let pos = pod_index(&mut pods, namespace, name, uid);
        pods[pos].containers.push((
            container.into(),
            resource.into(),
            ids.iter().map(|i| i.to_string()).collect(),
            pb::ContainerAllocateResponse::default(),
        ));
        self.write_pod_entries(&pods);
    }

    /// The DRA manager ran a pod's container with a prepared claim: listed in
    /// PodResources, the pod recorded for the claim in `dra_manager_state` (module doc).
    /// `devices`: (driver, pool, device, CDI IDs) as the driver answered.
    #[allow(clippy::too_many_arguments)]
    pub fn admit_claim(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        container: &str,
        claim_uid: &str,
        claim_name: &str,
        devices: &[(&str, &str, &str, Vec<String>)],
    ) {
        let claim = pr::DynamicResource {
            claim_name: claim_name.into(),
            claim_namespace: namespace.into(),
            claim_resources: devices
                .iter()
                .map(|(driver, pool, device, cdi)| pr::ClaimResource {
                    cdi_devices: cdi
                        .iter()
                        .map(|n| pr::CdiDevice { name: n.clone() })
                        .collect(),
                    driver_name: driver.to_string(),
                    pool_name: pool.to_string(),
                    device_name: device.to_string(),
                })
                .collect(),
        };
        let mut pods = self.shared.pods.lock().unwrap();
        let pos = pod_index(&mut pods, namespace, name, uid);
        pods[pos]
            .claims
            .push((container.into(), claim_uid.into(), claim));
        self.write_dra_state(&pods);
    }

    /// Where the DRA manager keeps its checkpoint.
    pub fn dra_state_path(&self) -> PathBuf {
        self.dir
            .parent()
            .unwrap_or(&self.dir)
            .join("dra_manager_state")
    }

    fn write_dra_state(&self, pods: &[AdmittedPod]) {
        let mut entries: BTreeMap<String, serde_json::Value> = BTreeMap::new();
        for p in pods {
            for (_, claim_uid, claim) in &p.claims {
                let e = entries.entry(claim_uid.clone()).or_insert_with(|| {
                    serde_json::json!({
                        "ClaimUID": claim_uid, "ClaimName": claim.claim_name,
                        "Namespace": claim.claim_namespace, "PodUIDs": {},
                        "DriverState": {},
                    })
                });
                e["PodUIDs"][p.uid.as_str()] = serde_json::json!({});
            }
        }
        let data = serde_json::json!({
            "kind": "DRACheckpoint",
            "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
            "Entries": entries.into_values().collect::<Vec<_>>(),
        })
        .to_string();
        let file = serde_json::json!({
            "Data": data,
            "Checksum": crc32fast::hash(data.as_bytes()),
        });
        std::fs::write(self.dra_state_path(), file.to_string()).unwrap();
    }

    /// The pod is gone: its devices are free and no longer listed or checkpointed.
    pub fn remove_pod(&self, uid: &str) {
        let mut pods = self.shared.pods.lock().unwrap();
        pods.retain(|p| p.uid != uid);
        self.write_pod_entries(&pods);
        if pods.iter().any(|p| !p.claims.is_empty()) || self.dra_state_path().exists() {
            self.write_dra_state(&pods);
        }
    }

    fn write_pod_entries(&self, pods: &[AdmittedPod]) {
        use base64::Engine as _;
        use prost::Message as _;
        let entries: Vec<serde_json::Value> = pods
            .iter()
            .flat_map(|p| {
                p.containers.iter().map(|(c, r, ids, answer)| {
                    serde_json::json!({
                        "PodUID": p.uid, "ContainerName": c, "ResourceName": r,
                        "DeviceIDs": {"-1": ids},
                        "AllocResp": base64::engine::general_purpose::STANDARD
                            .encode(answer.encode_to_vec()),
                    })
                })
            })
            .collect();
        let resources = self.shared.resources.lock().unwrap();
        write_checkpoint_with(
            &self.dir,
            registered(&resources),
            serde_json::Value::from(entries),
        );
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }

    pub fn state(&self, resource: &str) -> Option<ResourceState> {
        self.shared.resources.lock().unwrap().get(resource).cloned()
    }

    pub fn resources(&self) -> Vec<String> {
        self.shared
            .resources
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    /// Wait until `cond` holds over the resource map, or panic after `timeout`.
    pub async fn wait_until<F>(&self, timeout: Duration, what: &str, cond: F)
    where
        F: Fn(&BTreeMap<String, ResourceState>) -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cond(&self.shared.resources.lock().unwrap()) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let state = self.shared.resources.lock().unwrap().clone();
                panic!("timed out after {timeout:?} waiting for {what}; state: {state:#?}");
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), notified).await;
        }
    }

    /// The latest device list of a resource, once it has one.
    pub async fn devices(&self, resource: &str) -> Vec<pb::Device> {
        self.wait_until(
            Duration::from_secs(5),
            &format!("devices of {resource}"),
            |m| m.get(resource).is_some_and(|s| !s.lists.is_empty()),
        )
        .await;
        self.state(resource).unwrap().lists.last().unwrap().clone()
    }

    /// A client for a registered resource's plugin (as the kubelet uses for Allocate).
    pub async fn client(&self, resource: &str) -> DevicePluginClient<tonic::transport::Channel> {
        let endpoint = self.state(resource).expect("registered").endpoint;
        let channel = connect_unix(&self.dir.join(endpoint), Duration::from_secs(2))
            .await
            .unwrap();
        DevicePluginClient::new(channel)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn serve(dir: &Path, shared: Arc<Shared>, stop: CancellationToken) {
    let socket = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let service = RegistrationService {
        dir: dir.to_path_buf(),
        shared,
        stop: stop.clone(),
    };
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
            .await;
        let _ = std::fs::remove_file(socket);
    });
}

fn pod_resources_socket(dir: &Path) -> PathBuf {
    dir.parent()
        .unwrap_or(dir)
        .join("pod-resources/kubelet.sock")
}

struct PodResourcesService {
    shared: Arc<Shared>,
}

fn listed(p: &AdmittedPod) -> pr::PodResources {
    let mut containers: Vec<pr::ContainerResources> = Vec::new();
    for (c, r, ids, _) in &p.containers {
        let devices = pr::ContainerDevices {
            resource_name: r.clone(),
            device_ids: ids.clone(),
            topology: None,
        };
        match containers.iter_mut().find(|x| x.name == *c) {
            Some(x) => x.devices.push(devices),
            None => containers.push(pr::ContainerResources {
                name: c.clone(),
                devices: vec![devices],
                ..Default::default()
            }),
        }
    }
    for (c, _, claim) in &p.claims {
        match containers.iter_mut().find(|x| x.name == *c) {
            Some(x) => x.dynamic_resources.push(claim.clone()),
            None => containers.push(pr::ContainerResources {
                name: c.clone(),
                dynamic_resources: vec![claim.clone()],
                ..Default::default()
            }),
        }
    }
    pr::PodResources {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        containers,
    }
}

#[tonic::async_trait]
impl PodResourcesLister for PodResourcesService {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let pods = self.shared.pods.lock().unwrap();
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: pods.iter().map(listed).collect(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not modelled"))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let pods = self.shared.pods.lock().unwrap();
        // Like the kubelet: an unknown pod is an error naming it.
        let pod = pods
            .iter()
            .find(|p| p.name == req.pod_name && p.namespace == req.pod_namespace)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {} in namespace {} not found",
                    req.pod_name, req.pod_namespace
                ))
            })?;
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(listed(pod)),
        }))
    }
}

fn serve_pod_resources(socket: &Path, shared: Arc<Shared>, stop: CancellationToken) {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).unwrap();
    let socket = socket.to_path_buf();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(PodResourcesService {
                shared,
            }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
            .await;
        let _ = std::fs::remove_file(socket);
    });
}
