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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// The DRA driver name.
pub const DRIVER_NAME: &str = super::slices::DRIVER;
/// `PluginInfo.type` for DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// `PluginInfo.supported_versions`, most preferred first.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// Where the two sockets live; derived from `--kubelet-dir`, so tests use a tempdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraPaths {
    /// `<kubelet-dir>/plugins_registry/gpu.tessera.io-reg.sock`
    pub registration_socket: PathBuf,
    /// `<kubelet-dir>/plugins/gpu.tessera.io/dra.sock`
    pub plugin_socket: PathBuf,
}

impl DraPaths {
    pub fn under(kubelet_dir: &Path) -> Self {
        Self {
            registration_socket: kubelet_dir
                .join("plugins_registry")
                .join(format!("{DRIVER_NAME}-reg.sock")),
            plugin_socket: kubelet_dir
                .join("plugins")
                .join(DRIVER_NAME)
                .join("dra.sock"),
        }
    }
}

/// Errors of the DRA kubelet layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot serve on {socket}: {source}")]
    Serve {
        socket: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Remove a stale socket file, create its directory, and listen on it.
pub fn bind(socket: &Path) -> Result<tokio::net::UnixListener> {
    let serve_err = |source| Error::Serve {
        socket: socket.display().to_string(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(serve_err)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve_err(e)),
    }
    tokio::net::UnixListener::bind(socket).map_err(serve_err)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let p = DraPaths::under(Path::new("/var/lib/kubelet"));
        assert_eq!(
            p.registration_socket,
            Path::new("/var/lib/kubelet/plugins_registry/gpu.tessera.io-reg.sock")
        );
        assert_eq!(
            p.plugin_socket,
            Path::new("/var/lib/kubelet/plugins/gpu.tessera.io/dra.sock")
        );
    }
}
