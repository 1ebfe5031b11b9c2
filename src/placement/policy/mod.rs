//! Placement policies: the six baselines of the FGD paper and Tessera's own.
//!
//! Every policy filters nodes the same way (CPU, memory, GPU model, enough GPUs with
//! enough free capacity) and differs only in how it scores feasible nodes and which GPU
//! it takes on the chosen node. Ties between equally scored nodes are broken uniformly at
//! random, like the Kubernetes scheduler's `selectHost`, from the caller's seeded RNG.
//!
//! A policy's judgement of one node is a [`Verdict`] ([`Policy::verdict`]): its score and
//! the GPUs it would take there. [`Policy::place`] picks the best verdict over all nodes
//! (the simulator); the scheduler extender asks for the verdicts of its candidate nodes
//! and turns them into scores. Both read the same verdicts.
//!
//! Besides the paper's baselines and Tessera's own, HAMi's two node policies are here
//! (`binpack`, `spread`; [`fill`]), so the extender places pods that ask for them by
//! this engine too.

mod baselines;
mod fgd;
mod fill;
mod tessera;

use serde::Serialize;

use super::cluster::{Cluster, NodeClass};
use super::error::{Error, Result};
use super::frag::Workload;
use super::rng::SplitMix64;
use super::types::{Demand, GpuFree, Placement};

/// How equally scored nodes are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TieBreak {
    /// The first node in node-list order wins. This is what reproduces the FGD authors'
    /// published numbers (their simulator effectively takes the first best node).
    #[default]
    First,
    /// A uniformly random best node (the stock Kubernetes `selectHost`).
    Random,
}

impl TieBreak {
    /// Parses `first` or `random`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "first" => Ok(TieBreak::First),
            "random" => Ok(TieBreak::Random),
            _ => Err(Error::InvalidRequest {
                field: "ties",
                reason: format!("`{s}` is not `first` or `random`"),
            }),
        }
    }
}

/// What a policy is built from.
#[derive(Debug, Clone, Default)]
pub struct PolicyContext {
    /// FGD's target workload: the popular task shapes covering 95% of tasks.
    pub target: Workload,
    /// Every task shape of the workload with its share (coverage 1.0).
    pub shapes: Workload,
    /// Tie-breaking between equally scored nodes.
    pub ties: TieBreak,
}

impl PolicyContext {
    /// The context for a workload of these demands: every shape with its share, and
    /// FGD's target workload, the most popular shapes covering `coverage` of them.
    pub fn from_demands<'a>(
        demands: impl IntoIterator<Item = &'a Demand>,
        coverage: f64,
        ties: TieBreak,
    ) -> Self {
        let shapes = Workload::from_demands(demands, 1.0);
        let target = shapes.popular(coverage);
        Self {
            target,
            shapes,
            ties,
        }
    }
}

/// A placement policy. Neither method changes the cluster; the caller applies the result.
pub trait Policy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;
    /// The policy's verdict on node `node` for `d`: `None` when `d` does not fit there.
    /// Valid for the cluster as it is; [`Policy::place`] chooses among these.
    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict>;
    /// Chooses a node and GPUs for `d`, or `None` when no node can take it.
    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement>;
}

/// The policies the engine offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Random,
    DotProduct,
    GpuClustering,
    GpuPacking,
    BestFit,
    Fgd,
    Tessera,
    /// HAMi's `binpack`: the node whose GPUs are fullest after placing, its fullest GPUs.
    Binpack,
    /// HAMi's `spread`: the node whose GPUs are emptiest after placing, its emptiest GPUs.
    Spread,
}

