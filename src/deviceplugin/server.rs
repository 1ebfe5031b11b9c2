//! The tonic `DevicePlugin` service for one resource. It only translates: decisions are
//! made by [`super::allocate`] and [`super::preferred`] over the current [`Snapshot`].

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::Stream;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{debug, info, instrument, warn};

use crate::metrics::{ErrorLabels, NodeMetrics, ResourceLabels};
use crate::proto::deviceplugin as pb;
use crate::proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};

use super::allocate::{
    allocate_container, mig_device_specs, AllocateSettings, ContainerAllocation,
};
use super::preferred::preferred;
use super::snapshot::{SharedSnapshot, Snapshot};
use super::{Error, Result};
use crate::cdi::migcaps::MigCaps;

/// One resource's device-plugin service.
pub struct ResourceService {
    resource: String,
    snapshots: watch::Receiver<SharedSnapshot>,
    settings: Arc<AllocateSettings>,
    /// Ends ListAndWatch streams when the server stops.
    stop: CancellationToken,
    allocations: AtomicU64,
    metrics: Arc<NodeMetrics>,
}

impl ResourceService {
    pub fn new(
        resource: impl Into<String>,
        snapshots: watch::Receiver<SharedSnapshot>,
        settings: Arc<AllocateSettings>,
        stop: CancellationToken,
        metrics: Arc<NodeMetrics>,
    ) -> Self {
        Self {
            resource: resource.into(),
            snapshots,
            settings,
            stop,
            allocations: AtomicU64::new(0),
            metrics,
        }
    }

    fn refused(&self, e: Error) -> Status {
        self.metrics
            .allocation_errors
            .get_or_create(&ErrorLabels {
                resource: self.resource.clone(),
                reason: e.metric_label().to_string(),
            })
            .inc();
        e.into()
    }

    fn snapshot(&self) -> SharedSnapshot {
        self.snapshots.borrow().clone()
    }

