//! GPU health through DRA: the `DRAResourceHealth` stream (v1alpha1 and v1beta1) over a
//! real unix socket with the kubelet's socket-path authority, fed by the fake backend's
//! XID/ECC events; device taints in the ResourceSlices (schema-valid for 1.34 and 1.35);
//! and an API server with DRADeviceTaints off, which drops taints: the publisher names the
//! gate and the driver withholds the unhealthy GPU's devices instead.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::apiserver::ApiServer;
use tessera::dra::health::{
    devices_from_slices, HealthOptions, HealthService, TaintMode, NO_EXECUTE, TAINT_XID,
};
use tessera::dra::names::DRIVER;
use tessera::dra::plugin::{self, NotImplementedPreparer};
use tessera::dra::publish::{self, Publisher};
use tessera::dra::slices::{apply_taints, build_slices, CounterLayout, SliceOptions};
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::health::HealthPolicy;
use tessera::gpu::{GpuBackend, HealthEvent, Inventory};
use tessera::grpc::connect_unix_with_authority;
use tessera::partition::{config, layout};
use tessera::proto::dra_health::{v1alpha1, v1beta1};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(10);
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

async fn next_beta(
    s: &mut tonic::Streaming<v1beta1::NodeWatchResourcesResponse>,
) -> v1beta1::NodeWatchResourcesResponse {
    tokio::time::timeout(TIMEOUT, s.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}

const MIXED: &str = r#"
tessera:
  gpus:
  - { match: { index: [0] }, mode: mig, mig: { layout: balanced } }
  - { match: { index: [1] }, mode: vgpu, vgpu: { count: 4, memory: 16g, cores: 25 } }
  - { match: all, mode: whole }
"#;

fn slices(
    inv: &Inventory,
    counters: CounterLayout,
) -> Vec<k8s_openapi::api::resource::v1::ResourceSlice> {
    let yaml = if inv.gpus[0].mig_capable {
        MIXED
    } else {
        "version: v1"
    };
    let cfg = config::parse_config("mixed", yaml).unwrap();
    let plan = layout::plan(inv, &cfg).unwrap();
    let mut opts = SliceOptions::new("node-a");
    opts.counters = counters;
    build_slices(inv, &plan, &opts).unwrap()
}

fn xid(gpu: &str, xid: u64) -> HealthEvent {
    HealthEvent::Xid {
        gpu_uuid: gpu.into(),
        xid,
    }
}

#[tokio::test]
async fn health_stream_follows_gpu_events_on_both_versions() {
    let backend = Arc::new(FakeBackend::from_spec("4xH100-80GB").unwrap());
    let inv = backend.inventory().unwrap();
    let published = slices(&inv, CounterLayout::Separate);
    let health = HealthService::new(
        HealthOptions {
            timeout: Duration::from_secs(3),
            heartbeat: Duration::from_millis(300),
        },
        HealthPolicy::default(),
    );
    let devices = devices_from_slices(&published, &inv);
    let total = devices.len();
    assert!(
        total > 20,
        "whole, MIG placements and vGPU devices: {total}"
    );
    health.set_devices(devices);

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("dra.sock");
    let cancel = CancellationToken::new();
    let server = tokio::spawn(plugin::serve_with_health(
        Arc::new(NotImplementedPreparer),
        health.clone(),
        UnixListener::bind(&sock).unwrap(),
        sock.clone(),
        cancel.clone(),
    ));
    let ch = connect_unix_with_authority(&sock, &sock.display().to_string(), TIMEOUT)
        .await
        .unwrap();
    let mut alpha = v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(ch.clone())
        .node_watch_resources(v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut beta = v1beta1::dra_resource_health_client::DraResourceHealthClient::new(ch)
        .node_watch_resources(v1beta1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();

    // Before the backend's events are watched, every device is Unknown.
    let first = next_beta(&mut beta).await;
    assert_eq!(first.devices.len(), total);
    assert!(first
        .devices
        .iter()
        .all(|d| d.health == v1beta1::HealthStatus::Unknown as i32));
    let a = tokio::time::timeout(TIMEOUT, alpha.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(a.devices.len(), total);

    let watcher = {
        let h = health.clone();
        let b: Arc<dyn GpuBackend> = backend.clone();
        let c = cancel.clone();
        tokio::spawn(async move { h.run(b, c).await })
    };
    // Wait for the watch to run: all Healthy, with the timeout.
    let bad_gpu = inv.gpus[0].uuid.clone();
    let status_of = |r: &v1beta1::NodeWatchResourcesResponse, name: &str| {
        r.devices
            .iter()
            .find(|d| d.device.as_ref().unwrap().device_name == name)
            .map(|d| (d.health, d.message.clone()))
            .unwrap()
    };
    let mut r = next_beta(&mut beta).await;
    while r.devices[0].health != v1beta1::HealthStatus::Healthy as i32 {
        r = next_beta(&mut beta).await;
    }
    assert_eq!(r.devices[0].health_check_timeout_seconds, 3);
    assert_eq!(r.devices[0].device.as_ref().unwrap().pool_name, "node-a");

    // XID 79 on GPU 0: the whole GPU and every MIG placement of it turn Unhealthy.
    let t0 = std::time::Instant::now();
    backend.inject(xid(&bad_gpu, 79));
    let mut r = next_beta(&mut beta).await;
    while status_of(&r, "gpu-0").0 != v1beta1::HealthStatus::Unhealthy as i32 {
        r = next_beta(&mut beta).await;
    }
    let latency = t0.elapsed();
    let (h, msg) = status_of(&r, "gpu-0-mig-3g-40gb-4");
    assert_eq!(h, v1beta1::HealthStatus::Unhealthy as i32);
    assert!(msg.contains("XID 79") && msg.contains("NoExecute"), "{msg}");
    assert_eq!(
        status_of(&r, "gpu-1-vgpu").0,
        v1beta1::HealthStatus::Healthy as i32
    );
    eprintln!("XID → Unhealthy on the stream: {latency:?}");

    // Heartbeats keep last_updated_time fresh with no change at all.
    let before = r.devices[0].last_updated_time;
    let mut later = next_beta(&mut beta).await;
    for _ in 0..10 {
        if later.devices[0].last_updated_time > before {
            break;
        }
        later = next_beta(&mut beta).await;
    }
    assert!(later.devices[0].last_updated_time > before, "heartbeat");

    // Recovery.
    backend.inject(HealthEvent::Recovered {
        gpu_uuid: bad_gpu.clone(),
    });
    let mut r = next_beta(&mut beta).await;
    while status_of(&r, "gpu-0").0 != v1beta1::HealthStatus::Healthy as i32 {
        r = next_beta(&mut beta).await;
    }
    // Shutdown: the streams end, so the server's graceful shutdown completes.
    health.close();
    assert!(tokio::time::timeout(TIMEOUT, beta.message())
        .await
        .unwrap()
        .unwrap()
        .is_none());
    cancel.cancel();
    watcher.await.unwrap().unwrap();
    drop(alpha);
    tokio::time::timeout(TIMEOUT, server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

#[test]
fn tainted_slices_validate_against_the_official_schemas() {
    let inv = FakeBackend::from_spec("4xH100-80GB")
        .unwrap()
        .inventory()
        .unwrap();
    let mut state = tessera::dra::health::HealthState::default();
    state.set_watching(true);
    let now = std::time::SystemTime::now();
    state.apply(&xid(&inv.gpus[0].uuid, 79), now);
    state.apply(&xid(&inv.gpus[3].uuid, 74), now);
    let taints = state.taints();
    for (counters, version) in [
        (CounterLayout::Inline, "1.34.0"),
        (CounterLayout::Separate, "1.35.0"),
    ] {
        let mut s = slices(&inv, counters);
        apply_taints(&mut s, &inv, &taints, TaintMode::Taint);
        let devices: Vec<_> = s
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        let tainted = |name: &str| {
            devices
                .iter()
                .find(|d| d.name == name)
                .unwrap()
                .taints
                .clone()
        };
        let t = tainted("gpu-0-mig-1g-10gb-0").unwrap();
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            (TAINT_XID, Some("79"), NO_EXECUTE)
        );
        assert_eq!(tainted("gpu-3").unwrap()[0].effect, "NoSchedule");
        assert!(tainted("gpu-2").is_none() && tainted("gpu-1-vgpu").is_none());
        let objects: Vec<serde_json::Value> =
            s.iter().map(|x| serde_json::to_value(x).unwrap()).collect();
        support::schema::validate_all(&objects, &[version]);

        // Withheld instead: the unhealthy GPUs' devices are gone, the rest stay valid.
        let mut w = slices(&inv, counters);
        apply_taints(&mut w, &inv, &taints, TaintMode::Withhold);
        let names: Vec<String> = w
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect();
        assert!(!names.iter().any(|n| n.starts_with("gpu-0") || n == "gpu-3"));
        assert!(names.contains(&"gpu-2".to_string()) && names.contains(&"gpu-1-vgpu".to_string()));
        let objects: Vec<serde_json::Value> =
            w.iter().map(|x| serde_json::to_value(x).unwrap()).collect();
        support::schema::validate_all(&objects, &[version]);
    }
}

#[tokio::test]
async fn gate_off_names_the_gate_and_withholds_unhealthy_devices() {
    let inv = FakeBackend::from_spec("2xL4").unwrap().inventory().unwrap();
    let mut state = tessera::dra::health::HealthState::default();
    state.set_watching(true);
    state.apply(&xid(&inv.gpus[1].uuid, 48), std::time::SystemTime::now());
    let build = |mode: TaintMode| {
        let mut s = slices(&inv, CounterLayout::Separate);
        apply_taints(&mut s, &inv, &state.taints(), mode);
        s
    };

    // Gate on: the taints are stored as sent.
    let api = ApiServer::start("node-a").await;
    let publisher = Publisher::new(api.client(), "node-a", DRIVER);
    publisher.publish(&build(TaintMode::Taint)).await.unwrap();
    let stored = api.objects(SLICES);
    let dev = |objs: &[serde_json::Value], name: &str| {
        objs.iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
    };
    assert_eq!(
        dev(&stored, "gpu-1").unwrap()["taints"][0]["key"],
        TAINT_XID
    );

    // Gate off: the API server drops `taints`.
    let api = ApiServer::start("node-a").await;
    api.drop_field("spec.devices.*.taints");
    let publisher = Publisher::new(api.client(), "node-a", DRIVER);
    let mut mode = TaintMode::Taint;
    let e = publisher.publish(&build(mode)).await.unwrap_err();
    assert!(
        matches!(&e, publish::Error::FieldDropped { gate, .. } if *gate == "DRADeviceTaints"),
        "{e}"
    );
    assert!(e.to_string().contains("DRADeviceTaints"), "{e}");
    mode = mode.after_publish_error(&e);
    assert_eq!(mode, TaintMode::Withhold);
    publisher.publish(&build(mode)).await.unwrap();
    let stored = api.objects(SLICES);
    assert!(
        dev(&stored, "gpu-1").is_none(),
        "the broken GPU is not advertised"
    );
    assert!(dev(&stored, "gpu-0").is_some(), "the healthy one still is");
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}
