//! Incremental decisions over the watch-fed [`Cache`]: the engine and the workloads read
//! from the objects are kept between passes, and a pass applies only what changed since
//! the last one, so its cost follows the changes, not the number of waiting workloads.
//!
//! ```text
//! Cache ─changes_since(seen)─► pods/Jobs changed ─► their workloads re-read ─► Engine:
//!   submit (new) · remove (deleted, finished) · nothing (recorded reason, Ready, own admit seen)
//! Engine::schedule(now) ─► Admit from events · Pending for the workloads whose reason may move
//! ```
//! [`decide`](super::decide::decide) over a fresh snapshot stays the reference: an incremental pass gives the
//! same [`Plan`] (a property test drives both). Queue objects and namespaces that
//! changed go to the kept engine as events (`incremental_queues.rs`, which lists the
//! changes it cannot follow); so do DRA claims and templates (`incremental_claims.rs`:
//! only a spec change matters, and it re-reads the workloads that name the object).
//! Whatever the kept engine cannot follow
//! exactly makes the pass decide from scratch instead, and start keeping again from
//! there: configuration changed; a store re-LISTed; with
//! `blockAdmission` a pass admitting a workload that is not the front of its queue, or
//! not in the schedule's first cycle (the admission holds every queue in the middle of
//! the schedule, and a fresh pass would have evaluated every queue's next workloads
//! before it), or a running workload's pods no longer Ready before being recorded; a
//! running workload that could not be restored (an error). A pass admitting a queue's
//! front in the first cycle is followed: a fresh pass admits the same workload (every
//! other front it evaluated first could not fit, as the kept engine knows), and a pass
//! that ends held tells every workload what a pass held from its start would (below),
//! as a fresh pass does (`decide::held_timer`, `Engine::block_start`). The pods of a
//! ReplicaSet added, removed or re-owned while they exist are read again (their workload keys follow their owner;
//! a running one moved to a new key re-decides its scope). With
//! `blockAdmission` the passes while an admitted workload's pods start are followed: the
//! engine is told when they are Ready (`Engine::mark_pods_ready`), a held pass gives each
//! queue's first waiting workload `WaitingForPodsReady` and the others their recorded
//! reason (`Engine::held_entry`: what a fresh pass, holding every queue before
//! evaluating anything, gives them; cost: the queues), and the reasons to re-decide wait
//! for the pass that ends the hold. With `waitForPodsReady` the kept pass follows the rest
//! as a fresh pass does: a pods-ready timeout due makes its workload terminate (evicted again each pass
//! until its objects change, its scope re-decided), a requeue backoff ending submits
//! its workload, the records' requeue states are read again where they changed (the
//! workloads whose entries moved are read again) and their entries no longer needed are
//! forgotten (cost: the entries). A waiting workload whose requests, priority, creation
//! or requeue state changed, an admission the objects do not show on the next pass (its write failed),
//! and a finished workload's key used again are followed: the workload leaves the
//! engine and queues again as read now (a delete and a create, which a fresh pass
//! cannot tell apart), and its cohort is re-decided. (The engine orders equal priority and creation
//! by workload key, so a new workload tied with waiting ones needs no fresh pass.) A from-scratch pass restores running workloads in
//! admission order, re-assigning flavors and borrowing; for a ClusterQueue in a cohort
//! or with several flavors in a resource group that may differ from the kept books, so
//! after an admission into (or a removal from) one the pass first restores the running
//! workloads alone onto the queue objects and compares (cost: the running workloads);
//! the scopes where they differ are re-decided (below).
//!
//! Preemption scopes (a cohort, or a ClusterQueue without one) share no quota, so one
//! can be re-decided alone: its workloads leave the engine and come back as a fresh
//! pass builds them (running and terminating ones restored in admission order, waiting
//! ones submitted). A pass does that, instead of deciding everything from scratch, for
//! the scopes where the last pass preempted, where a workload terminates (a fresh pass
//! restores it as running and evicts nothing more there), and where a workload changed
//! in a way the engine has no update for (a running one's requests, running again,
//! waiting again after running), and where a victim's eviction was refused by a
//! PodDisruptionBudget (the preemptor names it until the retry), where an engine
//! timer is due (a minimum runtime running out), where a running workload no longer
//! fits its queue's quota (a fresh restore leaves it pending and reports it, each pass),
//! and where the kept books differ from a fresh restore. Cost: those scopes' workloads.
//!
//! Serving replicas (one workload per pod of a Deployment, ReplicaSet or StatefulSet)
//! are followed like other pods, keyed through the owners a fresh pass reads; each pass
//! reports every owner's (admitted, desired) counts and annotation, recounting only the
//! owners whose replicas or object changed (cost: their replicas), and an owner whose
//! object changed has its replicas read again (their requeue state lives on it).
//!
//! Holds on capacity a coupled scale-down freed (`holds.rs`) are set on the engine a
//! fresh pass builds and kept with it; a pass where an owner or a queue changed, or a
//! hold ended, reads them again, and where a queue's hold differs it is replaced on the
//! kept engine (`Engine::replace_hold`: what it can move in the cohort is re-decided, as
//! after a quota change). Owners whose hold cannot be read changing make the pass
//! decide from scratch.

use super::cache::{Cache, Changes, Key, Store};
use super::claims::ClaimSource;
use super::config::Config;
use super::decide::{
    admit_action, blocked_reason, collect, decide_full, drop_admissions_of_evicted,
    engine_with_queues, evict_action, finish_admission, held_timer, hold_reason, keeps_recorded,
    replica_message, replicas_actions, shows, subjects, terminating_message, unfit_problem, Action,
    BlockedFor, Built, Live, ObjRef, Plan, Scopes, Snapshot, State, UNKNOWN_SCOPE,
};
use super::evictions::Blocked;
use super::holds::Holds;
use super::lease::Millis;
use super::pods_ready::{self, state_kept_on_record};
use super::record_updates;
use super::requeue_book::{self, Book};
use super::serving::{
    desired_replicas, replica_set_of, replica_set_owners, Owner, ServingIndex, ServingKind,
};
use super::snapshot::{
    owned_by, queue_objects_cached, record_admission, record_place, serving_objects,
    snapshot_cached,
};
use super::workload_record::OwnerRef;
use super::workloads::{self, done_pod_workload_key, job_workload_key, live_pod_workload_key};
use crate::quota::{BlockStart, Engine, EventType, Restored, WaitForPodsReady};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[path = "incremental_claims.rs"]
mod kept_claims;
#[path = "incremental_queues.rs"]
mod queues;
use kept_claims::ClaimUser;

/// How many passes went each way (for tests, logs and the benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IncStats {
    /// Passes decided from scratch (the first one, and every fallback).
    pub full: u64,
    /// Passes that applied the changes to the kept engine.
    pub incremental: u64,
    /// Why the last pass that could not go on from the kept engine decided from scratch.
    pub last_fallback: Option<&'static str>,
    /// Workloads the incremental passes took out and queued again (a waiting workload's
    /// requests changed, an admission's write failed, a finished workload's key reused).
    pub requeued: u64,
    /// Preemption scopes the incremental passes re-decided from their workloads (victims
    /// evicted or terminating there, or a change the engine has no update for).
    pub scopes_redecided: u64,
    /// Wall time of the last [`Incremental::decide`] (the decision alone, no I/O).
    pub last_decide: std::time::Duration,
}

/// The incremental decider: one per cache, passes in time order.
#[derive(Default)]
pub struct Incremental {
    kept: Option<Kept>,
    pub stats: IncStats,
    /// Why [`Incremental::decide_assuming`] last dropped the kept engine (the next
    /// pass from scratch reports it).
    dropped: Option<&'static str>,
}

/// The same plan as [`decide`](super::decide::decide) over the cache's snapshot (with
/// `blocked` evictions), problems of unusable objects included: the reference.
pub fn decide_cached(
    cache: &Cache,
    cfg: &Config,
    now: Millis,
    blocked: &BTreeMap<ObjRef, Blocked>,
) -> Plan {
    full_pass(cache, cfg, now, blocked).0
}

fn full_pass(
    cache: &Cache,
    cfg: &Config,
    now: Millis,
    blocked: &BTreeMap<ObjRef, Blocked>,
) -> (Plan, Built, Snapshot, Vec<String>) {
    let mut problems = Vec::new();
    let mut snap = snapshot_cached(cache, cfg, now, &mut problems);
    snap.blocked = blocked.clone();
    let (mut plan, built) = decide_full(&snap);
    let mut base = problems.clone();
    base.extend(built.queue_problems.iter().cloned());
    problems.append(&mut plan.problems);
    plan.problems = problems;
    (plan, built, snap, base)
}

/// Store indexes in [`Cache::stores`] order.
const QUEUE_STORES: std::ops::Range<usize> = 0..5;

/// What a queue object (or namespace) means to a pass: everything but its status and
/// bookkeeping metadata (a ClusterQueue status write changes nothing).
fn fingerprint(v: &Value) -> Value {
    let mut out = v.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("status");
        let m = &v["metadata"];
        o.insert(
            "metadata".into(),
            json!({"name": m["name"], "namespace": m["namespace"], "labels": m["labels"]}),
        );
    }
    out
}

