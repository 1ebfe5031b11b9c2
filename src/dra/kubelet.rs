//! The kubelet side of the DRA driver `gpu.tessera.io`: socket paths, plugin-watcher
//! registration and the `DRAPlugin` / `DRAResourceHealth` gRPC services, served together.
//!
//! ```text
//!  kubelet plugin watcher ──dial──▶ plugins_registry/gpu.tessera.io-reg.sock  (registration)
//!        GetInfo ◀── {DRAPlugin, gpu.tessera.io, plugins/gpu.tessera.io/dra.sock, [v1, v1beta1]}
//!        NotifyRegistrationStatus(false) ──▶ backoff, re-create the socket (kubelet retries)
//!  kubelet DRA manager ──dial──▶ plugins/gpu.tessera.io/dra.sock                (plugin)
//!        NodePrepareResources / NodeUnprepareResources (v1 + v1beta1) ──▶ ClaimPreparer
//!        NodeWatchResources (v1alpha1 + v1beta1 health)
//! ```
//!
//! Both servers accept the socket path as `:authority` ([`crate::grpc`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::socket::{bind, DraPaths, Result};

/// Serve the DRA socket, then offer registration, until `cancel` (or an error), with the
/// placeholder health service.
pub async fn serve<P: super::plugin::ClaimPreparer>(
    paths: DraPaths,
    preparer: Arc<P>,
    retry: super::registration::RetryPolicy,
    cancel: CancellationToken,
) -> Result<()> {
    serve_with_health(
        paths,
        preparer,
        super::plugin::PlaceholderHealth,
        retry,
        cancel,
    )
    .await
}

/// [`serve`] with `health` as `DRAResourceHealth` (e.g. a
/// [`super::health::HealthService`]; close it on cancel, open streams hold the server).
pub async fn serve_with_health<P, H>(
    paths: DraPaths,
    preparer: Arc<P>,
    health: H,
    retry: super::registration::RetryPolicy,
    cancel: CancellationToken,
) -> Result<()>
where
    P: super::plugin::ClaimPreparer,
    H: crate::proto::dra_health::v1alpha1::dra_resource_health_server::DraResourceHealth
        + crate::proto::dra_health::v1beta1::dra_resource_health_server::DraResourceHealth
        + Clone,
{
    // Listen on dra.sock before announcing it: the kubelet dials it right after GetInfo.
    let listener = bind(&paths.plugin_socket)?;
    let socket = paths.plugin_socket.clone();
    let plugin = super::plugin::serve_with_health(
        preparer,
        health,
        listener,
        socket.clone(),
        cancel.clone(),
    );
    let registration = super::registration::serve(paths.clone(), retry, cancel.clone());
    let result = tokio::try_join!(plugin, registration).map(|_| ());
    cancel.cancel();
    if result.is_err() {
        // The server that did not fail was dropped mid-flight: withdraw both sockets.
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&paths.registration_socket);
    }
    result
}
