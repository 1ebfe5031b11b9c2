//! The controller's decision, pure: a snapshot of the API server (queue objects, pods,
//! Jobs) in, the actions to take out. Nothing is remembered between passes: the engine's
//! books are rebuilt from the snapshot every time, so a restarted controller (or a new
//! leader) decides exactly as the old one would have.
//!
//! ```text
//! pods/Jobs ─► workloads ─► running (ungated pods, unsuspended Jobs) ─► Engine::restore_admitted
//!                        └► waiting (gated pods, suspended Jobs)     ─► Engine::submit
//! Engine::schedule(now) ─► Admit (ungate / unsuspend) · Evict (Eviction API / suspend) · Pending
//! ```
//! Victims of a preemption still terminating keep their quota (they are restored as
//! running), and while any workload of a cohort (or of a ClusterQueue without one) is
//! terminating no new victim is chosen in it: a preemptor never evicts a second set of
//! victims for the quota the first set is about to free. Other cohorts are not held up.

use super::claims::ClaimIndex;
use super::holds::Holds;
pub use super::model::{Action, Blocked, ObjKind, ObjRef, Plan, Snapshot, Subject};
use super::pods_ready;
use super::readiness::{Hold, Requeue};
use super::record_updates;
use super::serving::{desired_replicas, recorded_replicas, Owner, ServingIndex};
use super::time::{rfc3339, Millis};
pub(super) use super::workloads::{collect, Live, State};
use crate::quota::events::split_place;
use crate::quota::{Engine, EventType, Restored};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Decides one pass over `s`.
pub fn decide(s: &Snapshot) -> Plan {
    decide_full(s).0
}

/// What a from-scratch pass built besides its plan: the engine after scheduling and
/// the workloads read, so [`super::incremental`] can go on from there.
pub(super) struct Built {
    pub(super) engine: Engine,
    pub(super) lives: Vec<Live>,
    /// Problems of the queue objects and of the holds (before any workload was read).
    pub(super) queue_problems: Vec<String>,
    /// The holds set on the engine.
    pub(super) holds: Holds,
    pub(super) submit_errors: BTreeMap<String, (String, String)>,
    /// Some running workload could not be restored (an error, not a misfit).
    pub(super) restore_problem: bool,
    /// Running or terminating workloads that no longer fit their queue's quota (over
    /// quota, or left pending without a flavor), with the problem reported, in restore
    /// order.
    pub(super) unfit: Vec<(String, String)>,
    /// The preemption scopes ([`Scopes::of`]) of the workloads the engine preempted or
    /// evicted in this pass (empty: none was).
    pub(super) evicted_scopes: BTreeSet<String>,
    /// ClusterQueues with a waiting workload that kept its recorded reason while
    /// admission was held ([`keeps_recorded`]): told their reasons again when it is not.
    pub(super) kept_recorded: BTreeSet<String>,
}