/// Everything kept from one pass to the next.
struct Kept {
    engine: Engine,
    /// The generation of each store (in [`Cache::stores`] order) last read.
    seen: Vec<u64>,
    now: Millis,
    device_classes: BTreeMap<String, String>,
    /// `waitForPodsReady` as configured when kept (a change decides from scratch).
    pods_ready: Option<WaitForPodsReady>,
    /// Running workloads whose pods were never recorded Ready, as (sort time, key): each
    /// pass records those Ready now, and one whose pods-ready timeout is due falls back.
    unrecorded: BTreeSet<(Millis, String)>,
    /// Waiting workloads held by a pods-ready backoff, as (end, key): not in the engine
    /// (their reason is kept with the submit errors); a backoff ending submits them.
    backoffs: BTreeSet<(Millis, String)>,
    /// With `blockAdmission`, while admission is held: the ClusterQueues whose reasons
    /// are re-decided once it is no longer held (a held pass decides none, and a waiting
    /// workload keeps its recorded reason: `keeps_recorded`), and the workloads told
    /// `WaitingForPodsReady` (told their reason again then).
    touched_while_held: BTreeSet<String>,
    held_heads: BTreeSet<String>,
    /// Running workloads evicted for a pods-ready timeout, as (admission, key): kept as
    /// terminating (a fresh pass reads them so) and evicted again each pass until their
    /// objects change.
    timed_out: BTreeSet<(Millis, String)>,
    /// With `waitForPodsReady`: the requeue states of pod groups' and lone pods' records,
    /// by workload key.
    books: Book,
    /// Finished pods (`Succeeded` / `Failed`) → their workload, and how many each
    /// workload has: a requeue state entry of a finished workload is forgotten.
    done_pods: HashMap<Key, String>,
    finished: HashMap<String, usize>,
    /// Queue objects and namespaces as last read: (store index, key) → fingerprint.
    queue_fps: HashMap<(usize, Key), Value>,
    queued_ns: BTreeSet<String>,
    flavor_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// ClusterQueues without a cohort and with one flavor per resource group: their
    /// flavor assignments do not depend on admission order.
    simple_cqs: BTreeSet<String>,
    /// Problems of unusable queue objects (repeated every pass, as a fresh pass does).
    base_problems: Vec<String>,
    /// DRA claim objects of the queued namespaces and which pods and Jobs name them.
    claims: kept_claims::KeptClaims,
    lives: HashMap<String, Live>,
    /// Keys of the running and terminating `lives` with requests (those a fresh pass
    /// restores), kept with `lives` by `put_live` and `take_live`.
    running: BTreeSet<String>,
    /// Pod → its workload, and each pod workload's pods.
    pod_wl: HashMap<Key, String>,
    members: HashMap<String, BTreeSet<Key>>,
    submit_errors: BTreeMap<String, (String, String)>,
    /// Waiting workloads whose recorded reason differed from the decided one.
    unsynced: BTreeSet<String>,
    /// Running workloads with pods still gated, as (sort time, key).
    gated_running: BTreeSet<(Millis, String)>,
    admitted: BTreeSet<String>,
    /// Admitted by the engine while the objects still show them waiting.
    admitted_waiting: BTreeSet<String>,
    /// The books may differ from a fresh restore (admissions into, or removals from, a
    /// ClusterQueue in a cohort or with several flavors): check before deciding.
    verify: bool,
    /// The queue objects and namespaces (no workloads), for that check.
    base: Snapshot,
    /// ClusterQueues with admissions in the last pass: reasons decided before an
    /// admission in the same pass are re-decided in the next (a fresh pass does).
    stale: BTreeSet<String>,
    /// Workloads queued again (or submitted under a reused key) in this pass.
    requeues: u64,
    /// Scopes re-decided from their workloads in this pass.
    redecided: u64,
    /// Preemption scopes (a cohort, or a ClusterQueue without one) of the queue objects.
    scopes: Scopes,
    /// The workloads of each scope (keys of `lives`).
    scope_keys: HashMap<String, BTreeSet<String>>,
    /// Terminating workloads (evicted, their objects not gone yet) per scope, as
    /// (admission time, key): a fresh pass restores them as running and evicts nothing
    /// more in their scope, so such a scope is re-decided from its workloads each pass.
    terminating: BTreeMap<String, BTreeSet<(Millis, String)>>,
    /// Running workloads that no longer fit their queue's quota (a fresh restore admits
    /// them over quota, or leaves them pending without a flavor, and reports them), per
    /// scope, as (admission, key) → the problem: such a scope is re-decided each pass, as
    /// a fresh pass restores it (which ones are over quota follows the restore order).
    unfit: BTreeMap<String, BTreeMap<(Millis, String), String>>,
    /// Scopes where the last pass preempted or evicted: re-decided in the next (the
    /// evictions' writes may not have landed, and a fresh pass would decide them again).
    evicted_scopes: BTreeSet<String>,
    /// Serving owners as a fresh pass reads them (ReplicaSets, Deployments,
    /// StatefulSets of the queued namespaces).
    serving_objs: (Vec<Value>, Vec<Value>, Vec<Value>),
    /// Pods with a ReplicaSet among their owners (a fresh pass reads ReplicaSets only
    /// when there is one), with the ReplicaSet that controls them.
    rs_pods: BTreeMap<Key, Option<Key>>,
    /// The replica workloads of each serving owner.
    replicas: BTreeMap<Owner, BTreeSet<String>>,
    /// (admitted, desired) replicas per owner with replicas, as the last pass reported.
    serving: BTreeMap<Owner, (u32, u32)>,
    /// The holds set on the engine, as the serving owners record them (`holds.rs`).
    holds: Holds,
}

impl Incremental {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decides one pass over the cache's contents at `now`: the same plan as
    /// [`decide_cached`], from the changes since the last pass when it can.
    pub fn decide(
        &mut self,
        cache: &Cache,
        cfg: &Config,
        now: Millis,
        blocked: &BTreeMap<ObjRef, Blocked>,
    ) -> Plan {
        let started = std::time::Instant::now();
        let plan = self.decide_inner(cache, cfg, now, blocked);
        self.stats.last_decide = started.elapsed();
        plan
    }

    /// Decides one pass like [`Incremental::decide`] while the writes of `assumed` are
    /// under way: the engine holds its admissions admitted (and its readiness records
    /// recorded) though their objects do not show it yet, as Kueue assumes a workload
    /// in its cache before the API server has it, and asks none of its evictions again.
    /// Only the kept engine can decide so: `None` when this pass needs one from
    /// scratch, which reads the objects as they are and must wait for those writes; the
    /// kept engine is dropped then.
    pub fn decide_assuming(
        &mut self,
        cache: &Cache,
        cfg: &Config,
        now: Millis,
        blocked: &BTreeMap<ObjRef, Blocked>,
        assumed: &Assumed,
    ) -> Option<Plan> {
        if assumed.is_empty() {
            return Some(self.decide(cache, cfg, now, blocked));
        }
        let started = std::time::Instant::now();
        let Some(kept) = self.kept.take() else {
            self.dropped = Some("nothing kept");
            return None;
        };
        let plan = self.go_on(kept, cache, cfg, now, blocked, assumed);
        self.stats.last_decide = started.elapsed();
        plan
    }

    /// The kept engine's pass, counted; `None` (the reason kept) when it cannot decide.
    fn go_on(
        &mut self,
        kept: Kept,
        cache: &Cache,
        cfg: &Config,
        now: Millis,
        blocked: &BTreeMap<ObjRef, Blocked>,
        assumed: &Assumed,
    ) -> Option<Plan> {
        match fast_pass(kept, cache, cfg, now, blocked, assumed) {
            Ok((plan, mut kept)) => {
                self.stats.requeued += std::mem::take(&mut kept.requeues);
                self.stats.scopes_redecided += std::mem::take(&mut kept.redecided);
                self.kept = Some(kept);
                self.stats.incremental += 1;
                Some(plan)
            }
            Err(why) => {
                tracing::debug!(why, "deciding from scratch");
                self.dropped = Some(why);
                None
            }
        }
    }

    fn decide_inner(
        &mut self,
        cache: &Cache,
        cfg: &Config,
        now: Millis,
        blocked: &BTreeMap<ObjRef, Blocked>,
    ) -> Plan {
        if let Some(kept) = self.kept.take() {
            let none = Assumed::default();
            if let Some(plan) = self.go_on(kept, cache, cfg, now, blocked, &none) {
                return plan;
            }
        }
        self.stats.last_fallback = Some(self.dropped.take().unwrap_or("nothing kept"));
        self.stats.full += 1;
        let seen: Vec<u64> = cache.fed_stores().iter().map(|s| s.generation()).collect();
        let (plan, built, snap, base) = full_pass(cache, cfg, now, blocked);
        self.kept = keep(cache, cfg, &plan, built, &snap, base, seen);
        plan
    }
}

fn sort_key(l: &Live) -> (Millis, String) {
    (l.admitted_at, l.key.clone())
}

/// Whether a fresh pass restores live `l` as admitted: it runs or terminates, with
/// requests read.
fn restored(l: &Live) -> bool {
    matches!(l.state, State::Running | State::Terminating) && l.info.is_some()
}

fn in_engine(l: &Live, errors: &BTreeMap<String, (String, String)>) -> bool {
    l.info.is_some() && !errors.contains_key(&l.key)
}

