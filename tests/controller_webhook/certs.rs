//! `--cert-mode=self` against the API-server double: a fresh install (no Secret) gets a
//! CA and serving certificate in a Secret, the webhook's caBundle is set to that CA and
//! the webhook answers over TLS verified with it; a second instance reuses the Secret
//! (also when the two race to create it); an expiring certificate is rotated and the
//! new one served without a restart. Every request is allowed by the shipped RBAC.

use super::hardening::{gated, pod_review, post_tls};
use crate::support::apiserver::ApiServer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tessera::controller::certs::{self, Bundle, CertConfig, Renewal};
use tessera::controller::tls::CertResolver;
use tessera::controller::webhook::Options;
use tessera::controller::webhook_server::{run, Health, Limits, Server, StaticClasses};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const SECRETS: &str = "/api/v1/namespaces/tessera-system/secrets";
pub const HOOKS: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const DNS: &str = "tessera-webhook.tessera-system.svc";

fn cfg() -> CertConfig {
    CertConfig {
        check_every: Duration::from_millis(100),
        ..CertConfig::new("tessera-system")
    }
}

/// The shipped MutatingWebhookConfiguration (no caBundle), as `kubectl apply` made it.
pub fn shipped_webhook_config() -> Value {
    let text = std::fs::read_to_string("daemonset/controller/webhook.yaml").unwrap();
    serde_saphyr::from_str::<Value>(&text).unwrap()
}

pub fn secret_entry(s: &ApiServer, key: &str) -> Vec<u8> {
    let secret = s
        .objects(SECRETS)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "tessera-webhook-cert")
        .expect("the Secret");
    let b: k8s_openapi::ByteString = serde_json::from_value(secret["data"][key].clone()).unwrap();
    b.0
}

pub fn ca_bundles(s: &ApiServer) -> Vec<Vec<u8>> {
    let config = &s.objects(HOOKS)[0];
    config["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let b: k8s_openapi::ByteString =
                serde_json::from_value(w["clientConfig"]["caBundle"].clone())
                    .unwrap_or_else(|e| panic!("{}: no caBundle ({e})", w["name"]));
            b.0
        })
        .collect()
}