/// The `Admit` action for waiting workload `l` admitted by event `ev`.
pub(super) fn admit_action(
    l: &Live,
    ev: &crate::quota::Event,
    flavor_labels: &BTreeMap<&str, &BTreeMap<String, String>>,
) -> Action {
    let selector = |pod_sets: &mut dyn Iterator<Item = &BTreeMap<String, String>>| {
        let mut out = BTreeMap::new();
        for flavor in pod_sets.flat_map(|per_resource| per_resource.values()) {
            if let Some(labels) = flavor_labels.get(flavor.as_str()) {
                out.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        out
    };
    let flavors = ev.flavors.as_ref();
    let node_selector = selector(&mut flavors.into_iter().flat_map(|f| f.values()));
    // Pods of several pod sets: each its own pod set's flavors (a pod set may be on
    // another flavor than its group's other pod sets).
    let pod_selectors: BTreeMap<String, BTreeMap<String, String>> = l
        .pod_sets
        .iter()
        .map(|(pod, set)| {
            let own = flavors.and_then(|f| f.get(set));
            (pod.clone(), selector(&mut own.into_iter()))
        })
        .collect();
    // One pod set: a Job, or a pod group whose pods are alike (the only partial
    // admissions the workloads read here allow).
    let partial = ev.pod_counts.as_ref().map(|c| c.values().sum::<u32>());
    let is_job = l.objects.first().is_some_and(|o| o.kind == ObjKind::Job);
    let (objects, excess) = match (is_job, partial) {
        (true, _) => (l.objects.clone(), Vec::new()),
        (false, Some(k)) => {
            let k = (k as usize).min(l.gated.len());
            (l.gated[..k].to_vec(), l.gated[k..].to_vec())
        }
        (false, None) => (l.gated.clone(), Vec::new()),
    };
    Action::Admit {
        workload: l.key.clone(),
        objects,
        node_selector,
        pod_selectors,
        partial,
        excess,
    }
}

/// The `Admit` action finishing running workload `l`'s admission after a restart
/// mid-way: pods still to ungate, and a partial group's pods beyond its count.
pub(super) fn finish_admission(l: &Live) -> Option<Action> {
    (l.state == State::Running && (!l.gated.is_empty() || !l.excess.is_empty())).then(|| {
        Action::Admit {
            workload: l.key.clone(),
            objects: l.gated.clone(),
            node_selector: BTreeMap::new(),
            pod_selectors: BTreeMap::new(),
            partial: l.admitted_count,
            excess: l.excess.clone(),
        }
    })
}

/// Drops the `Admit`s that would finish the admission of a workload this same plan
/// evicts (a running pod group with a pod recreated gated, preempted in this pass):
/// ungating its pod only for the eviction to take it again would start a pod on a GPU
/// the preemptor waits for.
pub(super) fn drop_admissions_of_evicted(actions: &mut Vec<Action>) {
    let evicted: BTreeSet<String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { workload, .. } => Some(workload.clone()),
            _ => None,
        })
        .collect();
    if !evicted.is_empty() {
        actions
            .retain(|a| !matches!(a, Action::Admit { workload, .. } if evicted.contains(workload)));
    }
}

/// Preemptor → (pod, backoff, API message) of a victim whose eviction is refused by a
/// PodDisruptionBudget and not due for a retry yet.
pub(super) type BlockedFor = BTreeMap<String, (ObjRef, Millis, String)>;

/// The `Evict` action for running victim `l` of event `ev`: its objects but those whose
/// eviction is refused and not due for a retry (`blocked`), which are recorded in
/// `blocked_for` under the preemptor instead; `None` when all of them are.
pub(super) fn evict_action(
    l: &Live,
    ev: &crate::quota::Event,
    blocked: &BTreeMap<ObjRef, Blocked>,
    now: Millis,
    blocked_for: &mut BlockedFor,
) -> Option<Action> {
    let by = ev.by.clone().unwrap_or_default();
    let mut objects = Vec::new();
    for (r, grace) in l.objects.iter().zip(l.graces.iter().copied()) {
        match blocked.get(r) {
            Some(b) if b.until > now => {
                blocked_for
                    .entry(by.clone())
                    .or_insert((r.clone(), b.delay, b.why.clone()));
            }
            _ => objects.push((r.clone(), grace)),
        }
    }
    (!objects.is_empty()).then(|| Action::Evict {
        workload: l.key.clone(),
        objects,
        reason: ev.reason.clone().unwrap_or_default(),
        by,
        requeue: None,
    })
}

/// An engine holding the queue objects, namespaces and priority classes of `s` (no
/// workload yet); objects it cannot use land in `problems`.
pub(super) fn engine_with_queues(s: &Snapshot, problems: &mut Vec<String>) -> Engine {
    let now = s.now;
    let mut engine = Engine::new(pods_ready::engine_config(s.pods_ready.as_ref()));
    for (name, labels) in &s.namespaces {
        engine.apply_namespace(name, labels.clone(), now);
    }
    for f in &s.flavors {
        if let Err(e) = engine.apply_flavor(f, now) {
            problems.push(e.to_string());
        }
    }
    for c in &s.priority_classes {
        if let Err(e) = engine.apply_priority_class(c) {
            problems.push(e.to_string());
        }
    }
    for q in &s.cluster_queues {
        if let Err(e) = engine.apply_cluster_queue(q, now) {
            problems.push(e.to_string());
        }
    }
    for q in &s.local_queues {
        if let Err(e) = engine.apply_local_queue(q, now) {
            problems.push(e.to_string());
        }
    }
    engine
}