/// Keeps the state of a from-scratch pass, when later passes can go on from it.
#[allow(clippy::too_many_arguments)]
fn keep(
    cache: &Cache,
    cfg: &Config,
    plan: &Plan,
    built: Built,
    snap: &Snapshot,
    base_problems: Vec<String>,
    seen: Vec<u64>,
) -> Option<Kept> {
    let scopes = Scopes::new(snap);
    // Evictions (now, or still terminating) are followed scope by scope when every
    // workload involved has a known scope.
    let preempting = !built.evicted_scopes.is_empty()
        || plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Evict { .. }))
        || built.lives.iter().any(|l| l.state == State::Terminating);
    let scoped = !built.evicted_scopes.contains(UNKNOWN_SCOPE)
        && built
            .lives
            .iter()
            .filter(|l| l.state == State::Terminating)
            .all(|l| scopes.of(l) != UNKNOWN_SCOPE);
    let eligible = !built.restore_problem && (!preempting || scoped);
    if !eligible {
        return None;
    }
    let evicted_scopes = built.evicted_scopes.clone();
    let Built {
        engine,
        holds,
        lives,
        mut submit_errors,
        unfit,
        kept_recorded,
        ..
    } = built;
    let mut backoffs = BTreeSet::new();
    if let Some(pr) = &cfg.pods_ready {
        for l in lives.iter().filter(|l| l.state == State::Waiting) {
            if let (Some(_), Some(r)) = (&l.info, l.requeue) {
                if let Some(h) = pods_ready::hold(pr, r, snap.now) {
                    if let pods_ready::Hold::Backoff(until) = h {
                        backoffs.insert((until, l.key.clone()));
                    }
                    submit_errors.insert(l.key.clone(), hold_reason(h, r));
                }
            }
        }
    }
    let stores = cache.stores();
    let mut queue_fps = HashMap::new();
    for i in QUEUE_STORES {
        for v in stores[i].values() {
            let k = (
                v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                v["metadata"]["name"].as_str().unwrap_or("").to_string(),
            );
            queue_fps.insert((i, k), fingerprint(&v));
        }
    }
    let queued_ns = super::snapshot::queued_namespaces(&snap.local_queues);
    let in_ns = |s: &Store| {
        s.values_where(|v| {
            v["metadata"]["namespace"]
                .as_str()
                .is_some_and(|n| queued_ns.contains(n))
        })
    };
    let mut pod_wl = HashMap::new();
    let mut members: HashMap<String, BTreeSet<Key>> = HashMap::new();
    let serving = ServingIndex::new(&snap.replica_sets, &snap.deployments, &snap.stateful_sets);
    for pod in &snap.pods {
        if let Some(wk) = live_pod_workload_key(pod, &serving) {
            let k = key_of(pod);
            members.entry(wk.clone()).or_default().insert(k.clone());
            pod_wl.insert(k, wk);
        }
    }
    let mut kept = Kept {
        seen,
        now: snap.now,
        device_classes: cfg.device_classes.clone(),
        pods_ready: cfg.pods_ready.clone(),
        unrecorded: BTreeSet::new(),
        backoffs,
        timed_out: BTreeSet::new(),
        touched_while_held: kept_recorded,
        held_heads: BTreeSet::new(),
        books: match cfg.pods_ready {
            Some(_) => Book {
                entries: cache
                    .records
                    .filter_map(requeue_book::read_one)
                    .into_iter()
                    .collect(),
            },
            None => Book::default(),
        },
        done_pods: HashMap::new(),
        finished: HashMap::new(),
        queue_fps,
        flavor_labels: queues::flavor_labels(&snap.flavors),
        simple_cqs: queues::simple_cluster_queues(&snap.cluster_queues),
        base_problems,
        claims: kept_claims::KeptClaims::new(
            in_ns(&cache.claim_templates),
            in_ns(&cache.claims),
            &snap.pods,
            &snap.jobs,
        ),
        lives: HashMap::new(),
        running: BTreeSet::new(),
        pod_wl,
        members,
        submit_errors,
        unsynced: BTreeSet::new(),
        gated_running: BTreeSet::new(),
        admitted: plan.admitted.clone(),
        admitted_waiting: BTreeSet::new(),
        verify: false,
        base: Snapshot {
            flavors: snap.flavors.clone(),
            cluster_queues: snap.cluster_queues.clone(),
            local_queues: snap.local_queues.clone(),
            priority_classes: snap.priority_classes.clone(),
            namespaces: snap.namespaces.clone(),
            pods_ready: snap.pods_ready.clone(),
            ..Snapshot::default()
        },
        stale: BTreeSet::new(),
        requeues: 0,
        redecided: 0,
        scopes,
        scope_keys: HashMap::new(),
        terminating: BTreeMap::new(),
        unfit: BTreeMap::new(),
        evicted_scopes,
        serving_objs: (
            snap.replica_sets.clone(),
            snap.deployments.clone(),
            snap.stateful_sets.clone(),
        ),
        rs_pods: snap
            .pods
            .iter()
            .filter_map(|p| Some((key_of(p), rs_entry(p)?)))
            .collect(),
        replicas: BTreeMap::new(),
        serving: plan.serving.clone(),
        queued_ns,
        engine,
        holds,
    };
    for a in &plan.actions {
        if let Action::Pending { workload, .. } = a {
            kept.unsynced.insert(workload.clone());
        }
    }
    for pod in &snap.pods {
        kept.set_done(key_of(pod), done_pod_workload_key(pod));
    }
    for l in lives {
        kept.track(&l);
        kept.put_live(l);
    }
    for (key, problem) in unfit {
        let l = kept.lives.get(&key)?;
        let scope = kept.scopes.of(l);
        if scope == UNKNOWN_SCOPE {
            return None;
        }
        let sk = sort_key(l);
        kept.unfit.entry(scope).or_default().insert(sk, problem);
    }
    kept.stale = kept
        .admitted_waiting
        .iter()
        .filter_map(|k| kept.engine.cluster_queue_of(k).map(String::from))
        .collect();
    for a in &plan.actions {
        match a {
            // Timed out in this pass: terminating as read, evicted again until their
            // objects change.
            Action::Evict {
                workload,
                requeue: Some(_),
                ..
            } => {
                let l = kept.lives.get(workload)?;
                kept.timed_out.insert(sort_key(l));
            }
            // Admission held (`blockAdmission`): who was told `WaitingForPodsReady`.
            Action::Pending {
                workload, reason, ..
            } if reason == "WaitingForPodsReady" => {
                kept.held_heads.insert(workload.clone());
            }
            _ => {}
        }
    }
    kept.verify = kept.stale.iter().any(|cq| !kept.simple_cqs.contains(cq));
    Some(kept)
}

