//! The scheduler extender's filter + prioritize for one pod on 1,000 nodes × 8 GPUs:
//! the request bodies decoded, the books fitted and scored, the answers encoded, as
//! `POST /filter` and `POST /prioritize` do (without the HTTP transport; prioritize
//! through the placement engine, Tessera's policy). The nodes are partly filled by
//! binds through the books first. Prints p50 / p99 of the pair.
//! Run: `cargo bench --bench extender` (`BENCH_ROUNDS=N` samples, default 300).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Instant;
use tessera::controller::extender::engine::WorkloadSource;
use tessera::controller::extender::records::node_state;
use tessera::controller::extender::server::{filter_answer, prioritize_answer};
use tessera::controller::extender::wire::ExtenderArgs;
use tessera::controller::extender::{Books, BooksConfig};

const NODES: usize = 1_000;
const GPUS: usize = 8;

fn pod(name: &str, memory: u64, cores: u32) -> serde_json::Value {
    json!({"metadata": {"name": name, "namespace": "team", "uid": name},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": memory.to_string(),
            "nvidia.com/gpucores": cores.to_string()}}}]}})
}

fn books(now: Timestamp) -> Books {
    // The placement engine measures fragmentation against the pods' shapes, as it would
    // have learned them from prioritizing the fill pods and this one.
    let books = Books::new(BooksConfig {
        workload: WorkloadSource::Fixed,
        ..BooksConfig::default()
    });
    let shapes: Vec<Pod> = [
        (8_192, 10),
        (20_480, 30),
        (40_960, 50),
        (81_920, 100),
        (10_240, 30),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(memory, cores))| {
        serde_json::from_value(pod(&format!("shape-{i}"), memory, cores)).expect("a Pod")
    })
    .collect();
    books.set_workload(&shapes);
    let heartbeat = now.to_string();
    let states = (0..NODES)
        .filter_map(|n| {
            let devices: Vec<_> = (0..GPUS)
                .map(|g| {
                    json!({"uuid": format!("GPU-{n}-{g}"), "model": "NVIDIA A100-SXM4-80GB",
                    "memoryMiB": 81_920, "sms": 108, "slots": 10, "healthy": true})
                })
                .collect();
            node_state(
                &json!({"metadata": {"name": format!("node-{n:04}"), "annotations": {
                "tessera.io/vgpu-devices": serde_json::Value::Array(devices).to_string(),
                "tessera.io/vgpu-heartbeat": heartbeat}}}),
            )
        })
        .collect();
    books.sync(states, Vec::new(), &BTreeMap::new(), now);
    // Fill: node n gets (n % 24) pods of mixed sizes, so nodes range from empty to full.
    let sizes = [(8_192, 10), (20_480, 30), (40_960, 50), (81_920, 100)];
    for n in 0..NODES {
        for k in 0..n % 24 {
            let (memory, cores) = sizes[(n + k) % sizes.len()];
            // Spread over the node's GPUs (HAMi's default GPU policy), as the fill was
            // before the engine chose GPUs, so every node keeps room for the pod.
            let mut fill = pod(&format!("fill-{n}-{k}"), memory, cores);
            fill["metadata"]["annotations"] = json!({"hami.io/gpu-scheduler-policy": "spread"});
            let p: Pod = serde_json::from_value(fill).expect("a Pod");
            let _ = books.reserve(&p, &format!("node-{n:04}"), now);
        }
    }
    books
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let now = Timestamp::now();
    let books = books(now);
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n:04}")).collect();
    let body = json!({"pod": pod("infer", 10_240, 30), "nodenames": names}).to_string();
    let mut times = Vec::with_capacity(rounds);
    let mut passed = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let args: ExtenderArgs = serde_json::from_str(&body).expect("ExtenderArgs");
        let filtered = filter_answer(&books, &args, now);
        let out = serde_json::to_vec(&filtered).expect("encodes");
        let args: ExtenderArgs = serde_json::from_str(&body).expect("ExtenderArgs");
        let scores = prioritize_answer(&books, &args, now);
        let out2 = serde_json::to_vec(&scores).expect("encodes");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        passed = filtered.nodenames.map_or(0, |n| n.len());
        std::hint::black_box((out, out2));
    }
    times.sort_by(f64::total_cmp);
    println!(
        "extender filter + prioritize, 1 pod on {NODES} nodes x {GPUS} GPUs ({passed} fit), \
         {rounds} rounds: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        percentile(&times, 50),
        percentile(&times, 99),
        times[times.len() - 1]
    );
}
