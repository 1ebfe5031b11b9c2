//! DRA plugin registration and the kubelet's socket-path `:authority`, over real sockets.
//!
//! A test kubelet (Rust, tonic over `AuthorityFixingStream::client_forcing`) and a Python
//! grpcio client (`tests/py/dra_kubelet_client.py`, `grpc.default_authority` = socket path)
//! both send the socket path as HTTP/2 `:authority`, exactly as the kubelet does. Control
//! servers without the adapter prove the requests pass only thanks to it.

#[path = "support/skip.rs"]
mod skip;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tessera::dra::kubelet as dra;
use tessera::dra::plugin::{self, NotImplementedPreparer, NOT_IMPLEMENTED};
use tessera::dra::registration::RetryPolicy;
use tessera::dra::socket::{self, DraPaths};
use tessera::grpc::connect_unix_with_authority;
use tessera::proto::dra::{v1, v1beta1};
use tessera::proto::dra_health;
use tessera::proto::pluginregistration as reg;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The agent's DRA side, running in a tempdir kubelet dir.
struct Driver {
    paths: DraPaths,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<socket::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Driver {
    async fn start(retry: RetryPolicy) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let paths = DraPaths::under(dir.path());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(dra::serve(
            paths.clone(),
            Arc::new(NotImplementedPreparer),
            retry,
            cancel.clone(),
        ));
        wait_for(|| paths.registration_socket.exists()).await;
        Self {
            paths,
            cancel,
            task,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        let served = tokio::time::timeout(TIMEOUT, self.task).await;
        assert!(matches!(served, Ok(Ok(Ok(())))), "{served:?}");
        assert!(!self.paths.registration_socket.exists());
        assert!(!self.paths.plugin_socket.exists());
    }
}

async fn wait_for(mut cond: impl FnMut() -> bool) {
    tokio::time::timeout(TIMEOUT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("condition not met within 5 s");
}

/// Dial like the kubelet: `:authority` is the socket path.
async fn kubelet_dial(sock: &Path) -> Channel {
    let authority = sock.display().to_string();
    connect_unix_with_authority(sock, &authority, TIMEOUT)
        .await
        .unwrap()
}

fn claims<C>(make: impl Fn(&str) -> C) -> Vec<C> {
    ["uid-a", "uid-b", "uid-c"]
        .iter()
        .map(|u| make(u))
        .collect()
}

async fn prepare_v1(ch: Channel) -> Result<Vec<(String, String)>, tonic::Status> {
    let mut c = v1::dra_plugin_client::DraPluginClient::new(ch);
    let req = v1::NodePrepareResourcesRequest {
        claims: claims(|uid| v1::Claim {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("name-{uid}"),
        }),
    };
    let resp = c.node_prepare_resources(req).await?.into_inner();
    let mut out: Vec<_> = resp.claims.into_iter().map(|(k, v)| (k, v.error)).collect();
    out.sort();
    Ok(out)
}

async fn prepare_v1beta1(ch: Channel) -> Result<Vec<(String, String)>, tonic::Status> {
    let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(ch);
    let req = v1beta1::NodePrepareResourcesRequest {
        claims: claims(|uid| v1beta1::Claim {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("name-{uid}"),
        }),
    };
    let resp = c.node_prepare_resources(req).await?.into_inner();
    let mut out: Vec<_> = resp.claims.into_iter().map(|(k, v)| (k, v.error)).collect();
    out.sort();
    Ok(out)
}

fn all_not_implemented() -> Vec<(String, String)> {
    claims(|uid| (uid.to_string(), NOT_IMPLEMENTED.to_string()))
}

/// A DRA v1 server on `sock` with the stock incoming stream (no adapter): the control.
fn serve_without_adapter(sock: &Path, cancel: CancellationToken) {
    let listener = UnixListener::bind(sock).unwrap();
    let svc = v1::dra_plugin_server::DraPluginServer::new(plugin::v1::DraV1(Arc::new(
        NotImplementedPreparer,
    )));
    let svc_beta = v1beta1::dra_plugin_server::DraPluginServer::new(plugin::v1beta1::DraV1beta1(
        Arc::new(NotImplementedPreparer),
    ));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .add_service(svc_beta)
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                cancel.cancelled_owned(),
            ),
    );
}

