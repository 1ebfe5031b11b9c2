//! Wake-ups of parked workloads, so that a scheduling cycle never pays for workloads
//! that cannot be admitted.
//!
//! When a workload is parked, each `(flavor, resource)` where it was short gets an entry
//! keyed by `released_so_far + deficit` in its cohort's index. The deficit is a lower
//! bound on how much must be released before the workload could fit: its request minus
//! what is available minus an upper bound of what its preemption policy could free.
//! Releases only ever raise availability by at most the released amount, and admissions
//! never help a parked workload, so the workload cannot become admissible before some
//! entry is reached. A release pops the reached entries: O(log n + woken), independent of
//! the number of workloads that stay inadmissible.
//!
//! Queues that cannot preempt use level keys instead, which do not drift: such a
//! workload fits only if the cohort's free lendable quota reaches `request - guaranteed`
//! and its queue's usage drops to `nominal + borrowingLimit - request`; admissions only
//! move both the wrong way. A release pops the keys whose level is reached.
//!
//! One refinement keeps reclaim-capable queues cheap: reclaiming from other queues is
//! only possible when the workload fits within its own queue's nominal quota, so while
//! it does not, cross-queue usage is left out of the bound and a second entry waits on
//! the workload's own queue releasing the excess (less what preemption within that
//! queue can free). An eviction with a grace period frees nothing yet but removes a
//! preemption candidate, which can help a reclaimer (the target heuristics are not
//! monotone): it wakes the cohort's reclaimers.

use super::api::{BorrowWithinCohortPolicy, ReclaimPolicy, StopPolicy, WithinClusterQueuePolicy};
use super::engine::{Engine, Requeue, WakeIndex};
use super::model::{CqId, FrId, WlId};
use super::quantity::Time;
use std::collections::BTreeMap;

impl Engine {
    pub(crate) fn register_wake_keys(
        &mut self,
        id: WlId,
        cq: CqId,
        gen: u64,
        shortfalls: &[(FrId, i64, i64)],
    ) {
        // Smallest deficit per fr over the considered flavors.
        let mut per_fr: BTreeMap<FrId, (i64, i64)> = BTreeMap::new();
        for &(fr, val, avail) in shortfalls {
            let e = per_fr.entry(fr).or_insert((val, avail));
            if val - avail < e.0 - e.1 {
                *e = (val, avail);
            }
        }
        let co = self.cqs[cq].cohort;
        if !self.cqs[cq].spec.can_preempt() {
            self.register_level_keys(id, cq, gen, &per_fr);
            return;
        }
        let pw = self.wls[id].priority;
        let pre = self.cqs[cq].spec.preemption.clone();
        for (fr, (val, avail)) in per_fr {
            let same = match pre.within_cluster_queue {
                WithinClusterQueuePolicy::Never => 0,
                WithinClusterQueuePolicy::LowerPriority => {
                    self.usage_where(co, Some(cq), fr, |p| p < pw)
                }
                WithinClusterQueuePolicy::LowerOrNewerEqualPriority => {
                    self.usage_where(co, Some(cq), fr, |p| p <= pw)
                }
            };
            let bwc = pre
                .borrow_within_cohort
                .as_ref()
                .is_some_and(|b| b.policy == BorrowWithinCohortPolicy::LowerPriority);
            let others = |pred: &dyn Fn(i32) -> bool| {
                self.usage_where(co, None, fr, pred) - self.usage_where(co, Some(cq), fr, pred)
            };
            // Reclaim needs the request within nominal once the victims in its own
            // queue (at most `same`) are gone, not with them still there.
            let excess = self.usage(cq, fr) - same + val - self.nominal(cq, fr);
            let within_nominal = excess <= 0;
            let mut cross = 0;
            if bwc {
                cross = cross.max(others(&|p| p < pw));
            }
            let mut local = None;
            match pre.reclaim_within_cohort {
                ReclaimPolicy::Never => {}
                _ if !within_nominal => {
                    local = Some(excess);
                }
                ReclaimPolicy::LowerPriority => cross = cross.max(others(&|p| p < pw)),
                ReclaimPolicy::Any => cross = cross.max(others(&|_| true)),
            }
            let deficit = (val - avail - same - cross).max(1);
            let seq = self.next_seq();
            let threshold = self.cohorts[co].released.get(&fr).copied().unwrap_or(0) + deficit;
            self.cohorts[co]
                .wake
                .entry(fr)
                .or_default()
                .insert((threshold, seq), (id, gen));
            if pre.reclaim_within_cohort != ReclaimPolicy::Never || bwc {
                self.cohorts[co]
                    .reclaimers
                    .entry(fr)
                    .or_default()
                    .insert((0, seq), (id, gen));
            }
            if let Some(d) = local {
                let t = self.cqs[cq].released.get(&fr).copied().unwrap_or(0) + d.max(1);
                self.cqs[cq]
                    .wake
                    .entry(fr)
                    .or_default()
                    .insert((t, seq), (id, gen));
            }
        }
    }

