//! Victim selection: Kueue's classic preemption (candidates, ordering, the four target
//! heuristics and the minimal-set fill-back), made checkpoint-aware and gated by a
//! per-queue minimum runtime.
//!
//! Candidates come from the preemptor's queue (`withinClusterQueue`) and from queues of
//! the cohort that borrow (`reclaimWithinCohort`, `borrowWithinCohort`). They are tried
//! in two orders: Kueue's (borrowing queues first, lowest priority, most recently
//! admitted) and a checkpoint-aware one (borrowing queues first, lowest priority, least
//! expected rework). Each gives a minimal set; the set losing the least work wins
//! (ties: fewer victims, then Kueue's). Whether preemption is possible at all is
//! decided by Kueue's order alone, so it never depends on the clock. Victims younger
//! than their queue's `minimumRuntime` are never taken; if only they could make room,
//! the preemptor waits until the first protection end after which victims exist.
//! A workload admitted by preempting others cannot itself be a victim in the same
//! instant, so one scheduling pass never preempts in a cycle.

use super::api::{BorrowWithinCohortPolicy, ReclaimPolicy, WithinClusterQueuePolicy};
use super::engine::Engine;
use super::model::{CqId, FrId, WlId};
use super::quantity::Time;
use std::cmp::Reverse;

#[derive(Clone, Debug)]
struct Cand {
    wl: WlId,
    cq: CqId,
    prio: i32,
    other: bool,
    rework: Time,
    admitted_at: Time,
    protected_until: Option<Time>,
    reclaim_ok: bool,
    bwc_ok: bool,
}

/// Result of a victim search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Victims {
    Found {
        victims: Vec<WlId>,
        rework: Time,
    },
    /// Only victims protected by a minimum runtime could make room; retry at `until`.
    Gated {
        until: Time,
    },
    None,
}

impl Engine {
    /// Work a workload would lose if evicted at `now`: time since its last checkpoint in
    /// this run (`tessera.io/last-checkpoint`, else `tessera.io/checkpoint-interval`,
    /// else the whole run).
    pub(crate) fn rework(&self, id: WlId, now: Time) -> Time {
        let w = &self.wls[id];
        let Some(adm) = &w.admission else { return 0 };
        let run = now.saturating_sub(adm.at);
        if let Some(lc) = w.info.last_checkpoint {
            if lc >= adm.at && lc <= now {
                return now - lc;
            }
        }
        match w.info.checkpoint_interval {
            Some(i) if i > 0 => run % i,
            _ => run,
        }
    }

    /// Whether `usage` fits `cq` now; without `allow_borrow` it must stay within nominal.
    pub(crate) fn fits(&self, cq: CqId, usage: &[(FrId, i64)], allow_borrow: bool) -> bool {
        usage.iter().all(|&(fr, v)| {
            self.available(cq, fr).is_some_and(|a| v <= a)
                && (allow_borrow || self.usage(cq, fr) + v <= self.nominal(cq, fr))
        })
    }

    /// Finds a minimal set of victims that lets `usage` of workload `id` fit in `cq`.
    pub(crate) fn find_victims(
        &mut self,
        id: WlId,
        cq: CqId,
        usage: &[(FrId, i64)],
        now: Time,
    ) -> Victims {
        let needed: Vec<FrId> = usage
            .iter()
            .filter(|&&(fr, v)| self.available(cq, fr).is_none_or(|a| v > a))
            .map(|&(fr, _)| fr)
            .collect();
        if needed.is_empty() {
            return Victims::Found {
                victims: Vec::new(),
                rework: 0,
            };
        }
        let co = self.cqs[cq].cohort;
        let version = self.cohorts[co].version;
        if let Some((w, u, t, v, r)) = &self.victim_memo {
            if (*w, *t, *v) == (id, now, version) && u.as_slice() == usage {
                return r.clone();
            }
        }
        let cands = self.candidates(id, cq, &needed, now);
        let free: Vec<Cand> = cands
            .iter()
            .filter(|c| c.protected_until.is_none())
            .cloned()
            .collect();
        let result = match self.best_targets(cq, usage, &needed, free) {
            Some((victims, rework)) => Victims::Found { victims, rework },
            None => self.gated_until(cq, usage, &needed, &cands),
        };
        self.cohorts[co].version = version;
        self.victim_memo = Some((id, usage.to_vec(), now, version, result.clone()));
        result
    }

