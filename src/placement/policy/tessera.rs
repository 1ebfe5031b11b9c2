//! Tessera's placement policy: FGD's fragmentation gradient, measured better.
//!
//! Like FGD it places each task where the node's expected fragmentation grows least, and
//! it keeps the first-best-node order that makes FGD pack. It changes what is measured:
//!
//! 1. **Every task shape, weighted by GPU demand.** FGD's target workload keeps only the
//!    popular shapes covering 95% of tasks by count, which drops all multi-GPU tasks
//!    (each 8-GPU shape is rare by count, yet multi-GPU tasks are ~7% of the GPU demand), so
//!    FGD happily breaks up whole nodes they need. Tessera keeps every shape and weights
//!    each by `1 + gpu_weight · GPUs requested`.
//! 2. **Stranded GPUs.** A GPU whose node has run out of CPU is lost as surely as a
//!    fragment, but FGD only sees it when a whole shape stops fitting. Tessera adds a
//!    smooth term: the GPU milli a node cannot feed with the CPU it has left, at the
//!    workload's CPU-per-GPU ratio, and charges each placement its change.
//! 3. **Contested nodes.** Some tasks can run on few nodes: those restricted to a GPU
//!    model, or an 8-GPU task asking 120 CPUs that only the 128-CPU nodes have. A task
//!    that could run anywhere but lands there takes capacity they cannot find elsewhere.
//!    Tessera charges each placement, per milli, the node's *host pressure*: the summed
//!    GPU demand per hosting GPU of every shape the node can host, relative to average.
//! 4. **Exact scores.** The fragmentation change is used as a real number, not squashed
//!    into FGD's 0–100 integer score.
//! 5. **A packing plan for sharing tasks.** Which sharing sizes end up on one GPU decides
//!    the idle GPU left once the cluster is full (470 + 470 leaves 60, 470 + 320 leaves
//!    210 that almost nothing fills). From the workload's size distribution Tessera
//!    solves the cutting-stock LP once ([`SharePlan`]) and a sharing task may leave a GPU
//!    only at a free capacity that a planned combination passes through; among those the
//!    fragmentation measure decides. Off-plan GPUs pay a charge larger than usual
//!    fragmentation changes, so they are taken only when no on-plan GPU fits.
//!
//! Decisions are memoised per (node state, demand) like every class-based policy, so a
//! decision on the 1,213-node cluster is one pass of array reads (see `benches/placement.rs`).

use super::{
    after_default, after_value, candidate_values, class_verdict, place_best, ClassMemo, Pick,
    Policy, PolicyContext, PolicyKind, TieBreak, Verdict, VerdictCache,
};
use crate::placement::cluster::model_allowed;
use crate::placement::cluster::{Cluster, NodeClass};
use crate::placement::frag::{frag_milli, TargetPod, Workload};
use crate::placement::plan::SharePlan;
use crate::placement::rng::SplitMix64;
use crate::placement::types::{Demand, GpuFree, Placement, MILLI};

/// Tuning knobs of Tessera's policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TesseraParams {
    /// Extra weight per requested GPU when weighting task shapes (0 = by count, like FGD).
    pub gpu_weight: f64,
    /// Weight of the stranded-GPU term (milli of stranded GPU per milli of fragment).
    pub strand_weight: f64,
    /// Weight of the host-pressure term (charge per milli placed, times the pressure).
    pub pressure_weight: f64,
    /// Charge (in milli of fragment) for leaving a GPU at a free capacity off the
    /// packing plan. Larger than any fragmentation change, so an on-plan GPU always
    /// wins when one exists (0 disables the plan).
    pub off_plan_penalty: f64,
}

impl Default for TesseraParams {
    /// The values measured best on the default trace (see `docs/simulate.md`).
    fn default() -> Self {
        Self {
            gpu_weight: 1.0,
            strand_weight: 1.0,
            pressure_weight: 0.5,
            off_plan_penalty: 10_000.0,
        }
    }
}

/// Tessera's policy.
pub struct Tessera {
    workload: Workload,
    /// CPU milli the workload needs per GPU milli.
    cpu_per_milli: f64,
    params: TesseraParams,
    ties: TieBreak,
    cache: VerdictCache,
    /// Current fragmentation + stranded GPU per node class.
    before: ClassMemo,
    /// Per node: host pressure (see [`host_pressure`]), computed on first use.
    pressure: Option<Vec<f64>>,
    /// Free-capacity levels of a good packing of the sharing sizes (see [`SharePlan`]).
    plan: Option<SharePlan>,
}

