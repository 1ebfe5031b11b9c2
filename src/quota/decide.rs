//! One admission attempt: flavor assignment, victim search and partial admission turned
//! into a [`Decision`], then applied (admit, preempt, or park with a precise reason).

use super::assign::{Assignment, Failure, Mode};
use super::engine::{Engine, EvictCause, OrderKey, Timer, WlState};
use super::events::PendingReason;
use super::model::{FrId, WlId};
use super::preempt::Victims;
use super::quantity::Time;

/// What to do with the head of a queue.
#[derive(Clone, Debug)]
pub(crate) enum Decision {
    Admit(Assignment),
    Preempt {
        assignment: Assignment,
        victims: Vec<WlId>,
    },
    Fail {
        reason: PendingReason,
        /// `(fr, request, available)` where quota was short: the wake-up keys.
        shortfalls: Vec<(FrId, i64, i64)>,
        wake_at: Option<Time>,
    },
}

impl Decision {
    pub(crate) fn borrows(&self) -> bool {
        match self {
            Decision::Admit(a) => a.borrowing,
            Decision::Preempt { assignment, .. } => assignment.borrowing,
            Decision::Fail { .. } => false,
        }
    }
}

enum Try {
    Ok(Decision),
    /// The only victims are protected until then (minimum runtime).
    Gated(Time),
    /// The workload itself may not preempt before then (`preempt_not_before`).
    Persist(Time),
    No,
}

impl Engine {
    fn try_assignment(&mut self, id: WlId, a: Assignment, now: Time) -> Try {
        match a.mode {
            Mode::Fit | Mode::Borrow => Try::Ok(Decision::Admit(a)),
            Mode::Preempt => {
                let Some(cq) = self.wls[id].cq else {
                    return Try::No;
                };
                if let Some(t) = self.wls[id].info.preempt_not_before.filter(|t| *t > now) {
                    return Try::Persist(t);
                }
                match self.find_victims(id, cq, &a.usage, now) {
                    Victims::Found { victims, .. } => Try::Ok(Decision::Preempt {
                        assignment: a,
                        victims,
                    }),
                    Victims::Gated { until } => Try::Gated(until),
                    Victims::None => Try::No,
                }
            }
            Mode::NoFit => Try::No,
        }
    }

    /// Evaluates workload `id` (pending in its queue) against the current books.
    pub(crate) fn evaluate(&mut self, id: WlId, now: Time) -> Decision {
        self.stats.evaluations += 1;
        let Some(cq) = self.wls[id].cq else {
            return Decision::Fail {
                reason: self.wls[id].reason.clone(),
                shortfalls: Vec::new(),
                wake_at: None,
            };
        };
        if self.cqs[cq].spec.stop != super::api::StopPolicy::None {
            return Decision::Fail {
                reason: PendingReason::ClusterQueueStopped,
                shortfalls: Vec::new(),
                wake_at: None,
            };
        }
        // A preemptor waiting for its victims decides with what is on its way to it, and
        // so does a workload ahead of one in its queue (`reserve.rs`).
        if self.claims_reservations(id, cq) {
            return self.evaluate_waiting(id, cq, now);
        }
        // An identical workload just failed against the same books: same answer.
        let shape = self.shape_in(id, cq);
        let version = self.cohorts[self.cqs[cq].cohort].version;
        if let Some((s, t, v, d)) = &self.cqs[cq].fail_memo {
            if (*s, *t, *v) == (shape, now, version) {
                self.stats.memo_hits += 1;
                return d.clone();
            }
        }
        let d = self.evaluate_fresh(id, cq, now);
        if matches!(d, Decision::Fail { .. }) {
            self.cqs[cq].fail_memo = Some((shape, now, version, d.clone()));
        }
        d
    }