/// Decides one pass over `s`, returning what was built on the way.
pub(super) fn decide_full(s: &Snapshot) -> (Plan, Built) {
    let now = s.now;
    let mut plan = Plan::default();
    let mut engine = engine_with_queues(s, &mut plan.problems);
    let serving = ServingIndex::new(&s.replica_sets, &s.deployments, &s.stateful_sets);
    // Capacity coupled scale-downs freed, held as their targets record it.
    let holds = Holds::read(&engine, &serving, now);
    holds.set(&mut engine, now, &mut plan.problems);
    plan.problems.extend(holds.problems.iter().cloned());
    let queue_problems = plan.problems.clone();
    let claims = ClaimIndex::new(&s.claim_templates, &s.claims, &s.device_classes);
    let mut lives = collect(s, &serving, &claims);
    // Running workloads first, oldest admission first: the books as they were.
    lives.sort_by(|a, b| (a.admitted_at, &a.key).cmp(&(b.admitted_at, &b.key)));
    if let Some(cfg) = &s.pods_ready {
        pods_ready::timeouts(cfg, s, &mut lives, &mut plan);
    }
    let scopes = Scopes::new(s);
    // Terminating workloads per preemption scope (cohort, or ClusterQueue without one).
    let mut terminating: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in lives.iter().filter(|l| l.state == State::Terminating) {
        terminating
            .entry(scopes.of(l))
            .or_default()
            .push(l.key.clone());
    }
    // Whether preemptions in `l`'s scope wait, and for which workloads. A terminating
    // workload whose queue is unknown holds every scope (its quota cannot be placed).
    let waiting_on = |l: &Live| -> Vec<String> {
        [scopes.of(l), UNKNOWN_SCOPE.to_string()]
            .iter()
            .filter_map(|k| terminating.get(k))
            .flatten()
            .cloned()
            .collect()
    };
    let mut pending_keys = BTreeSet::new();
    let mut restore_problem = false;
    let mut unfit = Vec::new();
    for l in &lives {
        let Some(mut info) = l.info.clone() else {
            continue;
        };
        pods_ready::engine_readiness(s.pods_ready.as_ref(), l, &mut info);
        match l.state {
            State::Running | State::Terminating => {
                match engine.restore_admitted_by(now, info, l.admitted_at, l.admitted_by.as_deref())
                {
                    Ok(Restored::Admitted) => {}
                    Ok(r) => {
                        let problem = unfit_problem(&l.key, r);
                        unfit.push((l.key.clone(), problem.clone()));
                        plan.problems.push(problem);
                    }
                    Err(e) => {
                        restore_problem = true;
                        plan.problems.push(format!("{}: {e}", l.key))
                    }
                }
            }
            State::Waiting => {}
        }
    }
    engine.take_events();
    // What runs in a draining ClusterQueue is evicted (`stopPolicy: HoldAndDrain`).
    engine.drain_stopped(now);
    let mut submit_errors: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut held: BTreeMap<String, (String, String)> = BTreeMap::new();
    for l in lives.iter().filter(|l| l.state == State::Waiting) {
        let Some(mut info) = l.info.clone() else {
            continue;
        };
        pods_ready::engine_readiness(s.pods_ready.as_ref(), l, &mut info);
        if let (Some(cfg), Some(r)) = (&s.pods_ready, l.requeue) {
            if let Some(h) = pods_ready::hold(cfg, r, now) {
                held.insert(l.key.clone(), hold_reason(h, r));
                continue;
            }
            if cfg.requeue_by_eviction_time {
                info.creation = r.evicted_at;
            }
        }
        match engine.submit(now, info) {
            Ok(()) => {
                pending_keys.insert(l.key.clone());
            }
            Err(e @ crate::quota::Error::UnknownPriorityClass { .. }) => {
                submit_errors.insert(
                    l.key.clone(),
                    ("UnknownPriorityClass".into(), e.to_string()),
                );
            }
            Err(e) => {
                submit_errors.insert(l.key.clone(), ("Invalid".into(), e.to_string()));
            }
        }
    }
    if let Err(e) = engine.schedule(now) {
        plan.problems.push(format!("scheduling: {e}"));
    }
    let events = engine.take_events();
    // Admission held at the end of the schedule (`blockAdmission`, from its start or
    // since an admission in it): every waiting workload is told what a pass held from
    // its start tells it ([`Engine::held_entry`]), whatever was evaluated before the
    // hold began, so the passes while held say the same.
    let admission_held = engine.admission_blocked();
    plan.next_timer = match admission_held {
        true => held_timer(&engine),
        false => engine.next_timer(),
    };
    let heads: BTreeSet<String> = match admission_held {
        true => engine.queue_heads().into_iter().collect(),
        false => BTreeSet::new(),
    };
    let state = engine.final_state();
    let by_key: BTreeMap<&str, &Live> = lives.iter().map(|l| (l.key.as_str(), l)).collect();
    let flavor_labels: BTreeMap<&str, &BTreeMap<String, String>> = s
        .flavors
        .iter()
        .map(|f| (f.metadata.name.as_str(), &f.spec.node_labels))
        .collect();
    let mut blocked_for = BlockedFor::new();
    let evicted_scopes: BTreeSet<String> = events
        .iter()
        .filter(|e| matches!(e.kind, EventType::Preempted | EventType::Evicted))
        .map(|e| {
            by_key
                .get(e.workload.as_str())
                .map_or(UNKNOWN_SCOPE.to_string(), |l| scopes.of(l))
        })
        .collect();
    for ev in &events {
        let Some(l) = by_key.get(ev.workload.as_str()) else {
            continue;
        };
        match ev.kind {
            EventType::Admitted if pending_keys.contains(&l.key) && engine.is_admitted(&l.key) => {
                plan.actions.push(admit_action(l, ev, &flavor_labels));
            }
            EventType::Preempted | EventType::Evicted
                if l.state == State::Running && waiting_on(l).is_empty() =>
            {
                plan.actions
                    .extend(evict_action(l, ev, &s.blocked, now, &mut blocked_for));
            }
            _ => {}
        }
    }
    // Running workloads whose group still has gated pods (a restart mid-way): finish.
    plan.actions
        .extend(lives.iter().filter_map(finish_admission));
    // Serving owners: admitted replicas (running, or admitted now) of desired.
    let mut replicas: BTreeMap<Owner, u32> = BTreeMap::new();
    for l in &lives {
        if let Some(o) = &l.serving {
            let admitted = l.state == State::Running
                || (l.state == State::Waiting && engine.is_admitted(&l.key));
            *replicas.entry(o.clone()).or_insert(0) += u32::from(admitted);
        }
    }
    for (owner, admitted) in &replicas {
        let desired = serving.object(owner).map_or(0, desired_replicas);
        plan.serving.insert(owner.clone(), (*admitted, desired));
    }
    let engine_pending: BTreeMap<&str, (&str, &str)> = state
        .pending
        .iter()
        .map(|p| (p.workload.as_str(), (p.reason.as_str(), p.message.as_str())))
        .collect();
    let mut kept_recorded = BTreeSet::new();
    for l in lives.iter().filter(|l| l.state == State::Waiting) {
        let (reason, message) = if let Some((r, m)) = l
            .invalid
            .clone()
            .or_else(|| submit_errors.get(&l.key).cloned())
            .or_else(|| held.get(&l.key).cloned())
        {
            (r, m)
        } else if let Some(&(r, m)) = engine_pending.get(l.key.as_str()) {
            let held_entry = (admission_held && (r != "Queued" || heads.contains(&l.key)))
                .then(|| engine.held_entry(&l.key))
                .flatten()
                .filter(|(hr, hm)| (hr.as_str(), hm.as_str()) != (r, m));
            let (r, m) = held_entry
                .as_ref()
                .map_or((r, m), |(r, m)| (r.as_str(), m.as_str()));
            if held_entry.is_some() {
                engine.forget_reported(&l.key);
            }
            // What is written (or kept) is not the engine's message: a kept engine must
            // see its next report of this workload as a change.
            if keeps_recorded(&engine, r, l) {
                engine.forget_reported(&l.key);
                kept_recorded.extend(engine.cluster_queue_of(&l.key).map(String::from));
                continue;
            }
            if let Some((pod, delay, why)) = blocked_for.get(&l.key) {
                engine.forget_reported(&l.key);
                blocked_reason(pod, *delay, why)
            } else if r == "WaitingForPreemptedWorkloads" && !waiting_on(l).is_empty() {
                engine.forget_reported(&l.key);
                (r.to_string(), terminating_message(&waiting_on(l)))
            } else {
                (r.to_string(), m.to_string())
            }
        } else {
            continue;
        };
        let message = replica_message(l, &plan.serving, message);
        let record_place = s.record_places.get(&l.key).map(String::as_str);
        if !shows(l, record_place, &reason, &message) {
            plan.actions.push(Action::Pending {
                workload: l.key.clone(),
                objects: l.objects.clone(),
                new_reason: l.recorded.as_ref().map(|(r, _)| r) != Some(&reason),
                reason,
                message,
            });
        }
    }
    replicas_actions(&serving, &plan.serving, &mut plan.actions);
    plan.admitted = lives
        .iter()
        .filter(|l| engine.is_admitted(&l.key) || l.state == State::Running)
        .map(|l| l.key.clone())
        .collect();
    plan.queue_counts = state
        .cluster_queues
        .iter()
        .map(|q| (q.name.clone(), (q.admitted_workloads, q.pending_workloads)))
        .collect();
    plan.queues = engine.queue_gauges();
    plan.local_queues = engine.local_queue_gauges();
    drop_admissions_of_evicted(&mut plan.actions);
    plan.subjects = subjects(&engine, &plan.actions, &events);
    let by_key: HashMap<&str, &Live> = lives.iter().map(|l| (l.key.as_str(), l)).collect();
    let cx = record_updates::Context {
        engine: &engine,
        pods_ready: s.pods_ready.as_ref(),
        now: s.now,
    };
    plan.records = record_updates::updates(&cx, &plan.actions, |k| by_key.get(k).copied());
    drop(by_key);
    let built = Built {
        engine,
        lives,
        queue_problems,
        holds,
        submit_errors,
        restore_problem,
        unfit,
        evicted_scopes,
        kept_recorded,
    };
    (plan, built)
}