fn key_of(v: &Value) -> Key {
    (
        v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        v["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

/// The object under `key` as a snapshot reads it: the first store holding it wins.
fn first_of(stores: &[Store], key: &Key) -> Option<(usize, Value)> {
    stores
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.get(key).map(|v| (i, v)))
}

/// The keys changed in `stores` since `seen` (`None`: a LIST replaced one).
impl Kept {
    /// Replaces the kept engine's holds with `holds` (read now) where they differ; the
    /// queues changed are re-decided in this pass.
    fn follow_holds(&mut self, holds: Holds, now: Millis) -> Result<(), &'static str> {
        if holds.problems != self.holds.problems {
            return Err("unreadable holds changed");
        }
        let queues: BTreeSet<&String> = self
            .holds
            .queues
            .keys()
            .chain(holds.queues.keys())
            .collect();
        for cq in queues {
            let new = holds.queues.get(cq);
            if self.holds.queues.get(cq) == new {
                continue;
            }
            self.engine
                .replace_hold(now, cq, new.map(|(levels, hold)| (levels, *hold)))
                .map_err(|_| "a hold the engine refuses")?;
            self.stale.insert(cq.clone());
        }
        self.holds = holds;
        // A fresh pass restores the running workloads under the new holds.
        self.verify = true;
        Ok(())
    }
}

/// The workload key of the Job at `k` (a cluster-scoped key read as `default`).
fn job_key_at(k: &Key) -> String {
    let ns = if k.0.is_empty() {
        "default"
    } else {
        k.0.as_str()
    };
    workloads::job_key(ns, &k.1)
}

fn changed(stores: &[&Store], seen: &[u64]) -> Option<BTreeSet<Key>> {
    let mut out = BTreeSet::new();
    for (s, &g) in stores.iter().zip(seen) {
        match s.changes_since(g) {
            Changes::All => return None,
            Changes::Keys(k) => out.extend(k),
        }
    }
    Some(out)
}

impl Kept {
    /// Records the bookkeeping of live `l` (just read or kept).
    fn track(&mut self, l: &Live) {
        if finish_admission(l).is_some() {
            self.gated_running.insert(sort_key(l));
        }
        if l.state == State::Running
            && l.info.is_some()
            && !l.ready_recorded
            && !l.objects.is_empty()
        {
            self.unrecorded.insert(sort_key(l));
        }
        if l.state == State::Waiting
            && in_engine(l, &self.submit_errors)
            && self.engine.is_admitted(&l.key)
        {
            self.admitted_waiting.insert(l.key.clone());
        }
    }

    /// Forgets the bookkeeping of live `l` (about to be replaced or gone).
    fn untrack(&mut self, l: &Live) {
        self.untrack_key(&sort_key(l));
    }

    fn untrack_key(&mut self, sk: &(Millis, String)) {
        self.gated_running.remove(sk);
        self.unrecorded.remove(sk);
        self.admitted_waiting.remove(&sk.1);
    }

    /// Adds live `l` to `lives` and to the scope indexes.
    fn put_live(&mut self, l: Live) {
        let scope = self.scopes.of(&l);
        if l.state == State::Terminating {
            self.terminating
                .entry(scope.clone())
                .or_default()
                .insert(sort_key(&l));
        }
        self.scope_keys
            .entry(scope)
            .or_default()
            .insert(l.key.clone());
        if let Some(o) = &l.serving {
            self.replicas
                .entry(o.clone())
                .or_default()
                .insert(l.key.clone());
        }
        if restored(&l) {
            self.running.insert(l.key.clone());
        }
        self.lives.insert(l.key.clone(), l);
    }

    /// Takes live `wk` out of `lives` and the scope indexes.
    fn take_live(&mut self, wk: &str) -> Option<Live> {
        let l = self.lives.remove(wk)?;
        self.running.remove(wk);
        let scope = self.scopes.of(&l);
        if let Some(keys) = self.scope_keys.get_mut(&scope) {
            keys.remove(wk);
            if keys.is_empty() {
                self.scope_keys.remove(&scope);
            }
        }
        if let Some(t) = self.terminating.get_mut(&scope) {
            t.remove(&sort_key(&l));
            if t.is_empty() {
                self.terminating.remove(&scope);
            }
        }
        if let Some(o) = &l.serving {
            if let Some(keys) = self.replicas.get_mut(o) {
                keys.remove(wk);
                if keys.is_empty() {
                    self.replicas.remove(o);
                }
            }
        }
        Some(l)
    }

    /// The scope whose decisions live `l` takes part in: its own when it is in the
    /// engine or terminates (one of an unknown scope holds every scope).
    fn scope_of(&self, l: &Live) -> Option<String> {
        (l.info.is_some() || l.state == State::Terminating).then(|| self.scopes.of(l))
    }

    /// The terminating workloads a preemptor in `scope` waits for, in a fresh pass's
    /// order (its scope's, then those of an unknown scope).
    fn terminating_in(&self, scope: &str) -> Vec<String> {
        [scope, UNKNOWN_SCOPE]
            .iter()
            .filter_map(|s| self.terminating.get(*s))
            .flatten()
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// Takes workload `wk` out of the engine (whatever its state) and forgets its key
    /// and bookkeeping; its scope is re-decided from its workloads in this pass.
    fn drop_from_engine(&mut self, wk: &str, now: Millis) -> Result<(), &'static str> {
        if !self.engine.forget_finished(wk) && self.engine.knows(wk) {
            self.engine
                .remove(now, wk)
                .map_err(|_| "removing an unknown workload")?;
            if !self.engine.forget_finished(wk) {
                return Err("a removed workload not finished");
            }
        }
        self.submit_errors.remove(wk);
        self.backoffs.retain(|(_, k)| k != wk);
        self.admitted.remove(wk);
        self.admitted_waiting.remove(wk);
        Ok(())
    }

    /// The scopes of the workloads `events` preempt or evict, where not in `held`
    /// (re-decided in this pass already).
    fn preempting_scopes(
        &self,
        events: &[crate::quota::Event],
        held: &BTreeSet<String>,
    ) -> BTreeSet<String> {
        events
            .iter()
            .filter(|e| matches!(e.kind, EventType::Preempted | EventType::Evicted))
            .map(|e| {
                self.lives
                    .get(&e.workload)
                    .map_or(UNKNOWN_SCOPE.to_string(), |l| self.scopes.of(l))
            })
            .filter(|s| !held.contains(s))
            .collect()
    }

    /// Re-decides preemption scope `scope` from its workloads as read now, as a fresh
    /// pass builds it: every workload of the scope leaves the engine, the running and
    /// terminating ones are restored in admission order, the waiting ones submitted.
    /// Cost: the scope's workloads. Returns their keys. Not while an admission or a
    /// readiness record in the scope is written (`writing`): its objects as read now
    /// predate it.
    fn rebuild_scope(
        &mut self,
        scope: &str,
        now: Millis,
        touched: &mut BTreeSet<String>,
        writing: &BTreeSet<String>,
    ) -> Result<Vec<String>, &'static str> {
        if scope == UNKNOWN_SCOPE {
            return Err("a workload of an unknown queue terminates or changed");
        }
        let keys = self.scope_keys.get(scope);
        if keys.is_some_and(|keys| writing.iter().any(|k| keys.contains(k))) {
            return Err(
                "a scope re-decided while an admission or readiness record in it is written",
            );
        }
        let mut order: Vec<(Millis, String)> = keys
            .into_iter()
            .flatten()
            .filter_map(|k| self.lives.get(k).map(sort_key))
            .collect();
        order.sort();
        for sk in &order {
            self.untrack_key(sk);
            self.drop_from_engine(&sk.1, now)?;
        }
        self.unfit.remove(scope);
        // Removals report Finished, restores Admitted: neither is this pass's news.
        let drained = self.engine.take_events();
        if drained
            .iter()
            .any(|e| !matches!(e.kind, EventType::Finished | EventType::Admitted))
        {
            return Err("events before scheduling");
        }
        for (_, k) in &order {
            let l = self.lives.get(k).ok_or("bookkeeping")?;
            let Some(mut info) = l.info.clone() else {
                continue;
            };
            if !matches!(l.state, State::Running | State::Terminating) {
                continue;
            }
            pods_ready::engine_readiness(self.pods_ready.as_ref(), l, &mut info);
            let admitted_at = l.admitted_at;
            let admitted_by = l.admitted_by.as_deref();
            match self
                .engine
                .restore_admitted_by(now, info, admitted_at, admitted_by)
            {
                Ok(Restored::Admitted) => {}
                // As a fresh restore: over quota (or pending), reported, re-decided
                // each pass.
                Ok(r) => {
                    self.unfit
                        .entry(scope.to_string())
                        .or_default()
                        .insert((admitted_at, k.clone()), unfit_problem(k, r));
                }
                Err(_) => return Err("a running workload could not be restored"),
            }
        }
        self.engine.take_events();
        for (_, k) in &order {
            let l = self.lives.remove(k).ok_or("bookkeeping")?;
            let done = if l.state == State::Waiting {
                self.submit(k, &l, now, touched)
            } else {
                Ok(())
            };
            self.track(&l);
            self.lives.insert(k.clone(), l);
            done?;
        }
        touched.extend(self.scopes.cluster_queues(scope));
        self.redecided += 1;
        Ok(order.into_iter().map(|(_, k)| k).collect())
    }

    /// The scopes where the engine's admissions are not those a fresh pass would
    /// restore: every running workload restored in admission order onto the queues alone
    /// must get the same flavors, borrowing and counts. Costs the running workloads, not
    /// the waiting.
    fn books_differ(&self, now: Millis) -> Result<BTreeSet<String>, &'static str> {
        let mut base = self.base.clone();
        base.now = now;
        let mut scratch = engine_with_queues(&base, &mut Vec::new());
        // The holds first, as a fresh pass sets them: a hold can leave a running
        // borrower over quota.
        self.holds.set(&mut scratch, now, &mut Vec::new());
        let mut running: Vec<&Live> = self
            .running
            .iter()
            .filter_map(|k| self.lives.get(k))
            .collect();
        running.sort_by(|a, b| (a.admitted_at, &a.key).cmp(&(b.admitted_at, &b.key)));
        // One that no longer fits (over quota, or pending) is re-decided with its scope,
        // which reports it as a fresh pass does.
        let mut unfit = BTreeSet::new();
        for l in &running {
            let Some(info) = &l.info else { continue };
            let admitted_by = l.admitted_by.as_deref();
            match scratch.restore_admitted_by(now, info.clone(), l.admitted_at, admitted_by) {
                Ok(Restored::Admitted) => {}
                Ok(_) => {
                    unfit.insert(l.key.as_str());
                }
                Err(_) => return Err("a running workload could not be restored"),
            }
        }
        Ok(running
            .iter()
            .filter(|l| {
                unfit.contains(l.key.as_str())
                    || scratch.admission_of(&l.key) != self.engine.admission_of(&l.key)
            })
            .map(|l| self.scopes.of(l))
            .collect())
    }

    fn simple(&self, key: &str) -> bool {
        self.engine
            .cluster_queue_of(key)
            .is_none_or(|cq| self.simple_cqs.contains(cq))
    }

    /// Re-reads workload `wk` from its objects in the cache (`Err`: cannot follow).
    fn reread(
        &self,
        cache: &Cache,
        wk: &str,
        job: Option<&Key>,
        cfg: &Config,
        serving: &ServingIndex,
    ) -> Result<Option<Live>, &'static str> {
        let mut snap = Snapshot::default();
        if let Some(k) = job {
            if let Some((_, v)) = first_of(&cache.jobs, k) {
                snap.jobs.push(v);
            }
        } else if let Some(keys) = self.members.get(wk) {
            let mut pods: Vec<(usize, Key, Value)> = Vec::new();
            for k in keys {
                if let Some((i, v)) = first_of(&cache.pods, k) {
                    pods.push((i, k.clone(), v));
                }
            }
            pods.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            snap.pods = pods.into_iter().map(|(_, _, v)| v).collect();
        }
        let claims = self.claims.index(&cfg.device_classes);
        let mut lives = collect(&snap, serving, &claims);
        if lives.len() > 1 || lives.iter().any(|l| l.key != wk) {
            return Err("a workload read under another key");
        }
        let mut live = lives.pop();
        if let Some(l) = live.as_mut().filter(|l| l.state != State::Waiting) {
            l.admitted_by = record_admission(cache, &l.key);
        }
        if let Some(l) = live.as_mut().filter(|l| state_kept_on_record(l)) {
            l.requeue = pods_ready::latest(l.requeue, self.book_requeue(&l.key));
        }
        Ok(live)
    }

    /// Applies the change of workload `wk` from `old` to `new` to the engine.
    fn apply(
        &mut self,
        wk: &str,
        old: Option<Live>,
        new: Option<&Live>,
        now: Millis,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), &'static str> {
        let old = match old {
            Some(o) if in_engine(&o, &self.submit_errors) => o,
            other => {
                if let Some(o) = &other {
                    self.untrack(o);
                }
                self.submit_errors.remove(wk);
                self.backoffs.retain(|(_, k)| k != wk);
                // Out of the engine's books as read, yet still admitted (a running
                // workload whose DRA claim went away reads without requests).
                if self.engine.is_admitted(wk) || self.admitted.contains(wk) {
                    self.drop_from_engine(wk, now)?;
                }
                let Some(n) = new else { return Ok(()) };
                if n.state != State::Waiting {
                    return Err("a workload runs that was not admitted here");
                }
                return self.submit(wk, n, now, touched);
            }
        };
        self.untrack(&old);
        let admitted = self.engine.is_admitted(wk);
        let same = |n: &Live| same_but_selector(n.info.as_ref(), old.info.as_ref());
        // Admitted with fewer pods (partial admission): its objects now say so.
        let as_admitted = old.info.as_ref().map(|i| {
            let mut i = i.clone();
            if let Some((_, _, counts)) = self.engine.admission_of(wk) {
                for (p, c) in i.pod_sets.iter_mut().zip(counts) {
                    p.count = c;
                    p.min_count = p.min_count.map(|m| m.min(c));
                }
            }
            i
        });
        let same_admitted = |n: &Live| same_but_selector(n.info.as_ref(), as_admitted.as_ref());
        match (old.state, new) {
            (State::Waiting | State::Running, None) => self.take_out(wk, now, touched)?,
            (State::Waiting, Some(n))
                if n.state == State::Waiting && same(n) && n.requeue == old.requeue => {}
            (State::Waiting, Some(n))
                if n.state == State::Running
                    && admitted
                    && same_admitted(n)
                    && self.engine.admitted_since(wk) == Some(n.admitted_at.min(now)) => {}
            (State::Running, Some(n))
                if n.state == State::Running && same(n) && n.admitted_at == old.admitted_at => {}
            // Still waiting, with other requests, priority, creation or requeue state (or
            // admitted here while its objects still wait): it leaves and queues again as
            // read now.
            (State::Waiting, Some(n)) if n.state == State::Waiting => {
                self.requeue(wk, n, now, touched)?;
            }
            _ => return Err("a workload changed in a way the engine has no update for"),
        }
        Ok(())
    }

    /// Submits waiting workload `n` under `wk` (a key of a finished workload is reused).
    fn submit(
        &mut self,
        wk: &str,
        n: &Live,
        now: Millis,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), &'static str> {
        let Some(mut info) = n.info.clone() else {
            return Ok(());
        };
        pods_ready::engine_readiness(self.pods_ready.as_ref(), n, &mut info);
        if let (Some(pr), Some(r)) = (&self.pods_ready, n.requeue) {
            if let Some(h) = pods_ready::hold(pr, r, now) {
                if let pods_ready::Hold::Backoff(until) = h {
                    self.backoffs.insert((until, wk.to_string()));
                }
                self.submit_errors.insert(wk.to_string(), hold_reason(h, r));
                return Ok(());
            }
            if pr.requeue_by_eviction_time {
                info.creation = r.evicted_at;
            }
        }
        if self.engine.knows(wk) {
            if !self.engine.forget_finished(wk) {
                return Err("a workload key used again");
            }
            self.requeues += 1;
        }
        match self.engine.submit(now, info) {
            Ok(()) => {
                if let Some(cq) = self.engine.cluster_queue_of(wk) {
                    touched.insert(cq.to_string());
                }
            }
            Err(e @ crate::quota::Error::UnknownPriorityClass { .. }) => {
                self.submit_errors.insert(
                    wk.to_string(),
                    ("UnknownPriorityClass".into(), e.to_string()),
                );
            }
            Err(crate::quota::Error::DuplicateWorkload(_)) => {
                return Err("a workload key used again")
            }
            Err(e) => {
                self.submit_errors
                    .insert(wk.to_string(), ("Invalid".into(), e.to_string()));
            }
        }
        Ok(())
    }

    /// Takes workload `wk` (in the engine, waiting or admitted) out and submits waiting
    /// `n` in its place, as a fresh pass reads it: deleted and created again. Its queue
    /// (and cohort) is re-decided; books moved in a cohort are checked before deciding.
    fn requeue(
        &mut self,
        wk: &str,
        n: &Live,
        now: Millis,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), &'static str> {
        self.take_out(wk, now, touched)?;
        self.admitted_waiting.remove(wk);
        self.submit(wk, n, now, touched)
    }

    /// Takes workload `wk` out of the engine; its queue (and cohort) is re-decided, and
    /// books moved in a cohort are checked before deciding.
    fn take_out(
        &mut self,
        wk: &str,
        now: Millis,
        touched: &mut BTreeSet<String>,
    ) -> Result<(), &'static str> {
        if self.engine.is_admitted(wk) && !self.simple(wk) {
            self.verify = true;
        }
        if let Some(cq) = self.engine.cluster_queue_of(wk) {
            touched.insert(cq.to_string());
        }
        self.engine
            .remove(now, wk)
            .map_err(|_| "removing an unknown workload")?;
        self.admitted.remove(wk);
        Ok(())
    }
}

