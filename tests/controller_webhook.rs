//! The admission webhook over real HTTPS (rustls on loopback): an AdmissionReview for a
//! pod naming a queue comes back with the scheduling-gate JSONPatch; garbage is a 400; a
//! rotated certificate is served to new connections while open ones keep working.
//! Hardening (`controller_webhook/hardening.rs`): slow clients, the connection cap, accept
//! errors (injected, and a real EMFILE in a child process), the probes. The
//! self-managed certificate against the API-server double (`controller_webhook/certs.rs`).
//! Kueue's label honoured only with `--accept-kueue-labels`, by the controller too
//! (`controller_webhook/kueue.rs`).

mod support;

#[path = "controller_webhook/binary.rs"]
mod binary;
#[path = "controller_webhook/certs.rs"]
mod certs;
#[path = "controller_webhook/hardening.rs"]
mod hardening;
#[path = "controller_webhook/kueue.rs"]
mod kueue;
#[path = "controller_webhook/selectors.rs"]
mod selectors;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tessera::controller::tls::ReloadingCert;
use tessera::controller::webhook_server::{serve, tls_config, StaticClasses};
use tokio_util::sync::CancellationToken;

const DIR: &str = "tests/data/webhook";

async fn post(addr: std::net::SocketAddr, path: &str, body: Vec<u8>) -> (u16, Value) {
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_file(Path::new(DIR).join("ca.crt")).unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake against the webhook certificate");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn https_round_trip_gates_a_queued_pod() {
    let tls = tls_config(
        &Path::new(DIR).join("tls.crt"),
        &Path::new(DIR).join("tls.key"),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let classes = Arc::new(StaticClasses(Some([("high".to_string(), 1000)].into())));
    let server = tokio::spawn(serve(listener, tls, classes, shutdown.clone()));

    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "7f0b", "operation": "CREATE",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "object": {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "p", "namespace": "team",
                                            "labels": {"tessera.io/queue-name": "lq",
                                                       "tessera.io/priority-class": "high"}},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    let (code, out) = post(addr, "/mutate", serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(code, 200, "{out}");
    let resp = &out["response"];
    assert_eq!(resp["uid"], "7f0b");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch");
    let patch: k8s_openapi::ByteString = serde_json::from_value(resp["patch"].clone()).unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch.0).unwrap();
    assert!(
        ops.contains(&json!({"op": "add", "path": "/spec/schedulingGates",
                                  "value": [{"name": "tessera.io/admission"}]}))
    );
    assert!(
        ops.contains(&json!({"op": "add", "path": "/metadata/annotations",
                                  "value": {"tessera.io/priority": "1000"}}))
    );

    // Not JSON, and not an AdmissionReview: clear 400s, and the server keeps serving.
    let (code, out) = post(addr, "/mutate", b"{not json".to_vec()).await;
    assert_eq!(code, 400);
    assert!(out["error"].as_str().unwrap().contains("not JSON"), "{out}");
    let (code, out) = post(addr, "/mutate", b"{\"kind\": \"Pod\"}".to_vec()).await;
    assert_eq!(code, 400);
    assert!(
        out["error"].as_str().unwrap().contains("AdmissionReview"),
        "{out}"
    );
    let (code, _) = post(addr, "/mutate", serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(code, 200);

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn bad_key_files_are_named_in_the_error() {
    let err = tls_config(
        Path::new("/nonexistent/tls.crt"),
        Path::new("/nonexistent/tls.key"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/tls.crt"), "{err}");
}

/// A TLS connection trusting both test CAs; returns the served leaf certificate and an
/// HTTP/1 sender on the connection.
async fn connect(
    addr: std::net::SocketAddr,
) -> (
    Vec<u8>,
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
) {
    let mut roots = rustls::RootCertStore::empty();
    for ca in ["ca.crt", "rotated/ca.crt"] {
        roots
            .add(CertificateDer::from_pem_file(Path::new(DIR).join(ca)).unwrap())
            .unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    (leaf, sender)
}

async fn healthz(sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>) -> u16 {
    let req = hyper::Request::get("/healthz")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender.send_request(req).await.unwrap().status().as_u16()
}

fn der(file: &str) -> Vec<u8> {
    CertificateDer::from_pem_file(Path::new(DIR).join(file))
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_dropping_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let install = |prefix: &str| {
        // As the kubelet updates a Secret volume: the new files appear by rename.
        for (name, to) in [("tls.key", &key), ("tls.crt", &cert)] {
            let tmp = dir.path().join(format!(".{name}.tmp"));
            std::fs::copy(Path::new(DIR).join(format!("{prefix}{name}")), &tmp).unwrap();
            std::fs::rename(&tmp, to).unwrap();
        }
    };
    install("");
    let reloading = ReloadingCert::load(&cert, &key).unwrap();
    let tls = reloading.server_config().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let watcher = tokio::spawn(reloading.watch(Duration::from_millis(20), shutdown.clone()));
    let classes = Arc::new(StaticClasses(None));
    let server = tokio::spawn(serve(listener, tls, classes, shutdown.clone()));

    let (leaf, mut old_conn) = connect(addr).await;
    assert_eq!(leaf, der("tls.crt"));
    install("rotated/");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (leaf, _) = connect(addr).await;
        if leaf == der("rotated/tls.crt") {
            break;
        }
        assert_eq!(leaf, der("tls.crt"), "only ever the old or the new pair");
        assert!(
            tokio::time::Instant::now() < deadline,
            "rotation not picked up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        healthz(&mut old_conn).await,
        200,
        "open connections keep working"
    );

    shutdown.cancel();
    server.await.unwrap().unwrap();
    watcher.await.unwrap();
}
