//! The admission engine: queues, cohorts, workloads and the scheduling cycle.
//!
//! Pure and clock-free: every call takes the current time as an argument, and timers
//! (runtime end, pods-ready timeout, requeue backoff, minimum-runtime gates) are returned
//! through [`Engine::next_timer`] and fired by [`Engine::advance_to`].
//!
//! ```text
//! submit ──► ClusterQueue.pending ──cycle: one head per queue──► evaluate
//!                 ▲                                   │ fits / victims found ─► Admitted
//!                 │ woken: a release in the cohort    │ does not fit
//!                 │ covers its recorded shortfall     ▼
//!                 └──────────────── parked (BestEffortFIFO) / queue blocked (StrictFIFO)
//! ```
//! A cycle touches only the head of each queue with work; parked workloads cost nothing
//! until a release in their cohort is large enough to possibly admit them (see `wake.rs`).

use super::api::{
    ClusterQueue, LocalQueue, QueueingStrategy, ResourceFlavor, ResourceFlavorSpec, StopPolicy,
    WorkloadPriorityClass,
};
use super::error::{Error, Result};
use super::events::{Event, FlavorMap, PendingReason, Positions};
use super::keyset::KeySet;
use super::model::{CqId, CqSpec, FrId, LqId, WlId, WorkloadInfo};
use super::quantity::Time;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

/// Queue order: higher priority first, then older timestamp, then workload key
/// (`namespace/name`): deterministic ties, whatever the order of submission. Kueue leaves
/// equal-timestamp ties to its heap; a fixed rule lets a kept engine and a fresh pass agree.
/// The last element, the workload's LocalQueue, never decides the order (the id before it
/// is unique): it lets a queue count its members per LocalQueue ([`KeySet`]).
pub(crate) type OrderKey = (i64, Time, Arc<str>, WlId, LqId);

/// Kueue's `waitForPodsReady` with its `requeuingStrategy`.
#[derive(Clone, Debug, PartialEq)]
pub struct WaitForPodsReady {
    /// Time from admission for all pods to be ready (Kueue default 5m).
    pub timeout: Time,
    /// First requeue delay; doubles each time (Kueue default 60s). No jitter.
    pub backoff_base: Time,
    /// Cap of the requeue delay (Kueue default 3600s).
    pub backoff_max: Time,
    /// After this many requeues the workload is deactivated; `None`: never.
    pub backoff_limit_count: Option<u32>,
    /// `requeuingStrategy.timestamp: Eviction` (default) orders a requeued workload by
    /// its eviction time; `Creation` keeps its creation time.
    pub requeue_by_eviction_time: bool,
    /// `blockAdmission`: while an admitted workload's pods are not all ready, nothing
    /// else is admitted (Kueue's sequential admission).
    pub block_admission: bool,
}

impl Default for WaitForPodsReady {
    fn default() -> Self {
        WaitForPodsReady {
            timeout: 300_000,
            backoff_base: 60_000,
            backoff_max: 3_600_000,
            backoff_limit_count: None,
            requeue_by_eviction_time: true,
            block_admission: false,
        }
    }
}

/// How parked (inadmissible) workloads come back for another try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requeue {
    /// Only when a release in the cohort covers the shortfall recorded at parking time.
    #[default]
    Indexed,
    /// Naive baseline for benchmarks: every release or arrival in a cohort puts every
    /// parked workload of that cohort back in its queue.
    FullRescan,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub wait_for_pods_ready: Option<WaitForPodsReady>,
    /// Keep an event log (turn off for large simulations).
    pub record_events: bool,
    pub requeue: Requeue,
    /// Guard against a scheduling bug: most cycles per `schedule` call.
    pub max_cycles: u64,
    /// How queue places are written into pending messages (exact for `tessera plan`,
    /// ranged for the controller, which writes every change).
    pub positions: Positions,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            wait_for_pods_ready: None,
            record_events: true,
            requeue: Requeue::Indexed,
            max_cycles: 100_000,
            positions: Positions::Exact,
        }
    }
}

/// Counters for tests and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub cycles: u64,
    /// Flavor-assignment attempts (the unit of scheduling work).
    pub evaluations: u64,
    pub admissions: u64,
    pub preemptions: u64,
    /// Parked workloads put back in their queue.
    pub wakes: u64,
    /// Evaluations answered by an identical workload's fresh failure.
    pub memo_hits: u64,
    /// Waiting workloads [`Engine::report_line`] looked at (its cost).
    pub line_looks: u64,
}

/// Key and answer of the last victim search.
pub(crate) type VictimMemo = (WlId, Vec<(FrId, i64)>, Time, u64, super::preempt::Victims);

/// Wake-up index entries: `(threshold on cumulative releases, seq) -> (workload, gen)`.
pub(crate) type WakeIndex = HashMap<FrId, BTreeMap<(i64, u64), (WlId, u64)>>;

/// Runtime state of a ClusterQueue.
pub(crate) struct Cq {
    pub spec: Arc<CqSpec>,
    pub cohort: usize,
    pub usage: HashMap<FrId, i64>,
    pub by_prio: HashMap<FrId, BTreeMap<i32, i64>>,
    /// Workloads to evaluate, in queue order.
    pub pending: KeySet,
    /// Inadmissible workloads waiting for a wake-up.
    pub parked: KeySet,
    /// Parked workloads grouped by shape: only one member of a class holds wake keys
    /// (`armed`), and a wake-up moves the class's first member back to the queue.
    pub classes: HashMap<u64, ShapeClass>,
    /// StrictFIFO: the head that does not fit and blocks the queue.
    pub blocked: Option<OrderKey>,
    pub admitted: BTreeSet<WlId>,
    /// Waiting preemptors of this queue that held a reservation (pruned lazily, see
    /// `reserve.rs`): a workload ahead of them in queue order may use what they hold.
    pub holders: BTreeSet<WlId>,
    pub released: HashMap<FrId, i64>,
    pub wake: WakeIndex,
    /// Level keys: wake when this queue's usage drops to `-key` or below.
    pub wake_usage: WakeIndex,
    /// The last failed decision, reused for an identical workload (same shape and
    /// priority) evaluated at the same time against unchanged books.
    pub fail_memo: Option<(u64, Time, u64, super::decide::Decision)>,
    /// Capacity a scale-down freed, kept from expensive borrowers (`hold.rs`).
    pub holds: HashMap<FrId, super::hold::Hold>,
    /// How far the places reported in this queue can have moved (`line.rs`).
    pub line: super::line::LineMarks,
}

