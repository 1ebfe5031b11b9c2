//! Workload lifecycle: admission, eviction (preemption, pods-ready timeout, drain),
//! requeue with backoff, completion, and the timers that drive them.

use super::assign::Assignment;
use super::engine::{Admission, Engine, EvictCause, Timer, WlState};
use super::events::{Event, EventType, PendingReason};
use super::model::{CqId, WlId};
use super::quantity::Time;
use std::cmp::Reverse;
use std::collections::BTreeMap;

impl Engine {
    pub(crate) fn set_timer(&mut self, at: Time, timer: Timer) {
        let seq = self.next_seq();
        self.timers.push(Reverse((at, seq, timer)));
    }

    pub(crate) fn timer_live(&self, timer: Timer) -> bool {
        let (id, gen) = timer.parts();
        if matches!(timer, Timer::ReadyTimeout(..)) && self.ready_marked.contains(&id) {
            return false;
        }
        self.wls.get(id).is_some_and(|w| w.gen == gen)
    }

    pub(crate) fn fire(&mut self, timer: Timer, at: Time) {
        match timer {
            Timer::Finish(id, _) => self.finish(id, at, "Succeeded"),
            Timer::ReadyTimeout(id, _) => self.evict(id, at, EvictCause::PodsReadyTimeout),
            Timer::BackoffEnd(id, _) => self.enqueue(id, at),
            Timer::Wake(id, _) => self.wake(id),
            Timer::PodsReady(id, _) => self.pods_ready(id),
            Timer::TerminateDone(id, _) => {
                let cause = self.wls[id].evicting.take();
                self.release_admission(id, at, preemptor(cause.as_ref()));
                if let Some(cause) = cause {
                    self.after_eviction(id, at, cause);
                }
            }
        }
    }

