//! Capacity freed by a scale-down, held from expensive borrowers for a while.
//!
//! An inference service that scales down usually scales up again: the next spike, the
//! next morning. If the GPUs it freed are lent at once to a three-hour training job,
//! that job is what the next scale-up reclaims, losing the work since its last
//! checkpoint. So when an autoscaler scales a serving workload down, its queue keeps,
//! for `until`, a *hold* at the usage it had before (per flavor and resource). While
//! the hold lasts, other queues of the cohort may borrow the held headroom (the hold's
//! level minus what the queue uses now) only with workloads that are cheap to reclaim:
//! whose work lost at an eviction is at most `max_rework` (their checkpoint interval or
//! their whole runtime). Other workloads still get their own queue's nominal quota and
//! anything beyond the headroom. A scale-up within the hold finds the headroom free, or
//! held by work that loses minutes when reclaimed (`docs/autoscale.md`, "Lending what a
//! scale-down freed").
//!
//! A hold only lowers what some workloads see as available, so the wake index's keys
//! stay lower bounds; when a hold ends, the workloads it kept something from are woken.
//!
//! Limitation: workloads of one queue with the same shape (requests, priority, pod sets)
//! are parked and decided as one class whatever their rework, so while a hold stands a
//! cheap workload queued behind an expensive one of the same shape waits with it. Making
//! rework part of the shape split classes apart in fleets whose jobs checkpoint at
//! assorted intervals, and the fleet simulation ran an order of magnitude slower.
//!
//! A live controller keeps holds outside the engine (on the scale target, where a
//! restart finds them) and sets them on each engine it builds: [`Engine::replica_usage`]
//! says what the replicas held would use, [`Engine::set_hold`] holds it. A hold set so
//! is one left by [`Engine::remove_holding`]: the same lending, waits and wake-ups.

use super::engine::Engine;
use super::error::{Error, Result};
use super::model::{CqId, FrId, WlId, WorkloadInfo, PODS};
use super::quantity::Time;
use std::collections::BTreeMap;

/// What a queue holds, or replicas use: milli-units per `(flavor, resource)`.
pub type HeldLevels = BTreeMap<(String, String), i64>;

/// How a removed serving replica's capacity is held (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldFreed {
    /// The hold ends then.
    pub until: Time,
    /// Borrowers that lose at most this much work when evicted may use the headroom.
    pub max_rework: Time,
}

/// One queue's hold in one `(flavor, resource)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    /// The queue's usage before the scale-down (the highest, if several).
    pub level: i64,
    pub until: Time,
    pub max_rework: Time,
}

/// The most work `info` can lose when evicted: its checkpoint interval, else its
/// runtime; unbounded when it runs until removed without checkpoints.
pub(crate) fn max_rework(info: &WorkloadInfo) -> Time {
    let checkpoint = info.checkpoint_interval.filter(|i| *i > 0);
    match (checkpoint, info.runtime) {
        (Some(c), Some(r)) => c.min(r),
        (Some(c), None) => c,
        (None, Some(r)) => r,
        (None, None) => Time::MAX,
    }
}

impl Engine {
    /// Like [`Engine::remove_with_reason`], and if `key` holds quota, its queue keeps a
    /// hold at its usage before the removal (see the module doc).
    pub fn remove_holding(
        &mut self,
        now: Time,
        key: &str,
        reason: &str,
        hold: HoldFreed,
    ) -> Result<()> {
        let id = *self
            .wl_by_key
            .get(key)
            .ok_or_else(|| Error::UnknownWorkload(key.to_string()))?;
        if hold.until > now {
            self.hold_usage_of(id, now, hold);
        }
        self.remove_with_reason(now, key, reason)
    }

    fn hold_usage_of(&mut self, id: WlId, now: Time, hold: HoldFreed) {
        let Some(adm) = &self.wls[id].admission else {
            return;
        };
        let (cq, frs): (CqId, Vec<FrId>) = (adm.cq, adm.usage.iter().map(|(f, _)| *f).collect());
        for fr in frs {
            let level = self.usage(cq, fr);
            self.hold_at(cq, fr, level, now, hold);
        }
        let co = self.cqs[cq].cohort;
        self.cohorts[co].version += 1;
    }

