//! One typo must not take a fleet down: each named config is validated on its own, a node
//! is affected only by its own config, and `/readyz` says whether this node has a good
//! config in force (and why not), or that it has no GPU at all.

mod support;

use std::time::{Duration, Instant};

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;

const WAIT: Duration = Duration::from_secs(5);

const GOOD: &str =
    "sharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2 } ] } }\n";
const BAD: &str =
    "tessera: { gpus: [ { match: all, mode: vgpu, vgpu: { count: 2, memory: 10g, cores: 130 } } ] }\n";

/// Wait until `/readyz`'s answer satisfies `want`; the last answer.
async fn ready_until(
    metrics: &tessera::metrics::NodeMetrics,
    what: &str,
    want: impl Fn(&Result<String, String>) -> bool,
) -> Result<String, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = metrics.probes.ready();
        if want(&answer) {
            return answer;
        }
        assert!(Instant::now() < deadline, "{what}: /readyz says {answer:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_configs_typo_does_not_touch_this_node() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    // `a-typo` sorts before `default`: it used to stop loading at the first bad file.
    let (_label_tx, label) = tokio::sync::watch::channel(None);
    let agent = AgentBuilder::new("2xA100-80GB")
        .named_configs(
            &[("a-typo", BAD), ("default", GOOD), ("mig", "flags: [\n")],
            label,
        )
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 4);
    let ready = ready_until(&agent.metrics, "ready", |r| r.is_ok()).await;
    assert!(ready.unwrap().contains("\"default\""));
    assert!(
        agent.events.0.lock().unwrap().is_empty(),
        "other configs' errors are not this node's"
    );
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_good_config_at_start_is_not_ready_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let (_label_tx, label) = tokio::sync::watch::channel(None);
    let agent = AgentBuilder::new("2xA100-80GB")
        .named_configs(&[("default", BAD), ("other", GOOD)], label)
        .root(tmp.path().to_path_buf())
        .start();
    let why = ready_until(&agent.metrics, "not ready", |r| {
        r.as_ref().is_err_and(|e| !e.starts_with("starting"))
    })
    .await
    .unwrap_err();
    assert!(why.contains("no good config in force"), "{why}");
    assert!(why.contains("tessera.gpus[0].vgpu.cores"), "{why}");
    assert!(!why.contains('\n'));
    {
        let events = agent.events.0.lock().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].contains("config \"default\""), "{events:?}");
    }
    assert!(kubelet.resources().is_empty(), "nothing advertised");

    // The node's own config fixed: applied, ready.
    let layouts = agent.config_path.clone().unwrap();
    let tmp_file = layouts.join(".default.tmp");
    std::fs::write(&tmp_file, GOOD).unwrap();
    std::fs::rename(&tmp_file, layouts.join("default")).unwrap();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 4);
    let _ = ready_until(&agent.metrics, "ready after the fix", |r| r.is_ok()).await;

    // Broken again: the last good config stays in force, still ready.
    std::fs::write(&tmp_file, BAD).unwrap();
    std::fs::rename(&tmp_file, layouts.join("default")).unwrap();
    let deadline = Instant::now() + WAIT;
    while agent.events.0.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "no second rejection");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(agent.metrics.probes.ready().is_ok());
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 4);
    agent.shutdown().await;
}

/// The fake backend with zero GPUs (a node without a GPU): the agent idles, advertises
/// nothing, and is ready saying so; it keeps running until stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_gpus_idles() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let inventory = tmp.path().join("no-gpus.yaml");
    std::fs::write(&inventory, "gpus: []\n").unwrap();
    let agent = AgentBuilder::new(inventory.to_str().unwrap())
        .config(GOOD)
        .root(tmp.path().to_path_buf())
        .start();
    let ready = ready_until(&agent.metrics, "ready", |r| r.is_ok())
        .await
        .unwrap();
    assert!(ready.contains("no GPU on this node"), "{ready}");
    assert!(agent.metrics.probes.live().is_ok());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!agent.task.is_finished(), "the agent keeps running");
    assert!(kubelet.resources().is_empty());
    assert!(agent.events.0.lock().unwrap().is_empty());
    agent.shutdown().await;
}
