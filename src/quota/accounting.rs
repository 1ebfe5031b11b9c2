//! Quota accounting: usage per queue and cohort, and Kueue's fit rule.
//!
//! For one `(flavor, resource)`, queue `c` with nominal `N`, borrowing limit `B` and lending
//! limit `L` keeps `G = N - L` for itself; the rest goes to the cohort pool. What `c` can
//! still take is `min(max(0, G - U) + pool_free, N + B - U)` where `pool_free` is the
//! cohort's lendable quota minus every member's usage above its own `G`. Without lending
//! limits this is Kueue's documented rule: the cohort's unused nominal quota, capped by
//! `nominalQuota + borrowingLimit`. A queue outside any cohort is a cohort of one.

use super::engine::Engine;
use super::model::{CqId, FrId, WlId};

impl Engine {
    pub(crate) fn usage(&self, cq: CqId, fr: FrId) -> i64 {
        self.cqs[cq].usage.get(&fr).copied().unwrap_or(0)
    }

    fn guaranteed(&self, cq: CqId, fr: FrId) -> i64 {
        self.cqs[cq]
            .spec
            .limits
            .get(&fr)
            .map_or(0, |l| l.guaranteed())
    }

    /// Quota `cq` can still use in `fr` without preemption; `None` if it has no quota there.
    pub(crate) fn available(&self, cq: CqId, fr: FrId) -> Option<i64> {
        let l = self.cqs[cq].spec.limits.get(&fr)?;
        let u = self.usage(cq, fr);
        let co = &self.cohorts[self.cqs[cq].cohort];
        let pool_free = co.lendable.get(&fr).copied().unwrap_or(0)
            - co.pool_used.get(&fr).copied().unwrap_or(0);
        let own = (l.guaranteed() - u).max(0) + pool_free;
        let cap = match l.borrowing {
            Some(b) => l.nominal.saturating_add(b) - u,
            None => i64::MAX,
        };
        Some(own.min(cap))
    }

    /// The most `cq` could ever hold in `fr` (everything else in the cohort idle).
    pub(crate) fn max_capacity(&self, cq: CqId, fr: FrId) -> i64 {
        let Some(l) = self.cqs[cq].spec.limits.get(&fr) else {
            return 0;
        };
        let co = &self.cohorts[self.cqs[cq].cohort];
        let pool = l.guaranteed() + co.lendable.get(&fr).copied().unwrap_or(0);
        match l.borrowing {
            Some(b) => pool.min(l.nominal.saturating_add(b)),
            None => pool,
        }
    }

    pub(crate) fn nominal(&self, cq: CqId, fr: FrId) -> i64 {
        self.cqs[cq].spec.limits.get(&fr).map_or(0, |l| l.nominal)
    }

    /// Whether `cq` uses more than its nominal quota in any of `frs`.
    pub(crate) fn borrowing_in(&self, cq: CqId, frs: &[FrId]) -> bool {
        frs.iter()
            .any(|&fr| self.usage(cq, fr) > self.nominal(cq, fr))
    }

    /// Adds `delta` usage of a workload of priority `prio` (no wake-ups).
    pub(crate) fn add_usage(&mut self, cq: CqId, fr: FrId, delta: i64, prio: i32) {
        if delta == 0 {
            return;
        }
        self.usage_total += delta;
        let g = self.guaranteed(cq, fr);
        let co_id = self.cqs[cq].cohort;
        let q = &mut self.cqs[cq];
        let u = q.usage.entry(fr).or_insert(0);
        let before = (*u - g).max(0);
        *u += delta;
        let after = (*u - g).max(0);
        bump(q.by_prio.entry(fr).or_default(), prio, delta);
        let co = &mut self.cohorts[co_id];
        *co.pool_used.entry(fr).or_insert(0) += after - before;
        bump(co.by_prio.entry(fr).or_default(), prio, delta);
        co.version += 1;
    }

    /// Takes a workload's admission usage out of the books (simulation, no wake-ups).
    pub(crate) fn sim_remove(&mut self, id: WlId) {
        self.sim_apply(id, -1);
    }

    /// Puts a workload's admission usage back (undoes [`Engine::sim_remove`]).
    pub(crate) fn sim_restore(&mut self, id: WlId) {
        self.sim_apply(id, 1);
    }

    fn sim_apply(&mut self, id: WlId, sign: i64) {
        let w = &self.wls[id];
        let Some(adm) = &w.admission else { return };
        let (cq, prio) = (adm.cq, w.priority);
        let usage = adm.usage.clone();
        for (fr, v) in usage {
            self.add_usage(cq, fr, sign * v, prio);
        }
    }

    /// Rebuilds a cohort's aggregates from its members (after a queue changed).
    pub(crate) fn recompute_cohort(&mut self, co: usize) {
        let members = self.cohorts[co].members.clone();
        let mut lendable = std::collections::HashMap::new();
        let mut pool_used = std::collections::HashMap::new();
        let mut by_prio: std::collections::HashMap<FrId, std::collections::BTreeMap<i32, i64>> =
            std::collections::HashMap::new();
        for &m in &members {
            let q = &self.cqs[m];
            for (&fr, l) in &q.spec.limits {
                *lendable.entry(fr).or_insert(0) += l.lendable();
            }
            for (&fr, &u) in &q.usage {
                let g = q.spec.limits.get(&fr).map_or(0, |l| l.guaranteed());
                *pool_used.entry(fr).or_insert(0) += (u - g).max(0);
            }
            for (&fr, prios) in &q.by_prio {
                let e = by_prio.entry(fr).or_default();
                for (&p, &v) in prios {
                    bump(e, p, v);
                }
            }
        }
        let c = &mut self.cohorts[co];
        c.lendable = lendable;
        c.pool_used = pool_used;
        c.by_prio = by_prio;
        c.version += 1;
    }

    /// Usage in `fr` held by workloads of `cq` (or, with `cq = None`, the whole cohort
    /// `co`) whose priority satisfies `pred`.
    pub(crate) fn usage_where(
        &self,
        co: usize,
        cq: Option<CqId>,
        fr: FrId,
        pred: impl Fn(i32) -> bool,
    ) -> i64 {
        let map = match cq {
            Some(q) => self.cqs[q].by_prio.get(&fr),
            None => self.cohorts[co].by_prio.get(&fr),
        };
        map.map_or(0, |m| {
            m.iter().filter(|(p, _)| pred(**p)).map(|(_, v)| *v).sum()
        })
    }
}

fn bump(map: &mut std::collections::BTreeMap<i32, i64>, prio: i32, delta: i64) {
    let e = map.entry(prio).or_insert(0);
    *e += delta;
    if *e == 0 {
        map.remove(&prio);
    }
}
