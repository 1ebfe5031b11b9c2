//! Read-outs of the engine: the final state of a plan and invariant checks for tests.

use super::api::StopPolicy;
use super::engine::{Engine, WlState};
use super::events::{AdmittedEntry, FinalState, PendingEntry, Positions, QueueUsage, UsageEntry};
use super::quantity::Quantity;
use std::collections::{BTreeMap, HashMap};

impl Engine {
    /// Admitted, pending and finished workloads and per-queue usage, sorted by name.
    pub fn final_state(&self) -> FinalState {
        let mut out = FinalState::default();
        let mut ids: Vec<usize> = (0..self.wls.len()).collect();
        ids.sort_by(|a, b| self.wls[*a].key.cmp(&self.wls[*b].key));
        let mut pending_per_cq: HashMap<usize, usize> = HashMap::new();
        // Queue positions in one walk per queue, not one per workload.
        let ranks: HashMap<usize, usize> = (0..self.cqs.len())
            .flat_map(|c| self.queue_ranks(c))
            .collect();
        for id in ids {
            let w = &self.wls[id];
            match w.state {
                WlState::Admitted => {
                    let Some(a) = &w.admission else { continue };
                    out.admitted.push(AdmittedEntry {
                        workload: w.key.to_string(),
                        cluster_queue: self.cqs[a.cq].spec.name.clone(),
                        flavors: a.flavors.clone(),
                        borrowing: a.borrowing,
                        pod_counts: w
                            .info
                            .pod_sets
                            .iter()
                            .zip(&a.counts)
                            .map(|(p, &c)| (p.name.clone(), c))
                            .collect(),
                        admitted_at: a.at as f64 / 1000.0,
                    });
                }
                WlState::Pending
                | WlState::Backoff
                | WlState::Deactivated
                | WlState::Terminating => {
                    if let Some(cq) = w.cq {
                        *pending_per_cq.entry(cq).or_default() += 1;
                    }
                    let position = (w.reason.has_position() && w.state == WlState::Pending)
                        .then(|| ranks.get(&id).copied())
                        .flatten();
                    let (reason, message) = if w.state == WlState::Terminating {
                        (
                            "Terminating".to_string(),
                            "evicted; waiting for its pods to terminate".to_string(),
                        )
                    } else {
                        (
                            w.reason.code().to_string(),
                            w.reason.message_as(position, self.cfg.positions),
                        )
                    };
                    out.pending.push(PendingEntry {
                        workload: w.key.to_string(),
                        cluster_queue: w.cq.map(|c| self.cqs[c].spec.name.clone()),
                        reason,
                        message,
                        position,
                    });
                }
                WlState::Finished => out.finished.push(w.key.to_string()),
            }
        }
        let mut cqs: Vec<usize> = (0..self.cqs.len()).collect();
        cqs.sort_by(|a, b| self.cqs[*a].spec.name.cmp(&self.cqs[*b].spec.name));
        for cq in cqs {
            let q = &self.cqs[cq];
            let mut resources = Vec::new();
            for g in &q.spec.groups {
                for slot in &g.flavors {
                    for (r, fr) in &slot.resources {
                        let u = self.usage(cq, *fr);
                        let n = self.nominal(cq, *fr);
                        resources.push(UsageEntry {
                            flavor: slot.flavor.clone(),
                            resource: r.clone(),
                            usage: Quantity(u).to_string(),
                            nominal_quota: Quantity(n).to_string(),
                            borrowed: Quantity((u - n).max(0)).to_string(),
                        });
                    }
                }
            }
            out.cluster_queues.push(QueueUsage {
                name: q.spec.name.clone(),
                cohort: self.cohorts[q.cohort].name.clone(),
                admitted_workloads: q.admitted.len(),
                pending_workloads: pending_per_cq.get(&cq).copied().unwrap_or(0),
                resources,
            });
        }
        out
    }