    fn register_level_keys(
        &mut self,
        id: WlId,
        cq: CqId,
        gen: u64,
        per_fr: &BTreeMap<FrId, (i64, i64)>,
    ) {
        let co = self.cqs[cq].cohort;
        let mut any = false;
        for (&fr, &(val, _)) in per_fr {
            let Some(l) = self.cqs[cq].spec.limits.get(&fr).copied() else {
                continue;
            };
            let u = self.usage(cq, fr);
            let g = l.guaranteed();
            let free = self.pool_free(co, fr);
            let seq = self.next_seq();
            if let Some(b) = l.borrowing {
                let cap = l.nominal + b - val;
                if u > cap && cap >= 0 {
                    self.cqs[cq]
                        .wake_usage
                        .entry(fr)
                        .or_default()
                        .insert((-cap, seq), (id, gen));
                    any = true;
                }
            }
            if (g - u).max(0) + free < val {
                // What the queue can take without borrowing limits is its unused
                // guarantee plus the pool's free quota, at most `g + free`: the pool
                // must reach `val - g` (for `g = 0` that is more than it has now).
                self.cohorts[co]
                    .wake_free
                    .entry(fr)
                    .or_default()
                    .insert((val - g, seq), (id, gen));
                any = true;
            }
        }
        if !any {
            // Failed for a reason the levels do not capture: wake on any release.
            for &fr in per_fr.keys() {
                let seq = self.next_seq();
                let t = self.cohorts[co].released.get(&fr).copied().unwrap_or(0) + 1;
                self.cohorts[co]
                    .wake
                    .entry(fr)
                    .or_default()
                    .insert((t, seq), (id, gen));
            }
        }
    }

    /// After an admission in `cq`: where it now borrows, its workloads are new reclaim
    /// candidates, and removing one can free more than the admission took.
    pub(crate) fn wake_reclaimers(&mut self, cq: CqId, frs: &[FrId]) {
        for &fr in frs {
            if self.usage(cq, fr) <= self.nominal(cq, fr) {
                continue;
            }
            self.wake_reclaimers_of(cq, fr);
        }
    }

    /// An admitted workload of `cq` holding `frs` was evicted with a grace period: it
    /// stops being a preemption candidate while its quota stays booked, so no release
    /// wakes anyone. The target heuristics are not monotone (taking it first could stop
    /// its queue from borrowing and rule out a victim that suffices), so a parked
    /// reclaimer may find victims now: wake the reclaimers of its resources while its
    /// queue borrows, and let cached decisions of the cohort go stale.
    pub(crate) fn candidate_gone(&mut self, cq: CqId, frs: &[FrId], now: Time) {
        let co = self.cqs[cq].cohort;
        self.cohorts[co].version += 1;
        if self.cfg.requeue == Requeue::FullRescan {
            self.wake_cohort_all(co, now);
            return;
        }
        let q = &self.cqs[cq];
        let borrows = q.usage.iter().any(|(&fr, &u)| u > self.nominal(cq, fr));
        if !borrows {
            return;
        }
        for &fr in frs {
            self.wake_reclaimers_of(cq, fr);
        }
    }

    /// Wakes the parked reclaimers of `fr` outside `cq` (only another queue's
    /// workloads can be their cross-queue victims); those of `cq` keep their entries.
    fn wake_reclaimers_of(&mut self, cq: CqId, fr: FrId) {
        let co = self.cqs[cq].cohort;
        let Some(map) = self.cohorts[co].reclaimers.remove(&fr) else {
            return;
        };
        let mut keep = BTreeMap::new();
        for (k, (id, gen)) in map {
            if self.wls[id].gen != gen {
                continue;
            }
            if self.wls[id].cq == Some(cq) {
                keep.insert(k, (id, gen));
            } else {
                self.wake(id);
            }
        }
        if !keep.is_empty() {
            self.cohorts[co]
                .reclaimers
                .entry(fr)
                .or_default()
                .extend(keep);
        }
    }