    /// What admission of `id` in `cq` depends on: equal values decide alike.
    pub(crate) fn shape_in(&self, id: WlId, cq: usize) -> u64 {
        let mut shape = self.wls[id].shape;
        if self.cqs[cq].spec.preemption.within_cluster_queue
            == super::api::WithinClusterQueuePolicy::LowerOrNewerEqualPriority
        {
            shape ^= self.wls[id].order_ts.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        shape
    }

    pub(crate) fn evaluate_fresh(&mut self, id: WlId, cq: usize, now: Time) -> Decision {
        let full: Vec<u32> = self.wls[id].info.pod_sets.iter().map(|p| p.count).collect();
        let a = self.assign(id, cq, &full, now);
        let mut failure = a.failure.clone();
        let mut shortfalls = a.shortfalls.clone();
        let mut gated = None;
        let mut persist = None;
        match self.try_assignment(id, a, now) {
            Try::Ok(d) => return d,
            Try::Gated(t) => gated = Some(t),
            Try::Persist(t) => persist = Some(t),
            Try::No => {}
        }
        // Partial admission: the largest pod counts (down to minCount) that fit.
        let mins: Vec<u32> = self.wls[id]
            .info
            .pod_sets
            .iter()
            .map(|p| p.min_count.unwrap_or(p.count))
            .collect();
        let total: u64 = full.iter().zip(&mins).map(|(c, m)| (c - m) as u64).sum();
        if total > 0 && !matches!(failure, Some(Failure::NoFlavor(_))) {
            let counts_at = |x: u64| -> Vec<u32> {
                full.iter()
                    .zip(&mins)
                    .map(|(&c, &m)| {
                        let d = (c - m) as u64;
                        let cut = (d * x).div_ceil(total).min(d);
                        c - cut as u32
                    })
                    .collect()
            };
            let a_min = self.assign(id, cq, &counts_at(total), now);
            shortfalls = a_min.shortfalls.clone();
            // The smallest admissible shape decides why the workload waits.
            failure = a_min.failure.clone();
            let d_min = match self.try_assignment(id, a_min, now) {
                Try::Ok(d) => Some(d),
                Try::Gated(t) => {
                    gated = Some(gated.map_or(t, |g: Time| g.min(t)));
                    None
                }
                Try::Persist(t) => {
                    persist = Some(t);
                    None
                }
                Try::No => None,
            };
            if let Some(d_min) = d_min {
                // Smallest cut that still fits: binary search over [1, total].
                let (mut lo, mut hi, mut best) = (1u64, total, d_min);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    self.stats.evaluations += 1;
                    let a = self.assign(id, cq, &counts_at(mid), now);
                    match self.try_assignment(id, a, now) {
                        Try::Ok(d) => {
                            best = d;
                            hi = mid;
                        }
                        _ => lo = mid + 1,
                    }
                }
                return best;
            }
        }
        let reason = match (gated, failure) {
            (None, f) if persist.is_some() => PendingReason::DemandNotPersisted {
                until: persist.unwrap_or(now),
                message: failure_text(f.as_ref()),
            },
            (Some(until), f) => PendingReason::MinimumRuntime {
                until,
                message: format!(
                    "{}; the only possible victims are protected (their queue's minimumRuntime, or admitted by preemption this instant)",
                    failure_text(f.as_ref())
                ),
            },
            (None, Some(Failure::NoFlavor(m))) => PendingReason::NoMatchingFlavor(m),
            (None, Some(Failure::ExceedsMax(m))) => PendingReason::ExceedsMaxQuota(m),
            (None, Some(Failure::Insufficient { message, brief })) => {
                PendingReason::WaitingForQuota { message, brief }
            }
            (None, None) => PendingReason::WaitingForQuota {
                message: "waiting for quota".into(),
                brief: "waiting for quota".into(),
            },
        };
        let wake_at = match (gated, persist) {
            (Some(g), Some(p)) => Some(g.min(p)),
            (g, p) => g.or(p),
        };
        Decision::Fail {
            reason,
            shortfalls,
            wake_at,
        }
    }

    /// Applies a decision for the queue head `key`.
    pub(crate) fn apply_decision(&mut self, key: OrderKey, decision: Decision, now: Time) {
        let id = key.3;
        let Some(cq) = self.wls[id].cq else { return };
        match decision {
            Decision::Admit(a) => {
                // A waiting preemptor (or a workload ahead of one) decided as if the
                // victims were gone: it is admitted once they are, or now if the quota
                // held and the free quota suffice.
                let own = self.still_terminating_for(id);
                let mut left = own.clone();
                left.extend(self.holders_victims(id, cq));
                if left.is_empty() || self.fits_with_reservation(id, cq, &a.usage) {
                    self.cqs[cq].pending.remove(&key);
                    self.admit_claiming(id, cq, a, now);
                } else {
                    // Quota is held only for a workload's own victims; one waiting for a
                    // holder's victims counts on the holder's reservation.
                    if own.is_empty() {
                        self.end_reservation(id, now);
                    } else {
                        self.reserve_for(id, &a.usage, now);
                    }
                    let reason = self.waiting_for(&left);
                    self.park(id, key, reason, &[], None);
                }
            }
            Decision::Preempt {
                assignment,
                victims,
            } => {
                let mut grace = 0;
                for &v in &victims {
                    let reason = if self.wls[v].admission.as_ref().map(|a| a.cq) == Some(cq) {
                        "InClusterQueue"
                    } else if assignment.borrowing {
                        "InCohortReclaimWhileBorrowing"
                    } else {
                        "InCohortReclamation"
                    };
                    grace = grace.max(self.wls[v].info.grace_period);
                    self.evict(v, now, EvictCause::Preempted { by: id, reason });
                }
                self.stats.preemptions += victims.len() as u64;
                if self.fits_with_reservation(id, cq, &assignment.usage) {
                    self.cqs[cq].pending.remove(&key);
                    self.wls[id].preempted_in_at = Some(now);
                    self.admit_claiming(id, cq, assignment, now);
                } else {
                    // It waits for these victims and any earlier ones still terminating;
                    // the quota it needs is held for it: what is free now (victims without
                    // a grace period included), and what the others release as they go.
                    let mut awaiting = self.still_terminating_for(id);
                    awaiting.extend(victims.iter().copied());
                    awaiting.retain(|&v| self.terminating_for(v, id));
                    // No victim of its own left (it counts on a holder's, see
                    // `reserve.rs`): it holds nothing itself.
                    self.wls[id].awaiting = awaiting.clone();
                    if awaiting.is_empty() {
                        self.end_reservation(id, now);
                    } else {
                        self.reserve_for(id, &assignment.usage, now);
                    }
                    let mut left = awaiting;
                    left.extend(self.holders_victims(id, cq));
                    let reason = self.waiting_for(&left);
                    self.park(
                        id,
                        key,
                        reason,
                        &assignment.shortfalls,
                        Some(now.saturating_add(grace.max(1))),
                    );
                }
            }
            Decision::Fail {
                reason,
                shortfalls,
                wake_at,
            } => {
                // Some of its victims are gone, the rest still terminate: it keeps waiting
                // for them at the head of its queue, as Kueue requeues a preemptor with
                // preemption in flight straight back to the heap. Parking it as an
                // ordinary failure would hand the quota already freed back to its victims
                // behind it, and it would preempt them again, forever.
                let left = self.still_terminating_for(id);
                if left.is_empty() {
                    self.end_reservation(id, now);
                    self.park(id, key, reason, &shortfalls, wake_at);
                } else {
                    let reason = self.waiting_for(&left);
                    self.park(id, key, reason, &shortfalls, wake_at);
                }
            }
        }
        let q = &self.cqs[cq];
        if !q.pending.is_empty()
            && q.blocked.is_none()
            && q.spec.stop == super::api::StopPolicy::None
        {
            self.ready.insert(cq);
        }
    }

