//! The five non-FGD baselines of the FGD paper, reimplemented from its description and
//! the scoring rules of its simulator: Random-fit, Dot-product (Tetris), GPU clustering,
//! GPU packing and Best-fit. Scores are integers in 0..=100 like Kubernetes score
//! plugins, so equal scores tie and the tie is broken at random.

use super::{
    class_verdict, place_best, resolve, Pick, Policy, PolicyKind, TieBreak, Verdict, VerdictCache,
};
use crate::placement::cluster::{affinity_tag, Cluster, NodeClass};
use crate::placement::rng::SplitMix64;
use crate::placement::types::{Demand, Placement, MILLI};

/// Normalisers of the simulator: the largest node has 128 CPUs and 8 GPUs.
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;
const MAX_SCORE: i64 = 100;

/// Random-fit: a uniformly random feasible node, a random fitting GPU on it.
pub struct RandomFit;

impl Policy for RandomFit {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    /// Every node that fits is as good as any other (the pick is random only in `place`).
    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        cluster.fits(node, d).then_some(Verdict {
            score: 0.0,
            pick: Pick::Default,
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let mut chosen = None;
        let mut n = 0u64;
        for i in 0..cluster.len() {
            if cluster.fits(i, d) {
                n += 1;
                if rng.below(n) == 0 {
                    chosen = Some(i);
                }
            }
        }
        let node = chosen?;
        if d.gpu_count != 1 {
            return resolve(cluster, node, d, Pick::Default);
        }
        let fitting: Vec<u8> = cluster
            .node(node)
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib)
            .map(|(i, _)| i as u8)
            .collect();
        let g = *fitting.get(rng.below(fitting.len() as u64) as usize)?;
        Some(Placement {
            node,
            gpus: vec![g],
        })
    }
}

/// Dot-product (Tetris): prefers the node whose free (CPU, GPU) vector has the smallest
/// dot product with the request, both normalised by the largest node.
pub struct DotProduct {
    ties: TieBreak,
    cache: VerdictCache,
}

impl DotProduct {
    /// A fresh instance with this tie-breaking rule.
    pub fn new(ties: TieBreak) -> Self {
        Self {
            ties,
            cache: VerdictCache::default(),
        }
    }
}

impl Policy for DotProduct {
    fn kind(&self) -> PolicyKind {
        PolicyKind::DotProduct
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        class_verdict(cluster, node, d, &mut self.cache, |_, _, c, d| {
            let dot = f64::from(c.cpu_left) / MAX_SPEC_CPU * f64::from(d.cpu_milli) / MAX_SPEC_CPU
                + f64::from(c.gpu_milli_left()) / MAX_SPEC_GPU * d.total_milli() as f64
                    / MAX_SPEC_GPU;
            let score = ((1.0 - dot / 2.0) * MAX_SCORE as f64) as i64;
            Some(Verdict {
                score: score as f64,
                pick: Pick::Default,
            })
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}

/// GPU packing: prefer GPUs already shared, then partly used nodes, then empty nodes.
pub struct GpuPacking {
    ties: TieBreak,
    cache: VerdictCache,
}

impl GpuPacking {
    /// A fresh instance with this tie-breaking rule.
    pub fn new(ties: TieBreak) -> Self {
        Self {
            ties,
            cache: VerdictCache::default(),
        }
    }
}

fn packing_score(c: &NodeClass, d: &Demand) -> i64 {
    let free = c.free_gpus() as i64;
    if free == c.gpus.len() as i64 {
        return (MAX_SCORE / 3 - free).max(free);
    }
    // Walk GPUs from the least free: the ones the default allocator would take.
    let mut need = d.gpu_count;
    let mut fully_free_used = 0i64;
    let mut free_ratio_sum = 0i64;
    for g in c.gpus.iter().rev() {
        if need == 0 {
            break;
        }
        if g.milli >= d.gpu_milli && g.memory_mib >= d.gpu_memory_mib {
            need -= 1;
            free_ratio_sum += i64::from(g.milli) * 100 / i64::from(MILLI);
            if g.milli == MILLI {
                fully_free_used += 1;
            }
        }
    }
    if fully_free_used > 0 {
        return (MAX_SCORE / 2 - fully_free_used).max(MAX_SCORE / 3);
    }
    (MAX_SCORE - free_ratio_sum / 10).max(MAX_SCORE / 2)
}

impl Policy for GpuPacking {
    fn kind(&self) -> PolicyKind {
        PolicyKind::GpuPacking
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        class_verdict(cluster, node, d, &mut self.cache, |_, _, c, d| {
            let score = if d.gpu_count == 0 {
                0
            } else {
                packing_score(c, d)
            };
            Some(Verdict {
                score: score as f64,
                pick: Pick::Default,
            })
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}

/// Best-fit: the node with the least free CPU and GPU left after placing (equal weights).
pub struct BestFit {
    ties: TieBreak,
    cache: VerdictCache,
}

impl BestFit {
    /// A fresh instance with this tie-breaking rule.
    pub fn new(ties: TieBreak) -> Self {
        Self {
            ties,
            cache: VerdictCache::default(),
        }
    }
}

impl Policy for BestFit {
    fn kind(&self) -> PolicyKind {
        PolicyKind::BestFit
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        class_verdict(cluster, node, d, &mut self.cache, |_, _, c, d| {
            let left = f64::from(c.cpu_left - d.cpu_milli) / MAX_SPEC_CPU * 0.5
                + (f64::from(c.gpu_milli_left()) - d.total_milli() as f64) / MAX_SPEC_GPU * 0.5;
            let score = ((1.0 - left) * MAX_SCORE as f64) as i64;
            Some(Verdict {
                score: score as f64,
                pick: Pick::Default,
            })
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}

/// GPU clustering: keep pods of the same GPU shape together, then prefer fuller nodes.
pub struct GpuClustering {
    pub ties: TieBreak,
}

impl Policy for GpuClustering {
    fn kind(&self) -> PolicyKind {
        PolicyKind::GpuClustering
    }

    /// Not memoised per class: the score reads the node's placed pods' tags.
    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        if !cluster.fits(node, d) {
            return None;
        }
        let score = if d.gpu_count == 0 {
            0
        } else {
            let tag = affinity_tag(d);
            let state = cluster.node(node);
            let left = i64::from(cluster.class(state.class).gpu_milli_left());
            let fill = MAX_SCORE / 4 * (MAX_SPEC_GPU as i64 - left) / MAX_SPEC_GPU as i64;
            let same = state.tags.iter().any(|&(t, n)| t == tag && n > 0);
            let tier = match (same, state.tags.len()) {
                (true, 1) => 3,
                (true, _) => 2,
                (false, 0) => 1,
                (false, _) => 0,
            };
            fill + MAX_SCORE / 4 * tier
        };
        Some(Verdict {
            score: score as f64,
            pick: Pick::Default,
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}
