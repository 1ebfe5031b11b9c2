//! `tessera simulate fgd` end to end on small hand-made traces: table, JSON shape, plot,
//! and clear errors for malformed input.

use std::path::Path;
use std::process::Command;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
    n0,64000,262144,4,G2\nn1,64000,262144,4,G2\nn2,32000,131072,2,T4\nn3,16000,65536,0,nan\n";
const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
    p0,8000,16384,1,1000,,LS\np1,4000,8192,1,500,,LS\np2,4000,8192,1,250,T4,BE\n\
    p3,16000,32768,2,1000,,LS\np4,2000,4096,0,0,,BE\np5,4000,8192,1,810,G2|T4,LS\n";

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn json_report_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let (n, p) = (
        write(dir.path(), "nodes.csv", NODES),
        write(dir.path(), "my_pods.csv", PODS),
    );
    let svg = dir.path().join("out.svg");
    let out = tessera()
        .args([
            "simulate",
            "fgd",
            "--node-list",
            &n,
            "--pod-list",
            &p,
            "--seeds",
            "2",
            "--json",
            "--plot",
        ])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["trace"], "my_pods");
    let policies = v["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "random",
            "dotproduct",
            "gpuclustering",
            "gpupacking",
            "bestfit",
            "fgd",
            "tessera"
        ]
    );
    for p in policies {
        assert_eq!(p["seeds"], 2);
        let curve = p["curve"].as_array().unwrap();
        assert_eq!(curve.len(), 131);
        for (i, pt) in curve.iter().enumerate() {
            assert_eq!(pt["arrived_pct"], i);
            let a = pt["alloc_pct_mean"].as_f64().unwrap();
            // Nothing is ever allocated beyond what has arrived.
            assert!(a <= i as f64 + 1e-9 && a >= 0.0, "{a} at {i}%");
            assert!(
                pt["alloc_pct_sd"].as_f64().is_some() && pt["frag_pct_mean"].as_f64().is_some()
            );
        }
    }
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tessera") && svg.contains("polyline"));
}

#[test]
fn table_lists_requested_policies_only() {
    let dir = tempfile::tempdir().unwrap();
    let (n, p) = (
        write(dir.path(), "nodes.csv", NODES),
        write(dir.path(), "pods.csv", PODS),
    );
    let out = tessera()
        .args([
            "simulate",
            "fgd",
            "--node-list",
            &n,
            "--pod-list",
            &p,
            "--seeds",
            "1",
            "--policy",
            "bestfit,tessera",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("bestfit") && text.contains("tessera") && !text.contains("\nrandom"),
        "{text}"
    );
    assert!(
        text.contains("100%") && text.contains("failed@100"),
        "{text}"
    );
    // Not a terminal: no progress bar on stderr.
    assert!(!String::from_utf8_lossy(&out.stderr).contains("runs,"));
}

#[test]
fn malformed_input_fails_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let n = write(dir.path(), "nodes.csv", NODES);
    let bad = write(
        dir.path(),
        "pods.csv",
        &format!("{PODS}p6,4000,8192,1,abc,,LS\n"),
    );
    let out = tessera()
        .args(["simulate", "fgd", "--node-list", &n, "--pod-list", &bad])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pods.csv:8:") && err.contains("gpu_milli"),
        "{err}"
    );

    let out = tessera()
        .args([
            "simulate",
            "fgd",
            "--node-list",
            &n,
            "--pod-list",
            &n,
            "--policy",
            "bestfit",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `name` column"));

    let p = write(dir.path(), "ok.csv", PODS);
    for (flag, value, needle) in [
        ("--policy", "worstfit", "unknown policy"),
        ("--seeds", "0", "at least 1"),
        ("--ties", "last", "ties"),
    ] {
        let out = tessera()
            .args([
                "simulate",
                "fgd",
                "--node-list",
                &n,
                "--pod-list",
                &p,
                flag,
                value,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{flag} {value}"
        );
    }
    let out = tessera()
        .args([
            "simulate",
            "fgd",
            "--node-list",
            "/nonexistent.csv",
            "--pod-list",
            &p,
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.csv"));
}

#[test]
fn no_argument_form_uses_the_bundled_trace_and_paper_numbers() {
    // The cheapest policy and one seed keep this fast in debug builds.
    let out = tessera()
        .args(["simulate", "--policy", "random", "--seeds", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("openb_pod_list_default") && text.contains("1213 nodes, 6212 GPUs"),
        "{text}"
    );
    // The paper's Random row at 100% arrived: 86.30.
    assert!(text.contains("  paper") && text.contains("86.30"), "{text}");
}