/// What one LocalQueue's workloads hold, kept as they are admitted and released.
#[derive(Clone, Debug, Default)]
pub(crate) struct LqBooks {
    /// Admitted workloads (Kueue's `admitted_active_workloads`).
    pub admitted: usize,
    /// Quota held by its admitted workloads and its evicted ones still terminating
    /// (milli-units), per `(flavor, resource)`.
    pub usage: HashMap<FrId, i64>,
}

/// Identical parked workloads of one queue (see [`Cq::classes`]).
#[derive(Default)]
pub(crate) struct ShapeClass {
    pub members: BTreeSet<OrderKey>,
    pub armed: bool,
}

/// Runtime state of a cohort (a queue without `cohortName` is alone in its own).
pub(crate) struct Cohort {
    pub name: Option<String>,
    pub members: Vec<CqId>,
    /// Sum of lendable quota of the members.
    pub lendable: HashMap<FrId, i64>,
    /// Sum over members of usage above their guaranteed (non-lendable) quota.
    pub pool_used: HashMap<FrId, i64>,
    pub by_prio: HashMap<FrId, BTreeMap<i32, i64>>,
    pub released: HashMap<FrId, i64>,
    pub wake: WakeIndex,
    /// Level keys: wake when the cohort's free lendable quota reaches the key.
    pub wake_free: WakeIndex,
    /// Parked workloads that may reclaim from borrowers: woken when an admission
    /// leaves a queue borrowing (its workloads become reclaim candidates).
    pub reclaimers: WakeIndex,
    /// Bumped on every usage change; a cycle re-evaluates stale decisions.
    pub version: u64,
}

/// What a workload is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WlState {
    Pending,
    Admitted,
    /// Evicted, holding quota until its pods are gone.
    Terminating,
    Backoff,
    Deactivated,
    Finished,
}

/// An admission: where the workload runs and what it holds.
#[derive(Clone, Debug)]
pub(crate) struct Admission {
    pub cq: CqId,
    pub at: Time,
    pub usage: Vec<(FrId, i64)>,
    pub flavors: FlavorMap,
    pub counts: Vec<u32>,
    pub borrowing: bool,
}

/// Runtime state of a workload.
pub(crate) struct Wl {
    pub info: Arc<WorkloadInfo>,
    pub key: Arc<str>,
    /// Its LocalQueue (`info.namespace`, `info.queue_name`), interned.
    pub lq: LqId,
    pub priority: i32,
    pub order_ts: Time,
    pub cq: Option<CqId>,
    pub state: WlState,
    /// Bumped on every state change; stale timers and wake entries are ignored.
    pub gen: u64,
    pub reason: PendingReason,
    pub reported: Option<(&'static str, String)>,
    /// The place `reported` was written for (`line::place_key`).
    pub reported_place: (usize, usize),
    /// The [`Engine::flush_epoch`] of the last flush that compared its message with
    /// `reported` (a moved line needs no second look at it: `Engine::report_line`).
    pub checked: u64,
    pub requeues: u32,
    /// Work saved by checkpoints (or completed) across runs.
    pub progress: Time,
    pub admission: Option<Admission>,
    /// Hash of what admission depends on (priority, pod sets): equal shapes decide alike.
    pub shape: u64,
    /// Set when it was admitted by preempting others at this time: it cannot be a
    /// victim in the same instant (no preemption cycles within one scheduling pass).
    pub preempted_in_at: Option<Time>,
    /// The workload that last preempted this one: never its victim in return (no
    /// preemption ping-pong between two workloads).
    pub preempted_by: Option<WlId>,
    /// When it was first admitted (for time-to-admission).
    pub first_admitted: Option<Time>,
    /// Why it is terminating (set while its grace period runs).
    pub evicting: Option<EvictCause>,
    /// Victims this workload preempted that may still be terminating: while any is, it
    /// keeps the head of its queue (see `Engine::still_terminating_for`).
    pub awaiting: Vec<WlId>,
    /// Quota held for this workload while it waits for its victims (`reserve.rs`):
    /// counted as usage of its queue, so no other workload takes it meanwhile.
    pub reserved: Vec<(FrId, i64)>,
    /// What the waiting preemptor needs: its reservation grows up to this.
    pub reserve_target: Vec<(FrId, i64)>,
}

impl Wl {
    pub fn order_key(&self, id: WlId) -> OrderKey {
        (
            -(self.priority as i64),
            self.order_ts,
            self.key.clone(),
            id,
            self.lq,
        )
    }
}

/// Timer kinds; each carries the workload generation it was set for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    Finish(WlId, u64),
    ReadyTimeout(WlId, u64),
    BackoffEnd(WlId, u64),
    Wake(WlId, u64),
    TerminateDone(WlId, u64),
    /// Its pods became ready (tracked for `blockAdmission`).
    PodsReady(WlId, u64),
}

impl Timer {
    /// The workload the timer was set for, and that workload's generation then.
    pub(crate) fn parts(self) -> (WlId, u64) {
        match self {
            Timer::Finish(i, g)
            | Timer::ReadyTimeout(i, g)
            | Timer::BackoffEnd(i, g)
            | Timer::Wake(i, g)
            | Timer::TerminateDone(i, g)
            | Timer::PodsReady(i, g) => (i, g),
        }
    }
}

/// `blockAdmission`: where a schedule started holding admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStart {
    /// The schedule's cycle (from 1) of the admission that started the hold.
    pub cycle: u64,
    /// Whether the workload admitted was then the first waiting one of its queue.
    pub front: bool,
}

