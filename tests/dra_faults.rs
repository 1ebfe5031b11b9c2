//! The DRA driver under injected GPU driver faults (the fake backend's `Faults`): a
//! health watch that dies is restarted (devices Unknown meanwhile, still reported, then
//! Healthy again and following events), and a MIG creation that fails half-way gives the
//! kubelet a clear error, leaves no instance the checkpoint does not own, and a retry
//! prepares the claim with exactly the instance it needs.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::apiserver::ApiServer;
use support::dra_agent::{DraAgentBuilder, NodeDirs, NODE};
use support::dra_kubelet::{Claim, DraKubelet};
use support::dra_pool::{complete_pool, gpu_uuids, DRIVER};
use tessera::dra::checkpoint::{Phase, Store};
use tessera::gpu::fake::{FakeBackend, Faults};
use tessera::gpu::GpuBackend;
use tessera::proto::dra_health::v1beta1::{HealthStatus, NodeWatchResourcesResponse};

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims";
const WAIT: Duration = Duration::from_secs(10);
const ALL_MIG: &str = "tessera: { gpus: [ { match: all, mode: mig, mig: { layout: balanced } } ] }";

fn allocate(api: &ApiServer, name: &str, device: &str) -> Claim {
    let uid = format!("uid-{name}");
    let results = json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]);
    api.put_object(
        CLAIMS,
        support::dra_agent::allocated_claim(name, &uid, "gpu.tessera.io", results),
    );
    Claim::new("ml", name, &uid)
}

fn mig_count(backend: &dyn GpuBackend) -> usize {
    backend
        .inventory()
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.mig_devices.len())
        .sum()
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn status_of(r: &NodeWatchResourcesResponse, device: &str) -> Option<i32> {
    r.devices
        .iter()
        .find(|d| d.device.as_ref().is_some_and(|i| i.device_name == device))
        .map(|d| d.health)
}

/// Read the health stream until `device` has `want` (and return that report).
async fn until(
    stream: &mut tonic::Streaming<NodeWatchResourcesResponse>,
    device: &str,
    want: HealthStatus,
) -> NodeWatchResourcesResponse {
    let deadline = Instant::now() + WAIT;
    loop {
        let r = tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if status_of(&r, device) == Some(want as i32) {
            return r;
        }
        assert!(Instant::now() < deadline, "{device} never {want:?}: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_health_watch_is_restarted_and_devices_stay_reported() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec("2xA100-80GB").unwrap());
    let gpu0 = gpu_uuids(backend.as_ref())[0].clone();
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[("default", ALL_MIG)])
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for("slices", || complete_pool(&api).is_some()).await;
    let mut stream = kubelet.watch_health(DRIVER).await.unwrap();
    let healthy = until(&mut stream, "gpu-0", HealthStatus::Healthy).await;
    let reported = healthy.devices.len();

    // The driver's event stream dies and cannot be started again at once.
    backend.set_faults(Faults {
        health_watch_start_failures: 1,
        ..Faults::default()
    });
    backend.end_health_watches();
    let down = until(&mut stream, "gpu-0", HealthStatus::Unknown).await;
    assert_eq!(down.devices.len(), reported, "every device still reported");
    // Restarted (after one failed start), the devices are Healthy again ...
    let up = until(&mut stream, "gpu-0", HealthStatus::Healthy).await;
    assert_eq!(up.devices.len(), reported);
    assert_eq!(backend.faults().health_watch_start_failures, 0);
    // ... and the new watch delivers events.
    backend.inject(tessera::gpu::HealthEvent::Xid {
        gpu_uuid: gpu0,
        xid: 79,
    });
    let sick = until(&mut stream, "gpu-0", HealthStatus::Unhealthy).await;
    assert_eq!(
        status_of(&sick, "gpu-1"),
        Some(HealthStatus::Healthy as i32)
    );
    assert!(complete_pool(&api).is_some(), "the pool is still published");
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_create_that_fails_half_way_is_reported_owned_and_retried() {
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = NodeDirs::under(tmp.path());
    let kubelet = DraKubelet::start(&dirs.kubelet_dir, NODE, api.client()).await;
    let backend = Arc::new(FakeBackend::from_spec("1xA100-80GB").unwrap());
    let agent = DraAgentBuilder::new(&dirs, backend.clone())
        .configs(&[("default", ALL_MIG)])
        .start(&api);
    kubelet.wait_registered(DRIVER, 1, WAIT).await;
    wait_for("slices", || complete_pool(&api).is_some()).await;

    // Two claims; each MIG creation fails once, the first after its instance exists
    // (the driver created the GPU instance, then the compute instance failed).
    let kept = allocate(&api, "kept", "gpu-0-mig-3g-40gb-4");
    let dropped = allocate(&api, "dropped", "gpu-0-mig-2g-20gb-0");
    for claim in [&kept, &dropped] {
        backend.set_faults(Faults {
            mig_create_failures: 1,
            mig_create_fails_after: 1,
            ..Faults::default()
        });
        let out = kubelet
            .prepare(DRIVER, std::slice::from_ref(claim))
            .await
            .unwrap();
        let err = out[&claim.uid].as_ref().unwrap_err();
        assert!(
            err.contains("creating MIG") && err.contains("injected driver fault"),
            "a clear error: {err}"
        );
        assert!(!dirs.claim_spec(&claim.uid).exists());
    }
    // The instances that exist are the two claims' own, recorded before the side effect.
    assert_eq!(mig_count(backend.as_ref()), 2);
    let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
    for claim in [&kept, &dropped] {
        assert_eq!(cp.claims[&claim.uid].phase, Phase::Started);
        assert!(cp.claims[&claim.uid].devices[0].mig.is_some());
    }

    // The kubelet retries one claim: prepared with the instance already there.
    let again = kubelet
        .prepare(DRIVER, std::slice::from_ref(&kept))
        .await
        .unwrap();
    again[&kept.uid].as_ref().unwrap();
    assert!(dirs.claim_spec(&kept.uid).is_file());
    assert_eq!(mig_count(backend.as_ref()), 2, "no second instance");
    // The other pod went away: unprepare destroys its instance.
    let gone = kubelet
        .unprepare(DRIVER, std::slice::from_ref(&dropped))
        .await
        .unwrap();
    gone[&dropped.uid].as_ref().unwrap();
    assert_eq!(mig_count(backend.as_ref()), 1, "no orphan instance");
    let cp = Store::new(&dirs.checkpoint_dir()).read().unwrap();
    assert_eq!(cp.claims[&kept.uid].phase, Phase::Completed);
    assert!(!cp.claims.contains_key(&dropped.uid));
    agent.shutdown().await;
}