    /// Merges a hold at `level` into `cq`'s hold in `fr`: the higher level, the later
    /// end and the lower rework of the two (a hold already ended is replaced).
    fn hold_at(&mut self, cq: CqId, fr: FrId, level: i64, now: Time, hold: HoldFreed) {
        let fresh = Hold {
            level,
            until: hold.until,
            max_rework: hold.max_rework,
        };
        let h = self.cqs[cq].holds.entry(fr).or_insert(fresh);
        if h.until <= now {
            *h = fresh;
        } else {
            h.level = h.level.max(level);
            h.until = h.until.max(hold.until);
            h.max_rework = h.max_rework.min(hold.max_rework);
        }
        let until = h.until;
        self.hold_ends.insert((until, cq));
    }

    /// ClusterQueue `cluster_queue` holds `levels` (milli-units per `(flavor, resource)`,
    /// as [`Engine::replica_usage`] gives them) until `hold.until`, merged with any hold
    /// it has as [`Engine::remove_holding`] merges them. A hold already ended at `now`
    /// sets nothing. Raising a hold frees nothing, so no workload is woken; the holds'
    /// end wakes those it kept something from.
    pub fn set_hold(
        &mut self,
        now: Time,
        cluster_queue: &str,
        levels: &HeldLevels,
        hold: HoldFreed,
    ) -> Result<()> {
        let cq = self.cq_id(cluster_queue)?;
        let frs = self.hold_levels(cq, levels)?;
        if hold.until <= now || frs.is_empty() {
            return Ok(());
        }
        for (fr, level) in frs {
            self.hold_at(cq, fr, level, now, hold);
        }
        let co = self.cqs[cq].cohort;
        self.cohorts[co].version += 1;
        Ok(())
    }

    /// Replaces ClusterQueue `cluster_queue`'s hold with exactly `new` (`levels` as
    /// [`Engine::set_hold`] takes them; `None`: no hold), as an engine given that hold
    /// alone has it, and re-decides what the change can move in its cohort: the
    /// workloads a hold kept something from, and the parked ones as after a quota change
    /// ([`Engine::update_cluster_queue`]). Nothing changes on an error.
    pub fn replace_hold(
        &mut self,
        now: Time,
        cluster_queue: &str,
        new: Option<(&HeldLevels, HoldFreed)>,
    ) -> Result<()> {
        let cq = self.cq_id(cluster_queue)?;
        let frs = match new {
            Some((levels, _)) => self.hold_levels(cq, levels)?,
            None => Vec::new(),
        };
        self.cqs[cq].holds.clear();
        self.hold_ends.retain(|&(_, c)| c != cq);
        if let Some((_, hold)) = new.filter(|(_, h)| h.until > now) {
            for (fr, level) in frs {
                self.hold_at(cq, fr, level, now, hold);
            }
        }
        let co = self.cqs[cq].cohort;
        self.cohorts[co].version += 1;
        self.wake_held_back(&[co].into());
        self.wake_cohort_spec(co, false, now);
        Ok(())
    }

    fn cq_id(&self, cluster_queue: &str) -> Result<CqId> {
        self.cq_by_name
            .get(cluster_queue)
            .copied()
            .ok_or_else(|| Error::UnknownQueue(format!("ClusterQueue {cluster_queue}")))
    }

    /// `levels` by the flavor-resource ids of queue `cq`; an error names one it has no
    /// quota for.
    fn hold_levels(&self, cq: CqId, levels: &HeldLevels) -> Result<Vec<(FrId, i64)>> {
        let mut frs = Vec::with_capacity(levels.len());
        for ((flavor, resource), &level) in levels {
            let fr = self
                .fr_by_name
                .get(&(flavor.clone(), resource.clone()))
                .copied()
                .filter(|fr| self.cqs[cq].spec.limits.contains_key(fr))
                .ok_or_else(|| Error::Invalid {
                    kind: "ClusterQueue",
                    name: self.cqs[cq].spec.name.clone(),
                    field: "spec.resourceGroups".into(),
                    why: format!("no quota for {resource} in flavor {flavor} to hold"),
                })?;
            frs.push((fr, level));
        }
        Ok(frs)
    }

