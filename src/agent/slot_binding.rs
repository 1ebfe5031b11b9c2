//! Split-mode slots bound to their pod's assignment: the I/O half of
//! [`crate::vgpu::slots`] (docs/hami.md, "Limits from the assignment").
//!
//! ```text
//! Allocate ─▶ <state>/vgpu/dp-<id>/slots  (answer: CDI device tessera.io/gpu=dp-<id>,
//!                 │                        whose spec does not exist yet)
//!                 ▼  every poll while one is pending
//! PodResources List ─▶ find_holder ─▶ GET the pod ─▶ bind (assignment annotation)
//!                 │                                      │
//!                 │ Ok: limits file, then the CDI spec    │ Err: Warning Event on the pod,
//!                 ▼     tessera.io-alloc-dp-<id>.json     ▼      nothing written (retried)
//!        the runtime can now create the container   the container is never created
//! ```
//!
//! The limits file is written before the spec, and the runtime resolves the CDI device
//! only when it creates the container, so a container never starts without its limits.
//! An allocation whose spec exists is bound; after a restart the pending ones (a `slots`
//! record and no spec) are picked up again. The directories and specs of containers
//! that are gone are removed by the device-plugin cleanup (`tessera node`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::cdi::{self, CdiDevice, ContainerEdits, DeviceNode, Spec};
use crate::deviceplugin::allocate::AllocateSettings;
use crate::proto::podresources as pr;
use crate::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use crate::shimfiles::{self, UnitLimits};
use crate::vgpu::record::ASSIGNMENT_ANNOTATION;
use crate::vgpu::request::{pod_request, RequestConfig};
use crate::vgpu::slots::{bind, find_holder, BoundUnit, Holder, PendingSlots, SlotGpu};

/// Where the kubelet serves its PodResources API.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// How often pending allocations are looked for (a directory listing when none is).
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);
/// How often a refused allocation is tried again (its pod may be fixed).
const RETRY_REFUSED: Duration = Duration::from_secs(5);
/// A PodResources call or a pod GET slower than this is given up until the next poll.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the binder needs besides the allocation settings.
#[derive(Clone)]
pub struct BindingSettings {
    pub client: kube::Client,
    pub node_name: String,
    pub pod_resources_socket: PathBuf,
    /// The kubelet's device checkpoint (`<kubelet-dir>/device-plugins/
    /// kubelet_internal_checkpoint`): PodResources names pods by namespace and name only,
    /// the checkpoint records the UID an allocation went to, so a pod deleted and created
    /// again under the same name is not taken for the one the kubelet allocated to. When
    /// the file is missing or unreadable the check is skipped.
    pub kubelet_checkpoint: PathBuf,
    pub poll: Duration,
}

impl std::fmt::Debug for BindingSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BindingSettings")
            .field("node_name", &self.node_name)
            .field("pod_resources_socket", &self.pod_resources_socket)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}

/// The CDI spec file (stem) of allocation `id`.
pub fn spec_stem(id: &str) -> String {
    format!("tessera.io-alloc-{id}")
}

/// The CDI spec of a bound allocation: one device named after the allocation with the
/// GPUs' nodes, `NVIDIA_VISIBLE_DEVICES` and the HAMi-core variables (for tools: the shim
/// reads the limits file), and the control nodes (a spec of its own: the node spec's do
/// not apply).
pub fn bound_spec(id: &str, units: &[BoundUnit], settings: &AllocateSettings) -> Spec {
    let mut env = vec![format!(
        "NVIDIA_VISIBLE_DEVICES={}",
        units
            .iter()
            .map(|u| u.uuid.as_str())
            .collect::<Vec<_>>()
            .join(",")
    )];
    for (i, u) in units.iter().enumerate() {
        env.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}={}m", u.memory_mib));
        env.push(format!("CUDA_DEVICE_SM_LIMIT_{i}={}", u.cores));
    }
    let spec = Spec {
        cdi_version: String::new(),
        kind: cdi::CDI_KIND.to_string(),
        devices: vec![CdiDevice {
            name: id.to_string(),
            container_edits: ContainerEdits {
                device_nodes: units
                    .iter()
                    .map(|u| DeviceNode::at(format!("/dev/nvidia{}", u.minor)))
                    .collect(),
                env,
                ..Default::default()
            },
        }],
        container_edits: ContainerEdits {
            device_nodes: cdi::CONTROL_NODES
                .iter()
                .map(|p| DeviceNode::at(p.to_string()))
                .collect(),
            ..Default::default()
        },
    };
    cdi::devroot::with_host_dev(spec, &settings.host_dev)
}

