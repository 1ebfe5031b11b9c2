//! Latency summaries shared by the harness-less benches (`node_agent`, `dra_node`).

use std::time::Duration;

/// The `p` quantile (0..=1) of an already sorted, non-empty sample (nearest rank).
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// p50 and p99 of a non-empty sample.
pub fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (pct(&v, 0.5), pct(&v, 0.99))
}
