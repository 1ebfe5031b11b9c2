//! Placement policies: the six baselines of the FGD paper and Tessera's own.
//!
//! Every policy filters nodes the same way (CPU, memory, GPU model, enough GPUs with
//! enough free capacity) and differs only in how it scores feasible nodes and which GPU
//! it takes on the chosen node. Ties between equally scored nodes are broken uniformly at
//! random, like the Kubernetes scheduler's `selectHost`, from the caller's seeded RNG.

mod baselines;
mod fgd;
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

/// A placement policy. `place` does not change the cluster; the caller applies the result.
pub trait Policy: Send {
    /// Which policy this is.
    fn kind(&self) -> PolicyKind;
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
            PolicyKind::Tessera => None,
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
}

/// A policy's verdict for one node class and one demand.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    score: f64,
    pick: Pick,
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

/// Scores all feasible nodes with a class-level scorer (memoised) and returns the best.
fn place_by_class(
    cluster: &Cluster,
    d: &Demand,
    rng: &mut SplitMix64,
    ties: TieBreak,
    cache: &mut VerdictCache,
    mut scorer: impl FnMut(usize, u32, &NodeClass, &Demand) -> Option<Verdict>,
) -> Option<Placement> {
    let mut best = Best::new(ties);
    for i in 0..cluster.len() {
        let cid = cluster.class_id(i);
        let Some(v) = cache.get_or(i, cid, d, || {
            let class = cluster.class(cid);
            if class.fits(d) {
                scorer(i, cid, class, d)
            } else {
                None
            }
        }) else {
            continue;
        };
        best.offer(v.score, i, v.pick, rng);
    }
    let (_, node, pick) = best.best?;
    resolve(cluster, node, d, pick)
}

/// Turns a class-level pick into concrete GPU indices on `node`.
fn resolve(cluster: &Cluster, node: usize, d: &Demand, pick: Pick) -> Option<Placement> {
    let gpus = match pick {
        Pick::Default => cluster.default_gpus(node, d)?,
        Pick::Value(v) => vec![cluster.gpu_with(node, v)?],
    };
    Some(Placement { node, gpus })
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