    /// When only protected candidates could make room: the first instant a protection
    /// ends after which victims exist among the candidates free by then. Each instant is
    /// tried in turn, not only "all candidates": the target heuristics are not monotone
    /// (taking a protected victim first can stop its queue from borrowing and rule out
    /// the one victim that suffices), so "no set with every candidate" does not mean
    /// "no set later".
    fn gated_until(
        &mut self,
        cq: CqId,
        usage: &[(FrId, i64)],
        needed: &[FrId],
        cands: &[Cand],
    ) -> Victims {
        let mut times: Vec<Time> = cands.iter().filter_map(|c| c.protected_until).collect();
        times.sort_unstable();
        times.dedup();
        for until in times {
            let free_then: Vec<Cand> = cands
                .iter()
                .filter(|c| c.protected_until.is_none_or(|t| t <= until))
                .cloned()
                .collect();
            if self.best_targets(cq, usage, needed, free_then).is_some() {
                return Victims::Gated { until };
            }
        }
        Victims::None
    }

    fn candidates(&self, id: WlId, cq: CqId, needed: &[FrId], now: Time) -> Vec<Cand> {
        let w = &self.wls[id];
        // "Newer" is by queue-order timestamp, as in Kueue (`GetQueueOrderTimestamp`): a
        // workload requeued after a pods-ready timeout is ordered, and compared, by its
        // eviction time. Comparing creation times instead lets the workload the queue puts
        // first be preempted at once by the one behind it, forever.
        let (pw, queued) = (w.priority, w.order_ts);
        let pre = &self.cqs[cq].spec.preemption;
        let co = self.cqs[cq].cohort;
        let mut out = Vec::new();
        for &m in &self.cohorts[co].members {
            for &x in &self.cqs[m].admitted {
                let xw = &self.wls[x];
                let Some(adm) = &xw.admission else { continue };
                if w.preempted_by == Some(x) {
                    continue;
                }
                if !adm.usage.iter().any(|(fr, _)| needed.contains(fr)) {
                    continue;
                }
                let px = xw.priority;
                let (other, reclaim_ok, bwc_ok) = if m == cq {
                    let ok = match pre.within_cluster_queue {
                        WithinClusterQueuePolicy::Never => false,
                        WithinClusterQueuePolicy::LowerPriority => px < pw,
                        WithinClusterQueuePolicy::LowerOrNewerEqualPriority => {
                            px < pw || (px == pw && xw.order_ts > queued)
                        }
                    };
                    if !ok {
                        continue;
                    }
                    (false, false, false)
                } else {
                    let reclaim_ok = match pre.reclaim_within_cohort {
                        ReclaimPolicy::Never => false,
                        ReclaimPolicy::LowerPriority => px < pw,
                        ReclaimPolicy::Any => true,
                    };
                    let bwc_ok = pre.borrow_within_cohort.as_ref().is_some_and(|b| {
                        b.policy == BorrowWithinCohortPolicy::LowerPriority
                            && px < pw
                            && b.max_priority_threshold.is_none_or(|t| px <= t)
                    });
                    if !reclaim_ok && !bwc_ok {
                        continue;
                    }
                    (true, reclaim_ok, bwc_ok)
                };
                let min_rt = self.cqs[m].spec.min_runtime;
                let mut until = adm.at.saturating_add(min_rt);
                if xw.preempted_in_at == Some(now) {
                    until = until.max(now.saturating_add(1));
                }
                out.push(Cand {
                    wl: x,
                    cq: m,
                    prio: px,
                    other,
                    rework: self.rework(x, now),
                    admitted_at: adm.at,
                    protected_until: (now < until).then_some(until),
                    reclaim_ok,
                    bwc_ok,
                });
            }
        }
        out
    }

