//! `tessera diagnose` on a 1,000-node, 50,000-pod snapshot (issue 21: ≤ 2 s): the
//! snapshot's JSON read back (as `--snapshot` does) and one pending pod diagnosed, for a
//! whole-GPU pod (free GPUs per node from every bound pod's requests) and for a vGPU
//! pod (the extender's books rebuilt from every pod's assignment).
//!
//! Run: `cargo bench --bench diagnose` (`BENCH_ROUNDS`, default 5). Under
//! `cargo test --all-targets`: 100 nodes, 5,000 pods, one round, as a smoke test.

use std::time::Instant;

use serde_json::{json, Value};
use tessera::diagnose::{diagnose_pod, Settings, Snapshot};

const AT: &str = "2026-12-03T12:00:00Z";

fn snapshot(nodes: usize, pods: usize) -> Snapshot {
    let vgpu_nodes = nodes / 10;
    let mut node_list = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let name = format!("node-{i:04}");
        let mut n = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": if i % 2 == 0 { "train" } else { "infer" }}},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}}});
        if i < vgpu_nodes {
            let devices: Vec<Value> = (0..8)
                .map(|g| {
                    json!({"uuid": format!("GPU-{i}-{g}"), "model": "NVIDIA H100 80GB HBM3",
                                "memoryMiB": 81559, "slots": 10, "healthy": true})
                })
                .collect();
            n["metadata"]["annotations"] = json!({
                "tessera.io/vgpu-devices": Value::from(devices).to_string(),
                "tessera.io/vgpu-heartbeat": AT});
        }
        node_list.push(n);
    }
    let mut pod_list = Vec::with_capacity(pods);
    for p in 0..pods {
        // Blocks of ten pods per node, one of them holding a GPU: 5 GPUs of 8 taken.
        let node = (p / 10) % nodes;
        let pending = p % 10 == 9;
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{p:05}"), "namespace": format!("ns-{}", p % 200),
                         "uid": format!("uid-{p}"), "creationTimestamp": "2026-12-03T11:00:00Z",
                         "labels": {"tessera.io/queue-name": "lq"}},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits":
                {"cpu": "1", "memory": "4Gi"}}}]},
            "status": {"phase": if pending { "Pending" } else { "Running" }}});
        // One pod in ten holds a GPU.
        if p % 10 == 0 {
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("1");
        }
        if !pending {
            pod["spec"]["nodeName"] = json!(format!("node-{node:04}"));
            if node < vgpu_nodes {
                pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] =
                    json!("4096");
                pod["metadata"]["annotations"] = json!({"tessera.io/vgpu-assignment": json!({
                    "node": format!("node-{node:04}"), "containers": [{"name": "main", "devices": [
                        {"uuid": format!("GPU-{node}-{}", p % 8), "memoryMiB": 4096, "cores": 0}]}]})
                    .to_string()});
            }
        }
        pod_list.push(pod);
    }
    // The two pods under diagnosis: 8 whole GPUs (free in total, on no node), 60 GiB of
    // vGPU (fits on a GPU nobody holds yet).
    pod_list.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "team", "uid": "uid-big"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        "status": {"phase": "Pending"}}));
    pod_list.push(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "vgpu", "namespace": "team", "uid": "uid-vgpu"},
        "spec": {"schedulerName": "tessera-scheduler", "containers": [{"name": "main",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "61440"}}}]},
        "status": {"phase": "Pending"}}));
    Snapshot::new(node_list, pod_list, AT.parse().expect("time"))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (nodes, pods, rounds) = if full {
        let rounds = std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(5);
        (1_000, 50_000, rounds)
    } else {
        (100, 5_000, 1)
    };
    let bytes = serde_json::to_vec(&snapshot(nodes, pods)).expect("encode");
    println!(
        "snapshot: {nodes} nodes, {pods} pods, {:.1} MB of JSON",
        bytes.len() as f64 / 1e6
    );
    for pod in ["big", "vgpu"] {
        let mut times = Vec::new();
        let mut verdict = String::new();
        for _ in 0..rounds {
            let start = Instant::now();
            let s = Snapshot::from_json(&bytes).expect("snapshot");
            let now = s.taken_at().expect("time");
            let d = diagnose_pod(&s, "team", pod, None, &Settings::default(), now).expect("pod");
            times.push(start.elapsed().as_secs_f64());
            verdict = d
                .verdict()
                .map_or("none".into(), |v| v.summary.chars().take(90).collect());
        }
        times.sort_by(f64::total_cmp);
        println!(
            "diagnose {pod:>4}: median {:.3} s, worst {:.3} s (read + diagnose); verdict: {verdict}",
            times[times.len() / 2],
            times[times.len() - 1]
        );
    }
}