/// Per node: how contested its GPUs are. Each task shape can run on some set of nodes
/// (by GPU model, GPU count and CPU when empty); its GPU demand per GPU of that set is its
/// scarcity. A node's pressure is the summed scarcity of the shapes it can host, relative
/// to the cluster-wide average, so nodes that rare or picky shapes depend on (the only
/// models a constrained task allows, the few nodes with CPU for a big 8-GPU task) cost
/// more to fill with tasks that could go elsewhere.
fn host_pressure(cluster: &Cluster, shapes: &Workload) -> Vec<f64> {
    let n = cluster.len();
    let hosts = |t: &TargetPod, i: usize| {
        let s = cluster.spec(i);
        let model = cluster.class(cluster.class_id(i)).model;
        t.gpu_count > 0
            && s.gpu_count >= t.gpu_count
            && s.cpu_milli >= t.cpu_milli
            && model_allowed(model, t.models)
    };
    let total_cap: f64 = (0..n).map(|i| f64::from(cluster.spec(i).gpu_count)).sum();
    let mut pressure = vec![0.0f64; n];
    let mut total_demand = 0.0;
    for t in &shapes.pods {
        let g = t.freq * f64::from(t.gpu_count) * f64::from(t.gpu_milli);
        if g <= 0.0 {
            continue;
        }
        total_demand += g;
        let cap: f64 = (0..n)
            .filter(|&i| hosts(t, i))
            .map(|i| f64::from(cluster.spec(i).gpu_count))
            .sum();
        if cap > 0.0 {
            for (i, p) in pressure.iter_mut().enumerate() {
                if hosts(t, i) {
                    *p += g / cap;
                }
            }
        }
    }
    let average = if total_cap > 0.0 {
        total_demand / total_cap
    } else {
        0.0
    };
    if average > 0.0 {
        pressure.iter_mut().for_each(|p| *p /= average);
    }
    pressure
}

impl Tessera {
    /// Tessera's policy for this workload with the default parameters.
    pub fn new(ctx: &PolicyContext) -> Self {
        Self::with_params(ctx, TesseraParams::default())
    }

    /// Tessera's policy with explicit parameters.
    pub fn with_params(ctx: &PolicyContext, params: TesseraParams) -> Self {
        let gw = params.gpu_weight;
        let workload = ctx.shapes.reweighted(|t| {
            1.0 + gw * f64::from(t.gpu_count) * f64::from(t.gpu_milli) / f64::from(MILLI)
        });
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for t in &ctx.shapes.pods {
            cpu += t.freq * f64::from(t.cpu_milli);
            gpu += t.freq * f64::from(t.gpu_count) * f64::from(t.gpu_milli);
        }
        let cpu_per_milli = if gpu > 0.0 { cpu / gpu } else { 0.0 };
        Self {
            workload,
            cpu_per_milli,
            params,
            ties: ctx.ties,
            cache: VerdictCache::default(),
            before: ClassMemo::default(),
            pressure: None,
            plan: SharePlan::from_workload(&ctx.shapes),
        }
    }
}

/// GPU milli a node cannot use for lack of CPU, at `r` CPU milli per GPU milli.
fn stranded(cpu_left: u32, gpu_left: u32, r: f64) -> f64 {
    if r <= 0.0 {
        return 0.0;
    }
    (f64::from(gpu_left) - f64::from(cpu_left) / r).max(0.0)
}

/// What a node state costs: expected fragmented plus stranded GPU milli.
fn cost(c: &NodeClass, w: &Workload, p: &TesseraParams, r: f64) -> f64 {
    frag_milli(c.model, c.cpu_left, &c.gpus, w)
        + p.strand_weight * stranded(c.cpu_left, c.gpu_milli_left(), r)
}

/// Tessera's verdict for one node class whose current cost is `before`: higher is better.
fn verdict(
    c: &NodeClass,
    d: &Demand,
    w: &Workload,
    p: &TesseraParams,
    r: f64,
    before: f64,
    plan: Option<&SharePlan>,
) -> Verdict {
    let cpu_after = c.cpu_left - d.cpu_milli;
    let value = |gpus: &[GpuFree]| {
        let left: u32 = gpus.iter().map(|g| u32::from(g.milli)).sum();
        let after = frag_milli(c.model, cpu_after, gpus, w)
            + p.strand_weight * stranded(cpu_after, left, r);
        before - after
    };
    if d.is_shared() {
        let mut best: Option<Verdict> = None;
        for v in candidate_values(c, d) {
            let mut s = value(&after_value(c, d, v));
            if plan.is_some_and(|plan| !plan.keeps(v.milli - d.gpu_milli)) {
                s -= p.off_plan_penalty;
            }
            // Candidates come largest-free first; on a tie keep the tighter GPU.
            if best.is_none_or(|b| s >= b.score) {
                best = Some(Verdict {
                    score: s,
                    pick: Pick::Value(v),
                });
            }
        }
        best.unwrap_or(Verdict {
            score: f64::MIN,
            pick: Pick::Default,
        })
    } else {
        Verdict {
            score: value(&after_default(c, d)),
            pick: Pick::Default,
        }
    }
}