/// The metrics' view ([`Subject`]) of the workloads `actions` admit or evict and of the
/// preemptors they name; `events` are the engine's of this pass.
pub(super) fn subjects(
    engine: &Engine,
    actions: &[Action],
    events: &[crate::quota::Event],
) -> BTreeMap<String, Subject> {
    let admitted_now: BTreeSet<&str> = events
        .iter()
        .filter(|e| e.kind == EventType::Admitted)
        .map(|e| e.workload.as_str())
        .collect();
    let mut out = BTreeMap::new();
    let mut add = |key: &str| {
        if key.is_empty() || out.contains_key(key) {
            return;
        }
        if let (Some(cq), Some(created), Some((ns, lq))) = (
            engine.cluster_queue_of(key),
            engine.created_at(key),
            engine.local_queue_of(key),
        ) {
            let subject = Subject {
                cluster_queue: cq.to_string(),
                local_queue: (ns.to_string(), lq.to_string()),
                created,
                admitted_now: admitted_now.contains(key),
            };
            out.insert(key.to_string(), subject);
        }
    };
    for a in actions {
        match a {
            Action::Admit { workload, .. } => add(workload),
            Action::Evict { workload, by, .. } => {
                add(workload);
                add(by);
            }
            _ => {}
        }
    }
    // A workload whose pods became Ready: its queues from the engine, its wait from its
    // objects (the engine of a pass from scratch restores a running workload with its
    // creation, not its last requeue).
    for a in actions {
        if let Action::PodsReady {
            workload,
            queued_at,
            ..
        } = a
        {
            if out.contains_key(workload) {
                continue;
            }
            if let (Some(cq), Some((ns, lq))) = (
                engine.cluster_queue_of(workload),
                engine.local_queue_of(workload),
            ) {
                let subject = Subject {
                    cluster_queue: cq.to_string(),
                    local_queue: (ns.to_string(), lq.to_string()),
                    created: *queued_at,
                    admitted_now: false,
                };
                out.insert(workload.clone(), subject);
            }
        }
    }
    out
}