    /// The pending reason of a preemptor whose `victims` still terminate.
    fn waiting_for(&self, victims: &[WlId]) -> PendingReason {
        let names: Vec<&str> = victims.iter().map(|&v| &*self.wls[v].key).collect();
        PendingReason::WaitingForPreemptedWorkloads(format!(
            "waiting for preempted workloads to terminate: {}",
            names.join(", ")
        ))
    }

    /// Whether `victim` is still terminating after being preempted by `by`.
    pub(crate) fn terminating_for(&self, victim: WlId, by: WlId) -> bool {
        let w = &self.wls[victim];
        w.state == WlState::Terminating
            && matches!(w.evicting, Some(EvictCause::Preempted { by: b, .. }) if b == by)
    }

    /// The victims of `id` still terminating for it; forgets the ones that are gone.
    pub(crate) fn still_terminating_for(&mut self, id: WlId) -> Vec<WlId> {
        let mut awaiting = std::mem::take(&mut self.wls[id].awaiting);
        awaiting.retain(|&v| self.terminating_for(v, id));
        self.wls[id].awaiting = awaiting.clone();
        awaiting
    }

    /// Parks an inadmissible workload (StrictFIFO, or waiting for its victims: blocks its
    /// queue) until a release in its cohort could cover its shortfall, a timer, or a
    /// configuration change.
    pub(crate) fn park(
        &mut self,
        id: WlId,
        key: OrderKey,
        reason: PendingReason,
        shortfalls: &[(FrId, i64, i64)],
        wake_at: Option<Time>,
    ) {
        let Some(cq) = self.wls[id].cq else { return };
        // A preemptor waiting for its victims keeps the head of its queue (Kueue requeues
        // it straight back to the heap): otherwise the quota its victims release goes to
        // the workloads behind it, victims included, and the preemption repeats forever.
        let holds_head = matches!(reason, PendingReason::WaitingForPreemptedWorkloads(_));
        let strict = self.strict(cq) || holds_head;
        let shape = self.shape_in(id, cq);
        let mut arm = true;
        {
            let q = &mut self.cqs[cq];
            if strict {
                q.blocked = Some(key);
            } else {
                q.pending.remove(&key);
                q.parked.insert(key.clone());
                let class = q.classes.entry(shape).or_default();
                class.members.insert(key);
                arm = !class.armed;
                class.armed = true;
            }
        }
        let w = &mut self.wls[id];
        w.gen += 1;
        w.reason = reason;
        let gen = w.gen;
        self.dirty.push(id);
        if let Some(t) = wake_at {
            self.set_timer(t, Timer::Wake(id, gen));
        }
        if self.cfg.requeue == super::engine::Requeue::FullRescan || !arm {
            return;
        }
        self.register_wake_keys(id, cq, gen, shortfalls);
    }
}

fn failure_text(f: Option<&Failure>) -> String {
    match f {
        Some(
            Failure::NoFlavor(m)
            | Failure::ExceedsMax(m)
            | Failure::Insufficient { message: m, .. },
        ) => m.clone(),
        None => "waiting for quota".into(),
    }
}