    /// Runs both candidate orders and keeps the set that loses the least work.
    fn best_targets(
        &mut self,
        cq: CqId,
        usage: &[(FrId, i64)],
        needed: &[FrId],
        mut cands: Vec<Cand>,
    ) -> Option<(Vec<WlId>, Time)> {
        if cands.is_empty() {
            return None;
        }
        cands.sort_by_key(|c| (!c.other, c.prio, Reverse(c.admitted_at), c.wl));
        let kueue = self.targets(cq, usage, needed, &cands);
        cands.sort_by_key(|c| (!c.other, c.prio, c.rework, Reverse(c.admitted_at), c.wl));
        let aware = self.targets(cq, usage, needed, &cands);
        let cost = |set: &Vec<WlId>| -> (Time, usize) {
            let rework = set
                .iter()
                .filter_map(|v| cands.iter().find(|c| c.wl == *v))
                .map(|c| c.rework)
                .sum();
            (rework, set.len())
        };
        // Whether preemption is possible is Kueue's answer (it does not depend on the
        // clock); the checkpoint-aware order only picks a cheaper set when both exist.
        let best = match (kueue, aware) {
            (Some(k), Some(a)) if cost(&a) < cost(&k) => a,
            (Some(k), _) => k,
            (None, _) => return None,
        };
        let rework = cost(&best).0;
        Some((best, rework))
    }

    /// Kueue's classic target heuristics over ordered candidates.
    fn targets(
        &mut self,
        cq: CqId,
        usage: &[(FrId, i64)],
        needed: &[FrId],
        cands: &[Cand],
    ) -> Option<Vec<WlId>> {
        let all: Vec<&Cand> = cands.iter().collect();
        if all.iter().all(|c| !c.other) {
            return self.greedy(cq, usage, needed, &all, true);
        }
        let bwc = self.cqs[cq]
            .spec
            .preemption
            .borrow_within_cohort
            .as_ref()
            .is_some_and(|b| b.policy != BorrowWithinCohortPolicy::Never);
        if bwc {
            let set: Vec<&Cand> = all
                .iter()
                .copied()
                .filter(|c| !c.other || c.bwc_ok)
                .collect();
            if let Some(t) = self.greedy(cq, usage, needed, &set, true) {
                return Some(t);
            }
        }
        let under_nominal = needed
            .iter()
            .all(|&fr| self.usage(cq, fr) < self.nominal(cq, fr));
        if under_nominal {
            let set: Vec<&Cand> = all
                .iter()
                .copied()
                .filter(|c| !c.other || c.reclaim_ok)
                .collect();
            if let Some(t) = self.greedy(cq, usage, needed, &set, false) {
                return Some(t);
            }
        }
        let same: Vec<&Cand> = all.iter().copied().filter(|c| !c.other).collect();
        self.greedy(cq, usage, needed, &same, true)
    }

    /// Takes candidates in order until the preemptor fits, then gives back every victim
    /// that turns out not to be needed (reverse order). Leaves the books unchanged.
    fn greedy(
        &mut self,
        cq: CqId,
        usage: &[(FrId, i64)],
        needed: &[FrId],
        cands: &[&Cand],
        allow_borrow: bool,
    ) -> Option<Vec<WlId>> {
        let mut removed: Vec<WlId> = Vec::new();
        for c in cands {
            if c.other && !self.borrowing_in(c.cq, needed) {
                continue;
            }
            self.sim_remove(c.wl);
            removed.push(c.wl);
            if self.fits(cq, usage, allow_borrow) {
                let mut keep = vec![true; removed.len()];
                for j in (0..removed.len() - 1).rev() {
                    self.sim_restore(removed[j]);
                    if self.fits(cq, usage, allow_borrow) {
                        keep[j] = false;
                    } else {
                        self.sim_remove(removed[j]);
                    }
                }
                let victims: Vec<WlId> = removed
                    .iter()
                    .zip(&keep)
                    .filter(|(_, k)| **k)
                    .map(|(v, _)| *v)
                    .collect();
                for &v in &victims {
                    self.sim_restore(v);
                }
                return Some(victims);
            }
        }
        for &v in removed.iter().rev() {
            self.sim_restore(v);
        }
        None
    }
}