/// The next timer of a pass that ends with admission held (`blockAdmission`): what a
/// pass held from its start leaves (it evaluates nothing, so it sets no wake-up): the
/// pods-ready timeouts and the holds' ends. Wake-ups set before the hold began are
/// the business of the pass that ends it. Costs the timers pending.
pub(super) fn held_timer(engine: &Engine) -> Option<Millis> {
    [engine.next_ready_timeout(), engine.next_hold_end()]
        .into_iter()
        .flatten()
        .min()
}

/// Whether waiting workload `l`, left by the engine at `reason`, keeps the reason it has
/// recorded: while `blockAdmission` holds admission, the workloads behind each queue's
/// head are not evaluated (`Queued`), and rewriting every one of them on each admission
/// (and back once the pods are Ready) would cost a write per waiting workload. As in
/// Kueue, their last reason stays; each queue's head says `WaitingForPodsReady`.
pub(super) fn keeps_recorded(engine: &Engine, reason: &str, l: &Live) -> bool {
    reason == "Queued" && l.recorded.is_some() && engine.admission_blocked()
}

/// Whether waiting workload `l` shows `reason` and `message` already: its pods (or its
/// Job) carry the reason and the message's sentence, and its `Workload` record
/// (`record_place`, `status.positionInClusterQueue`) the place the message names. A
/// place that moved is thus one write, to the record alone.
pub(super) fn shows(l: &Live, record_place: Option<&str>, reason: &str, message: &str) -> bool {
    let (sentence, place) = split_place(message);
    let carried = l
        .recorded
        .as_ref()
        .is_some_and(|(r, m)| r == reason && m == sentence);
    carried && record_place == place
}

