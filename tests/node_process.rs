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

    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["node", "--gpu-backend", "nvml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NVML"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
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
