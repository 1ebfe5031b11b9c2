//! The real `tessera node` binary against the kubelet emulator: the command from the
//! README registers its resources, and SIGTERM shuts it down cleanly with no orphaned
//! sockets.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::kubelet::Kubelet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_registers_and_exits_cleanly_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet_dir = tmp.path().join("kubelet");
    let kubelet = Kubelet::start(&kubelet_dir.join("device-plugins")).await;
    let config = tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        "version: v1\nsharing: { timeSlicing: { resources: [ { name: nvidia.com/gpu, replicas: 2 } ] } }\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "node",
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "2xA100-80GB",
        ])
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--cdi-root")
        .arg(tmp.path().join("cdi"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 4);
    assert!(tmp.path().join("cdi/tessera.io-gpu.json").is_file());

    // SIGHUP reloads in place: the process stays up and keeps serving.
    kill(Pid::from_raw(child.id() as i32), Signal::SIGHUP).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP must not stop the agent"
    );
    let st = kubelet.state("nvidia.com/gpu").unwrap();
    assert!(!st.stream_ended);
    assert_eq!(st.registrations, 1);

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "exit status {status}");
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("SIGHUP; reloading config"), "{log}");
    let left: Vec<_> = std::fs::read_dir(kubelet_dir.join("device-plugins"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("tessera-"))
        .collect();
    assert!(left.is_empty(), "orphaned sockets: {left:?}");
}

#[test]
fn bad_flags_give_a_clear_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--gpu-backend", "fake", "--fake-gpus", "3xQ900"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown GPU model \"Q900\""), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

use support::http::try_get as get;

/// With the NVML backend on a node without the NVIDIA driver (the library is absent), the
/// agent does not crash-loop: it stays up, advertises nothing, answers `/livez` and
/// `/readyz` ("no GPU on this node"), and exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_without_a_driver_idles_and_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet_dir = tmp.path().join("kubelet");
    let kubelet = Kubelet::start(&kubelet_dir.join("device-plugins")).await;
    let port = support::http::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--gpu-backend", "nvml", "--standalone"])
        .arg("--nvml-lib")
        .arg(tmp.path().join("absent/libnvidia-ml.so.1"))
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--cdi-root")
        .arg(tmp.path().join("cdi"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let ready = loop {
        if let Some((200, body)) = get(port, "/readyz").await {
            break body;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the agent exited ({status}) instead of idling");
        }
        assert!(Instant::now() < deadline, "no /readyz answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(ready.contains("no GPU on this node"), "{ready}");
    assert_eq!(get(port, "/livez").await.map(|r| r.0), Some(200));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent must keep running"
    );
    assert!(kubelet.resources().is_empty(), "nothing is advertised");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "exit status {status}");
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(log.contains("no NVIDIA driver on this node"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn layout_command_reports_invalid_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.yaml");
    std::fs::write(
        &cfg,
        "tessera: { gpus: [ { match: { index: [1] }, mode: mig, mig: { profiles: [4g.40gb, 4g.40gb] } } ] }",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["layout", "--fake-gpus", "2xA100-80GB", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU 1"), "{err}");
    assert!(err.contains("4g.40gb"), "{err}");

    std::fs::write(
        &cfg,
        "tessera: { gpus: [ { match: { index: [1] }, mode: mig, mig: { layout: all-1g.10gb } } ] }",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "layout",
            "--fake-gpus",
            "2xA100-80GB",
            "-o",
            "json",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let resources = doc["resources"].as_array().unwrap();
    let mig = resources
        .iter()
        .find(|r| r["name"] == "nvidia.com/mig-1g.10gb")
        .unwrap();
    assert_eq!(mig["devices"].as_array().unwrap().len(), 7);
    let whole = resources
        .iter()
        .find(|r| r["name"] == "nvidia.com/gpu")
        .unwrap();
    assert_eq!(
        whole["devices"].as_array().unwrap().len(),
        1,
        "GPU 0 stays whole"
    );
}

/// The binary with both paths and `--dra-gpus`: the flag overrides the node config's
/// `tessera.dra.gpus` and says so in the log; `--driver-root` with a `dev` directory puts
/// the device nodes' host paths under it in the node's CDI spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_gpus_flag_overrides_the_config_and_driver_root_maps_host_paths() {
    use support::apiserver::ApiServer;
    use support::dra_kubelet::DraKubelet;
    const NODE: &str = "node-a";
    let api = ApiServer::start(NODE).await;
    let tmp = tempfile::tempdir().unwrap();
    let kubelet_dir = tmp.path().join("kubelet");
    let plugins = Kubelet::start(&kubelet_dir.join("device-plugins")).await;
    let dra = DraKubelet::start(&kubelet_dir, NODE, api.client()).await;
    let layouts = tmp.path().join("layouts");
    std::fs::create_dir_all(&layouts).unwrap();
    std::fs::write(layouts.join("default"), "tessera: { dra: { gpus: all } }\n").unwrap();
    let driver_root = tmp.path().join("run/nvidia/driver");
    std::fs::create_dir_all(driver_root.join("dev")).unwrap();
    let boot = tmp.path().join("boot_id");
    std::fs::write(&boot, "boot-1\n").unwrap();
    let log_path = tmp.path().join("agent.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--gpu-backend", "fake", "--fake-gpus", "2xL4"])
        .args(["--dra", "--dra-gpus", "0", "--node-name", NODE])
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .arg("--cdi-root")
        .arg(tmp.path().join("cdi"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--config")
        .arg(&layouts)
        .arg("--boot-id-file")
        .arg(&boot)
        .arg("--driver-root")
        .arg(&driver_root)
        .env(
            "KUBECONFIG",
            support::dra_agent::kubeconfig(tmp.path(), &api.url),
        )
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    dra.wait_registered("gpu.tessera.io", 1, Duration::from_secs(10))
        .await;
    // The flag (GPU 0 to DRA) wins over the config (every GPU to DRA).
    let dp = plugins.devices("nvidia.com/gpu").await;
    assert_eq!(dp.len(), 1, "{}", log());
    assert!(
        log().contains("--dra-gpus overrides the config's tessera.dra.gpus (all)"),
        "{}",
        log()
    );
    // The node spec (device plugin's GPU): host paths under the driver root.
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("cdi/tessera.io-gpu.json")).unwrap())
            .unwrap();
    assert_eq!(spec["cdiVersion"], "0.5.0");
    let node = &spec["devices"][0]["containerEdits"]["deviceNodes"][0];
    assert_eq!(
        node["hostPath"],
        format!(
            "{}{}",
            driver_root.display(),
            node["path"].as_str().unwrap()
        )
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "exit status {status}: {}", log());
    assert!(!log().contains("panicked"), "{}", log());
    support::rbac::assert_allows_every_request(&api, "daemonset/node/rbac.yaml");
}

/// `tessera layout` on a directory of named configs: one bad config does not stop the
/// chosen one from laying out; it is reported as a warning.
#[test]
fn layout_command_lays_out_a_config_beside_a_bad_one() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("default"), "version: v1\n").unwrap();
    std::fs::write(
        tmp.path().join("broken"),
        "tessera: { gpus: [ { mode: nope } ] }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["layout", "--fake-gpus", "2xA100-80GB", "--config"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("config \"broken\" is rejected"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "layout",
            "--fake-gpus",
            "2xA100-80GB",
            "--config-name",
            "broken",
            "--config",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config \"broken\""));
}
