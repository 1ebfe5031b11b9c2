//! Plugin-watcher registration: `pluginregistration.Registration` on
//! `<kubelet-dir>/plugins_registry/gpu.tessera.io-reg.sock`.
//!
//! The kubelet's plugin watcher notices the socket, calls `GetInfo`, validates the answer,
//! dials the DRA endpoint and reports the outcome with `NotifyRegistrationStatus`. On a
//! rejection we log the kubelet's error and re-offer: after a backoff (doubling up to a
//! cap) the socket is removed and re-created, which makes the watcher try again.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::grpc::serve_unix_incoming;
use crate::proto::pluginregistration as pb;
use crate::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use crate::retry::Backoff;

use super::names::DRIVER;
use super::socket::{bind, DraPaths, Error, Result, PLUGIN_TYPE, SUPPORTED_VERSIONS};

/// How fast a rejected registration is offered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The delays between offers: `initial`, doubling per rejection up to `max`.
    pub fn backoff(&self) -> Backoff {
        Backoff::doubling(self.initial, self.max)
    }
}

/// What `GetInfo` answers.
pub fn plugin_info(paths: &DraPaths) -> pb::PluginInfo {
    pb::PluginInfo {
        r#type: PLUGIN_TYPE.to_string(),
        name: DRIVER.to_string(),
        endpoint: paths.plugin_socket.display().to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }
}

/// What the kubelet told us.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Registered,
    Rejected(String),
}

struct RegistrationService {
    info: pb::PluginInfo,
    outcomes: mpsc::UnboundedSender<Outcome>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> std::result::Result<Response<pb::PluginInfo>, Status> {
        info!(driver = DRIVER, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pb::RegistrationStatus>,
    ) -> std::result::Result<Response<pb::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let outcome = if status.plugin_registered {
            info!(driver = DRIVER, "kubelet registered the DRA plugin");
            Outcome::Registered
        } else {
            warn!(driver = DRIVER, error = %status.error, "kubelet rejected the DRA plugin");
            Outcome::Rejected(status.error)
        };
        // The receiver lives as long as the server; a send error means we are shutting down.
        let _ = self.outcomes.send(outcome);
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}

/// Serve the registration socket until `cancel`; re-offer after every rejection.
pub async fn serve(paths: DraPaths, retry: RetryPolicy, cancel: CancellationToken) -> Result<()> {
    let socket = paths.registration_socket.clone();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut backoff = retry.backoff();
    loop {
        let listener = bind(&socket)?;
        let service = RegistrationService {
            info: plugin_info(&paths),
            outcomes: tx.clone(),
        };
        let stop = cancel.child_token();
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(
                serve_unix_incoming(listener),
                stop.clone().cancelled_owned(),
            );
        tokio::pin!(server);
        let rejection = loop {
            tokio::select! {
                served = &mut server => {
                    let _ = std::fs::remove_file(&socket);
                    return served.map_err(|e| Error::Serve {
                        socket: socket.display().to_string(),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
                Some(outcome) = rx.recv() => match outcome {
                    Outcome::Registered => backoff.reset(),
                    Outcome::Rejected(error) => break error,
                },
            }
        };
        // Withdraw the offer now; the old server drains (bounded by the backoff: a kubelet
        // that keeps its connection open must not hold up the next offer).
        let _ = std::fs::remove_file(&socket);
        stop.cancel();
        let delay = backoff.next_delay();
        warn!(socket = %socket.display(), error = %rejection, retry_in = ?delay,
            "re-offering the DRA plugin registration");
        let deadline = tokio::time::Instant::now() + delay;
        let _ = tokio::time::timeout_at(deadline, &mut server).await;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = cancel.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn info_names_the_driver_endpoint_and_v1_first() {
        let info = plugin_info(&DraPaths::under(Path::new("/k")));
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gpu.tessera.io");
        assert_eq!(info.endpoint, "/k/plugins/gpu.tessera.io/dra.sock");
        assert_eq!(
            info.supported_versions,
            ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        let mut b = p.backoff();
        let steps: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(steps, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), p.initial, "a registration starts over");
    }
}
