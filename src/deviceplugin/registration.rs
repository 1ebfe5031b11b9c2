//! Registering a resource with the kubelet (`Registration.Register` on `kubelet.sock`),
//! and dialing gRPC over a unix socket (also used by the tests' kubelet emulator).

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::info;

use crate::proto::deviceplugin as pb;
use crate::proto::deviceplugin::registration_client::RegistrationClient;

use super::{Error, Result, API_VERSION};

/// A gRPC channel over the unix socket at `path`. The URI is a placeholder: the
/// connector ignores it, and `:authority` is `localhost`, as the kubelet sends it.
pub async fn connect_unix(path: &Path, timeout: Duration) -> Result<Channel> {
    let path: PathBuf = path.to_path_buf();
    let unavailable = |reason: String| Error::KubeletUnavailable {
        socket: path.display().to_string(),
        reason,
    };
    let endpoint = Endpoint::try_from("http://localhost")
        .map_err(|e| unavailable(e.to_string()))?
        .connect_timeout(timeout);
    let dial = path.clone();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(dial).await?)) }
        }))
        .await
        .map_err(|e| unavailable(format!("{e}: {}", source_chain(&e))))
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out.join(": ")
}

/// Register `resource`, served at `<device-plugins dir>/<endpoint>`, with the kubelet.
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    options: pb::DevicePluginOptions,
) -> Result<()> {
    let channel = connect_unix(kubelet_socket, Duration::from_secs(5)).await?;
    let mut client = RegistrationClient::new(channel);
    client
        .register(pb::RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint: endpoint.to_string(),
            resource_name: resource.to_string(),
            options: Some(options),
        })
        .await
        .map_err(|s| Error::RegistrationRefused {
            resource: resource.to_string(),
            reason: s.message().to_string(),
        })?;
    info!(%resource, %endpoint, "registered with the kubelet");
    Ok(())
}

/// The socket file name for a resource: `tessera-nvidia.com-mig-1g.10gb.sock`.
pub fn socket_name(resource: &str) -> String {
    let safe: String = resource
        .chars()
        .map(|c| if c == '/' { '-' } else { c })
        .collect();
    format!("tessera-{safe}.sock")
}
