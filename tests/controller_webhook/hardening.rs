//! The webhook must never be the outage: slow clients are dropped on time with memory
//! bounded while a real AdmissionReview is still answered; connections over the cap
//! wait briefly and are dropped; accept errors (injected, and a real EMFILE in a child
//! process) never end the listener; the probes report a listener that is gone.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};
use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::controller::tls::{certified_key, CertResolver};
use tessera::controller::webhook::Options;
use tessera::controller::webhook_server::{
    run, serve_probes, Accept, Health, Limits, Server, StaticClasses,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const DIR: &str = "tests/data/webhook";

/// A resolver serving the test pair of tests/data/webhook (for `localhost`).
pub fn test_resolver() -> Arc<CertResolver> {
    let read = |f: &str| std::fs::read(Path::new(DIR).join(f)).unwrap();
    let r = CertResolver::empty();
    r.set(certified_key(&read("tls.crt"), &read("tls.key"), "test pair").unwrap());
    r
}

pub fn client_config(ca_pems: &[u8]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pems) {
        roots.add(ca.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// POSTs `body` to `path` over TLS verified against `ca_pems` for `name`: status and
/// JSON answer, or the connection error.
pub async fn post_tls(
    addr: SocketAddr,
    ca_pems: &[u8],
    name: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, Value), String> {
    let connector = tokio_rustls::TlsConnector::from(client_config(ca_pems));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = connector
        .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::post(path)
        .header("host", name)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// An AdmissionReview of a pod labelled `labels`.
pub fn pod_review(labels: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "system:serviceaccount:kube-system:x"},
                    "object": {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "p", "namespace": "team", "labels": labels},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    .unwrap()
}

/// Whether an answered review gated the pod.
pub fn gated(answer: &Value) -> bool {
    let Some(patch) = answer["response"].get("patch") else {
        return false;
    };
    let patch: k8s_openapi::ByteString = serde_json::from_value(patch.clone()).unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch.0).unwrap();
    ops.iter().any(|op| {
        op["path"]
            .as_str()
            .unwrap()
            .starts_with("/spec/schedulingGates")
    })
}

async fn review_ok(addr: SocketAddr) -> Result<(u16, Value), String> {
    let ca = std::fs::read(Path::new(DIR).join("ca.crt")).unwrap();
    post_tls(
        addr,
        &ca,
        "localhost",
        "/mutate",
        pod_review(json!({"tessera.io/queue-name": "lq"})),
    )
    .await
}

fn server(limits: Limits, options: Options) -> (Server, Arc<Health>) {
    let resolver = test_resolver();
    let health = Health::new(Some(resolver.clone()), limits.accept_failure_grace);
    let server = Server {
        tls: resolver.server_config().unwrap(),
        classes: Arc::new(StaticClasses(None)),
        options,
        vgpu: Default::default(),
        templates: Arc::new(tessera::controller::claim_templates::NoTemplates),
        limits,
        health: health.clone(),
    };
    (server, health)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Waits until the server closes `tcp` (EOF or an error on read or write), writing
/// `trickle` one byte every 100 ms meanwhile; returns how long that took (None: still
/// open after `give_up`).
async fn until_closed(
    mut tcp: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    trickle: &[u8],
    give_up: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 512];
    let mut next = 0;
    while start.elapsed() < give_up {
        tokio::select! {
            r = tcp.read(&mut buf) => match r {
                Ok(0) | Err(_) => return Some(start.elapsed()),
                Ok(_) => {}
            },
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if next < trickle.len() {
                    if tcp.write_all(&trickle[next..next + 1]).await.is_err() {
                        return Some(start.elapsed());
                    }
                    next += 1;
                }
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_dropped_on_time_and_memory_stays_bounded() {
    let limits = Limits {
        handshake_timeout: Duration::from_millis(800),
        header_timeout: Duration::from_millis(1500),
        request_timeout: Duration::from_millis(2500),
        idle_timeout: Duration::from_millis(2000),
        max_connections: 256,
        max_body_in_flight: 8 << 20,
        ..Limits::default()
    };
    let (srv, _health) = server(limits, Options::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(srv, listener, shutdown.clone()));
    // Warm up (TLS, allocator), then measure.
    assert_eq!(review_ok(addr).await.unwrap().0, 200);
    let before = rss_kib();
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib() as usize, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let ca = std::fs::read(Path::new(DIR).join("ca.crt")).unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_config(&ca));
    let mut clients = Vec::new();
    for i in 0..100 {
        let connector = connector.clone();
        clients.push(tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            match i % 4 {
                // Opens TCP and sends nothing: the handshake timeout.
                0 => ("silent", until_closed(tcp, b"", Duration::from_secs(10)).await),
                // Trickles bytes that never make a TLS handshake.
                1 => (
                    "trickles TLS",
                    until_closed(tcp, &[0x16; 64], Duration::from_secs(10)).await,
                ),
                // Handshakes, then trickles a request head: the header timeout.
                2 => {
                    let tls = connector
                        .connect(ServerName::try_from("localhost").unwrap(), tcp)
                        .await
                        .unwrap();
                    let head = b"POST /mutate HTTP/1.1\r\nhost: localhost\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
                    ("trickles headers", until_closed(tls, head, Duration::from_secs(10)).await)
                }
                // Declares a 4 MB body, sends 3.5 MB of it and stalls: memory must not
                // follow (at most max_body_in_flight is read at once; 503 beyond).
                _ => {
                    let mut tls = connector
                        .connect(ServerName::try_from("localhost").unwrap(), tcp)
                        .await
                        .unwrap();
                    let head = "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 4000000\r\n\r\n";
                    let chunk = vec![b' '; 64 << 10];
                    let sent = async {
                        tls.write_all(head.as_bytes()).await?;
                        for _ in 0..56 {
                            tls.write_all(&chunk).await?;
                        }
                        tls.flush().await
                    };
                    let start = Instant::now();
                    let _ = tokio::time::timeout(Duration::from_secs(10), sent).await;
                    let left = Duration::from_secs(10).saturating_sub(start.elapsed());
                    let closed = until_closed(tls, b"", left).await;
                    ("stalls a big body", closed.map(|c| c + start.elapsed()))
                }
            }
        }));
    }
    // While they hold their connections, a real review is answered.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (code, answer) = review_ok(addr).await.expect("answered during the attack");
    assert_eq!(code, 200, "{answer}");
    assert!(gated(&answer), "{answer}");
    for c in clients {
        let (kind, closed) = c.await.unwrap();
        let closed = closed.unwrap_or_else(|| panic!("{kind}: still open after 10 s"));
        let bound = match kind {
            "silent" | "trickles TLS" => Duration::from_millis(800 + 1000),
            "trickles headers" => Duration::from_millis(800 + 1500 + 1000),
            _ => Duration::from_millis(800 + 1500 + 2500 + 2000),
        };
        assert!(
            closed <= bound,
            "{kind}: closed after {closed:?}, over {bound:?}"
        );
    }
    sampler.abort();
    let grown_mib = (peak.load(Ordering::Relaxed) as u64).saturating_sub(before) / 1024;
    // 25 clients × 3.5 MB of body would be 87 MB kept without the bound.
    assert!(
        grown_mib < 40,
        "RSS grew {grown_mib} MiB under 100 slow clients"
    );
    // And it is still serving.
    assert_eq!(review_ok(addr).await.unwrap().0, 200);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn connections_over_the_cap_wait_briefly_then_are_dropped() {
    let limits = Limits {
        handshake_timeout: Duration::from_secs(30),
        max_connections: 4,
        connection_wait: Duration::from_millis(500),
        ..Limits::default()
    };
    let (srv, health) = server(limits, Options::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run(srv, listener, shutdown.clone()));
    // Four silent connections take every slot (their handshake timeout is long).
    let mut holders = Vec::new();
    for _ in 0..4 {
        holders.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Four more wait for a slot, then are dropped; four beyond those are dropped at once.
    let mut extra = Vec::new();
    for _ in 0..8 {
        let tcp = TcpStream::connect(addr).await.unwrap();
        extra.push(tokio::spawn(until_closed(tcp, b"", Duration::from_secs(5))));
    }
    let mut closed: Vec<Duration> = Vec::new();
    for e in extra {
        closed.push(e.await.unwrap().expect("dropped"));
    }
    closed.sort();
    assert!(
        closed[3] < Duration::from_millis(400),
        "dropped at once: {closed:?}"
    );
    assert!(
        closed[4] >= Duration::from_millis(400) && closed[7] < Duration::from_millis(2000),
        "waited about connection_wait: {closed:?}"
    );
    assert_eq!(health.connections_dropped(), 8);
    // The slots free up when their holders go; then it serves again.
    drop(holders);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(review_ok(addr).await.unwrap().0, 200);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A TcpListener whose first `errors` accepts fail with EMFILE.
struct Flaky {
    listener: TcpListener,
    errors: usize,
}

impl Accept for Flaky {
    type Io = TcpStream;
    async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        if self.errors > 0 {
            self.errors -= 1;
            return Err(io::Error::from_raw_os_error(24)); // EMFILE
        }
        self.listener.accept().await
    }
}

#[tokio::test]
async fn injected_accept_errors_do_not_end_the_listener() {
    let limits = Limits {
        accept_failure_grace: Duration::from_millis(300),
        ..Limits::default()
    };
    let (srv, health) = server(limits, Options::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let flaky = Flaky {
        listener,
        errors: 10,
    };
    let task = tokio::spawn(run(srv, flaky, shutdown.clone()));
    // Backoff 5, 10, 20 … ms: by 900 ms, 8 errors over more than 300 ms of failing.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(health.accept_errors() >= 6, "{}", health.accept_errors());
    assert!(!health.ready().ok, "not ready while accepting fails");
    assert!(
        !health.live().ok,
        "failing for longer than the grace: not live"
    );
    let (code, _) = tokio::time::timeout(Duration::from_secs(10), review_ok(addr))
        .await
        .expect("answered once accepting works again")
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(health.accept_errors(), 10);
    assert!(
        health.ready().ok && health.live().ok,
        "{:?}",
        health.ready()
    );
    assert!(!task.is_finished());
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert!(!health.live().ok, "the listener has ended: not live");
}

const CHILD: &str = "TESSERA_WEBHOOK_EMFILE_CHILD";

/// The child of `a_real_emfile_does_not_end_the_listener`: serves the webhook, then
/// opens files until the process has no descriptor left, so that accept fails with a
/// real EMFILE; frees them when told on stdin.
fn emfile_child() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (srv, health) = server(Limits::default(), Options::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(srv, listener, shutdown.clone()));
        let mut held = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => held.push(f),
                Err(e) if e.raw_os_error() == Some(24) => break,
                Err(e) => panic!("{e}"),
            }
        }
        println!("\nCHILD-PORT {} held={}", addr.port(), held.len());
        io::stdout().flush().unwrap();
        let mut lines = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            io::stdin().lock().read_line(&mut line).unwrap();
            line
        });
        // Until the parent says so, every accept fails (EMFILE): report it.
        (&mut lines).await.unwrap();
        println!(
            "\nCHILD-ERRORS {} ready={} live={}",
            health.accept_errors(),
            health.ready().ok,
            health.live().ok
        );
        drop(held);
        io::stdout().flush().unwrap();
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = io::stdin().lock().read_line(&mut line);
        })
        .await
        .unwrap();
        shutdown.cancel();
        task.await.unwrap().unwrap();
    });
}

