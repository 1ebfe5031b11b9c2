//! The protocol on the bundled Alibaba trace, kept short for debug builds: a sample of the
//! real pod list on a slice of the real cluster.

use tessera::placement::{PolicyKind, TieBreak};
use tessera::sim::protocol::{run_one, Prepared};
use tessera::sim::runner;
use tessera::sim::trace;

const NODES: &str = include_str!("../data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");
const PODS: &str = include_str!("../data/alibaba-gpu-v2023/openb_pod_list_default.csv");

#[test]
fn bundled_trace_matches_the_paper_setup() {
    let nodes = trace::parse_node_list(NODES, "nodes").unwrap();
    let pods = trace::parse_pod_list(PODS, "pods").unwrap();
    assert_eq!(nodes.len(), 1213);
    assert_eq!(
        nodes.iter().map(|n| u32::from(n.gpu_count)).sum::<u32>(),
        6212
    );
    assert_eq!(pods.len(), 8152);
}

/// Every 10th node and every 8th pod: 122 nodes, ~1,000 pods.
fn sample(ties: TieBreak) -> Prepared {
    let nodes: Vec<_> = trace::parse_node_list(NODES, "nodes")
        .unwrap()
        .into_iter()
        .step_by(10)
        .collect();
    let pods: Vec<_> = trace::parse_pod_list(PODS, "pods")
        .unwrap()
        .into_iter()
        .step_by(8)
        .collect();
    Prepared::new(nodes, &pods, 1.3, 0.95, ties).unwrap()
}

#[test]
fn every_policy_respects_the_protocol_on_a_trace_sample() {
    let p = sample(TieBreak::First);
    let results = runner::run_all(&p, &PolicyKind::ALL, &[42], 2, &|_, _| {});
    assert_eq!(results.len(), PolicyKind::ALL.len());
    for r in &results {
        assert_eq!(r.curve.len(), 131, "{}", r.policy);
        for w in r.curve.windows(2) {
            assert!(
                w[1].alloc_pct >= w[0].alloc_pct,
                "{}: allocation never drops (no removals)",
                r.policy
            );
            assert!(w[1].failed_pods >= w[0].failed_pods);
        }
        for pt in &r.curve {
            assert!(
                pt.alloc_pct <= f64::from(pt.arrived_pct) + 1e-9,
                "{}: {pt:?}",
                r.policy
            );
            assert!(
                pt.frag_pct >= 0.0 && pt.frag_pct + pt.alloc_pct <= 100.0 + 1e-9,
                "{}: {pt:?}",
                r.policy
            );
        }
        // Arrival stops just short of 130% of capacity; the cluster saturates before that.
        assert!(r.pods_failed > 0 && r.pods_failed < r.pods_arrived);
        assert!(
            r.curve[130].alloc_pct > 60.0,
            "{}: {:?}",
            r.policy,
            r.curve[130]
        );
    }
    // Same seed, same arrival, same result.
    let again = run_one(&p, PolicyKind::Tessera, 42);
    let first = results
        .iter()
        .find(|r| r.policy == PolicyKind::Tessera)
        .unwrap();
    assert_eq!(again.curve, first.curve);
    assert_ne!(run_one(&p, PolicyKind::Tessera, 43).curve, first.curve);
}

#[test]
fn summary_means_and_spread_over_seeds() {
    let p = sample(TieBreak::Random);
    let results = runner::run_all(&p, &[PolicyKind::BestFit], &[1, 2, 3], 1, &|_, _| {});
    let s = runner::summarize(&results);
    assert_eq!((s.len(), s[0].seeds), (1, 3));
    let at = s[0].at(100).unwrap();
    let vals: Vec<f64> = results.iter().map(|r| r.curve[100].alloc_pct).collect();
    let mean = vals.iter().sum::<f64>() / 3.0;
    assert!((at.alloc_pct_mean - mean).abs() < 1e-9);
    let sd = (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 2.0).sqrt();
    assert!((at.alloc_pct_sd - sd).abs() < 1e-9);
}
