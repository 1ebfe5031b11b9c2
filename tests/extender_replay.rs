//! The default Alibaba trace (the one `tessera simulate` runs by default, bundled under
//! `data/alibaba-gpu-v2023/`) replayed through the scheduler extender's decision path:
//! each arriving pod, as a vGPU pod, through the books' filter, prioritize and bind, the
//! scheduler's own part played by `controller::extender::replay`. The live path and the
//! simulator are one engine, so the curves are equal point for point, not within a
//! tolerance: the same node and GPUs are chosen for every pod, the allocation is read
//! back from the memory booked in the extender's books, the fragmentation from the
//! books' free GPUs and CPU.
//!
//! A debug build replays about 80 pods a second on the whole cluster, so the tests
//! below take a slice of the nodes; the whole cluster over the simulator's ten seeds
//! (the number in benches/README.md) is `cargo test --test extender_replay --
//! --ignored --nocapture`.

use tessera::controller::extender::replay;
use tessera::placement::{PolicyKind, TieBreak};
use tessera::sim::protocol::{run_one, Prepared, RunResult, DEFAULT_COVERAGE, DEFAULT_INFLATION};
use tessera::sim::runner::{summarize, FIRST_SEED};
use tessera::sim::trace;
use tessera::vgpu::request::Policy;

const NODES: &str = include_str!("../data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");
const PODS: &str = include_str!("../data/alibaba-gpu-v2023/openb_pod_list_default.csv");

/// Every `step`-th node of the default cluster, with the whole default pod list.
fn prepared(step: usize) -> Prepared {
    let nodes: Vec<_> = trace::parse_node_list(NODES, "nodes")
        .expect("bundled node list")
        .into_iter()
        .step_by(step)
        .collect();
    let pods = trace::parse_pod_list(PODS, "pods").expect("bundled pod list");
    Prepared::new(
        nodes,
        &pods,
        DEFAULT_INFLATION,
        DEFAULT_COVERAGE,
        TieBreak::First,
    )
    .expect("prepared")
}

/// Replays `seed` under `policy` and checks it against the simulator's run.
fn same_as_simulate(p: &Prepared, policy: Option<Policy>, kind: PolicyKind, seed: u64) -> f64 {
    let live = replay::run(p, policy, seed).expect("the trace replays");
    let sim = run_one(p, kind, seed);
    assert_eq!(live.curve, sim.curve, "{kind}, seed {seed}");
    assert_eq!(
        (live.pods_arrived, live.pods_failed),
        (sim.pods_arrived, sim.pods_failed),
        "{kind}, seed {seed}"
    );
    // Not a trivial run: the cluster fills and pods are turned away.
    assert!(
        sim.pods_failed > 0 && sim.curve[100].alloc_pct > 80.0,
        "{kind}"
    );
    live.curve[100].alloc_pct
}

#[test]
fn tessera_through_the_extender_allocates_as_simulate_does() {
    // A quarter of the cluster (304 nodes) and the whole pod list.
    let p = prepared(4);
    same_as_simulate(&p, None, PolicyKind::Tessera, FIRST_SEED);
}

#[test]
fn binpack_and_spread_by_annotation_allocate_as_simulate_does() {
    let p = prepared(8);
    for (policy, kind) in [
        (Policy::Binpack, PolicyKind::Binpack),
        (Policy::Spread, PolicyKind::Spread),
    ] {
        same_as_simulate(&p, Some(policy), kind, FIRST_SEED);
    }
}

/// One seed through the extender and in the simulator, checked equal.
fn replay_and_simulate(p: &Prepared, seed: u64) -> (RunResult, RunResult) {
    let started = std::time::Instant::now();
    let live = replay::run(p, None, seed).expect("the trace replays");
    let sim = run_one(p, PolicyKind::Tessera, seed);
    assert_eq!(live.curve, sim.curve, "seed {seed}");
    println!(
        "seed {seed}: through the extender {:.4}%, simulate {:.4}% allocated at 100% \
         arrived ({} of {} pods failed; {:.0} s)",
        live.curve[100].alloc_pct,
        sim.curve[100].alloc_pct,
        live.pods_failed,
        live.pods_arrived,
        started.elapsed().as_secs_f64()
    );
    (live, sim)
}

/// The whole default cluster over `tessera simulate`'s ten seeds (42..=51): the mean
/// allocation at 100% arrived, through the extender and in the simulator.
#[test]
#[ignore = "about 25 minutes in a debug build: the number in benches/README.md"]
fn the_default_trace_over_ten_seeds_as_simulate_s_tessera_row() {
    let p = &prepared(1);
    assert_eq!((p.cluster.len(), p.demands.len()), (1213, 8152));
    let seeds: Vec<u64> = (FIRST_SEED..FIRST_SEED + 10).collect();
    // Two seeds at a time: the machines these run on have two cores.
    let runs: Vec<(RunResult, RunResult)> = seeds
        .chunks(2)
        .flat_map(|pair| {
            std::thread::scope(|scope| {
                let running: Vec<_> = pair
                    .iter()
                    .map(|&seed| scope.spawn(move || replay_and_simulate(p, seed)))
                    .collect();
                running
                    .into_iter()
                    .map(|r| r.join().expect("a replay thread"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let (live, sim): (Vec<RunResult>, Vec<RunResult>) = runs.into_iter().unzip();
    let (live, sim) = (summarize(&live), summarize(&sim));
    let at =
        |s: &[tessera::sim::runner::PolicySummary]| s[0].at(100).expect("a point at 100%").clone();
    let (l, s) = (at(&live), at(&sim));
    println!(
        "mean over {} seeds at 100% arrived: through the extender {:.2}% allocated \
         (sd {:.2}, fragmentation {:.2}%), simulate's tessera row {:.2}%",
        seeds.len(),
        l.alloc_pct_mean,
        l.alloc_pct_sd,
        l.frag_pct_mean,
        s.alloc_pct_mean
    );
    assert_eq!(l, s);
}
