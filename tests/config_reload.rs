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

/// Reloads so far (applied, unchanged or rejected).
fn reloads(agent: &support::agent::RunningAgent) -> u64 {
    use tessera::metrics::OutcomeLabels;
    ["applied", "unchanged", "rejected"]
        .iter()
        .map(|o| {
            agent
                .metrics
                .config_reloads
                .get_or_create(&OutcomeLabels {
                    outcome: o.to_string(),
                })
                .get()
        })
        .sum()
}

/// Wait until reloads stop for `quiet`; their count.
async fn settled_reloads(agent: &support::agent::RunningAgent, quiet: Duration) -> u64 {
    let mut last = reloads(agent);
    loop {
        tokio::time::sleep(quiet).await;
        let now = reloads(agent);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// A log file written beside `--config` (and an editor's swap file) is not the config:
/// no reload. Only the config file itself is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_beside_the_config_do_not_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xA100-80GB")
        .config("version: v1\n")
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    let before = settled_reloads(&agent, Duration::from_millis(300)).await;
    let dir = agent
        .config_path
        .as_ref()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .unwrap();
        writeln!(log, "line {n}").unwrap();
        std::fs::write(dir.join(".config.yaml.swp"), format!("{n}")).unwrap();
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(n > 50);
    assert_eq!(
        settled_reloads(&agent, Duration::from_millis(300)).await,
        before,
        "{n} writes beside the config reloaded it"
    );
    // The config itself still reloads.
    agent.write_config(
        "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2 } ] } }",
    );
    kubelet
        .wait_until(WAIT, "4 replicas", |m| {
            m["nvidia.com/gpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 4)
        })
        .await;
    assert_eq!(
        settled_reloads(&agent, Duration::from_millis(300)).await,
        before + 1
    );
    agent.shutdown().await;
}

/// A mounted ConfigMap: the kubelet writes a new timestamped directory, points a
/// `..data_tmp` symlink at it, renames that over `..data` and removes the old directory.
/// One swap, one reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_data_swap_reloads_exactly_once() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let (_label_tx, label) = tokio::sync::watch::channel(None);
    let agent = AgentBuilder::new("2xA100-80GB")
        .named_configs(&[("default", "version: v1\n")], label)
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    // Lay the directory out as the kubelet mounts a ConfigMap.
    let cm = agent.config_path.clone().unwrap();
    std::fs::create_dir(cm.join("..2026_12_03_08_00_00.1")).unwrap();
    std::fs::write(cm.join("..2026_12_03_08_00_00.1/default"), "version: v1\n").unwrap();
    symlink("..2026_12_03_08_00_00.1", cm.join("..data")).unwrap();
    symlink("..data/default", cm.join(".default.link")).unwrap();
    std::fs::rename(cm.join(".default.link"), cm.join("default")).unwrap();
    let before = settled_reloads(&agent, Duration::from_millis(300)).await;

    // The update, step by step as the kubelet's atomic writer does it.
    let new = cm.join("..2026_12_03_08_05_00.2");
    std::fs::create_dir(&new).unwrap();
    std::fs::write(
        new.join("default"),
        "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 3 } ] } }\n",
    )
    .unwrap();
    symlink("..2026_12_03_08_05_00.2", cm.join("..data_tmp")).unwrap();
    std::fs::rename(cm.join("..data_tmp"), cm.join("..data")).unwrap();
    std::fs::remove_dir_all(cm.join("..2026_12_03_08_00_00.1")).unwrap();
    kubelet
        .wait_until(WAIT, "6 replicas", |m| {
            m["nvidia.com/gpu"]
                .lists
                .last()
                .is_some_and(|l| l.len() == 6)
        })
        .await;
    assert_eq!(
        settled_reloads(&agent, Duration::from_millis(300)).await,
        before + 1
    );
    agent.shutdown().await;
}