    /// The ClusterQueue `replicas` pods shaped like `shape` (its namespace, LocalQueue
    /// and pod sets) are admitted to, and what they use of it per `(flavor, resource)`
    /// (milli-units): in each resource group the first flavor whose nodes the pod set
    /// may use, whatever its quota (the flavor a restore assigns first). `pods` counts
    /// when the queue covers it.
    pub fn replica_usage(
        &self,
        shape: &WorkloadInfo,
        replicas: u32,
    ) -> Result<(String, HeldLevels)> {
        let queue = (shape.namespace.clone(), shape.queue_name.clone());
        let cq_name = self
            .local_queues
            .get(&queue)
            .ok_or_else(|| Error::UnknownQueue(format!("LocalQueue {}/{}", queue.0, queue.1)))?;
        let cq = self.cq_id(cq_name)?;
        let spec = &self.cqs[cq].spec;
        let mut usage = HeldLevels::new();
        for ps in &shape.pod_sets {
            let pods = i64::from(ps.count).saturating_mul(i64::from(replicas));
            let mut requests: Vec<(&str, i64)> = ps
                .requests
                .iter()
                .filter(|(_, q)| q.0 > 0)
                .map(|(r, q)| (r.as_str(), q.0))
                .collect();
            if spec.group_of(PODS).is_some() && !ps.requests.contains_key(PODS) {
                requests.push((PODS, 1000));
            }
            for (resource, per_pod) in requests {
                let not_held = |why: String| Error::Invalid {
                    kind: "ClusterQueue",
                    name: cq_name.clone(),
                    field: "spec.resourceGroups".into(),
                    why,
                };
                let g = spec
                    .group_of(resource)
                    .ok_or_else(|| not_held(format!("{resource} is not covered")))?;
                let slot = spec.groups[g]
                    .flavors
                    .iter()
                    .find(|slot| self.flavor_matches(ps, &slot.flavor).is_ok())
                    .ok_or_else(|| {
                        not_held(format!("no flavor for {resource} fits pod set {}", ps.name))
                    })?;
                *usage
                    .entry((slot.flavor.clone(), resource.to_string()))
                    .or_insert(0i64) += per_pod.saturating_mul(pods);
            }
        }
        Ok((cq_name.clone(), usage))
    }

    /// Headroom of other queues' holds in `fr` that workload `id` may not borrow at `now`.
    fn held_from(&self, id: WlId, cq: CqId, fr: FrId, now: Time) -> i64 {
        let rework = max_rework(&self.wls[id].info);
        let co = self.cqs[cq].cohort;
        self.cohorts[co]
            .members
            .iter()
            .filter(|&&m| m != cq)
            .filter_map(|&m| {
                let h = self.cqs[m].holds.get(&fr)?;
                (h.until > now && rework > h.max_rework)
                    .then(|| (h.level - self.usage(m, fr)).max(0))
            })
            .sum()
    }

    /// What workload `id` may still use of `cq`'s quota in `fr` at `now` without
    /// preemption: [`Engine::available`] less other queues' held headroom, but never less
    /// than what is left of `cq`'s own nominal quota. A workload a hold kept anything
    /// from is remembered, to be woken when the holds of its cohort end.
    pub(crate) fn available_for(&mut self, id: WlId, cq: CqId, fr: FrId, now: Time) -> Option<i64> {
        let avail = self.available(cq, fr)?;
        if self.hold_ends.is_empty() {
            return Some(avail);
        }
        let held = self.held_from(id, cq, fr, now);
        let own = (self.nominal(cq, fr) - self.usage(cq, fr)).max(0);
        let left = avail.min(own.max(avail - held));
        if left < avail {
            self.held_back.insert(id);
        }
        Some(left)
    }

    /// When the next hold ends.
    pub(crate) fn next_hold_end(&self) -> Option<Time> {
        self.hold_ends.first().map(|(t, _)| *t)
    }

    /// Ends the holds due at or before `now` and wakes the workloads of their cohorts
    /// that a hold kept something from (the wake index does not know holds: a hold
    /// ending frees nothing it counts).
    pub(crate) fn end_holds(&mut self, now: Time) {
        let mut ended = std::collections::BTreeSet::new();
        while let Some(&(t, cq)) = self.hold_ends.first() {
            if t > now {
                break;
            }
            self.hold_ends.remove(&(t, cq));
            let before = self.cqs[cq].holds.len();
            self.cqs[cq].holds.retain(|_, h| h.until > now);
            if self.cqs[cq].holds.len() != before {
                let co = self.cqs[cq].cohort;
                self.cohorts[co].version += 1;
                ended.insert(co);
            }
        }
        self.wake_held_back(&ended);
    }

    /// Wakes the workloads a hold kept something from in `cohorts`.
    fn wake_held_back(&mut self, cohorts: &std::collections::BTreeSet<usize>) {
        if cohorts.is_empty() {
            return;
        }
        let held_back = std::mem::take(&mut self.held_back);
        for id in held_back {
            match self.wls[id].cq {
                Some(cq) if cohorts.contains(&self.cqs[cq].cohort) => self.wake(id),
                Some(_) => {
                    self.held_back.insert(id);
                }
                None => {}
            }
        }
    }
}
