//! `tessera controller` as shipped, against the API-server double with nothing else
//! present: no Secret, a webhook configuration without a caBundle. It becomes ready, the
//! Secret and the caBundle appear, the webhook answers over TLS verified with that CA
//! for the Service's name, and SIGTERM ends it cleanly.

use super::certs::{ca_bundles, secret_entry, shipped_webhook_config, HOOKS};
use super::hardening::{gated, pod_review, post_tls, probe};
use crate::support::apiserver::ApiServer;
use serde_json::json;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

#[tokio::test]
async fn a_fresh_install_brings_the_webhook_up_with_no_manual_step() {
    let s = ApiServer::empty().await;
    s.put_object(HOOKS, shipped_webhook_config());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = crate::support::dra_agent::kubeconfig(dir.path(), &s.url);
    let (webhook, probes) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["controller", "--webhook-only", "--cert-check-interval=1s"])
        .arg(format!("--webhook-addr={webhook}"))
        .arg(format!("--probe-addr={probes}"))
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", "tessera-system")
        .env("POD_NAME", "tessera-controller-0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let up = tokio::net::TcpStream::connect(probes).await.is_ok();
        if up && probe(probes, "/readyz").await.0 == 200 {
            break;
        }
        if tokio::time::Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("not ready: {}", String::from_utf8_lossy(&out.stderr));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(probe(probes, "/livez").await.0, 200);
    let ca = secret_entry(&s, "ca.crt");
    assert!(ca_bundles(&s).iter().all(|b| *b == ca));
    let (code, answer) = post_tls(
        webhook,
        &ca,
        "tessera-webhook.tessera-system.svc",
        "/mutate",
        pod_review(json!({"tessera.io/queue-name": "lq"})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{answer}");
    assert!(gated(&answer), "{answer}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    crate::support::rbac::assert_allows_every_request(&s, "daemonset/controller/rbac.yaml");
}