/// The limits file's units of a bound allocation (CUDA ordinal = position).
pub fn unit_limits(units: &[BoundUnit]) -> Vec<UnitLimits> {
    units
        .iter()
        .enumerate()
        .map(|(index, u)| UnitLimits {
            index,
            gpu: u.uuid.clone(),
            memory_mib: u.memory_mib,
            cores: u.cores,
        })
        .collect()
}

/// The device-plugin allocations waiting for their container: a `slots` record and no
/// CDI spec yet. Unreadable records are skipped with a warning.
pub fn pending_allocations(
    settings: &AllocateSettings,
    cdi_root: &Path,
) -> shimfiles::Result<Vec<(String, PendingSlots)>> {
    let dirs = settings.alloc_dirs();
    let mut out = Vec::new();
    for id in dirs.list(shimfiles::DP_PREFIX)? {
        if cdi::spec_path(cdi_root, &spec_stem(&id)).exists() {
            continue;
        }
        let Some(bytes) = dirs.read_record(&id, shimfiles::PENDING_FILE)? else {
            continue;
        };
        match serde_json::from_slice::<PendingSlots>(&bytes) {
            Ok(p) => out.push((id, p)),
            Err(e) => warn!(%id, error = %e, "unreadable split-mode allocation record skipped"),
        }
    }
    Ok(out)
}

/// Write what a bound allocation gets: the limits file first, then the CDI spec that
/// lets the runtime create the container.
pub fn write_bound(
    settings: &AllocateSettings,
    cdi_root: &Path,
    id: &str,
    units: &[BoundUnit],
) -> Result<(), String> {
    settings
        .alloc_dirs()
        .write_limits(id, &unit_limits(units))
        .map_err(|e| e.to_string())?;
    cdi::write_spec(cdi_root, &spec_stem(id), &bound_spec(id, units, settings))
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Remove the CDI spec of allocation `id` (its directory is gone); a missing one is fine.
pub fn remove_spec(cdi_root: &Path, id: &str) -> std::io::Result<()> {
    match std::fs::remove_file(cdi::spec_path(cdi_root, &spec_stem(id))) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Every container's devices, from the kubelet's PodResources `List`.
pub async fn list_holders(socket: &Path) -> Result<Vec<Holder>, String> {
    list_pod_resources(socket).await.map(|a| holders_of(&a))
}

/// The kubelet's PodResources `List` answer.
pub async fn list_pod_resources(socket: &Path) -> Result<pr::ListPodResourcesResponse, String> {
    let channel = crate::deviceplugin::registration::connect_unix(socket, CALL_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = PodResourcesListerClient::new(channel);
    let answer = tokio::time::timeout(
        CALL_TIMEOUT,
        client.list(pr::ListPodResourcesRequest::default()),
    )
    .await
    .map_err(|_| format!("PodResources List: no answer in {CALL_TIMEOUT:?}"))?
    .map_err(|s| format!("PodResources List: {}", s.message()))?
    .into_inner();
    Ok(answer)
}

/// Every container's device-plugin devices in a PodResources answer.
pub fn holders_of(answer: &pr::ListPodResourcesResponse) -> Vec<Holder> {
    let mut out = Vec::new();
    for pod in &answer.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                out.push(Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    resource: d.resource_name.clone(),
                    device_ids: d.device_ids.clone(),
                });
            }
        }
    }
    out
}

/// Bind pending allocations until `cancel` fires. `gpus` is this node's split-mode GPUs
/// (kept current by the agent as configs and health change).
pub async fn keep_bound(
    binding: BindingSettings,
    settings: std::sync::Arc<AllocateSettings>,
    cdi_root: PathBuf,
    gpus: watch::Receiver<Vec<SlotGpu>>,
    cancel: CancellationToken,
) {
    let mut binder = Binder {
        binding,
        settings,
        cdi_root,
        gpus,
        refused: BTreeMap::new(),
        last_list_error: None,
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(binder.binding.poll) => {}
        }
        binder.round().await;
    }
}