    /// The pending reason and message of `key` as [`Engine::final_state`] reports them
    /// (`None` when it is admitted, finished or unknown), without building the rest.
    pub fn pending_entry(&self, key: &str) -> Option<(String, String)> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        match w.state {
            WlState::Terminating => Some((
                "Terminating".to_string(),
                "evicted; waiting for its pods to terminate".to_string(),
            )),
            WlState::Pending | WlState::Backoff | WlState::Deactivated => Some((
                w.reason.code().to_string(),
                w.reason.message_as(self.position(id), self.cfg.positions),
            )),
            WlState::Admitted | WlState::Finished => None,
        }
    }

    /// The ClusterQueue `key` waits or runs in, when known.
    pub fn cluster_queue_of(&self, key: &str) -> Option<&str> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        let cq = w.admission.as_ref().map(|a| a.cq).or(w.cq)?;
        Some(self.cqs[cq].spec.name.as_str())
    }

    /// Whether ClusterQueue `cq` holds quota (for workloads admitted or terminating).
    pub fn uses_quota(&self, cq: &str) -> bool {
        self.cq_by_name
            .get(cq)
            .is_some_and(|&id| self.cqs[id].usage.values().any(|&v| v != 0))
    }

    /// The LocalQueue `(namespace, name)` workload `key` was submitted to.
    pub fn local_queue_of(&self, key: &str) -> Option<(&str, &str)> {
        let &id = self.wl_by_key.get(key)?;
        let info = &self.wls[id].info;
        Some((info.namespace.as_str(), info.queue_name.as_str()))
    }

    /// When the admission of `key` that holds its quota now began (`None` unless admitted).
    pub fn admitted_since(&self, key: &str) -> Option<super::quantity::Time> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        (w.state == WlState::Admitted)
            .then(|| w.admission.as_ref().map(|a| a.at))
            .flatten()
    }

    /// Where admitted `key` holds its quota: flavors per pod set and resource, whether it
    /// borrows, and its admitted pod counts (`None` unless admitted).
    pub fn admission_of(&self, key: &str) -> Option<(super::events::FlavorMap, bool, Vec<u32>)> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        if w.state != WlState::Admitted {
            return None;
        }
        let a = w.admission.as_ref()?;
        Some((a.flavors.clone(), a.borrowing, a.counts.clone()))
    }

    /// Whether `key` was ever submitted (a finished workload keeps its key: it cannot be
    /// submitted again).
    pub fn knows(&self, key: &str) -> bool {
        self.wl_by_key.contains_key(key)
    }

    /// Puts the parked workloads of `cq`'s cohort (or of `cq` alone, without one) whose
    /// reasons could have changed back in their queues, so the next
    /// [`Engine::schedule`] re-decides them against the books as they are now (a parked
    /// reason keeps the numbers it was decided on): with [`Positions::Ranged`] and no
    /// preemption in the cohort, only the first [`EXACT_PLACES`](super::events::EXACT_PLACES) of each queue, whose
    /// messages name the quota free now (see `wake.rs`); else all of them. Returns the
    /// names of the cohort's ClusterQueues.
    pub fn refresh_cohort_of(&mut self, cq: &str, now: super::quantity::Time) -> Vec<String> {
        let Some(&c) = self.cq_by_name.get(cq) else {
            return Vec::new();
        };
        let co = self.cqs[c].cohort;
        if self.cfg.positions == Positions::Ranged {
            self.wake_cohort_reasons(co, super::events::exact_places(), now);
        } else {
            self.wake_cohort_all(co, now);
        }
        self.cohorts[co]
            .members
            .iter()
            .map(|&m| self.cqs[m].spec.name.clone())
            .collect()
    }

    /// What the controller's metrics show of each ClusterQueue ([`QueueGauges`]), sorted
    /// by name: one walk over the queues and their `(flavor, resource)` quotas, no walk
    /// over the workloads.
    pub fn queue_gauges(&self) -> Vec<QueueGauges> {
        let mut out: Vec<QueueGauges> = self
            .cqs
            .iter()
            .enumerate()
            .map(|(c, q)| {
                // Quota held for waiting preemptors is reserved, not used (yet).
                let mut held: HashMap<usize, i64> = HashMap::new();
                for &h in &q.holders {
                    let w = &self.wls[h];
                    if w.cq == Some(c) {
                        for &(fr, n) in &w.reserved {
                            *held.entry(fr).or_insert(0) += n;
                        }
                    }
                }
                let status = self.cq_status(c);
                let mut resources = Vec::new();
                for g in &q.spec.groups {
                    for f in &g.flavors {
                        for (resource, fr) in &f.resources {
                            let Some(l) = q.spec.limits.get(fr) else {
                                continue;
                            };
                            let reservation = q.usage.get(fr).copied().unwrap_or(0);
                            resources.push(ResourceGauges {
                                flavor: f.flavor.clone(),
                                resource: resource.clone(),
                                nominal: l.nominal,
                                borrowing_limit: l.borrowing,
                                lending_limit: l.lending,
                                usage: reservation - held.get(fr).copied().unwrap_or(0),
                                reservation,
                            });
                        }
                    }
                }
                QueueGauges {
                    name: q.spec.name.clone(),
                    cohort: self.cohorts[q.cohort].name.clone().unwrap_or_default(),
                    active: q.pending.len(),
                    inadmissible: q.parked.len(),
                    admitted: q.admitted.len(),
                    status,
                    resources,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Kueue's `cluster_queue_status` of ClusterQueue `c`: `Pending` when it is stopped
    /// or names a ResourceFlavor that does not exist.
    fn cq_status(&self, c: usize) -> QueueStatus {
        let q = &self.cqs[c];
        if q.spec.stop != StopPolicy::None
            || q.spec.groups.iter().any(|g| {
                g.flavors
                    .iter()
                    .any(|f| !self.flavors.contains_key(&f.flavor))
            })
        {
            QueueStatus::Pending
        } else {
            QueueStatus::Active
        }
    }

    /// What the controller's metrics show of each LocalQueue ([`LocalQueueGauges`]),
    /// sorted by namespace and name: one walk over the LocalQueues and their
    /// ClusterQueue's `(flavor, resource)` quotas, and over the per-LocalQueue counts the
    /// queues keep as workloads come and go (none over the workloads, but the few
    /// preemptors holding a reservation, as [`Engine::queue_gauges`]).
    pub fn local_queue_gauges(&self) -> Vec<LocalQueueGauges> {
        let mut waiting: HashMap<usize, (usize, usize)> = HashMap::new();
        let mut held: HashMap<(usize, usize), i64> = HashMap::new();
        for (c, q) in self.cqs.iter().enumerate() {
            for (lq, n) in q.pending.per_local_queue() {
                waiting.entry(lq).or_default().0 += n;
            }
            for (lq, n) in q.parked.per_local_queue() {
                waiting.entry(lq).or_default().1 += n;
            }
            for &h in &q.holders {
                let w = &self.wls[h];
                if w.cq == Some(c) {
                    for &(fr, n) in &w.reserved {
                        *held.entry((w.lq, fr)).or_insert(0) += n;
                    }
                }
            }
        }
        let mut out: Vec<LocalQueueGauges> = self
            .local_queues
            .iter()
            .map(|((namespace, name), cq_name)| {
                let lq = self.lq_by_name.get(&(namespace.clone(), name.clone()));
                let books = lq.and_then(|&l| self.lqs.get(l));
                let (active, inadmissible) =
                    lq.and_then(|l| waiting.get(l)).copied().unwrap_or_default();
                let cq = self.cq_by_name.get(cq_name).copied();
                let mut resources = Vec::new();
                if let Some(c) = cq {
                    for g in &self.cqs[c].spec.groups {
                        for f in &g.flavors {
                            for (resource, fr) in &f.resources {
                                let fr = *fr;
                                if !self.cqs[c].spec.limits.contains_key(&fr) {
                                    continue;
                                }
                                let usage =
                                    books.and_then(|b| b.usage.get(&fr)).copied().unwrap_or(0);
                                let reserved =
                                    lq.and_then(|&l| held.get(&(l, fr))).copied().unwrap_or(0);
                                resources.push(LocalQueueResource {
                                    flavor: f.flavor.clone(),
                                    resource: resource.clone(),
                                    usage,
                                    reservation: usage + reserved,
                                });
                            }
                        }
                    }
                }
                LocalQueueGauges {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    active,
                    inadmissible,
                    admitted: books.map_or(0, |b| b.admitted),
                    cluster_queue_active: cq
                        .is_some_and(|c| self.cq_status(c) == QueueStatus::Active),
                    resources,
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// When `key` was created (or requeued, with `requeuingTimestamp: Eviction`): what
    /// its wait for admission is measured from.
    pub fn created_at(&self, key: &str) -> Option<super::quantity::Time> {
        let &id = self.wl_by_key.get(key)?;
        Some(self.wls[id].info.creation)
    }

    /// Per ClusterQueue, by name: (admitted, waiting in the queue) workloads. Equal to the
    /// counts of [`Engine::final_state`] while no workload terminates, backs off or is
    /// deactivated (those count as pending there and are not in a queue).
    pub fn queue_counts(&self) -> Vec<(String, usize, usize)> {
        let mut out: Vec<(String, usize, usize)> = self
            .cqs
            .iter()
            .map(|q| {
                (
                    q.spec.name.clone(),
                    q.admitted.len(),
                    q.pending.len() + q.parked.len(),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Checks the books: usage equals the sum of admissions and reservations, no queue above
    /// `nominal + borrowingLimit`, no cohort above its lendable pool, every workload in
    /// exactly one place. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut expect: HashMap<(usize, usize), i64> = HashMap::new();
        for (id, w) in self.wls.iter().enumerate() {
            let held = matches!(w.state, WlState::Admitted | WlState::Terminating);
            if held != w.admission.is_some() {
                return Err(format!(
                    "{}: state {:?} but admission {:?}",
                    w.key,
                    w.state,
                    w.admission.is_some()
                ));
            }
            if !w.reserved.is_empty() {
                let waiting = w.state == WlState::Pending && !w.awaiting.is_empty();
                let Some(cq) = w.cq.filter(|_| waiting) else {
                    return Err(format!(
                        "{} holds a reservation but waits for no victim ({:?}, {:?})",
                        w.key, w.state, w.reason
                    ));
                };
                for &(fr, v) in &w.reserved {
                    *expect.entry((cq, fr)).or_default() += v;
                }
            }
            if let Some(a) = &w.admission {
                for &(fr, v) in &a.usage {
                    *expect.entry((a.cq, fr)).or_default() += v;
                }
                if w.state == WlState::Admitted && !self.cqs[a.cq].admitted.contains(&id) {
                    return Err(format!("{} admitted but not listed in its queue", w.key));
                }
            }
            let places = w.cq.map_or(0, |cq| {
                let key = w.order_key(id);
                let q = &self.cqs[cq];
                q.pending.contains(&key) as usize + q.parked.contains(&key) as usize
            }) + self.orphans.contains(&id) as usize;
            let want = (w.state == WlState::Pending) as usize;
            if places != want {
                return Err(format!(
                    "{} ({:?}) is queued {places} times",
                    w.key, w.state
                ));
            }
        }
        self.check_local_queue_books()?;
        for (cq, q) in self.cqs.iter().enumerate() {
            for (&fr, &u) in &q.usage {
                let e = expect.get(&(cq, fr)).copied().unwrap_or(0);
                if u != e {
                    return Err(format!(
                        "queue {} usage {u} != admitted and reserved sum {e}",
                        q.spec.name
                    ));
                }
                if u < 0 {
                    return Err(format!("queue {} negative usage", q.spec.name));
                }
            }
        }
        // A workload restored over its lowered quota keeps it: the limits hold again once
        // none such holds quota.
        if self
            .over_quota
            .iter()
            .any(|&id| self.wls[id].admission.is_some())
        {
            return Ok(());
        }
        let mut pool: BTreeMap<(usize, usize), (i64, i64)> = BTreeMap::new();
        for (cq, q) in self.cqs.iter().enumerate() {
            for (&fr, l) in &q.spec.limits {
                let u = self.usage(cq, fr);
                if let Some(b) = l.borrowing {
                    if u > l.nominal + b {
                        return Err(format!(
                            "queue {} above nominal+borrowingLimit",
                            q.spec.name
                        ));
                    }
                }
                let e = pool.entry((q.cohort, fr)).or_default();
                e.0 += l.lendable();
                e.1 += (u - l.guaranteed()).max(0);
            }
        }
        for ((co, fr), (lendable, used)) in pool {
            if used > lendable {
                let (f, r) = &self.fr_names[fr];
                return Err(format!(
                    "cohort #{co} uses {used} of {r}/{f} above guarantees but lends only {lendable}"
                ));
            }
        }
        Ok(())
    }
}

impl Engine {
    /// Checks the per-LocalQueue counts the queues and books keep against a walk over
    /// the workloads: waiting in each ClusterQueue's queue and parked, admitted, and the
    /// usage of admissions held.
    fn check_local_queue_books(&self) -> Result<(), String> {
        type Walked = (usize, usize, usize, BTreeMap<usize, i64>);
        let mut walked: BTreeMap<usize, Walked> = BTreeMap::new();
        let mut kept: BTreeMap<usize, Walked> = BTreeMap::new();
        for (id, w) in self.wls.iter().enumerate() {
            let e = walked.entry(w.lq).or_default();
            if let Some(cq) = w.cq {
                let key = w.order_key(id);
                e.0 += self.cqs[cq].pending.contains(&key) as usize;
                e.1 += self.cqs[cq].parked.contains(&key) as usize;
            }
            if let Some(a) = &w.admission {
                e.2 += self.cqs[a.cq].admitted.contains(&id) as usize;
                for &(fr, v) in &a.usage {
                    *e.3.entry(fr).or_insert(0) += v;
                }
            }
            e.3.retain(|_, v| *v != 0);
        }
        for q in &self.cqs {
            for (lq, n) in q.pending.per_local_queue() {
                kept.entry(lq).or_default().0 += n;
            }
            for (lq, n) in q.parked.per_local_queue() {
                kept.entry(lq).or_default().1 += n;
            }
        }
        for (lq, b) in self.lqs.iter().enumerate() {
            let e = kept.entry(lq).or_default();
            e.2 = b.admitted;
            e.3 = b.usage.iter().map(|(&fr, &v)| (fr, v)).collect();
        }
        walked.retain(|_, e| *e != Walked::default());
        kept.retain(|_, e| *e != Walked::default());
        if walked != kept {
            return Err(format!(
                "LocalQueue books {kept:?} != walked over the workloads {walked:?}"
            ));
        }
        Ok(())
    }

    /// Parked workloads that could be admitted (or could preempt) right now: after
    /// [`Engine::schedule`] this must be empty, or a wake-up was missed. For tests.
    pub fn admissible_but_parked(&mut self, now: super::quantity::Time) -> Vec<String> {
        // While admission is blocked on pods ready nothing is admissible; the held
        // queues are scheduled again when the block ends.
        if self.admission_blocked() {
            return Vec::new();
        }
        let mut keys = Vec::new();
        for q in &self.cqs {
            if q.spec.stop != super::api::StopPolicy::None {
                continue;
            }
            // A preemptor waiting for its victims holds its queue's head on purpose: the
            // workloads parked behind it wait for it (they are woken by the releases).
            let held = q.blocked.as_ref().is_some_and(|b| {
                matches!(
                    self.wls[b.3].reason,
                    super::events::PendingReason::WaitingForPreemptedWorkloads(_)
                )
            });
            if !held {
                keys.extend(q.parked.iter().cloned());
            }
            keys.extend(q.blocked.clone());
        }
        let stats = self.stats.clone();
        let mut out = Vec::new();
        for key in keys {
            let id = key.3;
            if matches!(
                self.wls[id].reason,
                super::events::PendingReason::WaitingForPreemptedWorkloads(_)
                    | super::events::PendingReason::MinimumRuntime { .. }
            ) {
                continue;
            }
            let versions: Vec<u64> = self.cohorts.iter().map(|c| c.version).collect();
            let d = self.evaluate(id, now);
            for (c, v) in self.cohorts.iter_mut().zip(versions) {
                c.version = v;
            }
            if !matches!(d, super::decide::Decision::Fail { .. }) {
                out.push(self.wls[id].key.to_string());
            }
        }
        self.stats = stats;
        out
    }
}

/// Whether a ClusterQueue can admit (Kueue's `cluster_queue_status`): `Pending` when it
/// is stopped or names a ResourceFlavor that does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueStatus {
    Pending,
    Active,
}

impl QueueStatus {
    /// Kueue's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueStatus::Pending => "pending",
            QueueStatus::Active => "active",
        }
    }
}

/// One ClusterQueue's numbers for the controller's metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueGauges {
    pub name: String,
    /// Its cohort (empty without one).
    pub cohort: String,
    /// Waiting workloads in the queue, to be evaluated (Kueue's `active`).
    pub active: usize,
    /// Waiting workloads parked after a failed attempt until something changes
    /// (Kueue's `inadmissible`). How the waiting workloads split between the two
    /// depends on the engine's history (a restarted controller tries them all again).
    pub inadmissible: usize,
    /// Admitted workloads (Kueue's `admitted_active_workloads`).
    pub admitted: usize,
    pub status: QueueStatus,
    /// Per `(flavor, resource)` of its resource groups, in spec order.
    pub resources: Vec<ResourceGauges>,
}

/// Quota and use of one `(flavor, resource)` of a ClusterQueue, in milli-units.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceGauges {
    pub flavor: String,
    pub resource: String,
    pub nominal: i64,
    pub borrowing_limit: Option<i64>,
    pub lending_limit: Option<i64>,
    /// Held by admitted workloads and by evicted ones still terminating.
    pub usage: i64,
    /// `usage` plus what is held for preemptors waiting for their victims.
    pub reservation: i64,
}

/// One LocalQueue's numbers for the controller's metrics (Kueue's `local_queue_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct LocalQueueGauges {
    pub namespace: String,
    pub name: String,
    /// Its waiting workloads in their ClusterQueue's queue (Kueue's `active`) and parked
    /// after a failed attempt (`inadmissible`), as [`QueueGauges`] splits them.
    pub active: usize,
    pub inadmissible: usize,
    /// Its admitted workloads (Kueue's `admitted_active_workloads`).
    pub admitted: usize,
    /// Whether its ClusterQueue exists and is active (Kueue's LocalQueue `Active`
    /// condition).
    pub cluster_queue_active: bool,
    /// Per `(flavor, resource)` of its ClusterQueue's resource groups, in spec order
    /// (none while the ClusterQueue does not exist).
    pub resources: Vec<LocalQueueResource>,
}

/// What one LocalQueue's workloads hold of one `(flavor, resource)`, in milli-units.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalQueueResource {
    pub flavor: String,
    pub resource: String,
    /// Held by its admitted workloads and by evicted ones still terminating.
    pub usage: i64,
    /// `usage` plus what is held for its preemptors waiting for their victims.
    pub reservation: i64,
}