impl Policy for Tessera {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Tessera
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        let (w, p, r) = (&self.workload, &self.params, self.cpu_per_milli);
        let pressure = self
            .pressure
            .get_or_insert_with(|| host_pressure(cluster, w));
        let memo = &mut self.before;
        let plan = self.plan.as_ref();
        class_verdict(cluster, node, d, &mut self.cache, |node, cid, c, d| {
            let before = memo.get_or(cid, || cost(c, w, p, r));
            let mut v = verdict(c, d, w, p, r, before, plan);
            let hp = pressure.get(node).copied().unwrap_or(0.0);
            v.score -= p.pressure_weight * hp * d.total_milli() as f64;
            Some(v)
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{NodeSpec, Request};

    #[test]
    fn stranded_gpu_is_what_cpu_cannot_feed() {
        // 14 CPU per GPU: 2 GPUs need 28 CPU; with 16 CPU, 2000 - 16000/14 ≈ 857 milli stranded.
        let r = 14.0;
        assert!((stranded(16_000, 2000, r) - (2000.0 - 16_000.0 / 14.0)).abs() < 1e-9);
        assert_eq!(stranded(104_000, 2000, r), 0.0);
        assert_eq!(stranded(0, 0, r), 0.0);
        assert_eq!(stranded(0, 1000, 0.0), 0.0);
    }

    #[test]
    fn flexible_tasks_avoid_nodes_that_constrained_tasks_need() {
        // Half the workload may only use T4; the other half runs anywhere. Both nodes are
        // empty; an unconstrained task should leave the T4 node to the T4-only tasks.
        let specs = vec![
            NodeSpec::new("t4", 64_000, 1 << 20, 2, "T4"),
            NodeSpec::new("v100", 64_000, 1 << 20, 2, "V100"),
        ];
        let mut c = Cluster::new(specs).unwrap();
        let shapes: Vec<Demand> = [
            Request::whole(1000, 1, 1).on_models(&["T4"]),
            Request::whole(1000, 1, 1),
        ]
        .iter()
        .map(|r| c.demand(r).unwrap())
        .collect();
        let w = Workload::from_demands(&shapes, 1.0);
        let p = host_pressure(&c, &w);
        assert!(p[0] > p[1], "{p:?}");
        let ctx = PolicyContext {
            target: w.clone(),
            shapes: w,
            ties: TieBreak::First,
        };
        let d = c.demand(&Request::whole(1000, 1, 1)).unwrap();
        let got = Tessera::new(&ctx).place(&c, &d, &mut SplitMix64::new(1));
        assert_eq!(got.map(|p| p.node), Some(1));
    }

    #[test]
    fn small_tasks_keep_off_the_only_nodes_big_tasks_fit() {
        // An 8-GPU task asking 120 CPUs fits only the 128-CPU node; 1-GPU tasks fit both.
        let specs = vec![
            NodeSpec::new("big", 128_000, 1 << 20, 8, "G3"),
            NodeSpec::new("std", 96_000, 1 << 20, 8, "G3"),
        ];
        let mut c = Cluster::new(specs).unwrap();
        let shapes: Vec<Demand> = [
            Request::whole(120_000, 1, 8),
            Request::whole(8000, 1, 1),
            Request::whole(8000, 1, 1),
        ]
        .iter()
        .map(|r| c.demand(r).unwrap())
        .collect();
        let w = Workload::from_demands(&shapes, 1.0);
        let ctx = PolicyContext {
            target: w.clone(),
            shapes: w,
            ties: TieBreak::First,
        };
        let d = c.demand(&Request::whole(8000, 1, 1)).unwrap();
        let got = Tessera::new(&ctx).place(&c, &d, &mut SplitMix64::new(1));
        assert_eq!(got.map(|p| p.node), Some(1));
    }

    #[test]
    fn cpu_only_tasks_go_where_cpu_is_plentiful() {
        // Both nodes have 2 free GPUs; only node 1 has CPU to spare. A CPU-only task on
        // node 0 would strand its GPUs, so Tessera sends it to node 1 (FGD is indifferent).
        let mut c = Cluster::new(vec![
            NodeSpec::new("tight", 24_000, 1 << 20, 2, "T4"),
            NodeSpec::new("rich", 104_000, 1 << 20, 2, "T4"),
        ])
        .unwrap();
        let shapes: Vec<Demand> = [Request::whole(12_000, 1, 1), Request::cpu(8000, 1)]
            .iter()
            .map(|r| c.demand(r).unwrap())
            .collect();
        let w = Workload::from_demands(&shapes, 1.0);
        let ctx = PolicyContext {
            target: w.clone(),
            shapes: w,
            ties: TieBreak::First,
        };
        let d = c.demand(&Request::cpu(8000, 1)).unwrap();
        let got = Tessera::new(&ctx).place(&c, &d, &mut SplitMix64::new(1));
        assert_eq!(got.map(|p| p.node), Some(1));
    }
}
