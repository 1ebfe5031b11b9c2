//! Decision time of Tessera's policy vs BestFit on the 1,213-node Alibaba cluster.
//!
//! Replays the default trace (seed 42) under each policy and times every `place` call
//! between 10% and 100% arrived, with the node states the policy itself produced (that
//! is what a live scheduler sees: a warm memo and one changed node per decision). Also
//! times "cold" decisions: a fresh policy instance (empty memo) on a half-full cluster.
//! Prints medians and the Tessera/BestFit ratio. Run: `cargo bench --bench placement`.

use std::time::Instant;

use tessera::placement::{PolicyKind, SplitMix64, TieBreak};
use tessera::sim::protocol::{arrival_order, Prepared, DEFAULT_COVERAGE, DEFAULT_INFLATION};
use tessera::sim::trace;

const NODES: &str = include_str!("../data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");
const PODS: &str = include_str!("../data/alibaba-gpu-v2023/openb_pod_list_default.csv");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() * 99 / 100]
}

/// Per-decision times (µs) over a replay (at most `limit` decisions), and cold-decision
/// times.
fn measure(p: &Prepared, kind: PolicyKind, limit: usize) -> (Vec<f64>, Vec<f64>) {
    let mut cluster = p.cluster.clone();
    let cap = cluster.total_gpu_milli();
    let order = arrival_order(&p.demands, cap, DEFAULT_INFLATION, 42);
    let mut policy = kind.build(&p.context);
    let mut rng = SplitMix64::new(7);
    let mut warm = Vec::new();
    let mut cold = Vec::new();
    let mut arrived = 0u64;
    for &i in &order {
        let d = &p.demands[i];
        arrived += d.total_milli();
        let pct = arrived * 100 / cap;
        if pct > 100 || warm.len() >= limit {
            break;
        }
        if pct == 50 && cold.len() < 20 {
            let mut fresh = kind.build(&p.context);
            let t = Instant::now();
            let _ = std::hint::black_box(fresh.place(&cluster, d, &mut rng));
            cold.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let t = Instant::now();
        let choice = policy.place(&cluster, d, &mut rng);
        let us = t.elapsed().as_secs_f64() * 1e6;
        if pct >= 10 {
            warm.push(us);
        }
        if let Some(pl) = choice {
            let _ = cluster.apply(d, &pl);
        }
    }
    (warm, cold)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not: then only check
    // that the replay runs, on a few decisions, so debug test runs stay fast.
    let full = std::env::args().any(|a| a == "--bench");
    let nodes = trace::parse_node_list(NODES, "nodes").expect("bundled node list parses");
    let pods = trace::parse_pod_list(PODS, "pods").expect("bundled pod list parses");
    let p = Prepared::new(
        nodes,
        &pods,
        DEFAULT_INFLATION,
        DEFAULT_COVERAGE,
        TieBreak::First,
    )
    .expect("cluster builds");
    if !full {
        for kind in [PolicyKind::BestFit, PolicyKind::Tessera] {
            let (warm, _) = measure(&p, kind, 20);
            assert!(!warm.is_empty(), "{kind}: no decisions timed");
        }
        println!("placement bench: smoke run only (use `cargo bench --bench placement`)");
        return;
    }
    println!(
        "placement decision time on {} nodes (default trace, seed 42, 10–100% arrived)",
        p.cluster.len()
    );
    let mut medians = Vec::new();
    for kind in [PolicyKind::BestFit, PolicyKind::Fgd, PolicyKind::Tessera] {
        // Best of 3 replays: the machine is shared, so take the least disturbed one.
        let runs: Vec<(Vec<f64>, Vec<f64>)> =
            (0..3).map(|_| measure(&p, kind, usize::MAX)).collect();
        let (warm, cold) = runs
            .into_iter()
            .min_by(|a, b| median(a.0.clone()).total_cmp(&median(b.0.clone())))
            .expect("three runs");
        let (m, q, n) = (median(warm.clone()), p99(warm.clone()), warm.len());
        println!(
            "{:<8} median {:>7.2} µs  p99 {:>8.2} µs  over {n} decisions; cold (empty memo) median {:>8.1} µs",
            kind.name(),
            m,
            q,
            median(cold)
        );
        medians.push((kind, m));
    }
    let bf = medians[0].1;
    for (kind, m) in &medians[1..] {
        println!("ratio {}/bestfit (median): {:.2}", kind.name(), m / bf);
    }
}