/// Whether `new` is `old` but for node selectors added (the flavors' labels written on
/// admission): the same requests, counts, priority and times.
fn same_but_selector(
    new: Option<&crate::quota::WorkloadInfo>,
    old: Option<&crate::quota::WorkloadInfo>,
) -> bool {
    let (Some(new), Some(old)) = (new, old) else {
        return new.is_none() && old.is_none();
    };
    if new.pod_sets.len() != old.pod_sets.len() {
        return false;
    }
    let kept = new.pod_sets.iter().zip(&old.pod_sets).all(|(n, o)| {
        o.node_selector
            .iter()
            .all(|(k, v)| n.node_selector.get(k) == Some(v))
    });
    let strip = |i: &crate::quota::WorkloadInfo| {
        let mut i = i.clone();
        for p in &mut i.pod_sets {
            p.node_selector.clear();
        }
        i
    };
    kept && strip(new) == strip(old)
}

/// One pass from the changes since the last; `None` when it must decide from scratch.
fn fast_pass(
    mut kept: Kept,
    cache: &Cache,
    cfg: &Config,
    now: Millis,
    blocked: &BTreeMap<ObjRef, Blocked>,
    assumed: &Assumed,
) -> Result<(Plan, Kept), &'static str> {
    let writing = &assumed.recorded;
    let checks = [
        (now < kept.now, "time went back"),
        (
            cfg.device_classes != kept.device_classes || cfg.pods_ready != kept.pods_ready,
            "configuration changed",
        ),
        (
            // With `blockAdmission` the engine times out pods-ready too; the controller's
            // own timeouts take those workloads in this pass (checked again below).
            cfg.pods_ready.is_some()
                && kept.engine.next_timer().is_some_and(|t| t <= now)
                && !kept.engine.only_ready_timeouts_due(now),
            "an engine timer is due",
        ),
    ];
    if let Some((_, why)) = checks.iter().find(|(bad, _)| *bad) {
        return Err(why);
    }
    // The pass inputs, then the records (whose requeue states a pass reads).
    let stores = cache.fed_stores();
    let seen: Vec<u64> = stores.iter().map(|s| s.generation()).collect();
    if seen.len() != kept.seen.len() {
        return Err("stores changed");
    }
    // Queue objects and namespaces: a status write changes nothing; other changes go to
    // the kept engine (`incremental_queues.rs`).
    let mut queue_moved = Vec::new();
    for i in QUEUE_STORES {
        let keys =
            changed(&stores[i..=i], &kept.seen[i..=i]).ok_or("queue objects listed again")?;
        for k in keys {
            let now_fp = stores[i].get(&k).map(|v| fingerprint(&v));
            let k = (i, k);
            if now_fp.as_ref() != kept.queue_fps.get(&k) {
                queue_moved.push((k, now_fp));
            }
        }
    }
    let queues_changed = !queue_moved.is_empty();
    // Scopes whose ClusterQueues changed membership: re-decided from their workloads.
    let mut regrouped = BTreeSet::new();
    if queues_changed {
        let mut problems = Vec::new();
        let objects = queue_objects_cached(cache, &mut problems);
        if !problems.is_empty() {
            return Err("unusable queue objects");
        }
        regrouped = kept.follow_queue_objects(objects, cache, now)?;
        for (k, fp) in queue_moved {
            match fp {
                Some(fp) => kept.queue_fps.insert(k, fp),
                None => kept.queue_fps.remove(&k),
            };
        }
    }
    if kept.draining_busy() {
        return Err("a draining ClusterQueue with workloads in it");
    }
    let n_pods = cache.pods.len();
    let n_jobs = cache.jobs.len();
    let pods_at = QUEUE_STORES.end;
    let jobs_at = pods_at + n_pods;
    let rest_at = jobs_at + n_jobs;
    // DRA claims and templates in queued namespaces: those whose spec changed re-read
    // the workloads that name them (below).
    let claims_at = rest_at + 3;
    let states_at = stores.len() - 1;
    let mut respecified = Vec::new();
    for (at, source) in [
        (claims_at, ClaimSource::Template),
        (claims_at + 1, ClaimSource::Claim),
    ] {
        respecified.extend(
            kept.claims
                .follow(source, stores[at], kept.seen[at], &kept.queued_ns)
                .ok_or("claims listed again")?,
        );
    }
    // Serving owners (ReplicaSets, Deployments, StatefulSets) in queued namespaces.
    let mut owner_keys: [BTreeSet<Key>; 3] = Default::default();
    for (i, keys) in owner_keys.iter_mut().enumerate() {
        let at = rest_at + i;
        *keys = changed(&stores[at..=at], &kept.seen[at..=at])
            .ok_or("serving owners listed again")?
            .into_iter()
            .filter(|(ns, _)| kept.queued_ns.contains(ns))
            .collect();
    }
    // Records: the workloads whose requeue states changed are read again.
    let mut state_changed: BTreeSet<String> = BTreeSet::new();
    if cfg.pods_ready.is_some() {
        let keys =
            changed(&stores[states_at..], &kept.seen[states_at..]).ok_or("records listed again")?;
        for k in keys {
            let read = stores[states_at]
                .get(&k)
                .as_ref()
                .and_then(requeue_book::read_one);
            // The state a record of this name held, under the key it was read for.
            let old = kept
                .books
                .entries
                .iter()
                .find(|(_, s)| (&s.namespace, &s.name) == (&k.0, &k.1))
                .map(|(wk, s)| (wk.clone(), s.clone()));
            if old == read {
                continue;
            }
            for (wk, _) in old.iter().chain(&read) {
                state_changed.insert(wk.clone());
            }
            if let Some((wk, _)) = old {
                kept.books.entries.remove(&wk);
            }
            if let Some((wk, stored)) = read {
                kept.books.entries.insert(wk, stored);
            }
        }
    }
    let pod_keys = changed(&stores[pods_at..jobs_at], &kept.seen[pods_at..jobs_at])
        .ok_or("pods listed again")?;
    let job_keys = changed(&stores[jobs_at..rest_at], &kept.seen[jobs_at..rest_at])
        .ok_or("Jobs listed again")?;
    // Serving owners as a fresh pass reads them now. Which owner a replica pod has (its
    // workload's key) follows its ReplicaSet's Deployment: the pods of a ReplicaSet
    // added, removed or re-owned are read again.
    let rs_owned_before = !kept.rs_pods.is_empty();
    let mut pods_now: Vec<(Key, Option<Value>)> = pod_keys
        .into_iter()
        .map(|k| {
            let pod = first_of(&cache.pods, &k).map(|(_, v)| v);
            (k, pod)
        })
        .collect();
    for (k, pod) in &pods_now {
        match pod.as_ref().and_then(rs_entry) {
            Some(rs) => kept.rs_pods.insert(k.clone(), rs),
            None => kept.rs_pods.remove(k),
        };
        kept.set_done(k.clone(), pod.as_ref().and_then(done_pod_workload_key));
    }
    let rs_owned = !kept.rs_pods.is_empty();
    let owners_changed = owner_keys.iter().any(|k| !k.is_empty()) || rs_owned != rs_owned_before;
    if owners_changed {
        let now_objs = serving_objects(cache, &kept.queued_ns, rs_owned);
        let (before, after) = (
            replica_set_owners(&kept.serving_objs.0),
            replica_set_owners(&now_objs.0),
        );
        let moved: BTreeSet<&Key> = before
            .keys()
            .chain(after.keys())
            .filter(|rs| before.get(*rs) != after.get(*rs))
            .collect();
        // The pods of a ReplicaSet added, removed or re-owned are read again as if they
        // had changed: their workloads move to the keys a fresh pass gives them (a
        // running one is then restored with its scope, `REDECIDE_SCOPE`).
        let changed_pods: BTreeSet<&Key> = pods_now.iter().map(|(k, _)| k).collect();
        let rekeyed: Vec<Key> = kept
            .rs_pods
            .iter()
            .filter(|(pod, rs)| {
                rs.as_ref().is_some_and(|rs| moved.contains(rs)) && !changed_pods.contains(pod)
            })
            .map(|(pod, _)| pod.clone())
            .collect();
        for k in rekeyed {
            let pod = first_of(&cache.pods, &k).map(|(_, v)| v);
            pods_now.push((k, pod));
        }
        kept.serving_objs = now_objs;
    }
    let objs = std::mem::take(&mut kept.serving_objs);
    let serving = ServingIndex::new(&objs.0, &objs.1, &objs.2);
    // A hold recorded, changed or removed on an owner, or one ended: the holds a fresh
    // pass would set now replace the kept ones, queue by queue.
    let hold_ended = kept.holds.next_end().is_some_and(|t| t <= now);
    if owners_changed || queues_changed || hold_ended {
        let holds = Holds::read(&kept.engine, &serving, now);
        if holds != kept.holds {
            kept.follow_holds(holds, now)?;
        }
    }
    // Owners whose object changed: their replicas are read again (a replica's requeue
    // state lives on its owner) and their counts reported again.
    let mut owners_touched: BTreeSet<Owner> = BTreeSet::new();
    let bare_rs = replica_set_owners(&objs.0);
    for (i, kind) in [
        ServingKind::ReplicaSet,
        ServingKind::Deployment,
        ServingKind::StatefulSet,
    ]
    .into_iter()
    .enumerate()
    {
        for (ns, name) in &owner_keys[i] {
            if kind == ServingKind::ReplicaSet
                && bare_rs
                    .get(&(ns.clone(), name.clone()))
                    .is_some_and(Option::is_some)
            {
                continue;
            }
            owners_touched.insert(Owner {
                kind,
                namespace: ns.clone(),
                name: name.clone(),
            });
        }
    }
    // Workloads to re-read: key → the Job's key (for Jobs).
    let mut affected: BTreeMap<String, Option<Key>> = BTreeMap::new();
    for o in &owners_touched {
        for wk in kept.replicas.get(o).into_iter().flatten() {
            affected.insert(wk.clone(), None);
        }
    }
    for (k, pod) in pods_now {
        kept.claims.note(ClaimUser::Pod(k.clone()), pod.as_ref());
        let new_wk = pod
            .as_ref()
            .and_then(|p| live_pod_workload_key(p, &serving));
        let old_wk = kept.pod_wl.get(&k).cloned();
        if old_wk != new_wk {
            if let Some(o) = &old_wk {
                if let Some(m) = kept.members.get_mut(o) {
                    m.remove(&k);
                    if m.is_empty() {
                        kept.members.remove(o);
                    }
                }
            }
            match &new_wk {
                Some(n) => {
                    kept.members.entry(n.clone()).or_default().insert(k.clone());
                    kept.pod_wl.insert(k.clone(), n.clone());
                }
                None => {
                    kept.pod_wl.remove(&k);
                }
            }
        }
        affected.extend(old_wk.into_iter().chain(new_wk).map(|w| (w, None)));
    }
    // Pod workloads whose requeue state entry changed (one without pods reads as none).
    for wk in state_changed {
        if kept.members.contains_key(&wk) {
            affected.entry(wk).or_insert(None);
        }
    }
    for k in job_keys {
        let wk = job_key_at(&k);
        let job = first_of(&cache.jobs, &k).map(|(_, v)| v);
        if let Some(j) = &job {
            if job_workload_key(j).is_some_and(|w| w != wk) {
                return Err("a Job's key");
            }
        }
        kept.claims.note(ClaimUser::Job(k.clone()), job.as_ref());
        affected.insert(wk, Some(k));
    }
    // The workloads that name a claim object created, deleted or respecified.
    let claim_users: Vec<ClaimUser> = kept.claims.users_of(&respecified).cloned().collect();
    for user in claim_users {
        match user {
            ClaimUser::Pod(k) => {
                if let Some(wk) = kept.pod_wl.get(&k) {
                    affected.entry(wk.clone()).or_insert(None);
                }
            }
            ClaimUser::Job(k) => {
                affected.insert(job_key_at(&k), Some(k));
            }
        }
    }
    let mut touched: BTreeSet<String> = std::mem::take(&mut kept.stale);
    let mut candidates: BTreeSet<String> = kept.unsynced.clone();
    // Scopes re-decided from their workloads in this pass (see `Kept::rebuild_scope`):
    // evictions last pass, workloads terminating, a change the engine cannot follow.
    let mut held: BTreeSet<String> = std::mem::take(&mut kept.evicted_scopes);
    held.append(&mut regrouped);
    held.extend(kept.terminating.keys().cloned());
    held.extend(kept.unfit.keys().cloned());
    // An engine timer due (a minimum runtime running out): its workload's scope is
    // re-decided at `now`, as a fresh pass decides it.
    if kept.engine.next_timer().is_some_and(|t| t <= now) {
        let cqs = kept
            .engine
            .due_timer_queues(now)
            .ok_or("an engine timer is due")?;
        held.extend(cqs.iter().map(|cq| kept.scopes.of_cluster_queue(cq)));
    }
    // Pods whose eviction a PodDisruptionBudget refused: their scopes are re-decided
    // (a fresh pass preempts again, evicts the rest, and names the refusal).
    for pod in blocked.keys() {
        let key = (pod.namespace.clone(), pod.name.clone());
        if let Some(l) = kept.pod_wl.get(&key).and_then(|wk| kept.lives.get(wk)) {
            held.insert(
                kept.scope_of(l)
                    .ok_or("a blocked eviction of an unknown workload")?,
            );
        }
    }
    for (wk, job) in &affected {
        let new = kept.reread(cache, wk, job.as_ref(), cfg, &serving)?;
        // An admission being written shows once its write landed (the workload runs);
        // objects read before that may predate it. A workload whose readiness record is
        // written runs: only its objects gone stop the pass.
        if writing.contains(wk) && new.as_ref().is_none_or(|n| n.state == State::Waiting) {
            return Err("an object changed while its admission or readiness record is written");
        }
        let old = kept.take_live(wk);
        if let Some(o) = &old {
            kept.timed_out.remove(&sort_key(o));
        }
        owners_touched.extend(old.iter().chain(&new).filter_map(|l| l.serving.clone()));
        let scopes: Vec<String> = old
            .iter()
            .chain(&new)
            .filter_map(|l| kept.scope_of(l))
            .collect();
        let ends = old
            .iter()
            .chain(&new)
            .any(|l| l.state == State::Terminating);
        if ends || scopes.iter().any(|s| held.contains(s)) {
            held.extend(scopes);
            if let Some(o) = &old {
                kept.untrack(o);
            }
            kept.drop_from_engine(wk, now)?;
        } else {
            match kept.apply(wk, old, new.as_ref(), now, &mut touched) {
                Ok(()) => {}
                Err(why) if REDECIDE_SCOPE.contains(&why) => {
                    held.extend(scopes);
                    kept.drop_from_engine(wk, now)?;
                }
                Err(why) => return Err(why),
            }
        }
        if let Some(n) = new {
            if n.state == State::Running {
                kept.admitted.insert(wk.clone());
                if blocks_admission(cfg) {
                    kept.sync_readiness(&n)?;
                }
            }
            kept.track(&n);
            kept.put_live(n);
        }
        candidates.insert(wk.clone());
    }
    // Admitted here earlier, yet the objects still wait (the write failed): a fresh
    // pass queues it with the others, so it queues again here. One whose write is
    // under way stays admitted.
    let (still_writing, failed): (BTreeSet<String>, BTreeSet<String>) =
        std::mem::take(&mut kept.admitted_waiting)
            .into_iter()
            .partition(|wk| writing.contains(wk));
    kept.admitted_waiting = still_writing;
    for wk in failed {
        kept.queue_again(&wk, &held, |kept, l| {
            kept.requeue(&wk, l, now, &mut touched)
        })?;
        candidates.insert(wk);
    }
    // Backoffs ended: the workloads queue (a fresh pass submits them), or come back with
    // their scope when it is re-decided.
    while let Some((until, wk)) = kept.backoffs.first().cloned() {
        if until > now {
            break;
        }
        kept.backoffs.pop_first();
        kept.submit_errors.remove(&wk);
        kept.queue_again(&wk, &held, |kept, l| kept.submit(&wk, l, now, &mut touched))?;
        candidates.insert(wk);
    }
    // Pods-ready timeouts due: the workloads terminate (as a fresh pass reads them) and
    // their scopes are re-decided.
    held.extend(kept.time_out(now, writing)?);
    // Books a fresh restore would assign otherwise (flavors, borrowing): their scopes are
    // re-decided, which restores them as a fresh pass does.
    if kept.verify {
        held.extend(kept.books_differ(now)?);
        kept.verify = false;
    }
    let mut rebuilt: Vec<String> = Vec::new();
    for scope in &held {
        rebuilt.extend(kept.rebuild_scope(scope, now, &mut touched, writing)?);
    }
    if kept.engine.next_timer().is_some_and(|t| t <= now) {
        return Err("an engine timer is due");
    }
    // With `blockAdmission`, while an admitted workload's pods are not Ready nothing is
    // evaluated (a fresh pass holds every queue): the reasons to re-decide wait for the
    // pass that ends the hold, which also tells the held heads their reasons again.
    let held_pass = blocks_admission(cfg) && kept.engine.admission_blocked();
    if held_pass {
        kept.touched_while_held.append(&mut touched);
    } else {
        touched.append(&mut kept.touched_while_held);
        candidates.append(&mut kept.held_heads);
    }
    // Parked workloads keep the reason (and its numbers) they were parked with: those
    // of every cohort whose books moved are re-decided, as a fresh pass would.
    let mut refreshed: BTreeSet<String> = BTreeSet::new();
    let mut events = Vec::new();
    let mut round = 0;
    let mut admitted_while_blocking = false;
    loop {
        let todo: Vec<String> = touched.difference(&refreshed).cloned().collect();
        if todo.is_empty() && round > 0 {
            break;
        }
        for cq in todo {
            refreshed.extend(kept.engine.refresh_cohort_of(&cq, now));
            refreshed.insert(cq);
        }
        kept.engine.schedule(now).map_err(|_| "scheduling failed")?;
        let mut new_events = kept.engine.take_events();
        // A preemption in a scope followed incrementally: the kept engine may hold reasons
        // parked before that a fresh pass would not have decided (its preemptor takes the
        // head of the queue first), so the scope is re-decided from its workloads and
        // scheduled again.
        let preempting = kept.preempting_scopes(&new_events, &held);
        if round == 0 && !preempting.is_empty() {
            // The scopes this schedule admitted in are re-decided with it, so that one
            // schedule again orders all of the pass's admissions and evictions.
            let mut redo = preempting;
            for e in new_events.iter().filter(|e| e.kind != EventType::Pending) {
                let l = kept
                    .lives
                    .get(&e.workload)
                    .ok_or("a preemption beside a decision for an unknown workload")?;
                redo.insert(kept.scopes.of(l));
            }
            new_events.retain(|e| e.kind == EventType::Pending);
            events.append(&mut new_events);
            for scope in redo {
                rebuilt.extend(kept.rebuild_scope(&scope, now, &mut touched, writing)?);
                held.insert(scope);
            }
            continue;
        }
        round += 1;
        for ev in new_events {
            if round > 1 && matches!(ev.kind, EventType::Preempted | EventType::Evicted) {
                return Err("a preemption after re-deciding parked workloads");
            }
            if ev.kind == EventType::Admitted {
                if round > 1 {
                    return Err("an admission after re-deciding parked workloads");
                }
                // With `blockAdmission` the first admission holds every queue: a fresh
                // pass admits the same workload only if it took it in its first cycle,
                // from the front of its queue, as the kept engine did.
                if blocks_admission(cfg) {
                    let first_front = Some(BlockStart {
                        cycle: 1,
                        front: true,
                    });
                    if admitted_while_blocking || kept.engine.block_start() != first_front {
                        return Err("blockAdmission: an admission not at a queue's front");
                    }
                    admitted_while_blocking = true;
                }
                touched.extend(ev.cluster_queue.clone());
                kept.stale.extend(ev.cluster_queue.clone());
            }
            events.push(ev);
        }
    }
    // Held since an admission in this pass: what follows tells every workload what a
    // pass held from its start would (as a fresh pass does, `decide::held_timer`), and
    // the queues re-decided in it are re-decided again when the hold ends.
    let held_after = held_pass || (blocks_admission(cfg) && kept.engine.admission_blocked());
    if held_after && !held_pass {
        if events
            .iter()
            .any(|e| matches!(e.kind, EventType::Preempted | EventType::Evicted))
        {
            return Err("blockAdmission: an admission beside a preemption");
        }
        kept.touched_while_held.extend(refreshed.iter().cloned());
    }
    // Lines moved (a workload ahead left or arrived): the workloads whose message
    // changed with their place, though not re-decided (one walk per queue).
    for cq in &refreshed {
        kept.engine.report_line(cq, now);
    }
    events.extend(kept.engine.take_events());
    let mut plan = Plan {
        actions: kept.pods_ready_actions(now, assumed)?,
        ..Plan::default()
    };
    let flavor_labels: BTreeMap<&str, &BTreeMap<String, String>> = kept
        .flavor_labels
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let mut evicted_scopes = BTreeSet::new();
    let mut blocked_for = BlockedFor::new();
    // The reason and message each workload was last reported with by this pass's
    // schedule: the engine reports every message that changed (a moved place included),
    // so one reported last as waiting is told that message as it is.
    let mut reported: HashMap<&str, (&str, &str)> = HashMap::new();
    for ev in &events {
        match (&ev.kind, &ev.reason, &ev.message) {
            (EventType::Pending, Some(reason), Some(message)) => {
                reported.insert(&ev.workload, (reason, message));
            }
            _ => {
                reported.remove(ev.workload.as_str());
            }
        }
        match ev.kind {
            EventType::Preempted | EventType::Evicted => {
                // As a fresh pass: a running victim is evicted unless its scope waits
                // for terminating workloads already (then nothing more is evicted).
                let Some(l) = kept.lives.get(&ev.workload) else {
                    evicted_scopes.insert(UNKNOWN_SCOPE.to_string());
                    continue;
                };
                let scope = kept.scopes.of(l);
                // Every preempting scope was re-decided above (round 0); a preemption
                // anywhere else is one the kept engine cannot vouch for.
                if !held.contains(&scope) {
                    return Err("a preemption");
                }
                if l.state == State::Running && kept.terminating_in(&scope).is_empty() {
                    plan.actions
                        .extend(evict_action(l, ev, blocked, now, &mut blocked_for));
                }
                evicted_scopes.insert(scope);
            }
            EventType::Admitted => {
                let l = kept
                    .lives
                    .get(&ev.workload)
                    .ok_or("an unknown workload admitted")?;
                if ev
                    .cluster_queue
                    .as_ref()
                    .is_some_and(|cq| !kept.simple_cqs.contains(cq))
                {
                    kept.verify = true;
                }
                // As a fresh pass: only a waiting workload still admitted at the end of
                // the schedule is admitted (one preempted again in it is not).
                if l.state != State::Waiting || !kept.engine.is_admitted(&l.key) {
                    candidates.insert(ev.workload.clone());
                    continue;
                }
                plan.actions.push(admit_action(l, ev, &flavor_labels));
                kept.admitted.insert(l.key.clone());
                kept.admitted_waiting.insert(l.key.clone());
            }
            EventType::Pending => {
                candidates.insert(ev.workload.clone());
            }
            _ => {}
        }
    }
    // The re-decided scopes' workloads: admitted when the engine holds them admitted
    // or they run (a victim evicted again while it terminates is neither).
    for k in &rebuilt {
        let l = kept.lives.get(k).ok_or("bookkeeping")?;
        if kept.engine.is_admitted(k) || l.state == State::Running {
            kept.admitted.insert(k.clone());
        } else {
            kept.admitted.remove(k);
        }
    }
    kept.evicted_scopes = evicted_scopes;
    // Serving owners whose replicas were admitted, evicted or re-decided: their counts
    // (a fresh pass reports every owner's) and, when those moved, the messages of their
    // waiting replicas, which carry them.
    let owner_of = |k: &String| kept.lives.get(k).and_then(|l| l.serving.clone());
    owners_touched.extend(events.iter().filter_map(|e| owner_of(&e.workload)));
    owners_touched.extend(rebuilt.iter().filter_map(owner_of));
    for o in owners_touched {
        let Some(keys) = kept.replicas.get(&o) else {
            kept.serving.remove(&o);
            continue;
        };
        let mut admitted = 0u32;
        for k in keys {
            let l = kept.lives.get(k).ok_or("bookkeeping")?;
            admitted += u32::from(
                l.state == State::Running
                    || (l.state == State::Waiting && kept.engine.is_admitted(k)),
            );
        }
        let counts = (admitted, serving.object(&o).map_or(0, desired_replicas));
        if kept.serving.insert(o, counts) != Some(counts) {
            candidates.extend(keys.iter().cloned());
        }
    }
    for (_, key) in &kept.gated_running {
        let l = kept.lives.get(key).ok_or("bookkeeping")?;
        plan.actions.extend(finish_admission(l));
    }
    // Pending reasons: of the workloads that changed, that were not recorded yet, and
    // whose message the engine reported changed (re-decided, or moved in its line).
    // Held: each queue's first waiting workload says so (cost: the queues).
    if held_after {
        let heads = kept.engine.queue_heads();
        kept.held_heads.extend(heads.iter().cloned());
        candidates.extend(heads);
    }
    reported.retain(|k, _| kept.engine.is_waiting(k));
    let mut ordered: Vec<(Millis, &str)> = candidates
        .iter()
        .filter_map(|k| kept.lives.get(k))
        .filter(|l| l.state == State::Waiting)
        .map(|l| (l.admitted_at, l.key.as_str()))
        .collect();
    ordered.sort();
    let mut unsynced = BTreeSet::new();
    for (_, key) in ordered {
        let l = kept.lives.get(key).ok_or("bookkeeping")?;
        let fixed = l
            .invalid
            .clone()
            .or_else(|| kept.submit_errors.get(key).cloned());
        let from_engine = fixed.is_none();
        let want = fixed.or_else(|| match held_after {
            true => kept.engine.held_entry(key),
            false => reported
                .get(key)
                .map(|(reason, message)| (reason.to_string(), message.to_string()))
                .or_else(|| kept.engine.pending_entry(key)),
        });
        let Some((mut reason, mut message)) = want else {
            continue;
        };
        // Where what is written (or kept) is not the engine's own message, the engine
        // forgets what it reported: its next report of this workload counts as a change
        // (`Engine::report_line` finds moved lines by what was reported).
        if from_engine && keeps_recorded(&kept.engine, &reason, l) {
            kept.engine.forget_reported(key);
            if let Some(cq) = kept.engine.cluster_queue_of(key) {
                kept.touched_while_held.insert(cq.to_string());
            }
            continue;
        }
        if held_after && from_engine {
            kept.engine.forget_reported(key);
        }
        if let (true, Some((pod, delay, why))) = (from_engine, blocked_for.get(key)) {
            (reason, message) = blocked_reason(pod, *delay, why);
            kept.engine.forget_reported(key);
        } else if reason == "WaitingForPreemptedWorkloads" {
            let waiting_on = kept.terminating_in(&kept.scopes.of(l));
            if !waiting_on.is_empty() {
                message = terminating_message(&waiting_on);
                kept.engine.forget_reported(key);
            }
        }
        let message = replica_message(l, &kept.serving, message);
        if !shows(l, record_place(cache, key).as_deref(), &reason, &message) {
            unsynced.insert(key.to_string());
            plan.actions.push(Action::Pending {
                workload: key.to_string(),
                objects: l.objects.clone(),
                new_reason: l.recorded.as_ref().map(|(r, _)| r) != Some(&reason),
                reason,
                message,
            });
        }
    }
    for k in &candidates {
        kept.unsynced.remove(k);
    }
    kept.unsynced.extend(unsynced);
    replicas_actions(&serving, &kept.serving, &mut plan.actions);
    plan.serving = kept.serving.clone();
    drop(serving);
    kept.serving_objs = objs;
    plan.problems = kept.base_problems.clone();
    plan.problems.extend(kept.books.problems().cloned());
    let mut unfit: Vec<(&(Millis, String), &String)> = kept.unfit.values().flatten().collect();
    unfit.sort();
    plan.problems
        .extend(unfit.into_iter().map(|(_, problem)| problem.clone()));
    plan.admitted = kept.admitted.clone();
    plan.queue_counts = kept
        .engine
        .queue_counts()
        .into_iter()
        .map(|(name, a, p)| (name, (a, p)))
        .collect();
    // A fresh pass counts evicted workloads still holding quota as pending; in the kept
    // engine those are this pass's victims (earlier ones' scopes were re-decided).
    let victims: BTreeSet<(&str, &str)> = events
        .iter()
        .filter(|e| matches!(e.kind, EventType::Preempted | EventType::Evicted))
        .filter(|e| kept.engine.is_terminating(&e.workload))
        .filter_map(|e| Some((e.cluster_queue.as_deref()?, e.workload.as_str())))
        .collect();
    for (cq, _) in victims {
        if let Some(c) = plan.queue_counts.get_mut(cq) {
            c.1 += 1;
        }
    }
    // A fresh pass held from its start evaluates nothing: of the kept engine's timers
    // only the pods-ready timeouts and the holds' ends are its (wake-ups set by earlier
    // evaluations stay kept for the pass that ends the hold).
    plan.next_timer = match held_after {
        true => held_timer(&kept.engine),
        false => kept.engine.next_timer(),
    };
    plan.queues = kept.engine.queue_gauges();
    plan.local_queues = kept.engine.local_queue_gauges();
    drop_admissions_of_evicted(&mut plan.actions);
    plan.subjects = subjects(&kept.engine, &plan.actions, &events);
    let cx = record_updates::Context {
        engine: &kept.engine,
        pods_ready: kept.pods_ready.as_ref(),
        now,
    };
    plan.records = record_updates::updates(&cx, &plan.actions, |k| kept.lives.get(k));
    kept.seen = seen;
    kept.now = now;
    Ok((plan, kept))
}

