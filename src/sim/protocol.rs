//! The FGD paper's evaluation protocol, one run at a time.
//!
//! 1. Shuffle the pod list with the run's seed, then keep drawing random pods from the
//!    list (with replacement) until their total GPU request would pass `inflation` (1.3)
//!    times the cluster's GPU capacity.
//! 2. Place the pods one at a time in that order; placed pods are never removed; a pod no
//!    node can take counts as failed and is skipped.
//! 3. For every whole percent X of capacity, record the cluster as it is once exactly the
//!    pods within X% of arrived GPU request have been placed: the GPU allocation ratio
//!    (allocated milli / capacity) and the cluster's fragmentation (the FGD measure
//!    summed over nodes, as a percent of capacity).

use super::error::{Error, Result};
use super::trace::TracePod;
use crate::placement::{
    node_frag_milli, Cluster, Demand, NodeSpec, Policy, PolicyContext, PolicyKind, SplitMix64,
    TieBreak, Workload,
};

/// The paper's arrival: 130% of GPU capacity.
pub const DEFAULT_INFLATION: f64 = 1.3;
/// The paper's target workload: the most popular task shapes covering 95% of tasks.
pub const DEFAULT_COVERAGE: f64 = 0.95;
/// Checkpoints are every whole percent from 0 up to this.
pub const MAX_ARRIVED_PCT: u32 = 130;

/// A trace loaded against a cluster, ready to run any policy with any seed.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The empty cluster each run starts from.
    pub cluster: Cluster,
    /// Pod demands in the pod list's order.
    pub demands: Vec<Demand>,
    /// The target workload FGD and Tessera measure fragmentation against.
    pub workload: Workload,
    /// What policies are built from (target workload, all shapes, tie-breaking).
    pub context: PolicyContext,
    /// Arrival as a fraction of capacity (1.3 in the paper).
    pub inflation: f64,
}

impl Prepared {
    /// Builds the cluster and demands; the target workload is the pod list's.
    pub fn new(
        nodes: Vec<NodeSpec>,
        pods: &[TracePod],
        inflation: f64,
        coverage: f64,
        ties: TieBreak,
    ) -> Result<Self> {
        let mut cluster = Cluster::new(nodes)?;
        if cluster.total_gpu_milli() == 0 {
            return Err(Error::NoGpus);
        }
        let demands = pods
            .iter()
            .map(|p| cluster.demand(&p.request))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let context = PolicyContext::from_demands(&demands, coverage, ties);
        let workload = context.target.clone();
        Ok(Self {
            cluster,
            demands,
            workload,
            context,
            inflation,
        })
    }
}

/// The cluster at one checkpoint of a run.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CurvePoint {
    /// Arrived GPU request, percent of capacity.
    pub arrived_pct: u32,
    /// Allocated GPU, percent of capacity.
    pub alloc_pct: f64,
    /// Fragmented GPU (FGD measure), percent of capacity.
    pub frag_pct: f64,
    /// Pods that failed so far.
    pub failed_pods: u32,
}

/// The outcome of one (policy, seed) run.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub policy: PolicyKind,
    pub seed: u64,
    /// One point per whole percent, `0..=MAX_ARRIVED_PCT`.
    pub curve: Vec<CurvePoint>,
    pub pods_arrived: usize,
    pub pods_failed: usize,
}

/// The arrival order of step 1: indices into the pod list.
pub fn arrival_order(
    demands: &[Demand],
    capacity_milli: u64,
    inflation: f64,
    seed: u64,
) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let n = demands.len();
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let target = inflation * capacity_milli as f64;
    let mut total: u64 = demands.iter().map(Demand::total_milli).sum();
    if total as f64 > target {
        // More work than the target: drop random pods until it fits (the paper's tune-down).
        while total as f64 > target && !order.is_empty() {
            let i = rng.below(order.len() as u64) as usize;
            total -= demands[order.remove(i)].total_milli();
        }
        return order;
    }
    if n == 0 || demands.iter().all(|d| d.total_milli() == 0) {
        return order;
    }
    loop {
        let i = rng.below(n as u64) as usize;
        let m = demands[i].total_milli();
        if (total + m) as f64 > target {
            return order;
        }
        total += m;
        order.push(i);
    }
}

/// What the protocol drives: something that places pods and can be measured. The
/// simulator's engine is one ([`run_one`]); the scheduler extender's decision path,
/// replayed on the same arrival, is another (`controller::extender::replay`).
pub trait Placer {
    /// Places pod `pod` (an index into [`Prepared::demands`]); false when it fails.
    fn place(&mut self, pod: usize) -> bool;
    /// GPU milli allocated now.
    fn allocated_milli(&mut self) -> u64;
    /// Fragmented GPU milli now (the FGD measure against [`Prepared::workload`]).
    fn frag_milli(&mut self) -> f64;
}