    pub(crate) fn admit(&mut self, id: WlId, cq: CqId, a: Assignment, now: Time) {
        let prio = self.wls[id].priority;
        for &(fr, v) in &a.usage {
            self.add_usage(cq, fr, v, prio);
        }
        let borrowing = a
            .usage
            .iter()
            .any(|&(fr, _)| self.usage(cq, fr) > self.nominal(cq, fr));
        let w = &mut self.wls[id];
        w.state = WlState::Admitted;
        w.awaiting.clear();
        w.first_admitted.get_or_insert(now);
        w.gen += 1;
        w.reported = None;
        let gen = w.gen;
        let counts: BTreeMap<String, u32> = w
            .info
            .pod_sets
            .iter()
            .zip(&a.counts)
            .map(|(p, &c)| (p.name.clone(), c))
            .collect();
        let partial = w
            .info
            .pod_sets
            .iter()
            .zip(&a.counts)
            .any(|(p, &c)| p.count != c);
        if self.cfg.record_events {
            let mut ev = Event::new(now, EventType::Admitted, w.key.to_string());
            ev.cluster_queue = Some(self.cqs[cq].spec.name.clone());
            ev.flavors = Some(a.flavors.clone());
            ev.borrowing = Some(borrowing);
            if partial {
                ev.pod_counts = Some(counts);
            }
            self.events.push(ev);
        }
        let w = &mut self.wls[id];
        w.admission = Some(Admission {
            cq,
            at: now,
            usage: a.usage,
            flavors: a.flavors,
            counts: a.counts,
            borrowing,
        });
        let ready_after = w.info.pods_ready_after;
        let remaining = w.info.runtime.map(|r| r.saturating_sub(w.progress));
        self.ready_marked.remove(&id);
        if self.cqs[cq].admitted.insert(id) {
            self.lqs[self.wls[id].lq].admitted += 1;
        }
        let usage = self.wls[id]
            .admission
            .as_ref()
            .map(|a| a.usage.clone())
            .unwrap_or_default();
        self.lq_books_apply(id, &usage, 1);
        self.stats.admissions += 1;
        if self.cfg.requeue == super::engine::Requeue::Indexed {
            self.chain_class(id, cq);
        }
        if borrowing && self.cfg.requeue == super::engine::Requeue::Indexed {
            let frs: Vec<_> = self.wls[id]
                .admission
                .as_ref()
                .map(|a| a.usage.iter().map(|(fr, _)| *fr).collect())
                .unwrap_or_default();
            self.wake_reclaimers(cq, &frs);
        }
        let timeout = self.cfg.wait_for_pods_ready.as_ref().map(|c| c.timeout);
        let ready_in_time = match (ready_after, timeout) {
            (Some(r), Some(t)) => r <= t,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if let Some(t) = timeout {
            if !ready_in_time {
                self.set_timer(now.saturating_add(t), Timer::ReadyTimeout(id, gen));
            }
        }
        let blocks = self
            .cfg
            .wait_for_pods_ready
            .as_ref()
            .is_some_and(|c| c.block_admission);
        match ready_after {
            // Not ready until its timeout evicts it.
            _ if blocks && !ready_in_time => {
                self.unready.insert(id);
            }
            Some(r) if blocks && r > 0 => {
                self.unready.insert(id);
                self.set_timer(now.saturating_add(r), Timer::PodsReady(id, gen));
            }
            _ => {}
        }
        if let (true, Some(r), Some(rem)) = (ready_in_time, ready_after, remaining) {
            self.set_timer(
                now.saturating_add(r).saturating_add(rem),
                Timer::Finish(id, gen),
            );
        }
    }

    /// Evicts an admitted workload. Its quota is released now, or after its grace period.
    pub(crate) fn evict(&mut self, id: WlId, now: Time, cause: EvictCause) {
        if self.wls[id].state != WlState::Admitted {
            return;
        }
        let rework = self.rework(id, now);
        let w = &mut self.wls[id];
        let Some(adm) = &w.admission else { return };
        let cq = adm.cq;
        if cause != EvictCause::PodsReadyTimeout {
            let ran =
                now.saturating_sub(adm.at.saturating_add(w.info.pods_ready_after.unwrap_or(0)));
            w.progress = w.progress.saturating_add(ran.saturating_sub(rework));
            if let Some(rt) = w.info.runtime {
                w.progress = w.progress.min(rt);
            }
        }
        w.gen += 1;
        if let EvictCause::Preempted { by, .. } = cause {
            w.preempted_by = Some(by);
        }
        let gen = w.gen;
        let grace = w.info.grace_period;
        if self.cfg.record_events {
            let mut ev;
            match &cause {
                EvictCause::Preempted { by, reason } => {
                    ev = Event::new(now, EventType::Preempted, w.key.to_string());
                    ev.reason = Some(reason.to_string());
                    ev.by = Some(self.wls[*by].key.to_string());
                    ev.expected_rework = Some(rework as f64 / 1000.0);
                }
                EvictCause::PodsReadyTimeout => {
                    ev = Event::new(now, EventType::Evicted, w.key.to_string());
                    ev.reason = Some("PodsReadyTimeout".into());
                }
                EvictCause::Drained => {
                    ev = Event::new(now, EventType::Evicted, w.key.to_string());
                    ev.reason = Some("ClusterQueueStopped".into());
                }
            }
            ev.cluster_queue = Some(self.cqs[cq].spec.name.clone());
            self.events.push(ev);
        }
        if self.cqs[cq].admitted.remove(&id) {
            self.lqs[self.wls[id].lq].admitted -= 1;
        }
        self.pods_ready(id);
        if grace > 0 {
            let frs: Vec<_> = self.wls[id]
                .admission
                .as_ref()
                .map(|a| a.usage.iter().map(|(fr, _)| *fr).collect())
                .unwrap_or_default();
            self.candidate_gone(cq, &frs, now);
            let w = &mut self.wls[id];
            w.state = WlState::Terminating;
            w.evicting = Some(cause);
            self.set_timer(now.saturating_add(grace), Timer::TerminateDone(id, gen));
        } else {
            self.release_admission(id, now, preemptor(Some(&cause)));
            self.after_eviction(id, now, cause);
        }
    }

    /// Frees a workload's quota. `by`: the preemptor it was evicted for, which gets the
    /// quota reserved if it still waits (see `reserve.rs`).
    pub(crate) fn release_admission(&mut self, id: WlId, now: Time, by: Option<WlId>) {
        let prio = self.wls[id].priority;
        let Some(adm) = self.wls[id].admission.take() else {
            return;
        };
        self.lq_books_apply(id, &adm.usage, -1);
        for (fr, v) in adm.usage {
            self.release(adm.cq, fr, v, prio, now);
            if let Some(by) = by {
                self.victim_released(id, by, fr, v);
            }
        }
    }

    fn after_eviction(&mut self, id: WlId, now: Time, cause: EvictCause) {
        if cause != EvictCause::PodsReadyTimeout {
            self.enqueue(id, now);
            return;
        }
        let Some(cfg) = self.cfg.wait_for_pods_ready.clone() else {
            self.enqueue(id, now);
            return;
        };
        let w = &mut self.wls[id];
        w.requeues += 1;
        w.gen += 1;
        let gen = w.gen;
        let n = w.requeues;
        if cfg.backoff_limit_count.is_some_and(|limit| n > limit) {
            w.state = WlState::Deactivated;
            w.reason = PendingReason::Deactivated(n - 1);
            self.dirty.push(id);
            return;
        }
        let shift = (n - 1).min(40);
        let delay = cfg
            .backoff_base
            .saturating_mul(1u64 << shift)
            .min(cfg.backoff_max);
        let until = now.saturating_add(delay);
        if cfg.requeue_by_eviction_time {
            w.order_ts = now;
        }
        w.state = WlState::Backoff;
        w.reason = PendingReason::Backoff { until, count: n };
        self.dirty.push(id);
        self.set_timer(until, Timer::BackoffEnd(id, gen));
    }

    /// Ends a workload: frees its quota if admitted, removes it from its queue otherwise.
    pub(crate) fn finish(&mut self, id: WlId, now: Time, reason: &str) {
        let state = self.wls[id].state.clone();
        if state == WlState::Finished {
            return;
        }
        let key = self.wls[id].order_key(id);
        if let Some(cq) = self.wls[id].cq {
            if self.cqs[cq].parked.contains(&key) {
                self.leave_class(id, cq, key.clone());
            }
            let q = &mut self.cqs[cq];
            q.pending.remove(&key);
            q.parked.remove(&key);
            if q.blocked == Some(key) {
                q.blocked = None;
                if !q.pending.is_empty() {
                    self.ready.insert(cq);
                }
            }
            if q.admitted.remove(&id) {
                self.lqs[self.wls[id].lq].admitted -= 1;
            }
        }
        self.orphans.remove(&id);
        self.pods_ready(id);
        let cq_name = self.wls[id]
            .admission
            .as_ref()
            .map(|a| self.cqs[a.cq].spec.name.clone());
        let by = preemptor(self.wls[id].evicting.as_ref());
        self.release_admission(id, now, by);
        // A preemptor that leaves while waiting passes its victims and reservation on to
        // the workload ahead of it waiting for them, or gives the reservation back.
        self.pass_on_reservation(id);
        self.end_reservation(id, now);
        self.wake_waiting_head(id);
        let w = &mut self.wls[id];
        w.state = WlState::Finished;
        w.gen += 1;
        if self.cfg.record_events {
            let mut ev = Event::new(now, EventType::Finished, w.key.to_string());
            ev.cluster_queue = cq_name;
            ev.reason = Some(reason.to_string());
            self.events.push(ev);
        }
    }
}

/// The preemptor an eviction was for.
fn preemptor(cause: Option<&EvictCause>) -> Option<WlId> {
    match cause {
        Some(EvictCause::Preempted { by, .. }) => Some(*by),
        _ => None,
    }
}