    pub(crate) fn pool_free(&self, co: usize, fr: FrId) -> i64 {
        let c = &self.cohorts[co];
        c.lendable.get(&fr).copied().unwrap_or(0) - c.pool_used.get(&fr).copied().unwrap_or(0)
    }

    /// Releases `amount` of `fr` held by a workload of priority `prio` in `cq`, and wakes
    /// the parked workloads this could help.
    pub(crate) fn release(&mut self, cq: CqId, fr: FrId, amount: i64, prio: i32, now: Time) {
        self.add_usage(cq, fr, -amount, prio);
        let co = self.cqs[cq].cohort;
        if self.cfg.requeue == Requeue::FullRescan {
            self.wake_cohort_all(co, now);
            return;
        }
        let total = {
            let r = self.cohorts[co].released.entry(fr).or_insert(0);
            *r += amount;
            *r
        };
        let local = {
            let r = self.cqs[cq].released.entry(fr).or_insert(0);
            *r += amount;
            *r
        };
        let free = self.pool_free(co, fr);
        let usage = self.usage(cq, fr);
        let mut woken = pop_reached(&mut self.cohorts[co].wake, fr, total);
        woken.extend(pop_reached(&mut self.cqs[cq].wake, fr, local));
        woken.extend(pop_reached(&mut self.cohorts[co].wake_free, fr, free));
        woken.extend(pop_reached(&mut self.cqs[cq].wake_usage, fr, -usage));
        for (id, gen) in woken {
            if self.wls[id].gen == gen {
                self.wake(id);
            }
        }
    }

    /// Puts a parked workload's class back in its queue: the first member of the
    /// class by queue order (identical workloads decide alike), or unblocks a
    /// StrictFIFO queue.
    pub(crate) fn wake(&mut self, id: WlId) {
        let w = &self.wls[id];
        if w.state != super::engine::WlState::Pending {
            return;
        }
        let Some(cq) = w.cq else { return };
        let key = w.order_key(id);
        if self.cqs[cq].parked.contains(&key) {
            self.wls[id].gen += 1;
            let shape = self.shape_in(id, cq);
            self.release_class_head(cq, shape, key);
            return;
        }
        let q = &mut self.cqs[cq];
        if q.blocked == Some(key) {
            q.blocked = None;
            if q.spec.stop == StopPolicy::None {
                self.ready.insert(cq);
            }
            self.wls[id].gen += 1;
            self.stats.wakes += 1;
            self.queued_again(id);
        }
    }

    /// Disarms a class and moves its first member (or `fallback`) to the queue.
    pub(crate) fn release_class_head(
        &mut self,
        cq: CqId,
        shape: u64,
        fallback: super::engine::OrderKey,
    ) {
        let q = &mut self.cqs[cq];
        let first = match q.classes.get_mut(&shape) {
            Some(class) => {
                class.armed = false;
                let first = class.members.pop_first().unwrap_or(fallback);
                if class.members.is_empty() {
                    q.classes.remove(&shape);
                }
                first
            }
            None => fallback,
        };
        if self.unpark(cq, first) && self.cqs[cq].spec.stop == StopPolicy::None {
            self.ready.insert(cq);
        }
    }

    /// A parked workload leaves (finished, deleted): the class hands its wake-up duty
    /// to its next member.
    pub(crate) fn leave_class(&mut self, id: WlId, cq: CqId, key: super::engine::OrderKey) {
        let shape = self.shape_in(id, cq);
        let q = &mut self.cqs[cq];
        let Some(class) = q.classes.get_mut(&shape) else {
            return;
        };
        if !class.members.remove(&key) {
            return;
        }
        if class.members.is_empty() {
            q.classes.remove(&shape);
        } else if let Some(next) = class.members.first().cloned() {
            self.release_class_head(cq, shape, next);
        }
    }

    /// After an admission from `cq`: identical parked workloads may fit too.
    pub(crate) fn chain_class(&mut self, id: WlId, cq: CqId) {
        let shape = self.shape_in(id, cq);
        let Some(class) = self.cqs[cq].classes.get(&shape) else {
            return;
        };
        if class.armed {
            return;
        }
        if let Some(first) = class.members.first().cloned() {
            self.release_class_head(cq, shape, first);
        }
    }

