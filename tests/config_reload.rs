//! Config hot reload: changes are applied without a restart and touch only what changed;
//! a bad config is rejected with the field named and the last good config stays.

mod support;

use std::time::{Duration, Instant};

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;

const WAIT: Duration = Duration::from_secs(5);

const TWO_RESOURCES: &str = r#"
tessera:
  gpus:
  - match: { index: [0] }
    mode: whole
  - match: { index: [1] }
    mode: vgpu
    vgpu: { count: 2, memory: 20g, cores: 50 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_touches_only_changed_resources() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config(TWO_RESOURCES)
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 1);
    assert_eq!(kubelet.devices("nvidia.com/vgpu").await.len(), 2);
    let gpu_before = kubelet.state("nvidia.com/gpu").unwrap();

    let t0 = Instant::now();
    agent.write_config(&TWO_RESOURCES.replace(
        "count: 2, memory: 20g, cores: 50",
        "count: 4, memory: 10g, cores: 25",
    ));
    kubelet
        .wait_until(WAIT, "4 vGPU slices", |m| {
            m["nvidia.com/vgpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 4)
        })
        .await;
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "applied in {:?}",
        t0.elapsed()
    );
    assert!(agent.events.0.lock().unwrap().is_empty());
    // The whole-GPU resource was not touched: same registration, no new list.
    let gpu_after = kubelet.state("nvidia.com/gpu").unwrap();
    assert_eq!(gpu_after.registrations, gpu_before.registrations);
    assert_eq!(gpu_after.lists.len(), gpu_before.lists.len());
    assert!(!gpu_after.stream_ended);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_is_rejected_and_last_good_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config("version: v1")
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);

    // Invalid field value.
    agent.write_config(
        "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 130 } } ] }",
    );
    // A layout that does not fit the GPU (two 4g instances).
    let wait_events = |n: usize| {
        let events = agent.events.clone();
        async move {
            let deadline = Instant::now() + WAIT;
            while events.0.lock().unwrap().len() < n {
                assert!(Instant::now() < deadline, "no rejection event");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_events(1).await;
    agent.write_config(
        "flags: { migStrategy: mixed }\ntessera: { gpus: [ { match: all, mode: mig, mig: { profiles: [4g.40gb, 4g.40gb] } } ] }",
    );
    wait_events(2).await;
    {
        let events = agent.events.0.lock().unwrap();
        assert!(
            events[0].contains("tessera.gpus[0].vgpu.cores") && events[0].contains("130"),
            "{events:?}"
        );
        assert!(events[1].contains("4g.40gb"), "{events:?}");
    }
    // Nothing changed for the kubelet.
    let st = kubelet.state("nvidia.com/gpu").unwrap();
    assert_eq!(st.lists.len(), 1);
    assert!(!st.stream_ended);
    assert_eq!(kubelet.resources(), vec!["nvidia.com/gpu".to_string()]);
    assert!(
        agent.backend.as_ref().inventory_mig_free(),
        "a rejected MIG layout must not be half-applied"
    );

    // A good config after bad ones is applied.
    agent.write_config(
        "sharing: { timeSlicing: { renameByDefault: true, resources: [ { name: nvidia.com/gpu, replicas: 3 } ] } }",
    );
    assert_eq!(kubelet.devices("nvidia.com/gpu.shared").await.len(), 6);
    kubelet
        .wait_until(WAIT, "old resource gone", |m| {
            m["nvidia.com/gpu"].stream_ended
        })
        .await;
    agent.shutdown().await;
}

trait MigFree {
    fn inventory_mig_free(&self) -> bool;
}

impl MigFree for tessera::gpu::fake::FakeBackend {
    fn inventory_mig_free(&self) -> bool {
        use tessera::gpu::GpuBackend;
        self.inventory()
            .unwrap()
            .gpus
            .iter()
            .all(|g| g.mig_devices.is_empty())
    }
}
