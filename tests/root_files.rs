//! Files the node agent writes as root: symlinks planted in the CDI directory never
//! redirect a write, and a CDI spec damaged on disk is rewritten on SIGHUP and by the
//! periodic check (counted in `tessera_cdi_spec_repairs_total`).

mod support;

use std::path::Path;
use std::time::Duration;

use support::agent::AgentBuilder;
use support::kubelet::Kubelet;
use tessera::cdi::Spec;

const WAIT: Duration = Duration::from_secs(10);

fn spec_ok(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
        && std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Spec>(&b).ok())
            .is_some_and(|s| s.devices.len() == 2)
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
async fn planted_symlinks_do_not_redirect_the_cdi_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let victim = tmp.path().join("shadow");
    std::fs::write(&victim, "root:secret\n").unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    // The fixed temporary name earlier releases wrote through, and the spec itself.
    std::os::unix::fs::symlink(&victim, cdi.join(".tessera.io-gpu.json.tmp")).unwrap();
    std::os::unix::fs::symlink(&victim, cdi.join("tessera.io-gpu.json")).unwrap();
    let agent = AgentBuilder::new("2xL4")
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    assert!(spec_ok(&cdi.join("tessera.io-gpu.json")));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root:secret\n");
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_cdi_spec_is_rewritten_on_sighup() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let agent = AgentBuilder::new("2xL4")
        .root(tmp.path().to_path_buf())
        .start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    let path = agent.cdi_root.join("tessera.io-gpu.json");
    assert!(spec_ok(&path));
    std::fs::write(&path, "{ \"cdiVersion\": \"0.3.0\", garbage").unwrap();
    // Nothing else repairs it within a while (the periodic check is 60 s here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!spec_ok(&path));
    agent.reload.send(()).unwrap();
    eventually("the spec rewritten after SIGHUP", || spec_ok(&path)).await;
    assert_eq!(agent.metrics.cdi_spec_repairs.get(), 1);
    // An intact spec is left alone.
    agent.reload.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(agent.metrics.cdi_spec_repairs.get(), 1);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_or_edited_cdi_spec_is_rewritten_by_the_periodic_check() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let mut builder = AgentBuilder::new("2xL4").root(tmp.path().to_path_buf());
    builder.cdi_verify_interval = Duration::from_millis(100);
    let agent = builder.start();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    let path = agent.cdi_root.join("tessera.io-gpu.json");
    eventually("the first spec", || spec_ok(&path)).await;
    std::fs::remove_file(&path).unwrap();
    eventually("the removed spec rewritten", || spec_ok(&path)).await;
    // Edited to hand out one device less: still valid JSON, but not what the agent wrote.
    let mut spec: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec.devices.pop();
    std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
    eventually("the edited spec rewritten", || spec_ok(&path)).await;
    assert!(agent.metrics.cdi_spec_repairs.get() >= 2);
    agent.shutdown().await;
}
