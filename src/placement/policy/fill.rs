//! HAMi's node policies as placement policies: `binpack` prefers the node whose GPUs are
//! fullest once the task is placed and takes its fullest fitting GPUs; `spread` prefers
//! the emptiest node and takes its emptiest GPUs. Fullness is the share of the node's GPU
//! capacity (milli) given out, a real number, so only equal nodes tie. CPU and memory
//! only decide whether the task fits, as in HAMi, where they are the scheduler's concern.

use super::{class_verdict, place_best, Pick, Policy, PolicyKind, TieBreak, Verdict, VerdictCache};
use crate::placement::cluster::{Cluster, NodeClass};
use crate::placement::rng::SplitMix64;
use crate::placement::types::{Demand, Placement, MILLI};

/// `binpack` or `spread`.
pub struct Fill {
    spread: bool,
    ties: TieBreak,
    cache: VerdictCache,
}

impl Fill {
    /// HAMi's `binpack`.
    pub fn binpack(ties: TieBreak) -> Self {
        Self {
            spread: false,
            ties,
            cache: VerdictCache::default(),
        }
    }

    /// HAMi's `spread`.
    pub fn spread(ties: TieBreak) -> Self {
        Self {
            spread: true,
            ..Self::binpack(ties)
        }
    }
}

/// Share of the node's GPU capacity given out once `d` is placed, 0..=1 (0 without GPUs).
fn fullness_after(c: &NodeClass, d: &Demand) -> f64 {
    let capacity = c.gpus.len() as f64 * f64::from(MILLI);
    if capacity == 0.0 {
        return 0.0;
    }
    let used = capacity - f64::from(c.gpu_milli_left()) + d.total_milli() as f64;
    used / capacity
}

impl Policy for Fill {
    fn kind(&self) -> PolicyKind {
        if self.spread {
            PolicyKind::Spread
        } else {
            PolicyKind::Binpack
        }
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        let spread = self.spread;
        class_verdict(cluster, node, d, &mut self.cache, |_, _, c, d| {
            let full = fullness_after(c, d);
            Some(if spread {
                Verdict {
                    score: -full,
                    pick: Pick::Emptiest,
                }
            } else {
                Verdict {
                    score: full,
                    pick: Pick::Fullest,
                }
            })
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}