/// One controller instance: the certificate loop and the webhook on its own port.
struct Instance {
    resolver: Arc<CertResolver>,
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn start(s: &ApiServer) -> Instance {
    let resolver = CertResolver::empty();
    let stop = CancellationToken::new();
    let certs_task = tokio::spawn(certs::run(
        s.client(),
        cfg(),
        resolver.clone(),
        stop.clone(),
    ));
    let limits = Limits::default();
    let server = Server {
        tls: resolver.server_config().unwrap(),
        classes: Arc::new(StaticClasses(None)),
        options: Options::default(),
        vgpu: Default::default(),
        templates: Arc::new(tessera::controller::claim_templates::NoTemplates),
        health: Health::new(Some(resolver.clone()), limits.accept_failure_grace),
        limits,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serve = tokio::spawn({
        let stop = stop.clone();
        async move { run(server, listener, stop).await.unwrap() }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !resolver.is_ready() {
        assert!(tokio::time::Instant::now() < deadline, "no certificate");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Instance {
        resolver,
        addr,
        stop,
        tasks: vec![certs_task, serve],
    }
}

impl Instance {
    async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

async fn cluster() -> ApiServer {
    let s = ApiServer::empty().await;
    s.put_object(HOOKS, shipped_webhook_config());
    s
}

#[tokio::test]
async fn a_fresh_install_makes_its_certificate_and_sets_the_ca_bundle() {
    let s = cluster().await;
    assert!(s.objects(SECRETS).is_empty());
    let a = start(&s).await;
    let ca = secret_entry(&s, "ca.crt");
    let bundles = ca_bundles(&s);
    assert_eq!(bundles.len(), 3, "every webhook of the configuration");
    assert!(
        bundles.iter().all(|b| *b == ca),
        "caBundle is the Secret's CA"
    );
    // The API server's view: TLS to the Service's name, verified with the caBundle.
    let (code, answer) = post_tls(
        a.addr,
        &bundles[0],
        DNS,
        "/mutate",
        pod_review(json!({"tessera.io/queue-name": "lq"})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{answer}");
    assert!(gated(&answer));
    // Another CA does not verify it.
    let other = Bundle::generate(&cfg(), SystemTime::now()).unwrap();
    let err = post_tls(a.addr, other.ca_cert.as_bytes(), DNS, "/mutate", vec![])
        .await
        .unwrap_err();
    assert!(err.starts_with("TLS"), "{err}");

    // A second replica reuses the Secret: same pair, no write.
    let writes = s.writes();
    let b = start(&s).await;
    assert_eq!(b.resolver.leaf(), a.resolver.leaf());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.writes(), writes, "nothing rewritten by either replica");
    assert_eq!(s.objects(SECRETS).len(), 1);
    let (code, _) = post_tls(b.addr, &bundles[0], DNS, "/mutate", pod_review(json!({})))
        .await
        .unwrap();
    assert_eq!(code, 200);
    a.stop().await;
    b.stop().await;
    crate::support::rbac::assert_allows_every_request(&s, "daemonset/controller/rbac.yaml");
}

#[tokio::test]
async fn two_replicas_racing_to_create_the_secret_share_the_winner() {
    let s = cluster().await;
    // The other replica's create lands just before ours: ours gets 409 AlreadyExists.
    let theirs = Bundle::generate(&cfg(), SystemTime::now()).unwrap();
    let data: serde_json::Map<String, Value> = [
        ("ca.crt", &theirs.ca_cert),
        ("ca.key", &theirs.ca_key),
        ("tls.crt", &theirs.cert),
        ("tls.key", &theirs.key),
    ]
    .into_iter()
    .map(|(k, v)| {
        let b = k8s_openapi::ByteString(v.as_bytes().to_vec());
        (k.to_string(), serde_json::to_value(b).unwrap())
    })
    .collect();
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "tessera-webhook-cert", "namespace": "tessera-system"},
        "data": data});
    s.before_next_write("POST", SECRETS, move |s| s.put_object(SECRETS, secret));
    let bundle = certs::ensure(&s.client(), &cfg(), SystemTime::now())
        .await
        .unwrap();
    assert_eq!(bundle, theirs, "the winner's pair is used, not overwritten");
    assert_eq!(secret_entry(&s, "tls.crt"), theirs.cert.as_bytes());
    crate::support::rbac::assert_allows_every_request(&s, "daemonset/controller/rbac.yaml");
}

#[tokio::test]
async fn an_expiring_certificate_is_rotated_and_served_without_a_restart() {
    let s = cluster().await;
    let a = start(&s).await;
    let ca = secret_entry(&s, "ca.crt");
    let first_leaf = a.resolver.leaf().unwrap();
    // Another replica's Secret, as it will stand in 340 days: the serving pair has
    // 25 days left (under the 30 days of rotate_before).
    let now = SystemTime::now();
    let ca_key = String::from_utf8(secret_entry(&s, "ca.key")).unwrap();
    let ca_pem = String::from_utf8(ca.clone()).unwrap();
    let names = cfg().dns_names();
    let (cert, key) = certs::new_serving(
        &ca_pem,
        &ca_key,
        &names,
        now,
        Duration::from_secs(25 * 86400),
    )
    .unwrap();
    let expiring = Bundle {
        ca_cert: ca_pem.clone(),
        ca_key,
        cert: cert.clone(),
        key,
    };
    assert_eq!(expiring.renewal(&cfg(), now), Renewal::Serving);
    let mut secret = s
        .objects(SECRETS)
        .into_iter()
        .find(|o| o["metadata"]["name"] == "tessera-webhook-cert")
        .unwrap();
    secret["data"]["tls.crt"] =
        serde_json::to_value(k8s_openapi::ByteString(cert.as_bytes().to_vec())).unwrap();
    secret["data"]["tls.key"] =
        serde_json::to_value(k8s_openapi::ByteString(expiring.key.as_bytes().to_vec())).unwrap();
    s.put_object(SECRETS, secret);
    // The running instance sees it, rotates it (same CA), and serves the new pair.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stored = secret_entry(&s, "tls.crt");
        let leaf = a.resolver.leaf().unwrap();
        if stored != cert.as_bytes() && leaf != first_leaf {
            let rotated = String::from_utf8(stored).unwrap();
            let left = certs::not_after(&rotated).unwrap()
                - now
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64;
            if left > 300 * 86400 {
                break;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "not rotated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(secret_entry(&s, "ca.crt"), ca, "the CA stays");
    assert!(ca_bundles(&s).iter().all(|b| *b == ca));
    let (code, _) = post_tls(a.addr, &ca, DNS, "/mutate", pod_review(json!({})))
        .await
        .unwrap();
    assert_eq!(code, 200);
    // An expiring CA: a new one, the old one kept in the bundle while still valid.
    let soon = SystemTime::now();
    let (old_ca, old_key) = certs::new_ca(soon, Duration::from_secs(10 * 86400)).unwrap();
    let (c, k) =
        certs::new_serving(&old_ca, &old_key, &names, soon, Duration::from_secs(86400)).unwrap();
    let dying = Bundle {
        ca_cert: old_ca.clone(),
        ca_key: old_key,
        cert: c,
        key: k,
    };
    let renewed = dying
        .renew(dying.renewal(&cfg(), soon), &cfg(), soon)
        .unwrap();
    assert!(
        renewed.ca_cert.ends_with(&old_ca),
        "old CA kept while valid"
    );
    assert_ne!(renewed.ca_cert, old_ca);
    a.stop().await;
    crate::support::rbac::assert_allows_every_request(&s, "daemonset/controller/rbac.yaml");
}

#[tokio::test]
async fn a_removed_ca_bundle_is_set_again() {
    let s = cluster().await;
    let a = start(&s).await;
    let ca = secret_entry(&s, "ca.crt");
    // Someone re-creates the configuration without a caBundle.
    s.put_object(HOOKS, shipped_webhook_config());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let config = &s.objects(HOOKS)[0];
        if config["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["clientConfig"]["caBundle"].is_string())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "caBundle not restored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ca_bundles(&s).iter().all(|b| *b == ca));
    a.stop().await;
}