    /// Puts every parked workload of a cohort back in its queue (configuration changes,
    /// and the naive baseline on every release).
    pub(crate) fn wake_cohort_all(&mut self, co: usize, _now: Time) {
        let members = self.cohorts[co].members.clone();
        self.cohorts[co].wake.clear();
        self.cohorts[co].wake_free.clear();
        self.cohorts[co].reclaimers.clear();
        for m in members {
            self.wake_queue_all(m);
        }
    }

    /// Puts every parked workload of queue `m` back in it (and unblocks a StrictFIFO
    /// head). Entries of its workloads left in the cohort's indexes go stale (their
    /// generation moved on).
    fn wake_queue_all(&mut self, m: CqId) {
        let q = &mut self.cqs[m];
        q.wake.clear();
        q.wake_usage.clear();
        q.classes.clear();
        // Most queues of a cohort have nothing parked: no set is taken (or made) for them.
        if !q.parked.is_empty() {
            let parked = q.parked.take();
            self.stats.wakes += parked.len() as u64;
            for key in parked.iter() {
                self.wls[key.3].gen += 1;
            }
            self.cqs[m].pending.append(parked);
        }
        self.unblock(m);
    }

    /// Makes queue `m` ready if it has pending workloads, and puts its blocked
    /// StrictFIFO head back.
    fn unblock(&mut self, m: CqId) {
        let q = &mut self.cqs[m];
        if !q.pending.is_empty() && q.spec.stop == StopPolicy::None {
            self.ready.insert(m);
        }
        if let Some(b) = q.blocked.take() {
            self.wls[b.3].gen += 1;
            self.queued_again(b.3);
        }
    }

    /// Puts parked workloads of cohort `co` back in their queues so that the next
    /// schedule decides their reasons against the books as they are now. Where a parked
    /// reason cannot change with the books, only the first `front` of each queue are
    /// (their messages name the quota free now; see [`Engine::reasons_may_follow_books`]);
    /// elsewhere all of them. Used by a caller that must report what a fresh engine
    /// would (the controller): the scheduling semantics are the wake index's.
    pub(crate) fn wake_cohort_reasons(&mut self, co: usize, front: usize, now: Time) {
        let members = self.cohorts[co].members.clone();
        if members.iter().any(|&m| self.cqs[m].spec.can_preempt()) {
            self.wake_cohort_all(co, now);
            return;
        }
        for m in members {
            if self.reasons_may_follow_books(m) {
                self.wake_queue_all(m);
                continue;
            }
            self.wake_front(m, front);
            self.unblock(m);
        }
    }

    /// Puts the first `front` parked workloads of queue `m` back in it.
    fn wake_front(&mut self, m: CqId, front: usize) {
        let keys: Vec<super::engine::OrderKey> =
            self.cqs[m].parked.iter().take(front).cloned().collect();
        for key in keys {
            let shape = self.shape_in(key.3, m);
            let q = &mut self.cqs[m];
            // The class's wake-up may have been armed by this member: the class
            // waits disarmed until a member parks again (this one, re-decided now).
            if let Some(class) = q.classes.get_mut(&shape) {
                class.members.remove(&key);
                class.armed = false;
                if class.members.is_empty() {
                    q.classes.remove(&shape);
                }
            }
            self.unpark(m, key);
        }
    }

    /// Moves parked `key` back to queue `m`'s pending set (a new generation, so its
    /// wake-up entries go stale); whether it was parked.
    fn unpark(&mut self, m: CqId, key: super::engine::OrderKey) -> bool {
        if !self.cqs[m].parked.remove(&key) {
            return false;
        }
        self.wls[key.3].gen += 1;
        self.stats.wakes += 1;
        self.cqs[m].pending.insert(key);
        true
    }

