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
//! still does not fit), finishes or is deleted, or its queue is re-applied; each end is a
//! release, so workloads parked on it are woken (after an admission too: a workload that
//! could not preempt the reservation may preempt the admitted preemptor).
//!
//! A reservation is held against other queues, not against the preemptor's own queue
//! order. Kueue gives quota freed by evictions to whichever workload heads the
//! ClusterQueue when it is free (priority, then FIFO), and puts already evicted
//! workloads first among preemption candidates. So a workload ahead of the holder in
//! the same queue (higher priority, or equal and older) is evaluated as if it held the
//! reservation: the holders behind it have their reservations and terminating victims
//! counted as free. If it fits now it is admitted, taking what it needs out of their
//! reservations (they keep the rest and go on waiting); if it needs their victims gone
//! first it takes the head of the queue and waits for them (`WaitingForPreemptedWorkloads`),
//! woken by each of their releases; if it does not fit even so, it parks and the holders
//! keep everything. The holders never lose their victims, so when the workload ahead is
//! done with what it needed they continue where they were, without preempting again.

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

    /// Whether `id` waits for its victims or holds quota for itself.
    fn is_holder(&self, id: WlId) -> bool {
        self.is_waiting_preemptor(id) || !self.wls[id].reserved.is_empty()
    }

    /// The waiting preemptors of `cq` behind `id` in queue order: `id`, being ahead,
    /// may use what they hold. Forgets the ones that no longer hold anything.
    pub(crate) fn holders_behind(&mut self, id: WlId, cq: CqId) -> Vec<WlId> {
        if self.cqs[cq].holders.is_empty() {
            return Vec::new();
        }
        let stale: Vec<WlId> = self.cqs[cq]
            .holders
            .iter()
            .copied()
            .filter(|&h| {
                self.wls[h].cq != Some(cq)
                    || self.wls[h].state != WlState::Pending
                    || !self.is_holder(h)
            })
            .collect();
        for h in stale {
            self.cqs[cq].holders.remove(&h);
        }
        let key = self.wls[id].order_key(id);
        let mut behind: Vec<_> = self.cqs[cq]
            .holders
            .iter()
            .map(|&h| self.wls[h].order_key(h))
            .filter(|k| *k > key)
            .collect();
        behind.sort_unstable();
        behind.into_iter().map(|k| k.3).collect()
    }

    /// `h`'s victims that still terminate (read only).
    fn terminating_victims(&self, h: WlId) -> impl Iterator<Item = WlId> + '_ {
        self.wls[h]
            .awaiting
            .iter()
            .copied()
            .filter(move |&v| self.terminating_for(v, h))
    }

    /// The victims of the holders behind `id` that still terminate: `id` waits for them
    /// when it counted on them.
    pub(crate) fn holders_victims(&mut self, id: WlId, cq: CqId) -> Vec<WlId> {
        let holders = self.holders_behind(id, cq);
        holders
            .iter()
            .flat_map(|&h| self.terminating_victims(h).collect::<Vec<_>>())
            .collect()
    }

    /// Evaluates a waiting preemptor, or a workload ahead of one in its queue: the
    /// reservations of it and of the holders behind it, and their terminating victims'
    /// quota, count as free. Leaves the books as they were (cached decisions see a new
    /// cohort version).
    pub(crate) fn evaluate_waiting(&mut self, id: WlId, cq: CqId, now: Time) -> Decision {
        let mut group = vec![id];
        group.extend(self.holders_behind(id, cq));
        // Read only: `awaiting` changes when the decision is applied, which a held queue
        // (`blockAdmission`) may postpone; until then it still waits for them.
        let left: Vec<WlId> = group
            .iter()
            .flat_map(|&h| self.terminating_victims(h).collect::<Vec<_>>())
            .collect();
        let held: Vec<(WlId, Vec<(FrId, i64)>)> = group
            .iter()
            .map(|&h| (h, self.lift_reservation(h)))
            .collect();
        for &v in &left {
            self.sim_remove(v);
        }
        let d = self.evaluate_fresh(id, cq, now);
        for &v in left.iter().rev() {
            self.sim_restore(v);
        }
        for (h, r) in held.into_iter().rev() {
            self.put_back_reservation(h, r);
        }
        self.victim_memo = None;
        d
    }

    /// Whether `id` must be evaluated with reservations counted as free.
    pub(crate) fn claims_reservations(&mut self, id: WlId, cq: CqId) -> bool {
        self.is_holder(id) || !self.holders_behind(id, cq).is_empty()
    }

    /// Whether `usage` fits `cq` with the reservations of `id` and of the holders behind
    /// it counted as free.
    pub(crate) fn fits_with_reservation(
        &mut self,
        id: WlId,
        cq: CqId,
        usage: &[(FrId, i64)],
    ) -> bool {
        let mut group = vec![id];
        group.extend(self.holders_behind(id, cq));
        let held: Vec<(WlId, Vec<(FrId, i64)>)> = group
            .iter()
            .map(|&h| (h, self.lift_reservation(h)))
            .collect();
        let fits = self.fits(cq, usage, true);
        for (h, r) in held.into_iter().rev() {
            self.put_back_reservation(h, r);
        }
        fits
    }

    /// Admits `id` (its own reservation ends), taking what it needs out of the
    /// reservations of the holders behind it; they keep what is left, in queue order.
    pub(crate) fn admit_claiming(
        &mut self,
        id: WlId,
        cq: CqId,
        a: super::assign::Assignment,
        now: Time,
    ) {
        let holders = self.holders_behind(id, cq);
        let held: Vec<(WlId, Vec<(FrId, i64)>)> = holders
            .iter()
            .map(|&h| (h, self.lift_reservation(h)))
            .collect();
        self.end_reservation(id, now);
        self.admit(id, cq, a, now);
        for (h, r) in held {
            let prio = self.wls[h].priority;
            let mut kept = Vec::with_capacity(r.len());
            for (fr, v) in r {
                let keep = v.min(self.available(cq, fr).unwrap_or(0));
                if keep > 0 {
                    self.add_usage(cq, fr, keep, prio);
                    kept.push((fr, keep));
                }
            }
            self.wls[h].reserved = kept;
        }
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
        self.cqs[cq].holders.insert(id);
    }

    /// A victim of `by` released `amount` of `fr`: hold it for `by` if it still waits,
    /// and let `by`, or whoever waits for its victims ahead of it, look again.
    pub(crate) fn victim_released(&mut self, victim: WlId, by: WlId, fr: FrId, amount: i64) {
        if self.is_waiting_preemptor(by) && self.wls[by].awaiting.contains(&victim) {
            self.top_up(by, fr, amount);
            self.wake(by);
        }
        self.wake_waiting_head(by);
    }

    /// A workload ahead of `holder` in its queue may hold the head waiting for
    /// `holder`'s victims: wake it when one of them is gone, or when `holder` leaves.
    pub(crate) fn wake_waiting_head(&mut self, holder: WlId) {
        let Some(cq) = self.wls[holder].cq else {
            return;
        };
        let Some(head) = self.cqs[cq].blocked.as_ref().map(|k| k.3) else {
            return;
        };
        if head != holder
            && matches!(
                self.wls[head].reason,
                super::events::PendingReason::WaitingForPreemptedWorkloads(_)
            )
        {
            self.wake(head);
        }
    }

    /// `holder` leaves while waiting (deleted, finished): a workload ahead of it that
    /// holds the head of the queue waiting for its victims inherits them and what is
    /// reserved, so the quota on its way is not borrowed back by the victims meanwhile
    /// (and reclaimed from them again). Without such a workload nothing is passed on.
    pub(crate) fn pass_on_reservation(&mut self, holder: WlId) {
        let Some(cq) = self.wls[holder].cq else {
            return;
        };
        let Some(head) = self.cqs[cq].blocked.as_ref().map(|k| k.3) else {
            return;
        };
        if head == holder
            || self.wls[head].state != WlState::Pending
            || !matches!(
                self.wls[head].reason,
                super::events::PendingReason::WaitingForPreemptedWorkloads(_)
            )
        {
            return;
        }
        let victims: Vec<WlId> = self.terminating_victims(holder).collect();
        if victims.is_empty() {
            return;
        }
        for &v in &victims {
            let w = &mut self.wls[v];
            if let Some(super::engine::EvictCause::Preempted { by, .. }) = &mut w.evicting {
                *by = head;
            }
            w.preempted_by = Some(head);
        }
        let held = self.lift_reservation(holder);
        let target = std::mem::take(&mut self.wls[holder].reserve_target);
        let prio = self.wls[head].priority;
        for &(fr, v) in &held {
            self.add_usage(cq, fr, v, prio);
        }
        let w = &mut self.wls[head];
        w.awaiting.extend(victims);
        for (list, add) in [(&mut w.reserved, held), (&mut w.reserve_target, target)] {
            for (fr, v) in add {
                match list.iter_mut().find(|(f, _)| *f == fr) {
                    Some((_, have)) => *have += v,
                    None => list.push((fr, v)),
                }
            }
        }
        self.cqs[cq].holders.insert(head);
        self.wake(head);
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