impl PolicyKind {
    /// All policies, baselines first in the paper's order, then Tessera's.
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Random,
        PolicyKind::DotProduct,
        PolicyKind::GpuClustering,
        PolicyKind::GpuPacking,
        PolicyKind::BestFit,
        PolicyKind::Fgd,
        PolicyKind::Tessera,
    ];

    /// HAMi's node policies, which pods ask for by annotation (not run by `all`).
    pub const HAMI: [PolicyKind; 2] = [PolicyKind::Binpack, PolicyKind::Spread];

    /// CLI name (`bestfit`, `fgd`, `tessera`, ...).
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::DotProduct => "dotproduct",
            PolicyKind::GpuClustering => "gpuclustering",
            PolicyKind::GpuPacking => "gpupacking",
            PolicyKind::BestFit => "bestfit",
            PolicyKind::Fgd => "fgd",
            PolicyKind::Tessera => "tessera",
            PolicyKind::Binpack => "binpack",
            PolicyKind::Spread => "spread",
        }
    }

    /// The label of this policy in the FGD authors' result files, if they ran it.
    pub fn paper_label(self) -> Option<&'static str> {
        match self {
            PolicyKind::Random => Some("01-Random"),
            PolicyKind::DotProduct => Some("02-DotProd"),
            PolicyKind::GpuClustering => Some("03-GpuClustering"),
            PolicyKind::GpuPacking => Some("04-GpuPacking"),
            PolicyKind::BestFit => Some("05-BestFit"),
            PolicyKind::Fgd => Some("06-FGD"),
            PolicyKind::Tessera | PolicyKind::Binpack | PolicyKind::Spread => None,
        }
    }

    /// Parses a CLI name (case-insensitive; `dotprod` and `best-fit` style aliases too).
    pub fn parse(s: &str) -> Result<Self> {
        let norm: String = s
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        Ok(match norm.as_str() {
            "random" | "randomfit" => PolicyKind::Random,
            "dotproduct" | "dotprod" => PolicyKind::DotProduct,
            "gpuclustering" | "clustering" => PolicyKind::GpuClustering,
            "gpupacking" | "packing" => PolicyKind::GpuPacking,
            "bestfit" => PolicyKind::BestFit,
            "fgd" => PolicyKind::Fgd,
            "tessera" => PolicyKind::Tessera,
            "binpack" => PolicyKind::Binpack,
            "spread" => PolicyKind::Spread,
            _ => return Err(Error::UnknownPolicy(s.to_string())),
        })
    }

    /// A fresh policy instance.
    pub fn build(self, ctx: &PolicyContext) -> Box<dyn Policy> {
        let ties = ctx.ties;
        match self {
            PolicyKind::Random => Box::new(baselines::RandomFit),
            PolicyKind::DotProduct => Box::new(baselines::DotProduct::new(ties)),
            PolicyKind::GpuClustering => Box::new(baselines::GpuClustering { ties }),
            PolicyKind::GpuPacking => Box::new(baselines::GpuPacking::new(ties)),
            PolicyKind::BestFit => Box::new(baselines::BestFit::new(ties)),
            PolicyKind::Fgd => Box::new(fgd::Fgd::new(ctx.target.clone(), ties)),
            PolicyKind::Tessera => Box::new(tessera::Tessera::new(ctx)),
            PolicyKind::Binpack => Box::new(fill::Fill::binpack(ties)),
            PolicyKind::Spread => Box::new(fill::Fill::spread(ties)),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which GPU(s) to take on the chosen node.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pick {
    /// The default allocator (tightest fit for one GPU, lowest free indices for several).
    Default,
    /// The lowest-index GPU whose free capacity equals this value.
    Value(GpuFree),
    /// The fitting GPUs with the least free capacity (lowest index among equals).
    Fullest,
    /// The fitting GPUs with the most free capacity (lowest index among equals).
    Emptiest,
}

/// A policy's verdict on one node for one demand: how much it likes the node (higher is
/// better; only the order of scores means something) and which GPUs it takes there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// The node's score.
    pub score: f64,
    pick: Pick,
}

impl Verdict {
    /// The placement this verdict makes on `node` (the GPUs by index), `None` when the
    /// node no longer holds what the verdict was given for.
    pub fn placement(&self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Placement> {
        resolve(cluster, node, d, self.pick)
    }
}

/// Memo of verdicts per node and demand. A row is valid while its node stays in the
/// class it was computed for (same class, same verdict), so a placement only invalidates
/// the one node it changed. Lookups are plain array reads: no hashing on the hot path.
#[derive(Default)]
struct VerdictCache {
    rows: Vec<Row>,
}

struct Row {
    class: u32,
    slots: Vec<Slot>,
}

#[derive(Clone, Copy)]
enum Slot {
    Unknown,
    Infeasible,
    Known(Verdict),
}

impl VerdictCache {
    fn get_or(
        &mut self,
        node: usize,
        class: u32,
        d: &Demand,
        f: impl FnOnce() -> Option<Verdict>,
    ) -> Option<Verdict> {
        if self.rows.len() <= node {
            self.rows.resize_with(node + 1, || Row {
                class: u32::MAX,
                slots: Vec::new(),
            });
        }
        let row = &mut self.rows[node];
        if row.class != class {
            row.class = class;
            row.slots.iter_mut().for_each(|s| *s = Slot::Unknown);
        }
        let id = d.id as usize;
        if row.slots.len() <= id {
            row.slots.resize(id + 1, Slot::Unknown);
        }
        match row.slots[id] {
            Slot::Known(v) => Some(v),
            Slot::Infeasible => None,
            Slot::Unknown => {
                let v = f();
                row.slots[id] = v.map_or(Slot::Infeasible, Slot::Known);
                v
            }
        }
    }
}

/// Memo of a per-class quantity (e.g. a node state's fragmentation), indexed by class id.
#[derive(Default)]
struct ClassMemo {
    values: Vec<f64>,
}

impl ClassMemo {
    fn get_or(&mut self, class: u32, f: impl FnOnce() -> f64) -> f64 {
        let i = class as usize;
        if self.values.len() <= i {
            self.values.resize(i + 1, f64::NAN);
        }
        if self.values[i].is_nan() {
            self.values[i] = f();
        }
        self.values[i]
    }
}

/// Keeps the best (score, node) seen so far under a tie-breaking rule.
struct Best<T> {
    ties: TieBreak,
    best: Option<(f64, usize, T)>,
    count: u64,
}

impl<T> Best<T> {
    fn new(ties: TieBreak) -> Self {
        Self {
            ties,
            best: None,
            count: 0,
        }
    }

    fn offer(&mut self, score: f64, node: usize, extra: T, rng: &mut SplitMix64) {
        match &self.best {
            Some((s, _, _)) if score < *s => {}
            Some((s, _, _)) if score == *s => {
                self.count += 1;
                if self.ties == TieBreak::Random && rng.below(self.count) == 0 {
                    self.best = Some((score, node, extra));
                }
            }
            _ => {
                self.count = 1;
                self.best = Some((score, node, extra));
            }
        }
    }
}

/// The verdict on `node` from a class-level scorer, memoised per (node, class, demand).
fn class_verdict(
    cluster: &Cluster,
    node: usize,
    d: &Demand,
    cache: &mut VerdictCache,
    scorer: impl FnOnce(usize, u32, &NodeClass, &Demand) -> Option<Verdict>,
) -> Option<Verdict> {
    let cid = cluster.class_id(node);
    cache.get_or(node, cid, d, || {
        let class = cluster.class(cid);
        if class.fits(d) {
            scorer(node, cid, class, d)
        } else {
            None
        }
    })
}

/// The node with the best verdict (ties broken by `ties`), placed as its verdict says.
fn place_best(
    cluster: &Cluster,
    d: &Demand,
    rng: &mut SplitMix64,
    ties: TieBreak,
    mut verdict: impl FnMut(usize) -> Option<Verdict>,
) -> Option<Placement> {
    let mut best = Best::new(ties);
    for i in 0..cluster.len() {
        if let Some(v) = verdict(i) {
            best.offer(v.score, i, v.pick, rng);
        }
    }
    let (_, node, pick) = best.best?;
    resolve(cluster, node, d, pick)
}

/// Turns a class-level pick into concrete GPU indices on `node`.
fn resolve(cluster: &Cluster, node: usize, d: &Demand, pick: Pick) -> Option<Placement> {
    let gpus = match pick {
        Pick::Default => cluster.default_gpus(node, d)?,
        Pick::Value(v) => vec![cluster.gpu_with(node, v)?],
        Pick::Fullest => ordered_gpus(cluster, node, d, false)?,
        Pick::Emptiest => ordered_gpus(cluster, node, d, true)?,
    };
    Some(Placement { node, gpus })
}

/// `d`'s GPUs on `node`: the fitting ones with the least (or, `emptiest`, the most) free
/// capacity, the lowest index first among equals. `None` when too few fit.
fn ordered_gpus(cluster: &Cluster, node: usize, d: &Demand, emptiest: bool) -> Option<Vec<u8>> {
    if d.gpu_count == 0 {
        return Some(Vec::new());
    }
    let mut fitting: Vec<(u16, u8)> = cluster
        .node(node)
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib)
        .map(|(i, g)| (g.milli, i as u8))
        .collect();
    if emptiest {
        fitting.sort_by_key(|&(milli, i)| (std::cmp::Reverse(milli), i));
    } else {
        fitting.sort_unstable();
    }
    let picked: Vec<u8> = fitting
        .into_iter()
        .map(|(_, i)| i)
        .take(usize::from(d.gpu_count))
        .collect();
    (picked.len() == usize::from(d.gpu_count)).then_some(picked)
}

/// Free capacity after taking `d` from a node in class `c` the way the FGD simulator's
/// `Sub` does: each GPU of the demand from the least-free GPU that still fits.
fn after_default(c: &NodeClass, d: &Demand) -> Vec<GpuFree> {
    let mut gpus = c.gpus.clone();
    let mut need = d.gpu_count;
    // `gpus` is sorted in decreasing order: walk it from the least free end.
    for g in gpus.iter_mut().rev() {
        if need == 0 {
            break;
        }
        if g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib {
            g.milli -= d.gpu_milli;
            if g.memory_mib != u32::MAX {
                g.memory_mib -= d.gpu_memory_mib;
            }
            need -= 1;
        }
    }
    gpus
}

/// Free capacity after taking `d` (one GPU) from the GPU with free capacity `v`.
fn after_value(c: &NodeClass, d: &Demand, v: GpuFree) -> Vec<GpuFree> {
    let mut gpus = c.gpus.clone();
    if let Some(g) = gpus.iter_mut().find(|g| **g == v) {
        g.milli -= d.gpu_milli;
        if g.memory_mib != u32::MAX {
            g.memory_mib -= d.gpu_memory_mib;
        }
    }
    gpus
}

/// Distinct free-capacity values of GPUs in `c` that can take one GPU of `d`.
fn candidate_values<'a>(c: &'a NodeClass, d: &Demand) -> impl Iterator<Item = GpuFree> + 'a {
    let mut last: Option<GpuFree> = None;
    let (m, mem) = (d.gpu_milli, d.gpu_memory_mib);
    c.gpus.iter().copied().filter(move |g| {
        let new = g.milli >= m && g.memory_mib >= mem && last != Some(*g);
        last = Some(*g);
        new
    })
}

#[cfg(test)]
mod tests;