/// The quota admission engine.
pub struct Engine {
    pub(crate) cfg: EngineConfig,
    pub(crate) flavors: HashMap<String, ResourceFlavorSpec>,
    pub(crate) cqs: Vec<Cq>,
    pub(crate) cq_by_name: HashMap<String, CqId>,
    pub(crate) cohorts: Vec<Cohort>,
    pub(crate) cohort_by_name: HashMap<String, usize>,
    pub(crate) local_queues: HashMap<(String, String), String>,
    /// Every LocalQueue `(namespace, name)` a workload was submitted to, by [`LqId`],
    /// with what its admitted workloads hold ([`LqBooks`]).
    pub(crate) lq_by_name: HashMap<(String, String), LqId>,
    pub(crate) lqs: Vec<LqBooks>,
    pub(crate) priority_classes: HashMap<String, i32>,
    pub(crate) namespaces: HashMap<String, BTreeMap<String, String>>,
    pub(crate) fr_names: Vec<(String, String)>,
    pub(crate) fr_by_name: HashMap<(String, String), FrId>,
    pub(crate) wls: Vec<Wl>,
    pub(crate) wl_by_key: HashMap<String, WlId>,
    /// Workloads whose LocalQueue or ClusterQueue does not exist (yet).
    pub(crate) orphans: BTreeSet<WlId>,
    /// Queues with workloads to evaluate.
    pub(crate) ready: BTreeSet<CqId>,
    /// `blockAdmission`: admitted workloads whose pods are not all ready yet.
    pub(crate) unready: BTreeSet<WlId>,
    /// `blockAdmission`: queues with work held until `unready` is empty.
    pub(crate) held: BTreeSet<CqId>,
    /// `blockAdmission`: the held queues' heads told `WaitingForPodsReady`.
    held_heads: BTreeSet<WlId>,
    /// `blockAdmission`: where the last [`Engine::schedule`] started holding admission,
    /// if an admission in it did ([`BlockStart`]).
    block_start: Option<BlockStart>,
    /// Cycles run by the current (or last) [`Engine::schedule`].
    schedule_cycles: u64,
    /// Flushes of pending events so far (see `Wl::checked`).
    pub(crate) flush_epoch: u64,
    /// Waiting workloads whose last report the controller had the engine forget
    /// ([`Engine::forget_reported`]): reported again on the next look at their line.
    pub(crate) forgotten: BTreeSet<WlId>,
    /// Classes of identical parked workloads, as `(queue, shape)`, whose first member
    /// was re-decided for a changed ClusterQueue spec, with what its members told
    /// before ([`super::wake::told`]): the rest follow it unless it is told otherwise
    /// now ([`Engine::update_cluster_queue`]).
    pub(crate) spec_probes: Vec<(CqId, u64, (&'static str, String))>,
    /// Admitted workloads told ready by [`Engine::mark_pods_ready`]: their pods-ready
    /// timeout timer no longer counts (until they are admitted again).
    pub(crate) ready_marked: BTreeSet<WlId>,
    /// Workloads restored over their queue's quota ([`Engine::restore_admitted`]): while
    /// one still holds quota, usage may exceed the limits (`check_invariants`).
    pub(crate) over_quota: BTreeSet<WlId>,
    pub(crate) timers: BinaryHeap<Reverse<(Time, u64, Timer)>>,
    pub(crate) events: Vec<Event>,
    /// Workloads whose pending reason may need an event at the end of `schedule`.
    pub(crate) dirty: Vec<WlId>,
    pub(crate) seq: u64,
    pub(crate) now: Time,
    /// Sum of all queues' usage (milli-units), kept up to date for cheap read-outs.
    pub(crate) usage_total: i64,
    /// Last victim search `(workload, request, now, cohort version) -> result`: the
    /// flavor oracle and the final search often ask the same question back to back.
    pub(crate) victim_memo: Option<VictimMemo>,
    /// When each queue's holds end (`hold.rs`).
    pub(crate) hold_ends: BTreeSet<(Time, CqId)>,
    /// Workloads a hold kept quota from, woken when their cohort's holds end.
    pub(crate) held_back: BTreeSet<WlId>,
    pub stats: Stats,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        Engine {
            cfg,
            flavors: HashMap::new(),
            cqs: Vec::new(),
            cq_by_name: HashMap::new(),
            cohorts: Vec::new(),
            cohort_by_name: HashMap::new(),
            local_queues: HashMap::new(),
            lq_by_name: HashMap::new(),
            lqs: Vec::new(),
            priority_classes: HashMap::new(),
            namespaces: HashMap::new(),
            fr_names: Vec::new(),
            fr_by_name: HashMap::new(),
            wls: Vec::new(),
            wl_by_key: HashMap::new(),
            orphans: BTreeSet::new(),
            ready: BTreeSet::new(),
            unready: BTreeSet::new(),
            held: BTreeSet::new(),
            held_heads: BTreeSet::new(),
            block_start: None,
            schedule_cycles: 0,
            flush_epoch: 0,
            forgotten: BTreeSet::new(),
            spec_probes: Vec::new(),
            over_quota: BTreeSet::new(),
            ready_marked: BTreeSet::new(),
            timers: BinaryHeap::new(),
            events: Vec::new(),
            dirty: Vec::new(),
            seq: 0,
            now: 0,
            usage_total: 0,
            victim_memo: None,
            hold_ends: BTreeSet::new(),
            held_back: BTreeSet::new(),
            stats: Stats::default(),
        }
    }

    fn intern_lq(&mut self, namespace: &str, name: &str) -> LqId {
        let key = (namespace.to_string(), name.to_string());
        if let Some(&lq) = self.lq_by_name.get(&key) {
            return lq;
        }
        self.lqs.push(LqBooks::default());
        self.lq_by_name.insert(key, self.lqs.len() - 1);
        self.lqs.len() - 1
    }

    /// A workload starts (`sign` 1) or stops (-1) holding its admission: its LocalQueue's
    /// books follow.
    pub(crate) fn lq_books_apply(&mut self, id: WlId, usage: &[(FrId, i64)], sign: i64) {
        let b = &mut self.lqs[self.wls[id].lq];
        for &(fr, v) in usage {
            let e = b.usage.entry(fr).or_insert(0);
            *e += sign * v;
            if *e == 0 {
                b.usage.remove(&fr);
            }
        }
    }

    pub(crate) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Creates or replaces a ResourceFlavor.
    pub fn apply_flavor(&mut self, rf: &ResourceFlavor, now: Time) -> Result<()> {
        if rf.metadata.name.is_empty() {
            return Err(Error::Invalid {
                kind: "ResourceFlavor",
                name: String::new(),
                field: "metadata.name".into(),
                why: "must not be empty".into(),
            });
        }
        self.flavors
            .insert(rf.metadata.name.clone(), rf.spec.clone());
        self.wake_everything(now);
        Ok(())
    }

    /// Creates or replaces a WorkloadPriorityClass (used by workloads submitted later).
    pub fn apply_priority_class(&mut self, pc: &WorkloadPriorityClass) -> Result<()> {
        if pc.metadata.name.is_empty() {
            return Err(Error::Invalid {
                kind: "WorkloadPriorityClass",
                name: String::new(),
                field: "metadata.name".into(),
                why: "must not be empty".into(),
            });
        }
        self.priority_classes
            .insert(pc.metadata.name.clone(), pc.value);
        Ok(())
    }

    /// Forgets a WorkloadPriorityClass (workloads submitted later cannot name it).
    pub fn remove_priority_class(&mut self, name: &str) {
        self.priority_classes.remove(name);
    }

    /// Sets (`Some`) or forgets (`None`) a Namespace's labels without re-deciding
    /// anything: for a namespace whose labels no queue of its workloads selects by
    /// (the caller knows). [`Engine::apply_namespace`] re-decides everything.
    pub fn note_namespace(&mut self, name: &str, labels: Option<BTreeMap<String, String>>) {
        match labels {
            Some(l) => self.namespaces.insert(name.to_string(), l),
            None => self.namespaces.remove(name),
        };
    }

    /// Creates or replaces a Namespace's labels (for `namespaceSelector`).
    pub fn apply_namespace(&mut self, name: &str, labels: BTreeMap<String, String>, now: Time) {
        self.namespaces.insert(name.to_string(), labels);
        self.wake_everything(now);
    }

    /// Creates or replaces a LocalQueue.
    pub fn apply_local_queue(&mut self, lq: &LocalQueue, now: Time) -> Result<()> {
        let ns = lq
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        if lq.metadata.name.is_empty() || lq.spec.cluster_queue.is_empty() {
            return Err(Error::Invalid {
                kind: "LocalQueue",
                name: format!("{ns}/{}", lq.metadata.name),
                field: if lq.metadata.name.is_empty() {
                    "metadata.name".into()
                } else {
                    "spec.clusterQueue".into()
                },
                why: "must not be empty".into(),
            });
        }
        self.local_queues.insert(
            (ns, lq.metadata.name.clone()),
            lq.spec.cluster_queue.clone(),
        );
        self.rehome_orphans(now);
        Ok(())
    }

    /// Deletes LocalQueue `name` of `namespace`: the workloads submitted to it from now on
    /// wait `LocalQueueNotFound`. Those already queued or admitted through it stay
    /// where they are; a caller removes and submits them again to move them out.
    pub fn remove_local_queue(&mut self, namespace: &str, name: &str) {
        self.local_queues
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Creates or replaces a ClusterQueue. Admitted workloads keep their admission; the
    /// parked workloads of its cohort queue again.
    pub fn apply_cluster_queue(&mut self, cq: &ClusterQueue, now: Time) -> Result<()> {
        let (cohort, _) = self.replace_cluster_queue(cq, now)?;
        self.wake_cohort_all(cohort, now);
        Ok(())
    }

    /// [`Engine::apply_cluster_queue`] for a caller that reports what an engine built
    /// with the new queue would ([`Positions::Ranged`](super::events::Positions)): in a
    /// cohort where no queue preempts (before or after) and a parked workload's reason
    /// follows from its request and its queue alone, only each queue's first
    /// [`exact_places`](super::events::exact_places) parked workloads (their messages name
    /// the quota free) and the first of each class of identical ones are re-decided; once
    /// a schedule settles, a class whose first member would now be told otherwise is
    /// re-decided whole. A quota raised under a long queue then costs its classes, not
    /// its length. Elsewhere every parked workload of the cohort is re-decided.
    pub fn update_cluster_queue(&mut self, cq: &ClusterQueue, now: Time) -> Result<()> {
        let (cohort, preempted_before) = self.replace_cluster_queue(cq, now)?;
        self.wake_cohort_spec(cohort, preempted_before, now);
        Ok(())
    }

    /// Creates or replaces a ClusterQueue and re-homes the workloads waiting for it:
    /// its cohort, and whether its old spec could preempt.
    fn replace_cluster_queue(&mut self, cq: &ClusterQueue, now: Time) -> Result<(usize, bool)> {
        let (names, by_name) = (&mut self.fr_names, &mut self.fr_by_name);
        let spec = CqSpec::compile(cq, |f, r| intern_fr(names, by_name, f, r))?;
        let name = spec.name.clone();
        let cohort_key = spec.cohort.clone();
        // Reservations were sized for the old limits of the cohorts this queue leaves or
        // joins: give them back first.
        let touched: Vec<usize> = [
            self.cq_by_name.get(&name).map(|&id| self.cqs[id].cohort),
            cohort_key
                .as_ref()
                .and_then(|c| self.cohort_by_name.get(c).copied()),
        ]
        .into_iter()
        .flatten()
        .collect();
        for co in touched {
            for m in self.cohorts[co].members.clone() {
                self.end_reservations_in(m, now);
            }
        }
        // A queue without a cohort keeps its own (unnamed) one across changes.
        let mut own_cohort = None;
        let mut preempted_before = false;
        let id = match self.cq_by_name.get(&name) {
            Some(&id) => {
                preempted_before = self.cqs[id].spec.can_preempt();
                let old_cohort = self.cqs[id].cohort;
                self.cohorts[old_cohort].members.retain(|&m| m != id);
                self.recompute_cohort(old_cohort);
                if self.cohorts[old_cohort].name.is_none() {
                    own_cohort = Some(old_cohort);
                }
                self.cqs[id].spec = Arc::new(spec);
                // A failure remembered under the old spec says nothing of the new one
                // (the cohort's version alone may repeat).
                self.cqs[id].fail_memo = None;
                id
            }
            None => {
                let id = self.cqs.len();
                self.cqs.push(Cq {
                    spec: Arc::new(spec),
                    cohort: usize::MAX,
                    usage: HashMap::new(),
                    by_prio: HashMap::new(),
                    pending: KeySet::default(),
                    parked: KeySet::default(),
                    classes: HashMap::new(),
                    blocked: None,
                    admitted: BTreeSet::new(),
                    holders: BTreeSet::new(),
                    released: HashMap::new(),
                    wake: HashMap::new(),
                    wake_usage: HashMap::new(),
                    fail_memo: None,
                    holds: HashMap::new(),
                    line: Default::default(),
                });
                self.cq_by_name.insert(name.clone(), id);
                id
            }
        };
        let cohort = match cohort_key {
            Some(c) => match self.cohort_by_name.get(&c) {
                Some(&co) => co,
                None => {
                    let co = self.new_cohort(Some(c.clone()));
                    self.cohort_by_name.insert(c, co);
                    co
                }
            },
            None => match own_cohort {
                Some(co) => co,
                None => self.new_cohort(None),
            },
        };
        self.cqs[id].cohort = cohort;
        self.cohorts[cohort].members.push(id);
        self.recompute_cohort(cohort);
        self.drain(id, now);
        self.rehome_orphans(now);
        Ok((cohort, preempted_before))
    }

    /// Evicts what ClusterQueue `id` admitted when it drains (`stopPolicy:
    /// HoldAndDrain`), reason `ClusterQueueStopped`.
    fn drain(&mut self, id: CqId, now: Time) {
        if self.cqs[id].spec.stop != StopPolicy::HoldAndDrain {
            return;
        }
        let admitted: Vec<WlId> = self.cqs[id].admitted.iter().copied().collect();
        for w in admitted {
            self.evict(w, now, EvictCause::Drained);
        }
    }

    /// Evicts what the draining ClusterQueues admitted (`stopPolicy: HoldAndDrain`): for
    /// a caller that restored running workloads into them ([`Engine::restore_admitted`]
    /// books them as they run), as a queue changed to drain evicts them at once.
    pub fn drain_stopped(&mut self, now: Time) {
        for id in 0..self.cqs.len() {
            self.drain(id, now);
        }
    }

    fn new_cohort(&mut self, name: Option<String>) -> usize {
        self.cohorts.push(Cohort {
            name,
            members: Vec::new(),
            lendable: HashMap::new(),
            pool_used: HashMap::new(),
            by_prio: HashMap::new(),
            released: HashMap::new(),
            wake: HashMap::new(),
            wake_free: HashMap::new(),
            reclaimers: HashMap::new(),
            version: 0,
        });
        self.cohorts.len() - 1
    }

    /// The priority `info` is queued with: explicit, else its WorkloadPriorityClass's value,
    /// else 0; `None` when it names a class the engine does not know.
    pub fn priority_of(&self, info: &WorkloadInfo) -> Option<i32> {
        match (info.priority, &info.priority_class) {
            (Some(p), _) => Some(p),
            (None, Some(class)) => self.priority_classes.get(class).copied(),
            (None, None) => Some(0),
        }
    }

    /// Submits a workload at `now`. Call [`Engine::schedule`] to admit.
    pub fn submit(&mut self, now: Time, info: WorkloadInfo) -> Result<()> {
        info.validate()?;
        let key = info.key();
        if self.wl_by_key.contains_key(&key) {
            return Err(Error::DuplicateWorkload(key));
        }
        let priority = self
            .priority_of(&info)
            .ok_or_else(|| Error::UnknownPriorityClass {
                workload: key.clone(),
                class: info.priority_class.clone().unwrap_or_default(),
            })?;
        let id = self.wls.len();
        let shape = shape_hash(priority, &info);
        let lq = self.intern_lq(&info.namespace, &info.queue_name);
        self.wls.push(Wl {
            lq,
            order_ts: info.creation,
            info: Arc::new(info),
            key: Arc::from(key.as_str()),
            priority,
            cq: None,
            state: WlState::Pending,
            gen: 0,
            reason: PendingReason::Queued,
            reported: None,
            reported_place: (0, 0),
            checked: 0,
            requeues: 0,
            progress: 0,
            admission: None,
            shape,
            preempted_in_at: None,
            preempted_by: None,
            awaiting: Vec::new(),
            reserved: Vec::new(),
            reserve_target: Vec::new(),
            first_admitted: None,
            evicting: None,
        });
        self.wl_by_key.insert(key, id);
        self.now = self.now.max(now);
        self.enqueue(id, now);
        Ok(())
    }

    /// Removes a workload (deleted or completed out of band): frees its quota.
    pub fn remove(&mut self, now: Time, key: &str) -> Result<()> {
        self.remove_with_reason(now, key, "Deleted")
    }

    /// Like [`Engine::remove`], with the reason reported on the `Finished` event.
    pub fn remove_with_reason(&mut self, now: Time, key: &str, reason: &str) -> Result<()> {
        let id = *self
            .wl_by_key
            .get(key)
            .ok_or_else(|| Error::UnknownWorkload(key.to_string()))?;
        self.finish(id, now, reason);
        Ok(())
    }

    /// Forgets finished workload `key`, so that a workload may be submitted under it
    /// again (its objects deleted and created anew, or re-read with other requests).
    /// Returns false, changing nothing, unless `key` is known and finished.
    pub fn forget_finished(&mut self, key: &str) -> bool {
        let finished = self
            .wl_by_key
            .get(key)
            .is_some_and(|&id| self.wls[id].state == WlState::Finished);
        if finished {
            self.wl_by_key.remove(key);
        }
        finished
    }

    /// The earliest pending timer, if any.
    pub fn next_timer(&mut self) -> Option<Time> {
        let hold_end = self.next_hold_end();
        while let Some(Reverse((t, _, timer))) = self.timers.peek().copied() {
            if self.timer_live(timer) {
                return Some(hold_end.map_or(t, |h| h.min(t)));
            }
            self.timers.pop();
        }
        hold_end
    }

    /// The ClusterQueues of the workloads with a live timer due at `now` (a minimum
    /// runtime running out, a grace period ending, ...); `None` when one of them is in
    /// no ClusterQueue. Costs the timers pending.
    pub fn due_timer_queues(&self, now: Time) -> Option<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for (_, timer) in self.live_timers().filter(|(at, _)| *at <= now) {
            let cq = self.wls[timer.parts().0].cq?;
            out.insert(self.cqs[cq].spec.name.clone());
        }
        Some(out)
    }

    /// The timers pending that still count (their workload's generation unchanged), in
    /// no order, with their times.
    fn live_timers(&self) -> impl Iterator<Item = (Time, Timer)> + '_ {
        self.timers
            .iter()
            .map(|Reverse((at, _, timer))| (*at, *timer))
            .filter(|(_, timer)| self.timer_live(*timer))
    }

