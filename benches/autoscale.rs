//! One scaling decision (`Scaler::step`): the HPA formula over two triggers, the
//! stabilization windows and rate policies over a history of 15 s polls, the quota
//! coupling; the readings cycle through a jittery load so the history and the decisions
//! keep changing. Prints the time per decision (p50 / p99 of batches of 1,000).
//!
//! Run: `cargo bench --bench autoscale` (`BENCH_ROUNDS` batches, default 300). Under
//! `cargo test --all-targets`: 3 batches, as a smoke test.

use std::time::Instant;
use tessera::autoscale::{Coupling, Observation, Reading, Scaler, ScalerSpec};

fn scaler() -> Scaler {
    let spec: ScalerSpec = serde_json::from_value(serde_json::json!({
        "scaleTargetRef": {"name": "chat"},
        "minReplicaCount": 1, "maxReplicaCount": 64, "pollingInterval": 15,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 60},
            "scaleDown": {"stabilizationWindowSeconds": 600}}}},
        "triggers": [
            {"type": "prometheus", "metadata": {"serverAddress": "http://p:9090",
                "query": "sum(queue)", "threshold": "100"}},
            {"type": "prometheus", "metricType": "Value", "metadata": {
                "serverAddress": "http://p:9090", "query": "p99_latency", "threshold": "0.5"}}]
    }))
    .expect("a spec");
    Scaler::new(spec.validate().expect("valid"), Coupling::Quota)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rounds: usize = if full {
        std::env::var("BENCH_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(300)
    } else {
        3
    };
    const BATCH: u64 = 1_000;
    let mut s = scaler();
    let (mut target, mut now, mut i) = (4u32, 0u64, 0u64);
    let mut per_decision = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..BATCH {
            i += 1;
            now += 15_000;
            let load = 800.0 + 600.0 * ((i % 97) as f64 / 97.0 - 0.5) + (i % 7) as f64 * 40.0;
            let obs = Observation {
                target,
                serving: target.saturating_sub((i % 3) as u32),
                readings: vec![
                    Reading::Value(load),
                    Reading::Value(0.3 + (i % 11) as f64 * 0.05),
                ],
            };
            target = std::hint::black_box(s.step(&obs, now)).replicas;
        }
        per_decision.push(start.elapsed().as_secs_f64() * 1e9 / BATCH as f64);
    }
    per_decision.sort_by(f64::total_cmp);
    let at = |p: f64| per_decision[((per_decision.len() - 1) as f64 * p).round() as usize];
    println!(
        "one decision (2 triggers, 60 s / 600 s windows, coupled), {rounds} batches of {BATCH}: p50 {:.0} ns, p99 {:.0} ns",
        at(0.5),
        at(0.99)
    );
}
