//! The `tessera node` binary's logs as `kubectl logs` sees them (stderr to a pipe): plain
//! text without ANSI escape codes, or with `--log-format json` (or
//! `TESSERA_LOG_FORMAT=json`) one JSON object per line. Also end to end: SIGHUP rewrites
//! a damaged CDI spec and says so in the log.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use support::kubelet::Kubelet;

fn start(dir: &Path, extra_args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.args(extra_args)
        .args([
            "node",
            "--gpu-backend",
            "fake",
            "--fake-gpus",
            "2xL4",
            "--standalone",
        ])
        .arg("--kubelet-dir")
        .arg(dir.join("kubelet"))
        .arg("--cdi-root")
        .arg(dir.join("cdi"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("RUST_LOG", "info")
        .env_remove("TESSERA_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// SIGTERM, wait for a clean exit, return stderr.
async fn stop(mut child: Child) -> String {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "agent did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert!(status.success(), "exit status {status}: {log}");
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_pipe_have_no_escape_codes_and_sighup_repairs_the_cdi_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
    let child = start(tmp.path(), &[], &[]);
    assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
    let spec = tmp.path().join("cdi/tessera.io-gpu.json");
    let good = std::fs::read(&spec).unwrap();
    std::fs::write(&spec, "{ not a spec").unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGHUP).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read(&spec).unwrap() != good {
        assert!(Instant::now() < deadline, "the CDI spec was not rewritten");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = stop(child).await;
    assert!(log.contains("starting node agent"), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escape codes in: {log:?}");
    assert!(
        log.lines()
            .any(|l| l.contains("the CDI spec on disk was wrong; rewritten")
                && l.contains("not a valid CDI spec")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    for (args, env) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("TESSERA_LOG_FORMAT", "json")][..]),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let kubelet = Kubelet::start(&tmp.path().join("kubelet/device-plugins")).await;
        let child = start(tmp.path(), args, env);
        assert_eq!(kubelet.devices("nvidia.com/gpu").await.len(), 2);
        let log = stop(child).await;
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(lines.len() >= 2, "{log}");
        for line in &lines {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            assert!(
                v["level"].is_string() && v["timestamp"].is_string(),
                "{line}"
            );
            assert!(v["fields"]["message"].is_string(), "{line}");
        }
        assert!(
            lines.iter().any(|l| l.contains("starting node agent")),
            "{log}"
        );
    }
    // A bad format is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["layout", "--fake-gpus", "1xL4"])
        .env("TESSERA_LOG_FORMAT", "xml")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("xml"));
}
