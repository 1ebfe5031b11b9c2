//! A tonic channel over a unix socket that sends a chosen `:authority` on the wire, e.g.
//! the socket path, as the kubelet does. Used by the tests' kubelet emulators.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::AuthorityFixingStream;

/// Dialing failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {socket}: {reason}")]
pub struct ConnectError {
    pub socket: String,
    pub reason: String,
}

/// Connect to the unix socket at `path`; every request carries `authority` as `:authority`
/// (tonic itself would send `localhost`: the placeholder URI's authority).
pub async fn connect_unix_with_authority(
    path: &Path,
    authority: &str,
    timeout: Duration,
) -> Result<Channel, ConnectError> {
    let err = |reason: String| ConnectError {
        socket: path.display().to_string(),
        reason,
    };
    let endpoint = Endpoint::try_from("http://localhost")
        .map_err(|e| err(e.to_string()))?
        .connect_timeout(timeout);
    let dial: PathBuf = path.to_path_buf();
    let authority = authority.to_string();
    endpoint
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let (dial, authority) = (dial.clone(), authority.clone());
            async move {
                let stream = UnixStream::connect(dial).await?;
                Ok::<_, std::io::Error>(TokioIo::new(AuthorityFixingStream::client_forcing(
                    stream, authority,
                )))
            }
        }))
        .await
        .map_err(|e| err(format!("{e}: {e:?}")))
}
