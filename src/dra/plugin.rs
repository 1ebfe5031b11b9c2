//! The DRA plugin socket (`<kubelet-dir>/plugins/gpu.tessera.io/dra.sock`): `DRAPlugin` v1
//! and v1beta1 over one [`ClaimPreparer`], plus `DRAResourceHealth` v1alpha1 and v1beta1.
//!
//! The gRPC types of both API versions are translated into [`ClaimRef`] and
//! [`PreparedDevice`]; [`complete`] makes sure every requested claim gets an entry.
//!
//! [`serve`] uses [`PlaceholderHealth`] (one empty device list, then nothing);
//! [`serve_with_health`] takes the real one, [`super::health::HealthService`].
//! [`NotImplementedPreparer`] (every claim fails with [`NOT_IMPLEMENTED`]) remains for
//! tests of the transport; the real preparer is [`super::node::NodePreparer`].

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::info;

use crate::grpc::serve_unix_incoming;
use crate::proto::{dra, dra_health};

use super::socket::{Error, Result};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// One prepared device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// Per-claim outcome, keyed by claim UID; `Err` is the message the kubelet shows.
pub type ClaimResults<T> = BTreeMap<String, std::result::Result<T, String>>;

/// What the DRA services delegate to; one implementation serves both API versions.
pub trait ClaimPreparer: Send + Sync + 'static {
    fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> impl Future<Output = ClaimResults<Vec<PreparedDevice>>> + Send;
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = ClaimResults<()>> + Send;
}

/// The per-claim error of [`NotImplementedPreparer`].
pub const NOT_IMPLEMENTED: &str = "claim preparation is not implemented yet";

/// Placeholder preparer: every claim fails with [`NOT_IMPLEMENTED`] (prepare and unprepare).
/// It exists so registration and both API versions can be served and tested end to end
/// before NodePrepareResources is written.
#[derive(Debug, Clone, Copy, Default)]
pub struct NotImplementedPreparer;

impl ClaimPreparer for NotImplementedPreparer {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> ClaimResults<Vec<PreparedDevice>> {
        claims
            .into_iter()
            .map(|c| (c.uid, Err(NOT_IMPLEMENTED.to_string())))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> ClaimResults<()> {
        claims
            .into_iter()
            .map(|c| (c.uid, Err(NOT_IMPLEMENTED.to_string())))
            .collect()
    }
}

/// Keep only the requested claims' results and give every requested claim one: a claim
/// without a UID, or one the preparer forgot, gets an error instead of silently missing.
pub fn complete<T>(requested: &[ClaimRef], mut results: ClaimResults<T>) -> ClaimResults<T> {
    let mut out = ClaimResults::new();
    for claim in requested {
        let result = if claim.uid.is_empty() {
            Err(format!(
                "claim {}/{} has no UID",
                claim.namespace, claim.name
            ))
        } else {
            results.remove(&claim.uid).unwrap_or_else(|| {
                Err(format!(
                    "driver returned no result for claim {}/{}",
                    claim.namespace, claim.name
                ))
            })
        };
        out.entry(claim.uid.clone()).or_insert(result);
    }
    out
}

/// `DRAPlugin` of one API version over a shared preparer.
macro_rules! dra_service {
    ($name:ident, $api:path) => {
        /// `DRAPlugin` service of this API version over a shared [`ClaimPreparer`].
        pub struct $name<P>(pub Arc<P>);

        #[tonic::async_trait]
        impl<P: ClaimPreparer> $api for $name<P> {
            async fn node_prepare_resources(
                &self,
                request: Request<pb::NodePrepareResourcesRequest>,
            ) -> std::result::Result<Response<pb::NodePrepareResourcesResponse>, Status> {
                let claims = claim_refs(request.into_inner().claims);
                info!(claims = claims.len(), "NodePrepareResources");
                let results = complete(&claims, self.0.prepare(claims.clone()).await);
                let claims = results
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r {
                            Ok(devices) => pb::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(device).collect(),
                                error: String::new(),
                            },
                            Err(error) => pb::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, resp)
                    })
                    .collect();
                Ok(Response::new(pb::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<pb::NodeUnprepareResourcesRequest>,
            ) -> std::result::Result<Response<pb::NodeUnprepareResourcesResponse>, Status> {
                let claims = claim_refs(request.into_inner().claims);
                info!(claims = claims.len(), "NodeUnprepareResources");
                let results = complete(&claims, self.0.unprepare(claims.clone()).await);
                let claims = results
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().unwrap_or_default();
                        (uid, pb::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new(pb::NodeUnprepareResourcesResponse { claims }))
            }
        }

        fn claim_refs(claims: Vec<pb::Claim>) -> Vec<ClaimRef> {
            claims
                .into_iter()
                .map(|c| ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                })
                .collect()
        }

