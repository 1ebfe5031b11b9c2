//! Tessera's placement policy.
//!
//! Starts from FGD's idea (place where the expected fragmentation against the target
//! workload grows least) and fixes what loses capacity in practice:
//! - the exact fragmentation increase is used, not a coarse integer score, so near-ties
//!   are not broken at random;
//! - remaining ties go to the node and GPU that leave the least free capacity (packing),
//!   which keeps empty GPUs and nodes whole for later multi-GPU tasks.

use super::{
    after_default, after_value, candidate_values, place_by_class, Pick, Policy, PolicyKind,
    Verdict, VerdictCache,
};
use crate::placement::cluster::{Cluster, NodeClass};
use crate::placement::frag::{frag_milli, Workload};
use crate::placement::rng::SplitMix64;
use crate::placement::types::{Demand, GpuFree, Placement};

/// Tessera's policy.
pub struct Tessera {
    workload: Workload,
    cache: VerdictCache,
}

impl Tessera {
    /// Tessera's policy against this target workload.
    pub fn new(workload: Workload) -> Self {
        Self {
            workload,
            cache: VerdictCache::default(),
        }
    }
}

/// Weight of the packing tie-break per milli of free GPU left on the node.
const PACK_WEIGHT: f64 = 1e-3;

fn value(before: f64, after: f64, gpus_after: &[GpuFree]) -> f64 {
    let left: u32 = gpus_after.iter().map(|g| u32::from(g.milli)).sum();
    (before - after) - PACK_WEIGHT * f64::from(left)
}

fn verdict(c: &NodeClass, d: &Demand, w: &Workload) -> Verdict {
    let before = frag_milli(c.model, c.cpu_left, &c.gpus, w);
    let cpu_after = c.cpu_left - d.cpu_milli;
    if d.is_shared() {
        let mut best: Option<Verdict> = None;
        for v in candidate_values(c, d) {
            let gpus = after_value(c, d, v);
            let s = value(before, frag_milli(c.model, cpu_after, &gpus, w), &gpus);
            if best.is_none_or(|b| s > b.score) {
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
        let gpus = after_default(c, d);
        Verdict {
            score: value(before, frag_milli(c.model, cpu_after, &gpus, w), &gpus),
            pick: Pick::Default,
        }
    }
}

impl Policy for Tessera {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Tessera
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let w = &self.workload;
        place_by_class(cluster, d, rng, &mut self.cache, |c, d| {
            Some(verdict(c, d, w))
        })
    }
}
