//! Driver faults injected into the fake backend, and the node agent surviving them with
//! nothing lost: an inventory error at start is retried (no crash loop), a health watch
//! that dies is restarted and its events flow again while the devices stay advertised, a
//! GPU that falls off the bus is dropped, and a MIG reconfiguration that fails half-way
//! is rolled back (no orphan instance), reported, and retried until it works.

mod support;

use std::time::Duration;

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;
use tessera::gpu::fake::Faults;
use tessera::gpu::{GpuBackend, HealthEvent};

const WAIT: Duration = Duration::from_secs(10);

/// An inventory YAML (with its `faults:`) in `dir`; returns its path for `--fake-gpus`.
fn inventory_file(dir: &std::path::Path, yaml: &str) -> String {
    let path = dir.join("gpus.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_errors_at_start_are_retried_and_a_lost_gpu_is_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let gpus = inventory_file(
        tmp.path(),
        "gpus: [ { model: L4, count: 2 } ]\nfaults: { inventoryFailures: 3 }\n",
    );
    let agent = AgentBuilder::new(&gpus)
        .root(tmp.path().to_path_buf())
        .start();
    // The first reloads fail on the driver; the agent retries on its own (no reload
    // trigger, no restart) and advertises both GPUs.
    let devices = kubelet.devices("nvidia.com/gpu").await;
    assert_eq!(devices.len(), 2);
    assert_eq!(
        agent.backend.faults().inventory_failures,
        0,
        "every fault fired"
    );
    assert!(!agent.task.is_finished(), "the agent did not exit");
    let rejected = agent.events.0.lock().unwrap().clone();
    assert!(
        rejected.iter().any(|m| m.contains("injected driver fault")),
        "{rejected:?}"
    );

    // GPU 1 falls off the bus: the next reload advertises GPU 0 only.
    let inv = agent.backend.inventory().unwrap();
    assert!(agent.backend.remove_gpu(&inv.gpus[1].uuid));
    agent.reload.send(()).unwrap();
    kubelet
        .wait_until(WAIT, "one GPU advertised", |m| {
            m["nvidia.com/gpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 1 && l[0].id.starts_with(&inv.gpus[0].uuid))
        })
        .await;
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_health_watch_is_restarted_and_devices_stay_advertised() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    eventually("a health watch", || agent.backend.health_watches() == 1).await;
    let gpu0 = agent.backend.inventory().unwrap().gpus[0].uuid.clone();

    // The driver's event stream dies, and the next start of it fails once.
    agent.backend.set_faults(Faults {
        health_watch_start_failures: 1,
        ..Faults::default()
    });
    agent.backend.end_health_watches();
    assert_eq!(agent.backend.health_watches(), 0);
    eventually("the health watch restarted", || {
        agent.backend.health_watches() == 1
    })
    .await;
    assert_eq!(agent.backend.faults().health_watch_start_failures, 0);
    assert!(agent.metrics.health_watch_restarts.get() >= 2);
    // Still advertised, and health events reach the kubelet again.
    let st = kubelet.state("nvidia.com/gpu").unwrap();
    assert!(!st.stream_ended);
    assert_eq!(st.lists.last().unwrap().len(), 2);
    agent.backend.inject(HealthEvent::Xid {
        gpu_uuid: gpu0.clone(),
        xid: 79,
    });
    kubelet
        .wait_until(WAIT, "GPU 0 unhealthy after the restart", |m| {
            m["nvidia.com/gpu"].lists.last().is_some_and(|l| {
                l.len() == 2
                    && l.iter()
                        .any(|d| d.id.starts_with(&gpu0) && d.health == "Unhealthy")
            })
        })
        .await;
    assert!(!agent.task.is_finished());
    agent.shutdown().await;
}

const MIG: &str = r#"
version: v1
flags: { migStrategy: mixed }
tessera:
  gpus:
  - match: { index: [0] }
    mode: mig
    mig: { layout: all-1g.10gb }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_failed_mig_layout_is_rolled_back_reported_and_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    // Every MIG reconfiguration fails after creating 3 of its 7 instances.
    let gpus = inventory_file(
        tmp.path(),
        "gpus: [ { model: A100-80GB, count: 1, migEnabled: true } ]\n\
         faults: { migCreateFailures: 1000, migCreateFailsAfter: 3 }\n",
    );
    let agent = AgentBuilder::new(&gpus)
        .config(MIG)
        .root(tmp.path().to_path_buf())
        .start();
    eventually("two failed tries", || {
        agent.backend.faults().mig_create_failures <= 998
    })
    .await;
    // Rolled back each time: no instance left that nothing advertises.
    let gpu = agent.backend.inventory().unwrap().gpus[0].clone();
    assert!(gpu.mig_devices.is_empty(), "orphans: {:?}", gpu.mig_devices);
    let rejected = agent.events.0.lock().unwrap().clone();
    assert!(
        rejected
            .iter()
            .any(|m| m.contains("creating MIG instance 4 of 7 failed")
                && m.contains("the instances it created were destroyed")),
        "a clear error: {rejected:?}"
    );
    assert!(kubelet.state("nvidia.com/mig-1g.10gb").is_none());
    assert!(!agent.task.is_finished());

    // The driver recovers: the next retry applies the layout.
    agent.backend.set_faults(Faults::default());
    let mig = tokio::time::timeout(WAIT, kubelet.devices("nvidia.com/mig-1g.10gb"))
        .await
        .unwrap();
    assert_eq!(mig.len(), 7);
    let gpu = agent.backend.inventory().unwrap().gpus[0].clone();
    assert_eq!(gpu.mig_devices.len(), 7);
    agent.shutdown().await;
}
