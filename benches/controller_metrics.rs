//! What the controller's metrics add to a pass, at 100 ClusterQueues (10 cohorts of 10)
//! and 5,000 workloads: the engine's per-queue read-out (`Engine::queue_gauges`) and the
//! registry's update from a plan (`ControllerMetrics::record_pass`: gauges from the books,
//! counters from the applied actions), next to the pure decision of the same pass from
//! scratch for scale. Prints p50 / p99 over rounds.
//!
//! Run: `cargo bench --bench controller_metrics` (`BENCH_ROUNDS`, default 200). Under
//! `cargo test --all-targets`: 3 rounds, as a smoke test.

use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tessera::controller::decide::{decide, Snapshot};
use tessera::controller::metrics::ControllerMetrics;
use tessera::quota::fixtures::{cluster_queue, flavor, local_queue};
use tessera::quota::{Engine, EngineConfig, WorkloadInfo};

const QUEUES: usize = 100;
const WORKLOADS: usize = 5_000;
/// 2026-11-18T12:01:00Z.
const NOW: u64 = 1_795_003_260_000;

fn queues() -> Vec<tessera::quota::api::ClusterQueue> {
    (0..QUEUES)
        .map(|q| {
            let mut cq = cluster_queue(&format!("cq-{q}"))
                .cohort(&format!("co-{}", q / 10))
                .quota("h100", "nvidia.com/gpu", 8)
                .build();
            cq.spec.namespace_selector = Some(Default::default());
            cq
        })
        .collect()
}

fn pod(i: usize) -> Value {
    json!({"metadata": {"name": format!("p-{i}"), "namespace": "team",
                        "creationTimestamp": "2026-11-18T12:00:00Z",
                        "labels": {"tessera.io/queue-name": format!("lq-{}", i % QUEUES)}},
           "spec": {"schedulingGates": [{"name": "tessera.io/admission"}],
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1 + i % 3}}}]}})
}

fn snapshot() -> Snapshot {
    Snapshot {
        now: NOW,
        flavors: vec![flavor("h100")],
        cluster_queues: queues(),
        local_queues: (0..QUEUES)
            .map(|q| local_queue("team", &format!("lq-{q}"), &format!("cq-{q}")))
            .collect(),
        namespaces: vec![("team".into(), Default::default())],
        pods: (0..WORKLOADS).map(pod).collect(),
        ..Default::default()
    }
}

fn engine() -> Engine {
    let mut e = Engine::new(EngineConfig::default());
    e.apply_flavor(&flavor("h100"), 0).expect("flavor");
    for cq in queues() {
        e.apply_cluster_queue(&cq, 0).expect("queue");
    }
    for q in 0..QUEUES {
        e.apply_local_queue(
            &local_queue("team", &format!("lq-{q}"), &format!("cq-{q}")),
            0,
        )
        .expect("local queue");
    }
    for i in 0..WORKLOADS {
        let w = WorkloadInfo::new(&format!("team/p-{i}"), &format!("lq-{}", i % QUEUES)).pod_set(
            "main",
            1,
            &[("nvidia.com/gpu", 1 + (i % 3) as i64)],
        );
        e.submit(0, w).expect("submit");
    }
    e.schedule(0).expect("schedule");
    e
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds: usize = if full {
        std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(200)
    } else {
        3
    };
    let snap = snapshot();
    let plan = decide(&snap);
    let done: Vec<usize> = (0..plan.actions.len()).collect();
    let admitted = plan
        .actions
        .iter()
        .filter(|a| matches!(a, tessera::controller::decide::Action::Admit { .. }))
        .count();
    assert_eq!(plan.queues.len(), QUEUES, "{:?}", plan.problems.first());
    let e = engine();
    let metrics = ControllerMetrics::new();
    let (mut gauges, mut record, mut decided, mut encode) = (vec![], vec![], vec![], vec![]);
    for r in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(e.queue_gauges());
        gauges.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        metrics.record_pass(&plan, &done, NOW, Duration::from_millis(1));
        record.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(metrics.encode());
        encode.push(t.elapsed().as_secs_f64() * 1e3);
        // The decision from scratch is slow: a tenth of the rounds.
        if r % 10 == 0 {
            let t = Instant::now();
            std::hint::black_box(decide(&snap));
            decided.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    println!(
        "{QUEUES} ClusterQueues, {WORKLOADS} workloads, {} actions ({admitted} admissions) per pass, {rounds} rounds",
        plan.actions.len()
    );
    for (what, v) in [
        ("Engine::queue_gauges", gauges),
        ("ControllerMetrics::record_pass", record),
        ("ControllerMetrics::encode (a scrape)", encode),
        ("decide from scratch (for scale)", decided),
    ] {
        let (p50, p99) = percentiles(v);
        println!("{what:40} p50 {p50:8.3} ms   p99 {p99:8.3} ms");
    }
}
