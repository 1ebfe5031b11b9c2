//! Poll lag of the live autoscaler (issue 20): 1,000 InferenceScalers at
//! `pollingInterval: 15`, each with its own Deployment, against the API-server double and a
//! real Prometheus (Debian's package) scraping an exporter. The loop's own `tick` runs every
//! 250 ms (the controller's default) for three polling intervals; the lag of a poll is how
//! late its decision came after it was due (the tick's lateness plus the tick's duration).
//! Prints p50 / p99 / max lag, polls done, and the longest tick.
//!
//! Run: `cargo bench --bench autoscaler_poll` (`SCALERS`, default 1,000; `ROUNDS` polling
//! intervals, default 3). Under `cargo test --all-targets`: 20 scalers, one interval of
//! 2 s, as a smoke test.

#[path = "../tests/support/apiserver.rs"]
mod apiserver;
#[path = "../tests/support/prometheus.rs"]
mod prometheus;
#[path = "../tests/support/skip.rs"]
mod skip;

use std::time::{Duration, Instant};

use apiserver::ApiServer;
use prometheus::{Exporter, Prometheus};
use serde_json::json;
use tessera::autoscale::Coupling;
use tessera::controller::autoscaler::{Autoscaler, AutoscalerConfig};

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/ml/deployments";
const SCALERS: &str = "/apis/tessera.io/v1alpha1/namespaces/ml/inferencescalers";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (scalers, rounds, interval) = if full {
        (env("SCALERS", 1000), env("ROUNDS", 3), 15)
    } else {
        (20, 1, 2)
    };
    let exporter = Exporter::start().await;
    let page: String = (0..scalers)
        .map(|i| format!("inflight{{service=\"s{i}\"}} {}\n", 100 + i % 300))
        .collect();
    exporter.set(&page);
    let Some(prom) = Prometheus::start(&exporter).await else {
        return;
    };
    let api = ApiServer::start("node-a").await;
    api.list_across_namespaces();
    for i in 0..scalers {
        let name = format!("s{i}");
        api.put_object(
            DEPLOYMENTS,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "ml"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}}}),
        );
        api.put_object(
            SCALERS,
            json!({"apiVersion": "tessera.io/v1alpha1", "kind": "InferenceScaler",
                "metadata": {"name": name, "namespace": "ml", "generation": 1,
                    "uid": format!("uid-{i}")},
                "spec": {"scaleTargetRef": {"name": name}, "pollingInterval": interval,
                    "minReplicaCount": 1, "maxReplicaCount": 20,
                    "triggers": [{"type": "prometheus", "metadata": {
                        "serverAddress": prom.url,
                        "query": format!("sum(inflight{{service=\"{name}\"}})"),
                        "threshold": "100"}}]}}),
        );
    }
    let cfg = AutoscalerConfig {
        tick: Duration::from_millis(250),
        query_timeout: Duration::from_secs(3),
        coupling: Coupling::Quota,
        lease_namespace: "tessera-system".into(),
        lease_name: "bench".into(),
        identity: "bench".into(),
        lease_duration: 15_000,
        metrics: Default::default(),
    };
    let mut autoscaler = Autoscaler::new(api.client(), &cfg).expect("a Prometheus client");
    let objects = api.objects(SCALERS);
    let end = Instant::now() + Duration::from_secs(rounds * interval);
    let mut longest = Duration::ZERO;
    let mut polls = 0;
    while Instant::now() < end {
        let started = Instant::now();
        polls += autoscaler.tick(&objects, now_ms()).await;
        longest = longest.max(started.elapsed());
        tokio::time::sleep(cfg.tick.saturating_sub(started.elapsed())).await;
    }
    let mut lags = autoscaler.take_lags();
    lags.sort_unstable();
    assert!(!lags.is_empty(), "no poll was made");
    println!(
        "autoscaler poll lag, {scalers} scalers at pollingInterval {interval} s, {} s: \
         {polls} polls, lag p50 {} ms, p99 {} ms, max {} ms; longest tick {:.1} ms",
        rounds * interval,
        pct(&lags, 0.5),
        pct(&lags, 0.99),
        lags[lags.len() - 1],
        longest.as_secs_f64() * 1e3
    );
    drop(prom);
}