    /// The earliest live pods-ready timeout: the only timers a schedule leaves while
    /// `blockAdmission` holds every queue from its start (nothing is evaluated, so no
    /// wake-up is set). Costs the timers pending.
    pub fn next_ready_timeout(&self) -> Option<Time> {
        self.live_timers()
            .filter(|(_, t)| matches!(t, Timer::ReadyTimeout(..)))
            .map(|(at, _)| at)
            .min()
    }

    /// Whether every live timer due at `now` is a pods-ready timeout (a controller that
    /// times workloads out itself evicts them in the same pass). Costs the timers pending.
    pub fn only_ready_timeouts_due(&self, now: Time) -> bool {
        self.live_timers()
            .all(|(at, t)| at > now || matches!(t, Timer::ReadyTimeout(..)))
    }

    /// Fires every timer due at or before `t`, scheduling after each instant.
    pub fn advance_to(&mut self, t: Time) -> Result<()> {
        let (mut last, mut same) = (Time::MAX, 0u64);
        while let Some(next) = self.next_timer() {
            if next > t {
                break;
            }
            // Guard against a bug re-arming a timer at the same instant forever.
            if next == last {
                same += 1;
                if same > self.cfg.max_cycles {
                    return Err(Error::NoFixedPoint(same));
                }
            } else {
                (last, same) = (next, 0);
            }
            while let Some(Reverse((at, _, timer))) = self.timers.peek().copied() {
                if at != next {
                    break;
                }
                self.timers.pop();
                if self.timer_live(timer) {
                    self.fire(timer, at);
                }
            }
            self.end_holds(next);
            self.schedule(next)?;
        }
        self.now = self.now.max(t);
        Ok(())
    }