        fn device(d: PreparedDevice) -> pb::Device {
            pb::Device {
                request_names: d.request_names,
                pool_name: d.pool_name,
                device_name: d.device_name,
                cdi_device_ids: d.cdi_device_ids,
            }
        }
    };
}

/// `dra.v1.DRAPlugin`.
pub mod v1 {
    use super::*;
    use crate::proto::dra::v1 as pb;
    dra_service!(DraV1, crate::proto::dra::v1::dra_plugin_server::DraPlugin);
}

/// `dra.v1beta1.DRAPlugin`.
pub mod v1beta1 {
    use super::*;
    use crate::proto::dra::v1beta1 as pb;
    dra_service!(
        DraV1beta1,
        crate::proto::dra::v1beta1::dra_plugin_server::DraPlugin
    );
}

type HealthStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send>>;

/// Placeholder health stream: one empty device list, then silence until the client leaves.
fn empty_then_pending<T: Default + Send + 'static>() -> HealthStream<T> {
    Box::pin(futures::stream::once(async { Ok(T::default()) }).chain(futures::stream::pending()))
}

/// `DRAResourceHealth` placeholder (both versions): no devices are reported yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlaceholderHealth;

#[tonic::async_trait]
impl dra_health::v1alpha1::dra_resource_health_server::DraResourceHealth for PlaceholderHealth {
    type NodeWatchResourcesStream = HealthStream<dra_health::v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<dra_health::v1alpha1::NodeWatchResourcesRequest>,
    ) -> std::result::Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(empty_then_pending()))
    }
}

#[tonic::async_trait]
impl dra_health::v1beta1::dra_resource_health_server::DraResourceHealth for PlaceholderHealth {
    type NodeWatchResourcesStream = HealthStream<dra_health::v1beta1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<dra_health::v1beta1::NodeWatchResourcesRequest>,
    ) -> std::result::Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(empty_then_pending()))
    }
}

/// Serve all four services on `listener` (bound at `socket`) until `shutdown`, with the
/// placeholder health services; the socket file is removed on the way out.
pub async fn serve<P: ClaimPreparer>(
    preparer: Arc<P>,
    listener: UnixListener,
    socket: PathBuf,
    shutdown: CancellationToken,
) -> Result<()> {
    serve_with_health(preparer, PlaceholderHealth, listener, socket, shutdown).await
}

/// [`serve`] with `health` as `DRAResourceHealth` (v1alpha1 and v1beta1), e.g. a
/// [`super::health::HealthService`].
pub async fn serve_with_health<P, H>(
    preparer: Arc<P>,
    health: H,
    listener: UnixListener,
    socket: PathBuf,
    shutdown: CancellationToken,
) -> Result<()>
where
    P: ClaimPreparer,
    H: dra_health::v1alpha1::dra_resource_health_server::DraResourceHealth
        + dra_health::v1beta1::dra_resource_health_server::DraResourceHealth
        + Clone,
{
    use dra::v1::dra_plugin_server::DraPluginServer as V1Server;
    use dra::v1beta1::dra_plugin_server::DraPluginServer as V1beta1Server;
    use dra_health::v1alpha1::dra_resource_health_server::DraResourceHealthServer as HealthA;
    use dra_health::v1beta1::dra_resource_health_server::DraResourceHealthServer as HealthB;
    let result = tonic::transport::Server::builder()
        .add_service(V1Server::new(v1::DraV1(preparer.clone())))
        .add_service(V1beta1Server::new(v1beta1::DraV1beta1(preparer)))
        .add_service(HealthA::new(health.clone()))
        .add_service(HealthB::new(health))
        .serve_with_incoming_shutdown(serve_unix_incoming(listener), shutdown.cancelled_owned())
        .await;
    let _ = std::fs::remove_file(&socket);
    result.map_err(|e| Error::Serve {
        socket: socket.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("c-{uid}"),
        }
    }

    #[test]
    fn every_requested_claim_gets_exactly_one_entry() {
        let requested = [claim("a"), claim("b"), claim(""), claim("a")];
        let mut results: ClaimResults<u8> = ClaimResults::new();
        results.insert("a".into(), Ok(1));
        results.insert("stray".into(), Ok(9));
        let out = complete(&requested, results);
        let keys: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(keys, ["", "a", "b"]);
        assert_eq!(out["a"], Ok(1));
        assert_eq!(
            out["b"],
            Err("driver returned no result for claim ns/c-b".into())
        );
        assert_eq!(out[""], Err("claim ns/c- has no UID".into()));
    }

    #[tokio::test]
    async fn placeholder_fails_every_claim_clearly() {
        let out = NotImplementedPreparer
            .prepare(vec![claim("x"), claim("y")])
            .await;
        assert_eq!(out.len(), 2);
        assert!(out.values().all(|r| r == &Err(NOT_IMPLEMENTED.to_string())));
    }
}
