//! A second device plugin beside Tessera's: the real `tessera node` binary, the kubelet
//! emulator (which keeps the device manager's checkpoint), a stand-in for NVIDIA's plugin
//! registering `nvidia.com/gpu` with the node's GPU UUIDs on `nvidia-gpu.sock`, and a
//! plugin for other hardware on `example-nic.sock`. The agent reports the first (log
//! error and the `tessera_device_plugin_conflicts` gauge), not the second.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::Stream;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::kubelet::Kubelet;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;
use tessera::proto::deviceplugin as pb;
use tessera::proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Another vendor's plugin: advertises fixed IDs once and keeps the stream open.
struct OtherPlugin {
    ids: Vec<String>,
}

type Devices = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for OtherPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream = Devices;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        use futures::StreamExt;
        let devices = self
            .ids
            .iter()
            .map(|id| pb::Device {
                id: id.clone(),
                health: "Healthy".into(),
                ..Default::default()
            })
            .collect();
        let first = futures::stream::iter([Ok(pb::ListAndWatchResponse { devices })]);
        Ok(Response::new(Box::pin(
            first.chain(futures::stream::pending()),
        )))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn allocate(
        &self,
        _: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

/// Serves `ids` on `<dir>/<endpoint>` and registers `resource` with the kubelet.
async fn start_other_plugin(dir: &Path, endpoint: &str, resource: &str, ids: Vec<String>) {
    let listener = UnixListener::bind(dir.join(endpoint)).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(OtherPlugin { ids }))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    tessera::deviceplugin::registration::register(
        &dir.join("kubelet.sock"),
        endpoint,
        resource,
        pb::DevicePluginOptions::default(),
    )
    .await
    .unwrap();
}

/// GET /metrics on 127.0.0.1:port (None while nothing listens).
fn metrics(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_plugin_for_the_same_gpus_is_reported_and_other_hardware_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet_dir = tmp.path().join("kubelet");
    let plugin_dir = kubelet_dir.join("device-plugins");
    let kubelet = Kubelet::start(&plugin_dir).await;
    let uuids: Vec<String> = FakeBackend::from_spec("2xA100-80GB")
        .unwrap()
        .inventory()
        .unwrap()
        .gpus
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    start_other_plugin(
        &plugin_dir,
        "nvidia-gpu.sock",
        "nvidia.com/gpu",
        uuids.clone(),
    )
    .await;
    start_other_plugin(
        &plugin_dir,
        "example-nic.sock",
        "example.com/nic",
        vec!["nic-0".into()],
    )
    .await;
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    assert_eq!(kubelet.devices("example.com/nic").await.len(), 1);
    // The kubelet's checkpoint names both resources with their devices.
    let registered = tessera::deviceplugin::coexist::registered_devices(
        &plugin_dir.join(tessera::deviceplugin::coexist::CHECKPOINT),
    )
    .unwrap();
    assert_eq!(registered["nvidia.com/gpu"].len(), 2, "{registered:?}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "node",
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "2xA100-80GB",
            "--standalone",
        ])
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--cdi-root")
        .arg(tmp.path().join("cdi"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let gauge = loop {
        let text = metrics(port).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .find(|l| l.starts_with("tessera_device_plugin_conflicts "))
        {
            if line.ends_with(" 0") && Instant::now() < deadline {
                // Not scanned yet? The first scan runs at start; keep polling briefly.
            } else {
                break line.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no tessera_device_plugin_conflicts gauge: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        gauge, "tessera_device_plugin_conflicts 1",
        "only the GPU plugin conflicts"
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    let mut log = String::new();
    child
        .stderr
        .as_mut()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let conflict: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("device plugin conflict"))
        .collect();
    assert_eq!(conflict.len(), 1, "reported once: {log}");
    let line = conflict[0];
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("nvidia-gpu.sock"), "{line}");
    assert!(line.contains("registered nvidia.com/gpu"), "{line}");
    assert!(line.contains(&uuids[0]), "{line}");
    assert!(!log.contains("example-nic.sock"), "{log}");
}