    /// Runs scheduling cycles at `now` until nothing more can be admitted.
    pub fn schedule(&mut self, now: Time) -> Result<()> {
        self.now = self.now.max(now);
        self.block_start = None;
        self.schedule_cycles = 0;
        loop {
            while !self.ready.is_empty() {
                // `cycle` counts itself in `schedule_cycles`.
                if self.schedule_cycles >= self.cfg.max_cycles {
                    return Err(Error::NoFixedPoint(self.schedule_cycles + 1));
                }
                self.cycle(now);
            }
            if !self.settle_spec_probes(now) {
                break;
            }
        }
        self.flush_pending_events(now);
        Ok(())
    }

    /// One scheduling cycle: the head of every queue with work, best first.
    fn cycle(&mut self, now: Time) {
        self.stats.cycles += 1;
        self.schedule_cycles += 1;
        if self.admission_blocked() {
            let ready = std::mem::take(&mut self.ready);
            for cq in ready {
                self.hold(cq);
            }
            return;
        }
        let ready = std::mem::take(&mut self.ready);
        let mut heads = Vec::new();
        for cq in ready {
            let q = &self.cqs[cq];
            if q.spec.stop != StopPolicy::None || q.blocked.is_some() {
                continue;
            }
            // Queue order decides, waiting preemptors included: a workload ahead of one
            // (higher priority, or older) is evaluated with the quota held for it and its
            // terminating victims counted as free (`reserve.rs`), as Kueue's queue head
            // gets quota freed by evictions it did not issue.
            if let Some(key) = q.pending.first() {
                heads.push(key.clone());
            }
        }
        let mut decisions: Vec<(bool, OrderKey, super::decide::Decision, u64)> = heads
            .into_iter()
            .map(|key| {
                let d = self.evaluate(key.3, now);
                let co = self.cohort_of_wl(key.3);
                (d.borrows(), key, d, self.cohorts[co].version)
            })
            .collect();
        // Kueue's cycle order: entries that need no borrowing first, then priority, then
        // age. Tessera adds one rule ahead of it: a victim competing in the same cycle with
        // the workload that preempted it goes after it. Otherwise a higher-priority victim
        // can take back the quota its preemptor freed, be reclaimed again, and so on forever.
        let in_cycle: BTreeSet<WlId> = decisions.iter().map(|(_, key, _, _)| key.3).collect();
        let wls = &self.wls;
        decisions.sort_by_key(|(borrows, key, _, _)| {
            let behind_preemptor = wls[key.3]
                .preempted_by
                .is_some_and(|p| in_cycle.contains(&p));
            (behind_preemptor, *borrows, key.clone())
        });
        for (_, key, decision, version) in decisions {
            // An admission earlier in this cycle may have started a wait for pods ready.
            if self.admission_blocked() {
                if let Some(cq) = self.wls[key.3].cq {
                    self.hold(cq);
                }
                continue;
            }
            let co = self.cohort_of_wl(key.3);
            let decision = if self.cohorts[co].version != version {
                self.evaluate(key.3, now)
            } else {
                decision
            };
            let front = self.is_queue_front(&key);
            self.apply_decision(key, decision, now);
            if self.admission_blocked() {
                self.block_start = Some(BlockStart {
                    cycle: self.schedule_cycles,
                    front,
                });
            }
        }
    }