#[tokio::test]
async fn stock_h2_rejects_the_socket_path_authority_and_the_adapter_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.sock");
    let cancel = CancellationToken::new();
    serve_without_adapter(&plain, cancel.clone());
    wait_for(|| plain.exists()).await;

    // Control: same server, authority `localhost`: fine.
    let localhost = connect_unix_with_authority(&plain, "localhost", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(prepare_v1(localhost).await.unwrap(), all_not_implemented());
    // The trap: the socket path as authority is a malformed request for h2.
    let err = prepare_v1(kubelet_dial(&plain).await).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");

    // With the adapter (the driver's dra.sock) the very same request succeeds.
    let driver = Driver::start(RetryPolicy::default()).await;
    let ch = kubelet_dial(&driver.paths.plugin_socket).await;
    assert_eq!(prepare_v1(ch).await.unwrap(), all_not_implemented());
    cancel.cancel();
    driver.stop().await;
}

#[tokio::test]
async fn kubelet_registers_the_driver_and_prepares_on_both_api_versions() {
    let driver = Driver::start(RetryPolicy::default()).await;
    let ch = kubelet_dial(&driver.paths.registration_socket).await;
    let mut registration = reg::registration_client::RegistrationClient::new(ch);
    let info = registration
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.tessera.io");
    assert_eq!(Path::new(&info.endpoint), driver.paths.plugin_socket);
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    registration
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();

    // Dial the endpoint GetInfo named, as the kubelet does; one connection, many calls
    // (HPACK dynamic-table references across requests go through the adapter).
    let ch = kubelet_dial(Path::new(&info.endpoint)).await;
    for _ in 0..3 {
        assert_eq!(prepare_v1(ch.clone()).await.unwrap(), all_not_implemented());
        assert_eq!(
            prepare_v1beta1(ch.clone()).await.unwrap(),
            all_not_implemented()
        );
    }
    let mut c = v1::dra_plugin_client::DraPluginClient::new(ch.clone());
    let unprepared = c
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: claims(|uid| v1::Claim {
                namespace: "ns".into(),
                uid: uid.into(),
                name: "n".into(),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims.len(), 3);
    assert!(unprepared
        .claims
        .values()
        .all(|r| r.error == NOT_IMPLEMENTED));

    // Health placeholders: one empty device list on each version.
    let mut h1 =
        dra_health::v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(ch.clone());
    let mut s1 = h1
        .node_watch_resources(dra_health::v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(TIMEOUT, s1.message()).await.unwrap();
    assert_eq!(first.unwrap().unwrap().devices.len(), 0);
    let mut h2 = dra_health::v1beta1::dra_resource_health_client::DraResourceHealthClient::new(ch);
    let mut s2 = h2
        .node_watch_resources(dra_health::v1beta1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(TIMEOUT, s2.message()).await.unwrap();
    assert_eq!(first.unwrap().unwrap().devices.len(), 0);
    drop((s1, s2));
    driver.stop().await;
}

#[tokio::test]
async fn a_rejected_registration_is_offered_again_on_a_new_socket() {
    let driver = Driver::start(RetryPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(200),
    })
    .await;
    let sock = driver.paths.registration_socket.clone();
    let inode = |p: &PathBuf| std::fs::metadata(p).map(|m| m.ino()).ok();
    for round in 0..2 {
        let before = inode(&sock);
        let ch = kubelet_dial(&sock).await;
        let mut registration = reg::registration_client::RegistrationClient::new(ch);
        registration.get_info(reg::InfoRequest {}).await.unwrap();
        registration
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: false,
                error: format!("round {round}: version not supported"),
            })
            .await
            .unwrap();
        // Withdrawn (seen missing, or an inode change if the poll missed the gap), then
        // offered again.
        let mut withdrawn = false;
        wait_for(|| {
            let now = inode(&sock);
            withdrawn |= now.is_none() || now != before;
            withdrawn && now.is_some()
        })
        .await;
    }
    // The re-created socket answers like the first one.
    let ch = kubelet_dial(&sock).await;
    let info = reg::registration_client::RegistrationClient::new(ch)
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "gpu.tessera.io");
    driver.stop().await;
}