/// The `rs_pods` entry of `pod`: present when a ReplicaSet is among its owners (what
/// makes a fresh pass read ReplicaSets), with the one that controls it.
fn rs_entry(pod: &Value) -> Option<Option<Key>> {
    owned_by(pod, "ReplicaSet").then(|| replica_set_of(pod))
}

/// Why [`Kept::apply`] gives up on a workload where re-deciding its scope from its
/// workloads (a fresh pass, scope by scope) follows.
const REDECIDE_SCOPE: [&str; 2] = [
    "a workload changed in a way the engine has no update for",
    "a workload runs that was not admitted here",
];

/// The writes a pass assumes landed while they are under way behind the pass that
/// decided them (`deferred_records`), by workload key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assumed {
    /// Admissions and readiness records: the kept engine holds these workloads admitted
    /// (recorded Ready) while their objects do not show it yet.
    pub recorded: BTreeSet<String>,
    /// Evictions for a pods-ready timeout (with their requeue state): the workloads
    /// stay timed out, terminating, and their eviction is not asked again.
    pub evicting: BTreeSet<String>,
}

impl Assumed {
    /// Whether no write is under way.
    pub fn is_empty(&self) -> bool {
        self.recorded.is_empty() && self.evicting.is_empty()
    }
}

/// Whether `cfg` has `waitForPodsReady` with `blockAdmission` (the engine holds queues
/// while an admitted workload's pods are not Ready).
fn blocks_admission(cfg: &Config) -> bool {
    cfg.pods_ready.as_ref().is_some_and(|c| c.block_admission)
}