    /// After ClusterQueue specs of cohort `co` changed: see
    /// [`Engine::update_cluster_queue`]. `preempted_before`: the changed queue could
    /// preempt under its old spec (its classes were formed under other shapes).
    pub(crate) fn wake_cohort_spec(&mut self, co: usize, preempted_before: bool, now: Time) {
        let members = self.cohorts[co].members.clone();
        if preempted_before
            || self.cfg.positions != super::events::Positions::Ranged
            || members.iter().any(|&m| self.cqs[m].spec.can_preempt())
        {
            self.wake_cohort_all(co, now);
            return;
        }
        let front = super::events::exact_places();
        for m in members {
            if self.reasons_may_follow_books(m) {
                self.wake_queue_all(m);
                continue;
            }
            self.wake_front(m, front);
            // Each class's first member is re-decided (the class disarmed: it arms
            // again, under the new limits, when that member parks); the rest follow it.
            let classes: Vec<(u64, super::engine::OrderKey)> = self.cqs[m]
                .classes
                .iter()
                .filter_map(|(&shape, c)| Some((shape, c.members.first()?.clone())))
                .collect();
            for (shape, first) in classes {
                let before = told(&self.wls[first.3].reason);
                self.release_class_head(m, shape, first);
                self.spec_probes.push((m, shape, before));
            }
            self.unblock(m);
        }
    }

    /// Once a schedule settles after [`Engine::wake_cohort_spec`]: a probed class whose
    /// first parked member would now be told otherwise (another reason, or another
    /// message at a place written as a range) is woken whole. Whether any was.
    pub(crate) fn settle_spec_probes(&mut self, now: Time) -> bool {
        let probes = std::mem::take(&mut self.spec_probes);
        let mut woke = false;
        for (m, shape, before) in probes {
            let Some(first) = self.cqs[m]
                .classes
                .get(&shape)
                .and_then(|c| c.members.first().cloned())
            else {
                continue;
            };
            let same = match self.evaluate(first.3, now) {
                super::decide::Decision::Fail { reason, .. } => told(&reason) == before,
                _ => false,
            };
            if same {
                continue;
            }
            let Some(class) = self.cqs[m].classes.remove(&shape) else {
                continue;
            };
            for key in class.members {
                self.unpark(m, key);
            }
            self.unblock(m);
            woke = true;
        }
        woke
    }

    /// Whether a parked workload of queue `m` (which cannot preempt) may hold a reason
    /// that the books alone change. Without preemption a parked workload cannot fit
    /// until the wake index says so, and what its reason says apart from the quota free
    /// (which flavor-fit failure, exceeding the queue's maximum or not, the request in
    /// every flavor tried) follows from its request and the queue alone — when it is one
    /// pod set, within one resource group, admitted whole. With several pod sets or
    /// groups, which one fails first depends on the others' fit, and with partial
    /// admission which count was tried last: such a queue is re-decided whole.
    fn reasons_may_follow_books(&self, m: CqId) -> bool {
        let q = &self.cqs[m];
        let members: usize = q.classes.values().map(|c| c.members.len()).sum();
        if members != q.parked.len() {
            return true;
        }
        let covers_pods = q.spec.group_of(super::model::PODS).is_some();
        q.classes.values().any(|c| {
            let Some(first) = c.members.first() else {
                return false;
            };
            let info = &self.wls[first.3].info;
            let [ps] = info.pod_sets.as_slice() else {
                return true;
            };
            if ps.min_count.is_some_and(|min| min < ps.count) {
                return true;
            }
            let mut groups = ps
                .requests
                .iter()
                .filter(|(_, v)| v.0 > 0)
                .map(|(r, _)| q.spec.group_of(r));
            let first_group = groups.next().flatten();
            let mut other = groups.any(|g| g != first_group);
            if covers_pods && !ps.requests.contains_key(super::model::PODS) {
                other |= q.spec.group_of(super::model::PODS) != first_group;
            }
            other
        })
    }

    /// Re-evaluates everything (a flavor or namespace changed).
    pub(crate) fn wake_everything(&mut self, now: Time) {
        for co in 0..self.cohorts.len() {
            self.wake_cohort_all(co, now);
        }
    }
}

fn pop_reached(index: &mut WakeIndex, fr: FrId, reached: i64) -> Vec<(WlId, u64)> {
    let Some(map) = index.get_mut(&fr) else {
        return Vec::new();
    };
    let rest = map.split_off(&(reached + 1, 0));
    let hit = std::mem::replace(map, rest);
    hit.into_values().collect()
}

/// What a parked workload's reason tells at a place written as a range: what the
/// members of a class behind the exact places show.
pub(crate) fn told(r: &super::events::PendingReason) -> (&'static str, String) {
    let far = Some(super::events::exact_places() + 1);
    (
        r.code(),
        r.message_as(far, super::events::Positions::Ranged),
    )
}
