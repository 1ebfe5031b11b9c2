//! The webhook's HTTPS shell: TLS (rustls) over a TCP listener, `POST /mutate` decoded
//! and answered by the pure [`super::webhook::review`], `GET /healthz`. The known
//! WorkloadPriorityClasses come from a [`ClassSource`] (the API server in production).

use super::error::{Error, Result};
use super::webhook::review;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Largest AdmissionReview accepted (the API server sends at most about 3 MiB objects).
const MAX_BODY: usize = 4 << 20;

/// The known classes (name → value), or `None` when they cannot be listed now.
pub type Classes<'a> = Pin<Box<dyn Future<Output = Option<BTreeMap<String, i32>>> + Send + 'a>>;

/// Where the webhook learns the WorkloadPriorityClasses; `None`: unknown right now.
pub trait ClassSource: Send + Sync + 'static {
    fn classes(&self) -> Classes<'_>;
}

/// Classes listed from the API server on every request.
pub struct ApiClasses(pub kube::Client);

impl ClassSource for ApiClasses {
    fn classes(&self) -> Classes<'_> {
        Box::pin(async move {
            super::reconciler::list_priority_classes(&self.0)
                .await
                .map_err(|e| tracing::warn!(error = %e, "listing WorkloadPriorityClasses"))
                .ok()
                .map(|v| v.into_iter().map(|c| (c.metadata.name, c.value)).collect())
        })
    }
}

/// A fixed set of classes (tests, or a cluster without the CRDs).
pub struct StaticClasses(pub Option<BTreeMap<String, i32>>);

impl ClassSource for StaticClasses {
    fn classes(&self) -> Classes<'_> {
        Box::pin(async move { self.0.clone() })
    }
}

/// TLS settings from PEM files (`tls.crt` chain and `tls.key`, as cert-manager writes
/// them), loaded once; [`super::tls::ReloadingCert`] also follows rotations.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    super::tls::ReloadingCert::load(cert, key)?.server_config()
}

/// Serves the webhook on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    classes: Arc<dyn ClassSource>,
    shutdown: CancellationToken,
) -> Result<()> {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted.map_err(|source| Error::Io {
                what: "webhook accept".into(),
                source,
            })?,
        };
        let acceptor = acceptor.clone();
        let classes = classes.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let svc = hyper::service::service_fn(move |req| {
                let classes = classes.clone();
                async move { Ok::<_, Infallible>(handle(req, classes.as_ref()).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook connection");
            }
        });
    }
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    classes: &dyn ClassSource,
) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = code;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        r
    };
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/healthz") => return reply(StatusCode::OK, b"{\"ok\":true}".to_vec()),
        ("POST", "/mutate") => {}
        _ => return reply(StatusCode::NOT_FOUND, b"{\"error\":\"not found\"}".to_vec()),
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = serde_json::json!({"error": format!("reading body: {e}")});
            return reply(StatusCode::BAD_REQUEST, msg.to_string().into_bytes());
        }
    };
    let parsed: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let msg = serde_json::json!({"error": format!("body is not JSON: {e}")});
            return reply(StatusCode::BAD_REQUEST, msg.to_string().into_bytes());
        }
    };
    let known = classes.classes().await;
    match review(&parsed, known.as_ref()) {
        Ok(out) => reply(StatusCode::OK, out.to_string().into_bytes()),
        Err(e) => {
            let msg = serde_json::json!({"error": e.to_string()});
            reply(StatusCode::BAD_REQUEST, msg.to_string().into_bytes())
        }
    }
}