/// Runs one policy with one seed under the protocol.
pub fn run_one(p: &Prepared, policy: PolicyKind, seed: u64) -> RunResult {
    let mut engine = Engine {
        cluster: p.cluster.clone(),
        demands: &p.demands,
        workload: &p.workload,
        placer: policy.build(&p.context),
        // Tie-breaking draws come from their own stream so that the arrival order of a
        // seed is identical for every policy.
        rng: SplitMix64::new(seed ^ 0x7E55_E7A0_0000_0001),
        frag_memo: Vec::new(),
    };
    run_with(p, policy, seed, &mut engine)
}

/// Runs the protocol's arrival for `seed` through `placer`, recorded as `policy`'s run.
pub fn run_with(p: &Prepared, policy: PolicyKind, seed: u64, placer: &mut dyn Placer) -> RunResult {
    let capacity = p.cluster.total_gpu_milli();
    let order = arrival_order(&p.demands, capacity, p.inflation, seed);
    let mut curve = Vec::with_capacity(MAX_ARRIVED_PCT as usize + 1);
    let mut arrived = 0u64;
    let mut failed = 0usize;
    let mut next = 0u32;
    for &i in &order {
        let now = arrived + p.demands[i].total_milli();
        // Checkpoints this pod's arrival passes are recorded before it is placed, so the
        // point for X% is the cluster once exactly the pods within X% have arrived.
        let passed = ((now * 100).saturating_sub(1) / capacity) as u32;
        if next <= passed && now > arrived {
            record(placer, capacity, &mut curve, &mut next, passed, failed);
        }
        arrived = now;
        if !placer.place(i) {
            failed += 1;
        }
    }
    record(
        placer,
        capacity,
        &mut curve,
        &mut next,
        MAX_ARRIVED_PCT,
        failed,
    );
    RunResult {
        policy,
        seed,
        curve,
        pods_arrived: order.len(),
        pods_failed: failed,
    }
}

/// The placement engine on its own cluster: the simulator's placer.
struct Engine<'a> {
    cluster: Cluster,
    demands: &'a [Demand],
    workload: &'a Workload,
    placer: Box<dyn Policy>,
    rng: SplitMix64,
    frag_memo: Vec<f64>,
}

impl Placer for Engine<'_> {
    fn place(&mut self, pod: usize) -> bool {
        let d = &self.demands[pod];
        match self.placer.place(&self.cluster, d, &mut self.rng) {
            // A policy proposing something that does not fit counts as failed rather
            // than corrupting the run (tests assert this never happens).
            Some(pl) => self.cluster.apply(d, &pl).is_ok(),
            None => false,
        }
    }

    fn allocated_milli(&mut self) -> u64 {
        self.cluster.allocated_gpu_milli()
    }

    fn frag_milli(&mut self) -> f64 {
        cluster_frag_milli(&self.cluster, self.workload, &mut self.frag_memo)
    }
}

/// Records checkpoints `next..=upto` (capped at the maximum) with the current state.
fn record(
    placer: &mut dyn Placer,
    capacity: u64,
    curve: &mut Vec<CurvePoint>,
    next: &mut u32,
    upto: u32,
    failed: usize,
) {
    if *next > upto.min(MAX_ARRIVED_PCT) {
        return;
    }
    let cap = capacity as f64;
    let alloc_pct = placer.allocated_milli() as f64 * 100.0 / cap;
    let frag_pct = placer.frag_milli() * 100.0 / cap;
    while *next <= upto.min(MAX_ARRIVED_PCT) {
        curve.push(CurvePoint {
            arrived_pct: *next,
            alloc_pct,
            frag_pct,
            failed_pods: failed as u32,
        });
        *next += 1;
    }
}