fn python_has_grpcio() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .status()
        .is_ok_and(|s| s.success())
}

fn run_python(args: &[&str]) -> (bool, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/tests/py/dra_kubelet_client.py"))
        .arg(format!("{root}/proto"))
        .args(args)
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_with_socket_path_authority() {
    if !python_has_grpcio() {
        skip::tool_missing(
            "python3 grpcio/grpcio-tools",
            "pip install grpcio grpcio-tools",
        );
        return;
    }
    let driver = Driver::start(RetryPolicy::default()).await;
    let reg_sock = driver.paths.registration_socket.display().to_string();
    let dra_sock = driver.paths.plugin_socket.display().to_string();
    let (ok, text) = tokio::task::spawn_blocking(move || {
        run_python(&["--reg", &reg_sock, "--dra", &dra_sock, "--expect", "ok"])
    })
    .await
    .unwrap();
    eprintln!("python, adapter:\n{text}");
    assert!(ok, "{text}");
    assert!(
        text.contains("\"supported_versions\": [\"v1.DRAPlugin\", \"v1beta1.DRAPlugin\"]"),
        "{text}"
    );
    assert_eq!(text.matches(NOT_IMPLEMENTED).count(), 8, "{text}");

    // Control: the same client against a server without the adapter is rejected.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.sock");
    let cancel = CancellationToken::new();
    serve_without_adapter(&plain, cancel.clone());
    let plain = plain.display().to_string();
    let (ok, text) =
        tokio::task::spawn_blocking(move || run_python(&["--dra", &plain, "--expect", "rejected"]))
            .await
            .unwrap();
    eprintln!("python, no adapter (control):\n{text}");
    assert!(ok, "{text}");
    assert_eq!(text.matches("StatusCode.INTERNAL").count(), 4, "{text}");
    cancel.cancel();
    driver.stop().await;
}

/// Cost of the adapter per call: median NodePrepareResources(v1, 3 claims) round trip,
/// the three setups interleaved call by call so machine load hits them alike. Run:
/// `cargo test --test dra_registration -- --ignored --nocapture adapter_overhead`.
#[tokio::test]
#[ignore = "measurement, prints numbers"]
async fn adapter_overhead() {
    const N: usize = 3000;
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.sock");
    let cancel = CancellationToken::new();
    serve_without_adapter(&plain, cancel.clone());
    wait_for(|| plain.exists()).await;
    let driver = Driver::start(RetryPolicy::default()).await;
    let localhost = |p: PathBuf| async move {
        tessera::deviceplugin::registration::connect_unix(&p, TIMEOUT)
            .await
            .unwrap()
    };
    let setups = [
        (
            "stock server, authority localhost (baseline)",
            localhost(plain.clone()).await,
        ),
        (
            "adapter server, authority localhost",
            localhost(driver.paths.plugin_socket.clone()).await,
        ),
        (
            "adapter server, socket-path authority (client rewrites too)",
            kubelet_dial(&driver.paths.plugin_socket).await,
        ),
    ];
    let mut samples = vec![Vec::with_capacity(N); setups.len()];
    for round in 0..N + 100 {
        for (i, (_, ch)) in setups.iter().enumerate() {
            let t = std::time::Instant::now();
            prepare_v1(ch.clone()).await.unwrap();
            if round >= 100 {
                samples[i].push(t.elapsed()); // the first 100 rounds warm up
            }
        }
    }
    let medians: Vec<Duration> = samples
        .iter_mut()
        .map(|s| {
            s.sort();
            s[N / 2]
        })
        .collect();
    println!("median NodePrepareResources round trip, {N} calls each:");
    for ((name, _), m) in setups.iter().zip(&medians) {
        let ratio = m.as_secs_f64() / medians[0].as_secs_f64();
        println!("  {name}: {m:?} ({ratio:.2}x)");
    }
    cancel.cancel();
    driver.stop().await;
}