    /// Whether `key` is the first waiting workload of its ClusterQueue (queued or parked).
    fn is_queue_front(&self, key: &OrderKey) -> bool {
        let Some(cq) = self.wls[key.3].cq else {
            return false;
        };
        let q = &self.cqs[cq];
        q.pending.first() == Some(key) && q.parked.first().is_none_or(|p| key < p)
    }

    /// `blockAdmission`: where the last [`Engine::schedule`] started holding admission
    /// (an admission in it whose pods are not ready yet); `None` when none did.
    pub fn block_start(&self) -> Option<BlockStart> {
        self.block_start
    }

    pub(crate) fn cohort_of_wl(&self, id: WlId) -> usize {
        self.wls[id]
            .cq
            .map(|cq| self.cqs[cq].cohort)
            .unwrap_or(usize::MAX)
            .min(self.cohorts.len().saturating_sub(1))
    }

    /// Puts a workload into its ClusterQueue (or the orphan set) as pending.
    pub(crate) fn enqueue(&mut self, id: WlId, now: Time) {
        let resolved = self.resolve_queue(id);
        let w = &mut self.wls[id];
        w.state = WlState::Pending;
        w.gen += 1;
        match resolved {
            Ok(cq) => {
                w.cq = Some(cq);
                self.orphans.remove(&id);
                let stopped = self.cqs[cq].spec.stop != StopPolicy::None;
                let key = self.wls[id].order_key(id);
                self.wls[id].reason = if stopped {
                    PendingReason::ClusterQueueStopped
                } else {
                    PendingReason::Queued
                };
                let q = &mut self.cqs[cq];
                // A new head ahead of the one that blocked the queue: that one is no longer
                // evaluated first, and waits `Queued` again until it is (as a fresh schedule,
                // blocked at the new head, would leave it).
                let unblocked = q.blocked.take_if(|b| key < *b);
                q.pending.insert(key);
                if let Some(b) = unblocked {
                    self.queued_again(b.3);
                }
                let q = &self.cqs[cq];
                if !stopped && q.blocked.is_none() {
                    self.ready.insert(cq);
                }
                if self.cfg.requeue == Requeue::FullRescan {
                    let co = self.cqs[cq].cohort;
                    self.wake_cohort_all(co, now);
                }
            }
            Err(reason) => {
                w.cq = None;
                w.reason = reason;
                self.orphans.insert(id);
            }
        }
        self.dirty.push(id);
    }