/// Fragmented GPU milli of the whole cluster (FGD's measure summed over nodes).
pub fn cluster_frag_milli(cluster: &Cluster, w: &Workload, memo: &mut Vec<f64>) -> f64 {
    if memo.len() < cluster.class_count() {
        memo.resize(cluster.class_count(), f64::NAN);
    }
    let mut total = 0.0;
    for i in 0..cluster.len() {
        let cid = cluster.class_id(i) as usize;
        if memo[cid].is_nan() {
            memo[cid] = node_frag_milli(cluster.class(cid as u32), w);
        }
        total += memo[cid];
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Request;

    fn pods(reqs: &[Request]) -> Vec<TracePod> {
        reqs.iter()
            .enumerate()
            .map(|(i, r)| TracePod {
                name: format!("p{i}"),
                request: r.clone(),
            })
            .collect()
    }

    #[test]
    fn arrival_reaches_but_does_not_pass_the_target_and_is_seeded() {
        let nodes = vec![NodeSpec::new("a", 64_000, 1 << 20, 8, "G2")];
        let p = Prepared::new(
            nodes,
            &pods(&[Request::shared(1, 1, 300), Request::whole(1, 1, 1)]),
            1.3,
            1.0,
            TieBreak::First,
        )
        .unwrap();
        let order = arrival_order(&p.demands, 8000, 1.3, 7);
        let total: u64 = order.iter().map(|&i| p.demands[i].total_milli()).sum();
        assert!(total <= 10_400 && total > 10_400 - 1000, "{total}");
        assert_eq!(order, arrival_order(&p.demands, 8000, 1.3, 7));
        assert_ne!(order, arrival_order(&p.demands, 8000, 1.3, 8));
        // The original list is a shuffled prefix.
        let mut head = order[..2].to_vec();
        head.sort();
        assert_eq!(head, vec![0, 1]);
    }

    #[test]
    fn oversized_lists_are_cut_down_to_the_target() {
        let d: Vec<Request> = vec![Request::whole(1, 1, 1); 20];
        let p = Prepared::new(
            vec![NodeSpec::new("a", 64_000, 1 << 20, 8, "G2")],
            &pods(&d),
            1.3,
            1.0,
            TieBreak::First,
        )
        .unwrap();
        let order = arrival_order(&p.demands, 8000, 1.3, 1);
        assert_eq!(order.len(), 10);
    }

    #[test]
    fn failed_pods_are_skipped_and_placed_pods_stay() {
        // One 2-GPU node. Arrival: whole pods of 1 GPU; the third and later fail.
        let nodes = vec![NodeSpec::new("a", 64_000, 1 << 20, 2, "T4")];
        let p = Prepared::new(
            nodes,
            &pods(&[Request::whole(100, 100, 1)]),
            1.3,
            1.0,
            TieBreak::First,
        )
        .unwrap();
        for kind in PolicyKind::ALL {
            let r = run_one(&p, kind, 3);
            assert_eq!(
                r.pods_arrived, 2,
                "{kind}: 2600 milli target takes two 1000m pods"
            );
            assert_eq!(r.pods_failed, 0);
            let last = r.curve.last().unwrap();
            assert_eq!((last.arrived_pct, last.alloc_pct), (130, 100.0));
            // One pod (50% arrived) allocates 50%; allocation never decreases.
            assert_eq!(r.curve[49].alloc_pct, 0.0);
            assert_eq!(r.curve[50].alloc_pct, 50.0);
            assert!(r.curve.windows(2).all(|w| w[1].alloc_pct >= w[0].alloc_pct));
            assert_eq!(r.curve.len(), 131);
        }
        let nodes = vec![NodeSpec::new("a", 1000, 1 << 20, 2, "T4")];
        let p = Prepared::new(
            nodes,
            &pods(&[Request::whole(800, 100, 1)]),
            1.3,
            1.0,
            TieBreak::First,
        )
        .unwrap();
        let r = run_one(&p, PolicyKind::BestFit, 3);
        // CPU allows only one pod: the second fails, allocation stays at 50%.
        assert_eq!((r.pods_arrived, r.pods_failed), (2, 1));
        assert_eq!(r.curve[130].alloc_pct, 50.0);
        assert_eq!(r.curve[130].failed_pods, 1);
    }

    #[test]
    fn fragmentation_metric_is_the_fgd_measure_over_capacity() {
        // Workload of only 600m tasks; after one 600m pod on a 1-GPU node, 400m is free and
        // too small: 400 / 1000 = 40% fragmented.
        let nodes = vec![NodeSpec::new("a", 64_000, 1 << 20, 1, "T4")];
        let p = Prepared::new(
            nodes,
            &pods(&[Request::shared(1, 1, 600)]),
            1.3,
            1.0,
            TieBreak::First,
        )
        .unwrap();
        let r = run_one(&p, PolicyKind::Fgd, 1);
        assert_eq!(r.curve[0].frag_pct, 0.0);
        assert_eq!(r.curve[60].alloc_pct, 60.0);
        assert!((r.curve[60].frag_pct - 40.0).abs() < 1e-9);
    }

    #[test]
    fn runs_are_deterministic_per_seed() {
        let nodes: Vec<_> = (0..6)
            .map(|i| NodeSpec::new(&format!("n{i}"), 32_000, 1 << 18, 4, "T4"))
            .collect();
        let reqs = [
            Request::shared(2000, 4000, 300),
            Request::shared(4000, 4000, 700),
            Request::whole(8000, 8000, 2),
        ];
        let p = Prepared::new(nodes, &pods(&reqs), 1.3, 1.0, TieBreak::First).unwrap();
        for kind in PolicyKind::ALL {
            assert_eq!(
                run_one(&p, kind, 5).curve,
                run_one(&p, kind, 5).curve,
                "{kind}"
            );
        }
    }
}
