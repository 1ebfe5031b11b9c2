//! The admission webhook over real HTTPS (rustls on loopback): an AdmissionReview for a
//! pod naming a queue comes back with the scheduling-gate JSONPatch; garbage is a 400; a
//! rotated certificate is served to new connections while open ones keep working.
//! Hardening (`controller_webhook/hardening.rs`): slow clients, the connection cap, accept
//! errors (injected, and a real EMFILE in a child process), the probes. The
//! self-managed certificate against the API-server double (`controller_webhook/certs.rs`).
//! Kueue's label honoured only with `--accept-kueue-labels`, by the controller too
//! (`controller_webhook/kueue.rs`). `POST /vgpu` (the vGPU pod webhook): the
//! schedulerName patch, denials, and a queued vGPU pod through both entries; its DRA
//! mode (`controller_webhook/dra_mode.rs`).

mod support;

#[path = "controller_webhook/binary.rs"]
mod binary;
#[path = "controller_webhook/certs.rs"]
mod certs;
#[path = "controller_webhook/dra_mode.rs"]
mod dra_mode;
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
use tessera::controller::vgpu_webhook::VgpuOptions;
use tessera::controller::webhook::Options;
use tessera::controller::webhook_server::{
    run, serve, tls_config, Health, Limits, Server, StaticClasses,
};
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

/// The test certificate's TLS config and a loopback listener with its address.
async fn test_server_parts() -> (
    Arc<rustls::ServerConfig>,
    tokio::net::TcpListener,
    std::net::SocketAddr,
) {
    let tls = tls_config(
        &Path::new(DIR).join("tls.crt"),
        &Path::new(DIR).join("tls.key"),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (tls, listener, addr)
}

#[tokio::test]
async fn https_round_trip_gates_a_queued_pod() {
    let (tls, listener, addr) = test_server_parts().await;
    let shutdown = CancellationToken::new();
    let classes = Arc::new(StaticClasses(Some([("high".to_string(), 1000)].into())));
    let server = tokio::spawn(serve(listener, tls, classes, shutdown.clone()));

    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "7f0b", "operation": "CREATE",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "alice"},
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

/// The JSONPatch of an allowed AdmissionReview response (none: empty).
fn patch_ops(response: &Value) -> Vec<Value> {
    match response.get("patch") {
        None => Vec::new(),
        Some(p) => {
            assert_eq!(response["patchType"], "JSONPatch");
            let bytes: k8s_openapi::ByteString = serde_json::from_value(p.clone()).unwrap();
            serde_json::from_slice(&bytes.0).unwrap()
        }
    }
}

/// Applies the JSONPatch operations as the API server would (RFC 6902).
fn apply(mut doc: Value, ops: &[Value]) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(Value::from(ops.to_vec())).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap_or_else(|e| panic!("{e}: {ops:?}"));
    doc
}

fn vgpu_pod(labels: Value, limits: Value, scheduler: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "infer", "namespace": "ml", "labels": labels},
           "spec": {"schedulerName": scheduler,
                    "containers": [{"name": "main", "image": "cuda",
                                    "resources": {"limits": limits}}]}})
}

fn pod_review(uid: &str, pod: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "alice"},
                    "namespace": "ml", "object": pod}}))
    .unwrap()
}

/// A webhook server with default limits and no priority classes, for the `/vgpu` tests.
fn vgpu_server(
    tls: Arc<rustls::ServerConfig>,
    vgpu: VgpuOptions,
    templates: Arc<dyn tessera::controller::claim_templates::TemplateSink>,
) -> Server {
    let limits = Limits::default();
    Server {
        tls,
        classes: Arc::new(StaticClasses(None)),
        options: Options::default(),
        vgpu,
        templates,
        health: Health::new(None, limits.accept_failure_grace),
        limits,
    }
}

#[tokio::test]
async fn vgpu_pods_are_sent_to_the_scheduler_profile_over_https() {
    let (tls, listener, addr) = test_server_parts().await;
    let shutdown = CancellationToken::new();
    let server = vgpu_server(
        tls,
        VgpuOptions::new("gpu-scheduler", false),
        Arc::new(tessera::controller::claim_templates::NoTemplates),
    );
    let task = tokio::spawn(run(server, listener, shutdown.clone()));
    let issue = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                       "nvidia.com/gpucores": "30"});

    // The issue's pod, no queue label: schedulerName set, nothing else touched.
    let pod = vgpu_pod(json!({"app": "infer"}), issue.clone(), "default-scheduler");
    let (code, out) = post(addr, "/vgpu", pod_review("a1", &pod)).await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["uid"], "a1");
    assert_eq!(out["response"]["allowed"], true);
    let ops = patch_ops(&out["response"]);
    assert_eq!(
        ops,
        [json!({"op": "add", "path": "/spec/schedulerName", "value": "gpu-scheduler"})]
    );
    let after = apply(pod.clone(), &ops);
    assert_eq!(after["spec"]["schedulerName"], "gpu-scheduler");
    assert_eq!(after["spec"]["containers"], pod["spec"]["containers"]);

    // An invalid request: denied with the reason, whatever the label.
    let bad = vgpu_pod(
        json!({}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048",
               "nvidia.com/gpumem-percentage": "50"}),
        "default-scheduler",
    );
    let (code, out) = post(addr, "/vgpu", pod_review("a2", &bad)).await;
    assert_eq!(code, 200);
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(out["response"]["status"]["code"], 400);
    assert_eq!(
        out["response"]["status"]["message"],
        "Pod: container \"main\": nvidia.com/gpumem and nvidia.com/gpumem-percentage together; ask for one of them"
    );

    // A pod for another scheduler: left alone.
    let theirs = vgpu_pod(json!({}), issue.clone(), "hami-scheduler");
    let (_, out) = post(addr, "/vgpu", pod_review("a3", &theirs)).await;
    assert_eq!(out["response"]["allowed"], true);
    assert!(patch_ops(&out["response"]).is_empty());

    // A queued vGPU pod goes through both entries (the queue one, then this one): the
    // patches compose into a gated pod for the profile, and running them again adds
    // nothing (the API server may call a webhook again).
    let queued = vgpu_pod(
        json!({"tessera.io/queue-name": "lq"}),
        issue,
        "default-scheduler",
    );
    let (_, out) = post(addr, "/mutate", pod_review("q1", &queued)).await;
    let gated = apply(queued.clone(), &patch_ops(&out["response"]));
    let (_, out) = post(addr, "/vgpu", pod_review("q2", &gated)).await;
    let both = apply(gated, &patch_ops(&out["response"]));
    assert_eq!(
        both["spec"]["schedulingGates"],
        json!([{"name": "tessera.io/admission"}])
    );
    assert_eq!(both["spec"]["schedulerName"], "gpu-scheduler");
    for path in ["/mutate", "/vgpu"] {
        let (_, out) = post(addr, path, pod_review("again", &both)).await;
        assert_eq!(out["response"]["allowed"], true, "{path}");
        assert!(patch_ops(&out["response"]).is_empty(), "{path}: {out}");
    }

    // Garbage on the new path: a 400 like /mutate's.
    let (code, out) = post(addr, "/vgpu", b"{\"kind\": \"Pod\"}".to_vec()).await;
    assert_eq!(code, 400);
    assert!(
        out["error"].as_str().unwrap().contains("AdmissionReview"),
        "{out}"
    );

    shutdown.cancel();
    task.await.unwrap().unwrap();
}