#[test]
fn a_real_emfile_does_not_end_the_listener() {
    if std::env::var_os(CHILD).is_some() {
        return emfile_child();
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hardening::a_real_emfile_does_not_end_the_listener",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut line = |prefix: &str| loop {
        let l = out
            .next()
            .unwrap_or_else(|| panic!("child ended before {prefix}"))
            .unwrap();
        if let Some(rest) = l.strip_prefix(prefix) {
            return rest.to_string();
        }
    };
    let port: u16 = line("CHILD-PORT ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The connection waits in the backlog while the child's accepts fail.
    let request = rt.spawn(review_ok(addr));
    std::thread::sleep(Duration::from_millis(700));
    assert!(!request.is_finished(), "answered while out of descriptors?");
    writeln!(stdin, "free").unwrap();
    let report = line("CHILD-ERRORS ");
    let errors: u64 = report.split_whitespace().next().unwrap().parse().unwrap();
    assert!(errors >= 2, "accept failed with EMFILE: {report}");
    assert!(
        report.contains("ready=false"),
        "not ready meanwhile: {report}"
    );
    let answered = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), request).await })
        .expect("answered once descriptors are free")
        .unwrap();
    assert_eq!(answered.unwrap().0, 200, "the listener survived EMFILE");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

pub async fn probe(addr: SocketAddr, path: &str) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn probes_fail_when_the_listener_is_gone_or_has_no_certificate() {
    let resolver = CertResolver::empty();
    let limits = Limits::default();
    let health = Health::new(Some(resolver.clone()), limits.accept_failure_grace);
    let probes = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let paddr = probes.local_addr().unwrap();
    let probe_stop = CancellationToken::new();
    let probe_task = tokio::spawn(serve_probes(probes, health.clone(), probe_stop.clone()));
    // Not started yet: not ready, but alive (it is starting).
    assert_eq!(probe(paddr, "/readyz").await.0, 503);
    assert_eq!(probe(paddr, "/livez").await.0, 200);
    let srv = Server {
        tls: resolver.server_config().unwrap(),
        classes: Arc::new(StaticClasses(None)),
        options: Options::default(),
        vgpu: Default::default(),
        templates: Arc::new(tessera::controller::claim_templates::NoTemplates),
        limits,
        health: health.clone(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(srv, listener, stop.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (code, why) = probe(paddr, "/readyz").await;
    assert_eq!((code, why.trim()), (503, "no serving certificate yet"));
    assert!(
        review_ok(addr).await.is_err(),
        "no certificate: no handshake"
    );
    let read = |f: &str| std::fs::read(Path::new(DIR).join(f)).unwrap();
    resolver.set(certified_key(&read("tls.crt"), &read("tls.key"), "pair").unwrap());
    assert_eq!(probe(paddr, "/readyz").await.0, 200);
    assert_eq!(review_ok(addr).await.unwrap().0, 200);
    // The listener task ends (here: stopped on its own): both probes fail.
    stop.cancel();
    task.await.unwrap().unwrap();
    let (code, why) = probe(paddr, "/livez").await;
    assert_eq!((code, why.trim()), (503, "the webhook listener has ended"));
    assert_eq!(probe(paddr, "/readyz").await.0, 503);
    assert_eq!(probe(paddr, "/nope").await.0, 404);
    probe_stop.cancel();
    probe_task.await.unwrap().unwrap();
}

#[tokio::test]
async fn kueue_labels_are_honoured_only_with_the_option() {
    let ca = std::fs::read(Path::new(DIR).join("ca.crt")).unwrap();
    let kueue = pod_review(json!({"kueue.x-k8s.io/queue-name": "lq"}));
    let ours = pod_review(json!({"tessera.io/queue-name": "lq"}));
    for (accept, kueue_gated) in [(false, false), (true, true)] {
        let options = Options {
            accept_kueue_labels: accept,
        };
        let (srv, _) = server(Limits::default(), options);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(srv, listener, stop.clone()));
        let post = |body: Vec<u8>| post_tls(addr, &ca, "localhost", "/mutate", body);
        let (code, answer) = post(kueue.clone()).await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(gated(&answer), kueue_gated, "accept={accept}: {answer}");
        let (_, answer) = post(ours.clone()).await.unwrap();
        assert!(gated(&answer), "accept={accept}: ours always");
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn an_oversized_body_is_refused_without_being_read() {
    let limits = Limits {
        max_body: 64 << 10,
        ..Limits::default()
    };
    let (srv, _) = server(limits, Options::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(srv, listener, stop.clone()));
    let ca = std::fs::read(Path::new(DIR).join("ca.crt")).unwrap();
    let big = vec![b' '; 100 << 10];
    let (code, answer) = post_tls(addr, &ca, "localhost", "/mutate", big)
        .await
        .unwrap();
    assert_eq!(code, 413, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("65536"),
        "{answer}"
    );
    assert_eq!(review_ok(addr).await.unwrap().0, 200);
    stop.cancel();
    task.await.unwrap().unwrap();
}