    fn resolve_queue(&self, id: WlId) -> std::result::Result<CqId, PendingReason> {
        let info = &self.wls[id].info;
        let cq_name = self
            .local_queues
            .get(&(info.namespace.clone(), info.queue_name.clone()))
            .ok_or(PendingReason::LocalQueueNotFound)?;
        let &cq = self
            .cq_by_name
            .get(cq_name)
            .ok_or_else(|| PendingReason::ClusterQueueNotFound(cq_name.clone()))?;
        let selector = &self.cqs[cq].spec.namespace_selector;
        let mut labels = self
            .namespaces
            .get(&info.namespace)
            .cloned()
            .unwrap_or_default();
        labels.insert(
            "kubernetes.io/metadata.name".to_string(),
            info.namespace.clone(),
        );
        match selector {
            Some(sel) if sel.matches(&labels) => Ok(cq),
            _ => Err(PendingReason::NamespaceNotAllowed(cq_name.clone())),
        }
    }

    /// Queues the waiting workloads without a queue whose queue resolves now; the
    /// others get the reason that holds now (a LocalQueue created whose ClusterQueue
    /// does not exist yet), as a fresh submit would.
    fn rehome_orphans(&mut self, now: Time) {
        let orphans: Vec<WlId> = self.orphans.iter().copied().collect();
        for id in orphans {
            if self.wls[id].state != WlState::Pending {
                continue;
            }
            match self.resolve_queue(id) {
                Ok(_) => self.enqueue(id, now),
                Err(reason) if reason != self.wls[id].reason => {
                    self.wls[id].reason = reason;
                    self.dirty.push(id);
                }
                Err(_) => {}
            }
        }
    }

    /// Emits a `Pending` event for each workload whose reason changed.
    pub(crate) fn flush_pending_events(&mut self, now: Time) {
        let dirty = std::mem::take(&mut self.dirty);
        self.flush_epoch += 1;
        if !self.cfg.record_events {
            return;
        }
        let mut seen = BTreeSet::new();
        for id in dirty {
            if !seen.insert(id) {
                continue;
            }
            let w = &self.wls[id];
            let pending = matches!(
                w.state,
                WlState::Pending | WlState::Backoff | WlState::Deactivated
            );
            if !pending {
                continue;
            }
            let position = self.position(id);
            self.report_pending(id, position, now);
        }
    }

    /// Takes the events recorded so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// When `key` was first admitted, if ever.
    pub fn first_admitted_at(&self, key: &str) -> Option<Time> {
        self.wl_by_key
            .get(key)
            .and_then(|&id| self.wls[id].first_admitted)
    }

    /// Sum of every queue's usage of every resource, in milli-units.
    pub fn usage_total(&self) -> i64 {
        self.usage_total
    }

    /// Whether `key` is admitted now.
    pub fn is_admitted(&self, key: &str) -> bool {
        self.wl_by_key
            .get(key)
            .is_some_and(|&id| self.wls[id].state == WlState::Admitted)
    }

    /// Whether `key` waits in its ClusterQueue's line now (queued or parked).
    pub fn is_waiting(&self, key: &str) -> bool {
        self.wl_by_key
            .get(key)
            .is_some_and(|&id| self.wls[id].state == WlState::Pending)
    }

    /// Whether `key` was evicted and still holds its quota (its grace period runs).
    pub fn is_terminating(&self, key: &str) -> bool {
        self.wl_by_key
            .get(key)
            .is_some_and(|&id| self.wls[id].state == WlState::Terminating)
    }

