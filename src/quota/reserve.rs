//! Quota reserved for a preemptor while its victims terminate.
//!
//! A preemptor whose victims have a grace period waits for them at the head of its queue.
//! Meanwhile the quota they release, and the free quota its admission counts on, is held
//! for it: booked as usage of its queue (so every fit check, wake-up key and cached
//! decision of the cohort sees it, and the cohort version moves with it), but owned by no
//! admitted workload, so nobody can preempt it. Without it a victim in another queue
//! borrows the freed quota back at once, is reclaimed again when the next victim leaves,
//! and so on forever; Kueue avoids that by booking a preemptor's usage in the cohort for
//! every cycle it is requeued in.
//!
//! The preemptor itself is evaluated with its reservation lifted and its terminating
//! victims' usage taken out of the books (they will be its own), as Kueue puts evicted
//! candidates first, so it never picks new victims for quota already on its way. The
//! reservation ends when the preemptor is admitted, gives up (all victims gone and it
//! still does not fit), finishes, or its queue is re-applied; each end is a release, so
//! workloads parked on it are woken (after an admission too: a higher-priority workload
//! that could not preempt the reservation may preempt the admitted preemptor).

use super::decide::Decision;
use super::engine::{Engine, WlState};
use super::model::{CqId, FrId, WlId};
use super::quantity::Time;

impl Engine {
    /// Whether `id` is pending and waits for victims it preempted.
    pub(crate) fn is_waiting_preemptor(&self, id: WlId) -> bool {
        let w = &self.wls[id];
        w.state == WlState::Pending && !w.awaiting.is_empty()
    }

    /// Evaluates a waiting preemptor: its reservation and its terminating victims'
    /// quota count as free. Leaves the books as they were (cached decisions see a new
    /// cohort version).
    pub(crate) fn evaluate_waiting(&mut self, id: WlId, cq: CqId, now: Time) -> Decision {
        // Read only: `awaiting` changes when the decision is applied, which a held queue
        // (`blockAdmission`) may postpone; until then it still waits for them.
        let left: Vec<WlId> = self.wls[id]
            .awaiting
            .iter()
            .copied()
            .filter(|&v| self.terminating_for(v, id))
            .collect();
        let held = self.lift_reservation(id);
        for &v in &left {
            self.sim_remove(v);
        }
        let d = self.evaluate_fresh(id, cq, now);
        for &v in left.iter().rev() {
            self.sim_restore(v);
        }
        self.put_back_reservation(id, held);
        self.victim_memo = None;
        d
    }

    /// Whether `usage` fits `cq` with `id`'s reservation counted as free.
    pub(crate) fn fits_with_reservation(
        &mut self,
        id: WlId,
        cq: CqId,
        usage: &[(FrId, i64)],
    ) -> bool {
        let held = self.lift_reservation(id);
        let fits = self.fits(cq, usage, true);
        self.put_back_reservation(id, held);
        fits
    }

    /// Sets what waiting preemptor `id` needs, gives back what it holds beyond that, and
    /// holds whatever of it is free now.
    pub(crate) fn reserve_for(&mut self, id: WlId, target: &[(FrId, i64)], now: Time) {
        let Some(cq) = self.wls[id].cq else { return };
        let prio = self.wls[id].priority;
        self.wls[id].reserve_target = target.to_vec();
        let held = std::mem::take(&mut self.wls[id].reserved);
        let mut kept = Vec::with_capacity(held.len());
        for (fr, have) in held {
            let want = lookup(target, fr);
            if have > want {
                self.release(cq, fr, have - want, prio, now);
            }
            if want > 0 && have > 0 {
                kept.push((fr, have.min(want)));
            }
        }
        self.wls[id].reserved = kept;
        for &(fr, _) in target {
            self.top_up(id, fr, i64::MAX);
        }
    }

    /// A victim of `by` released `amount` of `fr`: hold it for `by` if it still waits,
    /// and let `by` look again.
    pub(crate) fn victim_released(&mut self, victim: WlId, by: WlId, fr: FrId, amount: i64) {
        if !self.is_waiting_preemptor(by) || !self.wls[by].awaiting.contains(&victim) {
            return;
        }
        self.top_up(by, fr, amount);
        self.wake(by);
    }

    /// Adds to `id`'s reservation in `fr` at most `limit`, up to its target and within
    /// what its queue can take now.
    fn top_up(&mut self, id: WlId, fr: FrId, limit: i64) {
        let Some(cq) = self.wls[id].cq else { return };
        if self.cqs[cq].spec.stop != super::api::StopPolicy::None {
            return;
        }
        let want = lookup(&self.wls[id].reserve_target, fr);
        let have = lookup(&self.wls[id].reserved, fr);
        let free = self.available(cq, fr).unwrap_or(0);
        let add = limit.min(want - have).min(free);
        if add <= 0 {
            return;
        }
        let prio = self.wls[id].priority;
        self.add_usage(cq, fr, add, prio);
        let reserved = &mut self.wls[id].reserved;
        match reserved.iter_mut().find(|(f, _)| *f == fr) {
            Some((_, v)) => *v += add,
            None => reserved.push((fr, add)),
        }
    }

    /// Ends `id`'s reservation: it is released, waking the workloads parked on it. Also
    /// when the preemptor is admitted right after: quota that nobody could preempt becomes
    /// an admitted workload that a higher-priority one may preempt, which a parked
    /// workload must get to see (wake-ups assume that admissions never help one).
    pub(crate) fn end_reservation(&mut self, id: WlId, now: Time) {
        self.wls[id].reserve_target.clear();
        let held = std::mem::take(&mut self.wls[id].reserved);
        let Some(cq) = self.wls[id].cq else { return };
        let prio = self.wls[id].priority;
        for (fr, have) in held {
            self.release(cq, fr, have, prio, now);
        }
    }

    /// Ends the reservations held in `cq` (its spec is about to change).
    pub(crate) fn end_reservations_in(&mut self, cq: CqId, now: Time) {
        // Holders wait at the head of their queue: they are pending, never parked.
        let holders: Vec<WlId> = self.cqs[cq]
            .pending
            .iter()
            .map(|k| k.3)
            .filter(|&id| !self.wls[id].reserved.is_empty())
            .collect();
        for id in holders {
            self.end_reservation(id, now);
        }
    }

    /// Takes `id`'s reservation out of the books without wake-ups (undo with
    /// [`Engine::put_back_reservation`]).
    fn lift_reservation(&mut self, id: WlId) -> Vec<(FrId, i64)> {
        let held = std::mem::take(&mut self.wls[id].reserved);
        if let Some(cq) = self.wls[id].cq {
            let prio = self.wls[id].priority;
            for &(fr, v) in &held {
                self.add_usage(cq, fr, -v, prio);
            }
        }
        held
    }

    fn put_back_reservation(&mut self, id: WlId, held: Vec<(FrId, i64)>) {
        if let Some(cq) = self.wls[id].cq {
            let prio = self.wls[id].priority;
            for &(fr, v) in &held {
                self.add_usage(cq, fr, v, prio);
            }
        }
        self.wls[id].reserved = held;
    }
}

fn lookup(list: &[(FrId, i64)], fr: FrId) -> i64 {
    list.iter().filter(|(f, _)| *f == fr).map(|(_, v)| *v).sum()
}
