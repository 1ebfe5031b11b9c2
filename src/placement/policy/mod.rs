//! Placement policies: the six baselines of the FGD paper and Tessera's own.
//!
//! Every policy filters nodes the same way (CPU, memory, GPU model, enough GPUs with
//! enough free capacity) and differs only in how it scores feasible nodes and which GPU
//! it takes on the chosen node. Ties between equally scored nodes are broken uniformly at
//! random, like the Kubernetes scheduler's `selectHost`, from the caller's seeded RNG.

mod baselines;
mod fgd;
mod tessera;

use std::collections::HashMap;

use serde::Serialize;

use super::cluster::{Cluster, NodeClass};
use super::error::{Error, Result};
use super::frag::Workload;
use super::hash::FxBuild;
use super::rng::SplitMix64;
use super::types::{Demand, GpuFree, Placement};

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

    /// A fresh policy instance; `workload` is the target workload FGD and Tessera use.
    pub fn build(self, workload: &Workload) -> Box<dyn Policy> {
        match self {
            PolicyKind::Random => Box::new(baselines::RandomFit),
            PolicyKind::DotProduct => Box::new(baselines::DotProduct::default()),
            PolicyKind::GpuClustering => Box::new(baselines::GpuClustering),
            PolicyKind::GpuPacking => Box::new(baselines::GpuPacking::default()),
            PolicyKind::BestFit => Box::new(baselines::BestFit::default()),
            PolicyKind::Fgd => Box::new(fgd::Fgd::new(workload.clone())),
            PolicyKind::Tessera => Box::new(tessera::Tessera::new(workload.clone())),
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

/// Per-(class, demand) memo of verdicts. Class ids never change meaning, so entries stay
/// valid for the cluster's lifetime.
#[derive(Default)]
struct VerdictCache {
    map: HashMap<u64, Option<Verdict>, FxBuild>,
}

impl VerdictCache {
    fn get_or(
        &mut self,
        class: u32,
        d: &Demand,
        f: impl FnOnce() -> Option<Verdict>,
    ) -> Option<Verdict> {
        let key = (u64::from(class) << 32) | u64::from(d.id);
        *self.map.entry(key).or_insert_with(f)
    }
}

/// Scores all feasible nodes with a class-level scorer (memoised) and returns the best,
/// ties broken uniformly at random.
fn place_by_class(
    cluster: &Cluster,
    d: &Demand,
    rng: &mut SplitMix64,
    cache: &mut VerdictCache,
    mut scorer: impl FnMut(&NodeClass, &Demand) -> Option<Verdict>,
) -> Option<Placement> {
    let mut best: Option<(f64, usize, Pick)> = None;
    let mut ties = 0u64;
    for i in 0..cluster.len() {
        let cid = cluster.class_id(i);
        let Some(v) = cache.get_or(cid, d, || {
            let class = cluster.class(cid);
            if class.fits(d) {
                scorer(class, d)
            } else {
                None
            }
        }) else {
            continue;
        };
        match best {
            Some((s, _, _)) if v.score < s => {}
            Some((s, _, _)) if v.score == s => {
                ties += 1;
                if rng.below(ties) == 0 {
                    best = Some((v.score, i, v.pick));
                }
            }
            _ => {
                ties = 1;
                best = Some((v.score, i, v.pick));
            }
        }
    }
    let (_, node, pick) = best?;
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