    fn next_alloc_id(&self) -> String {
        let n = self.allocations.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!(
            "{}{nanos:x}-{}-{n}",
            crate::shimfiles::DP_PREFIX,
            std::process::id()
        )
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for ResourceService {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let resource = self.resource.clone();
        debug!(%resource, "ListAndWatch opened");
        let state = (
            self.snapshots.clone(),
            None::<Vec<pb::Device>>,
            self.stop.clone(),
        );
        let stream = futures::stream::unfold(state, move |(mut rx, last, stop)| {
            let resource = resource.clone();
            async move {
                loop {
                    if last.is_some() {
                        tokio::select! {
                            changed = rx.changed() => if changed.is_err() { return None },
                            _ = stop.cancelled() => return None,
                        }
                    }
                    let devices = rx.borrow_and_update().device_list(&resource);
                    if last.as_ref() != Some(&devices) {
                        let msg = pb::ListAndWatchResponse {
                            devices: devices.clone(),
                        };
                        return Some((Ok(msg), (rx, Some(devices), stop)));
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    #[instrument(skip_all, fields(resource = %self.resource))]
    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let snapshot = self.snapshot();
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let size = usize::try_from(req.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "allocation_size {} is negative",
                    req.allocation_size
                ))
            })?;
            let ids = preferred(
                &snapshot,
                &self.resource,
                &req.available_device_i_ds,
                &req.must_include_device_i_ds,
                size,
            )?;
            container_responses.push(pb::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    #[instrument(skip_all, fields(resource = %self.resource))]
    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let snapshot = self.snapshot();
        let requests = request.into_inner().container_requests;
        let mut decided = Vec::with_capacity(requests.len());
        for req in &requests {
            let alloc_id = self.next_alloc_id();
            let a = allocate_container(
                &snapshot,
                &self.resource,
                &req.devices_ids,
                &self.settings,
                &alloc_id,
            )
            .inspect_err(|e| warn!(error = %e, ids = ?req.devices_ids, "Allocate refused"))
            .map_err(|e| self.refused(e))?;
            decided.push(a);
        }
        // MIG devices: their capability nodes from the driver's table, read once.
        if let Some(first) = decided.iter().flat_map(|a| &a.mig_units).next() {
            let caps = MigCaps::load(&self.settings.mig_caps)
                .map_err(|source| Error::MigCaps {
                    device: first.uuid.clone(),
                    source,
                })
                .inspect_err(|e| warn!(error = %e, "Allocate refused"))
                .map_err(|e| self.refused(e))?;
            for a in &mut decided {
                a.devices = mig_device_specs(&a.mig_units, &caps)
                    .inspect_err(|e| warn!(error = %e, "Allocate refused"))
                    .map_err(|e| self.refused(e))?;
            }
        }
        // A vGPU needs the shim library the agent installed (fail closed: never a mount
        // of nothing, which glibc would ignore and leave the container unlimited).
        if decided.iter().any(|a| a.vgpu.is_some()) {
            self.settings
                .shim
                .verify()
                .map_err(Error::from)
                .inspect_err(|e| warn!(error = %e, "Allocate refused"))
                .map_err(|e| self.refused(e))?;
        }
        // All containers validated; only now touch the filesystem.
        let mut container_responses = Vec::with_capacity(decided.len());
        for a in decided {
            if let Some(v) = &a.vgpu {
                let dirs = self.settings.alloc_dirs();
                dirs.create(&v.id)
                    .and_then(|_| match &v.pending {
                        // Split-mode slots: the agent writes the limits once it knows
                        // the container (crate::vgpu::slots).
                        Some(pending) => dirs.write_record(
                            &v.id,
                            crate::shimfiles::PENDING_FILE,
                            &serde_json::to_vec(pending).unwrap_or_default(),
                        ),
                        None => dirs.write_limits(&v.id, &v.units),
                    })
                    .map_err(Error::from)
                    .inspect_err(|e| warn!(error = %e, "Allocate refused"))
                    .map_err(|e| self.refused(e))?;
            }
            self.metrics
                .allocations
                .get_or_create(&ResourceLabels {
                    resource: self.resource.clone(),
                })
                .inc();
            info!(devices = %a.envs.get("NVIDIA_VISIBLE_DEVICES").map(String::as_str).unwrap_or(""), "allocated");
            container_responses.push(to_proto(a));
        }
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// The options every Tessera resource registers with.
pub fn options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn to_proto(a: ContainerAllocation) -> pb::ContainerAllocateResponse {
    pb::ContainerAllocateResponse {
        envs: a.envs.into_iter().collect(),
        mounts: a
            .mounts
            .into_iter()
            .map(|m| pb::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: a
            .devices
            .into_iter()
            .map(|d| pb::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: a.annotations.into_iter().collect(),
        cdi_devices: a
            .cdi_devices
            .into_iter()
            .map(|name| pb::CdiDevice { name })
            .collect(),
    }
}

/// Bind the unix socket `socket`, replacing a stale socket file at the path.
pub fn bind(socket: &Path) -> Result<UnixListener> {
    let serve_err = |source| Error::Serve {
        socket: socket.display().to_string(),
        source,
    };
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve_err(e)),
    }
    UnixListener::bind(socket).map_err(serve_err)
}

/// Serve `service` on `listener` (bound at `socket`) until `shutdown` fires; the socket
/// file is removed on the way out.
pub async fn serve(
    service: ResourceService,
    listener: UnixListener,
    socket: PathBuf,
    shutdown: CancellationToken,
) -> Result<()> {
    let result = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.cancelled())
        .await;
    let _ = std::fs::remove_file(&socket);
    result.map_err(|e| Error::Serve {
        socket: socket.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// Convenience for tests and benches: an in-memory snapshot channel.
pub fn snapshot_channel(
    s: Snapshot,
) -> (
    watch::Sender<SharedSnapshot>,
    watch::Receiver<SharedSnapshot>,
) {
    watch::channel(Arc::new(s))
}