impl Kept {
    /// With `waitForPodsReady`, the actions a fresh pass opens with: the requeue state
    /// writes (entries of this pass's timeouts, entries no longer needed), then
    /// `PodsReady` for running workloads Ready now but not recorded and the evictions of
    /// the timed-out ones, in admission order. A readiness record being written is
    /// assumed written, and an eviction being written (with its requeue state) is not
    /// asked again (`assumed`). Cost: those workloads and the entries.
    fn pods_ready_actions(
        &self,
        now: Millis,
        assumed: &Assumed,
    ) -> Result<Vec<Action>, &'static str> {
        let Some(cfg) = &self.pods_ready else {
            return Ok(Vec::new());
        };
        let mut set = BTreeMap::new();
        let mut out = Vec::new();
        let mut due: Vec<&(Millis, String)> = self
            .not_recorded(&assumed.recorded)
            .chain(&self.timed_out)
            .collect();
        due.sort();
        for (_, key) in due {
            let l = self.lives.get(key).ok_or("bookkeeping")?;
            if l.state == State::Terminating {
                if !assumed.evicting.contains(key) {
                    out.push(pods_ready::timeout_eviction(l, now, &mut set));
                }
                continue;
            }
            let Some(first) = l.objects.first() else {
                continue;
            };
            if l.ready {
                out.push(Action::PodsReady {
                    workload: l.key.clone(),
                    object: first.clone(),
                    queued_at: pods_ready::queued_at(l),
                    admitted_at: l.admitted_at,
                });
            } else if pods_ready::timed_out(cfg, l.admitted_at, now) {
                return Err("bookkeeping: a pods-ready timeout not taken");
            }
        }
        let finished_pods = |wk: &str| -> Option<Vec<OwnerRef>> {
            self.finished.contains_key(wk).then(|| {
                let pods = self.done_pods.iter().filter(|(_, w)| w.as_str() == wk);
                pods.map(|((_, name), _)| pods_ready::pod_owner(name))
                    .collect()
            })
        };
        let forget =
            pods_ready::forgotten(cfg, now, &self.books, |k| self.lives.get(k), finished_pods);
        let mut actions = pods_ready::state_actions(set, forget);
        actions.append(&mut out);
        Ok(actions)
    }

    /// The running workloads not recorded Ready, but those whose readiness record is
    /// being written (`writing`: assumed written).
    fn not_recorded<'a>(
        &'a self,
        writing: &'a BTreeSet<String>,
    ) -> impl Iterator<Item = &'a (Millis, String)> {
        self.unrecorded.iter().filter(|sk| !writing.contains(&sk.1))
    }

    /// Takes the running workloads whose pods-ready timeout is due at `now` as a fresh
    /// pass does: they terminate (holding their quota until their objects are gone) and
    /// are evicted each pass until their objects change. Returns their scopes, to be
    /// re-decided; a workload whose readiness record is being written (`writing`) is
    /// not timed out. Cost: the running workloads not recorded Ready.
    fn time_out(
        &mut self,
        now: Millis,
        writing: &BTreeSet<String>,
    ) -> Result<BTreeSet<String>, &'static str> {
        let Some(cfg) = &self.pods_ready else {
            return Ok(BTreeSet::new());
        };
        let mut due = Vec::new();
        for sk in self.not_recorded(writing) {
            let l = self.lives.get(&sk.1).ok_or("bookkeeping")?;
            if !l.ready && !l.objects.is_empty() && pods_ready::timed_out(cfg, l.admitted_at, now) {
                due.push(sk.clone());
            }
        }
        let mut scopes = BTreeSet::new();
        for sk in due {
            let mut l = self.take_live(&sk.1).ok_or("bookkeeping")?;
            self.untrack(&l);
            l.state = State::Terminating;
            scopes.insert(self.scopes.of(&l));
            self.timed_out.insert(sk);
            self.put_live(l);
        }
        Ok(scopes)
    }

    /// Queues waiting workload `wk` again with `queue` (given its live), unless its scope
    /// is among `held` (re-decided in this pass, which queues it with the others).
    fn queue_again(
        &mut self,
        wk: &str,
        held: &BTreeSet<String>,
        queue: impl FnOnce(&mut Kept, &Live) -> Result<(), &'static str>,
    ) -> Result<(), &'static str> {
        let l = self.lives.remove(wk).ok_or("bookkeeping")?;
        let redo = self.scope_of(&l).is_some_and(|s| held.contains(&s));
        let done = if redo { Ok(()) } else { queue(self, &l) };
        self.lives.insert(wk.to_string(), l);
        done
    }

    /// With `blockAdmission`, tells the engine whether running workload `n` (as read now)
    /// is ready, as a fresh restore does (`pods_ready::engine_readiness`): its pods
    /// became Ready (or were recorded so) ends its hold; pods no longer Ready before
    /// being recorded cannot be followed.
    fn sync_readiness(&mut self, n: &Live) -> Result<(), &'static str> {
        if n.info.is_none() || !self.engine.is_admitted(&n.key) {
            return Ok(());
        }
        if n.ready || n.ready_recorded {
            self.engine.mark_pods_ready(&n.key);
        } else if !self.engine.waits_for_pods(&n.key) {
            return Err("blockAdmission: a workload's pods are not Ready any more");
        }
        Ok(())
    }

    /// The requeue state workload `key`'s record keeps.
    fn book_requeue(&self, key: &str) -> Option<pods_ready::Requeue> {
        self.books.requeue(key)
    }

    /// Records whether pod `pod` is finished, for workload `done` (`None`: not finished
    /// or gone).
    fn set_done(&mut self, pod: Key, done: Option<String>) {
        if let Some(old) = self.done_pods.remove(&pod) {
            if let Some(n) = self.finished.get_mut(&old) {
                *n -= 1;
                if *n == 0 {
                    self.finished.remove(&old);
                }
            }
        }
        if let Some(wk) = done {
            *self.finished.entry(wk.clone()).or_default() += 1;
            self.done_pods.insert(pod, wk);
        }
    }
}