/// The problem reported for running workload `key` restored as `r` (not within quota).
pub(super) fn unfit_problem(key: &str, r: Restored) -> String {
    match r {
        Restored::OverQuota => format!(
            "{key} runs over its queue's quota (quota lowered): it keeps what it uses until it ends, and nothing is admitted in its place"
        ),
        _ => format!(
            "{key} runs but no longer fits its queue (queue deleted, or no flavor for its pods): it holds no quota"
        ),
    }
}

/// The pending message of workload `l` with its owner's replica counts when it is a
/// serving replica.
pub(super) fn replica_message(
    l: &Live,
    counts: &BTreeMap<Owner, (u32, u32)>,
    message: String,
) -> String {
    match &l.serving {
        Some(o) => {
            let (admitted, desired) = counts.get(o).copied().unwrap_or_default();
            format!(
                "replica of {} ({admitted} of {desired} admitted): {message}",
                o.describe()
            )
        }
        None => message,
    }
}

/// The `Replicas` annotations to write: owners with queued replicas (`counts`), or
/// annotated before (scaled to zero since), whose annotation differs.
pub(super) fn replicas_actions(
    serving: &ServingIndex,
    counts: &BTreeMap<Owner, (u32, u32)>,
    actions: &mut Vec<Action>,
) {
    for (owner, object) in serving.owners() {
        let (admitted, desired) = match counts.get(&owner) {
            Some(c) => *c,
            None if recorded_replicas(object).is_some() => (0, desired_replicas(object)),
            None => continue,
        };
        let value = format!("{admitted}/{desired}");
        if recorded_replicas(object) != Some(value.as_str()) {
            actions.push(Action::Replicas {
                owner: ObjRef {
                    kind: owner.kind.into(),
                    namespace: owner.namespace.clone(),
                    name: owner.name.clone(),
                },
                value,
            });
        }
    }
}