struct Binder {
    binding: BindingSettings,
    settings: std::sync::Arc<AllocateSettings>,
    cdi_root: PathBuf,
    gpus: watch::Receiver<Vec<SlotGpu>>,
    /// Allocation → (reason, when) of its last refusal: one Event per reason, retried
    /// every [`RETRY_REFUSED`].
    refused: BTreeMap<String, (String, Instant)>,
    last_list_error: Option<String>,
}

impl Binder {
    async fn round(&mut self) {
        let (settings, root) = (self.settings.clone(), self.cdi_root.clone());
        let pending = match tokio::task::spawn_blocking(move || {
            pending_allocations(&settings, &root)
        })
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return warn!(error = %e, "cannot list split-mode allocations"),
            Err(e) => return warn!(error = %e, "cannot list split-mode allocations"),
        };
        self.refused
            .retain(|id, _| pending.iter().any(|(p, _)| p == id));
        let now = Instant::now();
        let due: Vec<_> = pending
            .into_iter()
            .filter(|(id, _)| {
                self.refused
                    .get(id)
                    .is_none_or(|(_, at)| now.duration_since(*at) >= RETRY_REFUSED)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let holders = match list_holders(&self.binding.pod_resources_socket).await {
            Ok(h) => {
                self.last_list_error = None;
                h
            }
            Err(e) => {
                if self.last_list_error.as_deref() != Some(&e) {
                    warn!(error = %e, "cannot read the kubelet's PodResources; split-mode containers wait");
                    self.last_list_error = Some(e);
                }
                return;
            }
        };
        for (id, pending) in due {
            match find_holder(&pending, &holders) {
                Some(holder) => self.bind_one(&id, holder).await,
                None => debug!(%id, "split-mode allocation not listed by the kubelet yet"),
            }
        }
    }

    async fn bind_one(&mut self, id: &str, holder: &Holder) {
        let pods: Api<Pod> = Api::namespaced(self.binding.client.clone(), &holder.namespace);
        let pod = match tokio::time::timeout(CALL_TIMEOUT, pods.get_opt(&holder.pod)).await {
            Ok(Ok(Some(pod))) => pod,
            Ok(Ok(None)) => {
                return debug!(%id, pod = %holder.pod, "pod gone; allocation left to cleanup")
            }
            Ok(Err(e)) => {
                return warn!(%id, error = %e, "cannot read the pod of a split-mode allocation")
            }
            Err(_) => return warn!(%id, "reading the pod of a split-mode allocation timed out"),
        };
        let annotation = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ASSIGNMENT_ANNOTATION))
            .map(String::as_str);
        if let Some(allocated) = self.allocated_uid(id).await {
            let current = pod.metadata.uid.clone().unwrap_or_default();
            if allocated != current {
                let e = crate::vgpu::slots::BindError::OtherPod { allocated, current };
                return self.refuse(id, holder, &pod, e.to_string()).await;
            }
        }
        let gpus = self.gpus.borrow().clone();
        // The container's own request bounds what the annotation may give it.
        let request = pod_request(&pod, &RequestConfig::default())
            .ok()
            .flatten()
            .and_then(|r| {
                r.containers
                    .into_iter()
                    .find(|c| c.name == holder.container)
            });
        let bound = bind(
            holder,
            annotation,
            request.as_ref(),
            &self.binding.node_name,
            &gpus,
        )
        .map_err(|e| e.to_string())
        .and_then(|units| write_bound(&self.settings, &self.cdi_root, id, &units).map(|()| units));
        match bound {
            Ok(units) => {
                self.refused.remove(id);
                info!(%id, namespace = %holder.namespace, pod = %holder.pod,
                      container = %holder.container, ?units, "split-mode vGPUs bound");
            }
            Err(reason) => self.refuse(id, holder, &pod, reason).await,
        }
    }

    /// The UID of the pod the kubelet's checkpoint says allocation `id` went to.
    async fn allocated_uid(&self, id: &str) -> Option<String> {
        let path = self.binding.kubelet_checkpoint.clone();
        let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
            .await
            .ok()?
            .ok()?;
        shimfiles::allocation_owners(&bytes)
            .ok()?
            .remove(id)
            .filter(|uid| !uid.is_empty())
    }

    async fn refuse(&mut self, id: &str, holder: &Holder, pod: &Pod, reason: String) {
        let repeated = self
            .refused
            .get(id)
            .is_some_and(|(last, _)| *last == reason);
        self.refused
            .insert(id.to_string(), (reason.clone(), Instant::now()));
        if repeated {
            return;
        }
        let message = format!(
            "container {:?}: its vGPUs cannot be set up, so it is not started: {reason}",
            holder.container
        );
        warn!(%id, namespace = %holder.namespace, pod = %holder.pod, %message);
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(holder.namespace.clone()),
            name: Some(holder.pod.clone()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        };
        let event = super::cluster::warning("VgpuBindingRefused", "BindVgpu", &message);
        let recorder =
            super::cluster::agent_recorder(self.binding.client.clone(), &self.binding.node_name);
        if let Err(e) = recorder.publish(&event, &regarding).await {
            warn!(error = %e, "cannot record an Event on the pod");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(uuid: &str, minor: u32, memory_mib: u64, cores: u32) -> BoundUnit {
        BoundUnit {
            uuid: uuid.into(),
            minor,
            memory_mib,
            cores,
        }
    }

    #[test]
    fn the_spec_names_the_allocation_and_carries_the_assigned_gpus() {
        let settings = AllocateSettings::with_state_dir("/var/lib/tessera");
        let spec = bound_spec(
            "dp-1",
            &[unit("GPU-b", 3, 10240, 30), unit("GPU-a", 0, 2048, 0)],
            &settings,
        );
        assert_eq!(spec.kind, "tessera.io/gpu");
        let device = &spec.devices[0];
        assert_eq!(device.name, "dp-1");
        let nodes: Vec<&str> = device
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(nodes, ["/dev/nvidia3", "/dev/nvidia0"]);
        assert_eq!(
            device.container_edits.env,
            [
                "NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a",
                "CUDA_DEVICE_MEMORY_LIMIT_0=10240m",
                "CUDA_DEVICE_SM_LIMIT_0=30",
                "CUDA_DEVICE_MEMORY_LIMIT_1=2048m",
                "CUDA_DEVICE_SM_LIMIT_1=0",
            ]
        );
        assert!(spec
            .container_edits
            .device_nodes
            .iter()
            .any(|n| n.path == "/dev/nvidiactl"));
        let limits = unit_limits(&[unit("GPU-b", 3, 10240, 30)]);
        assert_eq!(
            limits,
            [UnitLimits {
                index: 0,
                gpu: "GPU-b".into(),
                memory_mib: 10240,
                cores: 30
            }]
        );
    }

    #[test]
    fn pending_means_a_record_and_no_spec() {
        let tmp = tempfile::tempdir().unwrap();
        let settings = AllocateSettings::with_state_dir(tmp.path().join("state"));
        let cdi_root = tmp.path().join("cdi");
        std::fs::create_dir_all(&cdi_root).unwrap();
        let dirs = settings.alloc_dirs();
        let pending = PendingSlots {
            resource: "nvidia.com/gpu".into(),
            device_ids: vec!["GPU-a::s0".into()],
        };
        for id in ["dp-1", "dp-2", "dp-3"] {
            dirs.create(id).unwrap();
        }
        let record = serde_json::to_vec(&pending).unwrap();
        dirs.write_record("dp-1", shimfiles::PENDING_FILE, &record)
            .unwrap();
        dirs.write_record("dp-2", shimfiles::PENDING_FILE, &record)
            .unwrap();
        // dp-3: a fixed vGPU slice (limits at Allocate, no record): never pending.
        write_bound(&settings, &cdi_root, "dp-2", &[unit("GPU-a", 0, 1024, 10)]).unwrap();
        let found = pending_allocations(&settings, &cdi_root).unwrap();
        assert_eq!(found, vec![("dp-1".to_string(), pending)]);
        let limits = std::fs::read_to_string(dirs.dir("dp-2").join("limits")).unwrap();
        assert!(limits.contains("1024m"), "{limits}");
        remove_spec(&cdi_root, "dp-2").unwrap();
        remove_spec(&cdi_root, "dp-2").unwrap();
        assert_eq!(pending_allocations(&settings, &cdi_root).unwrap().len(), 2);
    }
}