    /// The pending reason code of `key`, if it is pending.
    pub fn pending_reason(&self, key: &str) -> Option<&'static str> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        matches!(
            w.state,
            WlState::Pending | WlState::Backoff | WlState::Deactivated
        )
        .then(|| w.reason.code())
    }

    /// Whether the queue named `cq` uses StrictFIFO.
    pub(crate) fn strict(&self, cq: CqId) -> bool {
        self.cqs[cq].spec.strategy == QueueingStrategy::StrictFIFO
    }
}

fn shape_hash(priority: i32, info: &WorkloadInfo) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    priority.hash(&mut h);
    for ps in &info.pod_sets {
        (&ps.name, ps.count, ps.min_count, &ps.requests).hash(&mut h);
        (&ps.node_selector, &ps.tolerations).hash(&mut h);
    }
    info.preempt_not_before.hash(&mut h);
    h.finish()
}

fn intern_fr(
    names: &mut Vec<(String, String)>,
    by_name: &mut HashMap<(String, String), FrId>,
    flavor: &str,
    resource: &str,
) -> FrId {
    let k = (flavor.to_string(), resource.to_string());
    if let Some(&id) = by_name.get(&k) {
        return id;
    }
    let id = names.len();
    names.push(k.clone());
    by_name.insert(k, id);
    id
}

/// Why an admitted workload is being evicted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EvictCause {
    Preempted { by: WlId, reason: &'static str },
    PodsReadyTimeout,
    Drained,
}

impl Engine {
    /// `blockAdmission`: whether an admitted workload's pods are not all ready yet.
    pub fn admission_blocked(&self) -> bool {
        !self.unready.is_empty()
    }

    /// A head that blocked its queue (StrictFIFO) or was held by `blockAdmission` no
    /// longer does: until it is evaluated again it waits `Queued`, as a fresh schedule
    /// leaves a workload behind a head that blocks (a new head ahead of it may block the
    /// queue before it is evaluated). A preemptor waiting for its victims keeps saying so.
    pub(crate) fn queued_again(&mut self, id: WlId) {
        let w = &mut self.wls[id];
        if w.state == WlState::Pending
            && !matches!(
                w.reason,
                PendingReason::Queued | PendingReason::WaitingForPreemptedWorkloads(_)
            )
        {
            w.reason = PendingReason::Queued;
            self.dirty.push(id);
        }
    }

    /// Holds queue `cq` until every admitted workload is ready; its head says why.
    fn hold(&mut self, cq: CqId) {
        let q = &self.cqs[cq];
        if q.spec.stop != StopPolicy::None || q.blocked.is_some() || q.pending.is_empty() {
            return;
        }
        let head = q.pending.first().map(|k| k.3);
        self.held.insert(cq);
        if let Some(id) = head {
            self.wls[id].reason = PendingReason::WaitingForPodsReady;
            self.dirty.push(id);
            self.held_heads.insert(id);
        }
    }

    /// `blockAdmission`: admitted workload `key`'s pods are all ready now (a controller
    /// that saw them Ready): as if it had been admitted ready, its pods-ready timeout no
    /// longer applies and admission is no longer held for it. Returns whether it was
    /// waiting for its pods.
    pub fn mark_pods_ready(&mut self, key: &str) -> bool {
        let Some(&id) = self.wl_by_key.get(key) else {
            return false;
        };
        if self.wls[id].admission.is_none() {
            return false;
        }
        self.ready_marked.insert(id);
        let waiting = self.unready.contains(&id);
        self.pods_ready(id);
        waiting
    }

    /// `blockAdmission`: whether admitted workload `key` still waits for its pods.
    pub fn waits_for_pods(&self, key: &str) -> bool {
        self.wl_by_key
            .get(key)
            .is_some_and(|id| self.unready.contains(id))
    }

    /// While admission is held (`blockAdmission`), the reason a from-scratch schedule
    /// gives waiting workload `key`: nothing is evaluated, every ClusterQueue that can
    /// admit holds its first waiting workload (`WaitingForPodsReady`) and the others stay
    /// `Queued` with their place; a workload in a stopped queue or none keeps its reason.
    pub fn held_entry(&self, key: &str) -> Option<(String, String)> {
        let &id = self.wl_by_key.get(key)?;
        let w = &self.wls[id];
        let Some(cq) = w.cq.filter(|_| w.state == WlState::Pending) else {
            return self.pending_entry(key);
        };
        let q = &self.cqs[cq];
        if q.spec.stop != StopPolicy::None {
            return self.pending_entry(key);
        }
        let reason = if self.queue_head(cq) == Some(id) {
            PendingReason::WaitingForPodsReady
        } else {
            PendingReason::Queued
        };
        let position = reason.has_position().then(|| self.position_in(cq, id));
        Some((
            reason.code().to_string(),
            reason.message_as(position, self.cfg.positions),
        ))
    }

    /// The first waiting workload (queued or parked) of every ClusterQueue that can
    /// admit: those [`Engine::held_entry`] says `WaitingForPodsReady` of. Costs the queues.
    pub fn queue_heads(&self) -> Vec<String> {
        (0..self.cqs.len())
            .filter(|&cq| self.cqs[cq].spec.stop == StopPolicy::None)
            .filter_map(|cq| self.queue_head(cq))
            .map(|id| self.wls[id].key.to_string())
            .collect()
    }

    fn queue_head(&self, cq: CqId) -> Option<WlId> {
        let q = &self.cqs[cq];
        match (q.pending.first(), q.parked.first()) {
            (Some(a), Some(b)) => Some(a.min(b).3),
            (a, b) => a.or(b).map(|k| k.3),
        }
    }

    /// `blockAdmission`: `id`'s pods are ready, or it no longer runs. When the last such
    /// workload is done, the held queues go back to scheduling.
    pub(crate) fn pods_ready(&mut self, id: WlId) {
        if self.unready.remove(&id) && self.unready.is_empty() {
            let held = std::mem::take(&mut self.held);
            self.ready.extend(held);
            // The held heads wait `Queued` until evaluated again (a new head ahead of one
            // in a StrictFIFO queue may block it, as a fresh schedule would).
            for h in std::mem::take(&mut self.held_heads) {
                if self.wls[h].reason == PendingReason::WaitingForPodsReady {
                    self.queued_again(h);
                }
            }
        }
    }
}