/// The pending reason of a workload held after pods-ready timeouts (the plan's words).
pub(super) fn hold_reason(h: Hold, r: Requeue) -> (String, String) {
    match h {
        Hold::Backoff(until) => (
            "Backoff".into(),
            format!(
                "evicted after pods were not ready in time ({} time(s)); requeued at {}",
                r.count,
                rfc3339(until)
            ),
        ),
        Hold::Deactivated => (
            "Deactivated".into(),
            format!(
                "deactivated after {} requeues (backoffLimitCount reached)",
                r.count.saturating_sub(1)
            ),
        ),
    }
}

/// The pending reason of a preemptor whose victim `pod`'s eviction is refused (a
/// PodDisruptionBudget) and retried after `delay`.
pub(super) fn blocked_reason(pod: &ObjRef, delay: Millis, why: &str) -> (String, String) {
    (
        "EvictionBlocked".to_string(),
        format!(
            "eviction of {}/{} blocked by a PodDisruptionBudget, retrying in {}s ({why})",
            pod.namespace,
            pod.name,
            delay.div_ceil(1000)
        ),
    )
}

/// The message of a preemptor waiting while `keys` (evicted workloads of its scope)
/// terminate.
pub(super) fn terminating_message(keys: &[String]) -> String {
    format!(
        "waiting for evicted workloads to terminate: {}",
        keys.join(", ")
    )
}

/// Scope of a workload whose LocalQueue or ClusterQueue is unknown.
pub(super) const UNKNOWN_SCOPE: &str = "?";

/// Preemption scopes: a workload's cohort, or its ClusterQueue when that has none.
/// Scopes share no quota, so what happens in one never changes a decision in another.
#[derive(Clone, Debug, Default)]
pub(super) struct Scopes {
    local_queues: BTreeMap<(String, String), String>,
    cohorts: BTreeMap<String, Option<String>>,
}

impl Scopes {
    pub(super) fn new(s: &Snapshot) -> Self {
        Scopes {
            local_queues: s
                .local_queues
                .iter()
                .map(|q| {
                    (
                        (
                            q.metadata
                                .namespace
                                .clone()
                                .unwrap_or_else(|| "default".into()),
                            q.metadata.name.clone(),
                        ),
                        q.spec.cluster_queue.clone(),
                    )
                })
                .collect(),
            cohorts: s
                .cluster_queues
                .iter()
                .map(|q| (q.metadata.name.clone(), q.spec.cohort_name.clone()))
                .collect(),
        }
    }

    /// The ClusterQueues of `scope`.
    pub(super) fn cluster_queues(&self, scope: &str) -> Vec<String> {
        self.cohorts
            .iter()
            .filter(|(cq, cohort)| match cohort {
                Some(c) => scope.strip_prefix("cohort/") == Some(c.as_str()),
                None => scope.strip_prefix("clusterqueue/") == Some(cq.as_str()),
            })
            .map(|(cq, _)| cq.clone())
            .collect()
    }

    /// The scope of ClusterQueue `cq`.
    pub(super) fn of_cluster_queue(&self, cq: &str) -> String {
        match self.cohorts.get(cq) {
            Some(Some(cohort)) => format!("cohort/{cohort}"),
            Some(None) => format!("clusterqueue/{cq}"),
            None => UNKNOWN_SCOPE.into(),
        }
    }

    pub(super) fn of(&self, l: &Live) -> String {
        match self.cluster_queue_of(l) {
            Some(cq) => self.of_cluster_queue(cq),
            None => UNKNOWN_SCOPE.into(),
        }
    }

    /// The ClusterQueue of `l`'s LocalQueue, when it has both; for an admitted
    /// workload whose LocalQueue is gone, the one that admitted it (where the engine
    /// keeps it booked, [`crate::quota::Engine::restore_admitted_by`]).
    pub(super) fn cluster_queue_of<'a>(&'a self, l: &'a Live) -> Option<&'a String> {
        let info = l.info.as_ref()?;
        let lq = (info.namespace.clone(), info.queue_name.clone());
        match self.local_queues.get(&lq) {
            None if l.state != State::Waiting => l.admitted_by.as_ref(),
            cq => cq,
        }
    }
}
