//! FGD (Fragmentation Gradient Descent, ATC'23): place each task where it increases the
//! node's expected fragmentation (measured against the target workload) the least.
//!
//! As in the paper's scheduler plugin, the fragmentation decrease Δ (in milli) becomes the
//! integer score `⌊sigmoid(Δ / 1000) · 100⌋`; equal scores tie and are broken at random.
//! For a GPU-sharing task every fitting GPU is tried and the best one is taken; other tasks
//! take GPUs the default way.

use super::{
    after_default, after_value, candidate_values, class_verdict, place_best, ClassMemo, Pick,
    Policy, PolicyKind, TieBreak, Verdict, VerdictCache,
};
use crate::placement::cluster::{Cluster, NodeClass};
use crate::placement::frag::{frag_milli, Workload};
use crate::placement::rng::SplitMix64;
use crate::placement::types::{Demand, Placement};

/// The FGD policy.
pub struct Fgd {
    workload: Workload,
    ties: TieBreak,
    cache: VerdictCache,
    frag: ClassMemo,
}

impl Fgd {
    /// FGD against this target workload.
    pub fn new(workload: Workload, ties: TieBreak) -> Self {
        Self {
            workload,
            ties,
            cache: VerdictCache::default(),
            frag: ClassMemo::default(),
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn score(before: f64, after: f64) -> f64 {
    ((sigmoid((before - after) / 1000.0) * 100.0) as i64) as f64
}

/// FGD's verdict for one node class whose current fragmentation is `before`.
fn fgd_verdict(c: &NodeClass, d: &Demand, w: &Workload, before: f64) -> Verdict {
    let cpu_after = c.cpu_left - d.cpu_milli;
    if d.is_shared() {
        let mut best: Option<Verdict> = None;
        for v in candidate_values(c, d) {
            let after = frag_milli(c.model, cpu_after, &after_value(c, d, v), w);
            let s = score(before, after);
            if best.is_none_or(|b| s > b.score) {
                best = Some(Verdict {
                    score: s,
                    pick: Pick::Value(v),
                });
            }
        }
        // `fits` was checked by the caller, so there is at least one candidate.
        best.unwrap_or(Verdict {
            score: 0.0,
            pick: Pick::Default,
        })
    } else {
        let after = frag_milli(c.model, cpu_after, &after_default(c, d), w);
        Verdict {
            score: score(before, after),
            pick: Pick::Default,
        }
    }
}

impl Policy for Fgd {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fgd
    }

    fn verdict(&mut self, cluster: &Cluster, node: usize, d: &Demand) -> Option<Verdict> {
        let w = &self.workload;
        let memo = &mut self.frag;
        class_verdict(cluster, node, d, &mut self.cache, |_, cid, c, d| {
            let before = memo.get_or(cid, || frag_milli(c.model, c.cpu_left, &c.gpus, w));
            Some(fgd_verdict(c, d, w, before))
        })
    }

    fn place(&mut self, cluster: &Cluster, d: &Demand, rng: &mut SplitMix64) -> Option<Placement> {
        let ties = self.ties;
        place_best(cluster, d, rng, ties, |i| self.verdict(cluster, i, d))
    }
}
