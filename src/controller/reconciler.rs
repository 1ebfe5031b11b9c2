//! The Kubernetes shell around [`super::decide`]: read a snapshot, decide, apply — only
//! while this instance holds the Lease. [`run`] keeps a watch-fed [`Cache`] of every kind
//! a pass reads (queue objects, pods and Jobs naming a queue, serving owners, DRA
//! claims); its changes wake the loop, and a pass snapshots from it without a request.
//! A resync interval and the Lease renewal bound the wait.
//!
//! ```text
//! watches ─► Cache ─notify─► loop: Elector::tick ─leader?─► snapshot ─► decide ─► apply
//!              ▲                ▲                                              │ PUT pods/Jobs,
//!              │ own writes     └────────── resync / renew interval ◄──────────┘ POST eviction, Events
//!              └───────────────────────────────────────────────────────────────┘
//! ```
//! Writes start from the cache's copy of the object (a GET without a cache) and PUT it
//! back with that resourceVersion; a copy behind the API server gets 409 and is read
//! once more; a concurrent change after that fails the write and the next pass decides
//! again. What the API server
//! answers to a write goes into the cache at once, so the next pass reads its own writes
//! even before their watch events arrive. A cached pass decides from the changes since
//! the last one ([`super::incremental`]; [`PassState::with_cache_rebuilding`] decides
//! each from scratch). Without a cache ([`pass`], [`PassState::new`]) a pass LISTs
//! everything instead.

use super::cache::{Cache, Key};
pub use super::config::Config;
use super::decide::decide;
use super::deferred_records::{self, DeferredRecords};
use super::error::{Error, Result};
use super::evictions::EvictionBackoff;
use super::finish_watch::FinishWatch;
use super::in_flight::at_most;
use super::incremental::{decide_cached, Assumed, IncStats, Incremental};
use super::lease::Elector;
use super::metrics::ControllerMetrics;
use super::model::{Action, ObjKind, ObjRef, Plan};
use super::requeue_state;
pub use super::snapshot::{list_priority_classes, snapshot, snapshot_cached};
use super::time::Millis;
use super::workload_record::Update;
use super::writes::{KubeWrites, Writes, Written};
use k8s_openapi::jiff::Timestamp;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What the controller remembers between passes: when to retry evictions that a
/// PodDisruptionBudget refused, and (optionally) the watch-fed cache a pass reads
/// instead of LISTing. Every decision is still made from the objects themselves.
pub struct PassState {
    pub evictions: EvictionBackoff,
    /// Read by passes instead of LISTs when set (fed by [`Cache::spawn_feeders`]).
    pub cache: Option<Arc<Cache>>,
    /// Decides cached passes from the changes since the last one (else each cached
    /// pass decides from scratch).
    pub incremental: Option<Arc<Mutex<Incremental>>>,
    /// Set by a cached pass that reached a fixed point (see [`PassState::settled`]).
    settled: Option<Settled>,
    /// Updated after every pass when set (served on `/metrics`).
    pub metrics: Option<Arc<ControllerMetrics>>,
    /// The writes a cached pass does not wait for (record places; with `assume`, the
    /// whole of a plan that only admits, records readiness and tells reasons), and what
    /// writes left unwritten for the next pass.
    deferred: DeferredRecords,
    /// Passes hand an admitting plan's writes to a task and go on assuming them.
    assume: bool,
    /// Finds the workloads that finished, for their records' `Finished` (cached passes).
    finish: FinishWatch,
}

/// A cached pass that decided nothing to do: the cache's generation it read and the
/// engine's next timer.
#[derive(Clone, Copy, Debug)]
struct Settled {
    generation: u64,
    next_timer: Option<Millis>,
}

impl std::fmt::Debug for PassState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassState")
            .field("evictions", &self.evictions)
            .field("cached", &self.cache.is_some())
            .field("incremental", &self.incremental.is_some())
            .field("settled", &self.settled)
            .field("metrics", &self.metrics.is_some())
            .field("deferred", &self.deferred)
            .field("assume", &self.assume)
            .finish()
    }
}

impl PassState {
    /// Passes LIST what they read.
    pub fn new(cfg: &Config) -> Self {
        PassState {
            evictions: EvictionBackoff::new(cfg.eviction_backoff_base, cfg.eviction_backoff_max),
            cache: None,
            incremental: None,
            settled: None,
            metrics: None,
            deferred: DeferredRecords::default(),
            assume: false,
            finish: FinishWatch::new(),
        }
    }

    /// Passes update `metrics`.
    pub fn with_metrics(self, metrics: Arc<ControllerMetrics>) -> Self {
        PassState {
            metrics: Some(metrics),
            ..self
        }
    }

    /// Whether a pass at `now` would decide exactly as the last one, which had nothing
    /// to do: no cached object changed since (same generation), no engine timer is
    /// due, and nothing else runs on time (no `waitForPodsReady`, no eviction waiting
    /// out a PodDisruptionBudget backoff — a settled pass is only recorded then).
    pub fn settled(&self, now: Millis) -> bool {
        match (&self.cache, &self.settled) {
            (Some(cache), Some(s)) => {
                s.generation == cache.generation() && s.next_timer.is_none_or(|t| now < t)
            }
            _ => false,
        }
    }

    /// Forgets the fixed point (the next pass decides again).
    pub fn unsettle(&mut self) {
        self.settled = None;
    }

    /// Passes read `cache` (which must be fed) and put their own writes into it; each
    /// decides from the changes since the last ([`Incremental`]).
    pub fn with_cache(cfg: &Config, cache: Arc<Cache>) -> Self {
        PassState {
            incremental: Some(Arc::new(Mutex::new(Incremental::new()))),
            ..Self::with_cache_rebuilding(cfg, cache)
        }
    }

    /// Like [`PassState::with_cache`], but every pass decides from scratch (the
    /// reference, and the benchmark's baseline).
    pub fn with_cache_rebuilding(cfg: &Config, cache: Arc<Cache>) -> Self {
        PassState {
            cache: Some(cache),
            ..Self::new(cfg)
        }
    }

    /// A cached incremental pass whose plan only admits, records that admitted
    /// workloads' pods are Ready and tells waiting workloads their reasons hands its
    /// writes to a task and returns; the passes after it assume those admissions and
    /// readiness records until their writes are answered (as Kueue's scheduler assumes a
    /// workload in its cache and writes its admission from a goroutine). A pass that
    /// must decide from scratch, or evicts, waits for them first. With
    /// `waitForPodsReady` the task reads an admission's requeue state back before it
    /// ungates, as a pass does. `wake` is notified when such a write fails (the next
    /// pass tries it again).
    pub fn assuming_admissions(mut self, wake: Arc<Notify>) -> Self {
        self.assume = true;
        self.deferred.wake_on_failure(wake);
        self
    }

    /// Waits until the writes that passes deferred have landed (those that failed
    /// are tried again with the next pass's).
    pub async fn records_written(&mut self) {
        if let Some(cache) = &self.cache {
            self.deferred.join(cache).await;
        }
    }

    /// How many cached passes were decided from the changes / from scratch.
    pub fn incremental_stats(&self) -> Option<IncStats> {
        self.incremental
            .as_ref()
            .map(|i| i.lock().unwrap_or_else(|e| e.into_inner()).stats)
    }
}

/// A source of wall-clock time in milliseconds (injected so tests can steer it).
pub trait Clock: Send + Sync {
    fn now(&self) -> Millis;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        Timestamp::now().as_millisecond().max(0) as Millis
    }
}

/// A 429 from the Eviction API: the refusal's message (a PodDisruptionBudget blocks).
fn eviction_refused(e: &Error) -> Option<String> {
    match e {
        Error::Api {
            source: kube::Error::Api(s),
            ..
        } if s.code == 429 => Some(s.message.clone()),
        _ => None,
    }
}

/// Puts a write's outcome into the cache (if any): the stored object, or its absence.
fn seen(cache: Option<&Cache>, r: &ObjRef, result: Result<Written>) -> Result<()> {
    let Some(cache) = cache else {
        return result.map(|_| ());
    };
    match result {
        Ok(Some(v)) => {
            cache.observe(r.kind.name(), &v);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if e.is_not_found() {
                let key: Key = (r.namespace.clone(), r.name.clone());
                cache.forget(r.kind.name(), &key);
            }
            Err(e)
        }
    }
}

/// Applies a plan; returns how many writes failed (retried by the next pass).
/// Evictions refused with 429 are recorded in `evictions` for a later retry. What the
/// API server answers is put into `cache` (when passes read one).
pub async fn apply(
    client: &kube::Client,
    cfg: &Config,
    plan: &Plan,
    evictions: &mut EvictionBackoff,
    cache: Option<&Cache>,
    now: Millis,
) -> usize {
    apply_counted(client, cfg, plan, evictions, cache, now)
        .await
        .failed
}

/// What [`apply_counted`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Writes that failed (retried by the next pass).
    pub failed: usize,
    /// Indices of the plan's actions that took effect: an `Admit` that ungated or
    /// unsuspended one of its objects (its workload runs now; the rest is finished by a
    /// later pass), an `Evict` whose every object was evicted, suspended or already gone
    /// (one refused or failed is evicted again by a later pass, which counts then), a
    /// `PodsReady` recorded.
    pub done: Vec<usize>,
}

/// [`apply`], also telling which actions took effect (what the metrics count).
pub async fn apply_counted(
    client: &kube::Client,
    cfg: &Config,
    plan: &Plan,
    evictions: &mut EvictionBackoff,
    cache: Option<&Cache>,
    now: Millis,
) -> Applied {
    let writes = KubeWrites {
        client,
        cfg,
        cache,
        writing: None,
    };
    apply_with(&writes, cfg, plan, evictions, cache, now).await
}

/// The reconciler's rules over any [`Writes`]: actions in plan order, the waiting
/// workloads' reasons last and [`REASON_WRITES_IN_FLIGHT`] at a time (each writes its own
/// objects; a reason recorded for an evicted workload comes after its eviction); an admission
/// deferred while the API server holds newer requeue state; a partial admission's extra
/// pods deleted only once the admitted ones are ungated; a pods-ready timeout recorded
/// on its serving owner before any pod goes, and not evicted at all when its requeue
/// state could not be written; an eviction a PodDisruptionBudget refuses retried with
/// backoff; an Event after each write that took effect.
pub(crate) async fn apply_with(
    w: &impl Writes,
    cfg: &Config,
    plan: &Plan,
    evictions: &mut EvictionBackoff,
    cache: Option<&Cache>,
    now: Millis,
) -> Applied {
    let mut failed = 0;
    let mut done = Vec::new();
    // Workloads whose requeue state could not be written: not evicted in this pass.
    let mut unrecorded: std::collections::BTreeSet<String> = Default::default();
    // The waiting workloads' reasons, written after everything else.
    let mut reasons = Vec::new();
    for (index, action) in plan.actions.iter().enumerate() {
        match action {
            Action::Admit {
                workload,
                objects,
                node_selector,
                pod_selectors,
                partial,
                excess,
            } => {
                // A pod workload's requeue state newer than the pass read (a cache whose
                // record lags behind its pods) defers the admission.
                if let (Some(pr), true) = (&cfg.pods_ready, requeue_state::kept_here(workload)) {
                    match w.fresh_hold(pr, workload, now).await {
                        Ok(None) => {}
                        Ok(Some(hold)) => {
                            failed += 1;
                            tracing::warn!(%workload, ?hold, "requeue state newer than the pass read; admission deferred");
                            w.writes_answered(workload);
                            continue;
                        }
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, %workload, "reading requeue state; admission deferred");
                            w.writes_answered(workload);
                            continue;
                        }
                    }
                }
                tracing::info!(%workload, ?partial, "admitting");
                let mut all_admitted = true;
                let mut any_admitted = false;
                for r in objects {
                    let selector = pod_selectors.get(&r.name).unwrap_or(node_selector);
                    let result = w.admit(r, selector, *partial, now).await;
                    match seen(cache, r, result) {
                        Ok(()) => {
                            any_admitted = true;
                            w.event(
                                r,
                                "Admitted",
                                &format!("workload {workload} admitted"),
                                false,
                                now,
                            )
                            .await
                        }
                        Err(e) => {
                            failed += 1;
                            all_admitted = false;
                            tracing::warn!(error = %e, %workload, "admit");
                        }
                    }
                }
                if any_admitted {
                    done.push(index);
                }
                // Only once the admitted pods are ungated: a group left with fewer pods
                // than its total and none ungated would never run.
                if !all_admitted {
                    w.writes_answered(workload);
                    continue;
                }
                for r in excess {
                    match w.delete_excess(r).await {
                        Ok(true) => {
                            let note = format!(
                                "workload {workload} admitted with {} pods: this one is not needed",
                                partial.unwrap_or(0)
                            );
                            w.event(r, "NotAdmitted", &note, false, now).await;
                        }
                        Ok(false) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, %workload, pod = %r.name, "deleting a pod left out of a partial admission");
                        }
                    }
                }
                w.writes_answered(workload);
            }
            Action::Evict {
                workload,
                objects,
                reason,
                by,
                requeue,
            } => {
                if requeue.is_some() && unrecorded.contains(workload) {
                    failed += 1;
                    tracing::warn!(%workload, "requeue state not recorded; eviction deferred to the next pass");
                    w.writes_answered(workload);
                    continue;
                }
                tracing::info!(%workload, %reason, %by, "evicting");
                // A pods-ready timeout is recorded on the serving owner first (it outlives
                // the pods; without it the eviction waits for the next pass), then on
                // each pod before it goes (`pods_ready.rs`).
                let carrier = |r: &ObjRef| !matches!(r.kind, ObjKind::Pod | ObjKind::Job);
                let mut ordered: Vec<&(ObjRef, i64)> = objects.iter().collect();
                if requeue.is_some() {
                    ordered.sort_by_key(|(r, _)| !carrier(r));
                }
                let mut evicted = 0;
                for (r, grace) in ordered {
                    if let (Some(n), ObjKind::Pod) = (requeue, r.kind) {
                        let result = w.record_requeue(r, *n, now).await;
                        if let Err(e) = seen(cache, r, result) {
                            if !e.is_not_found() {
                                failed += 1;
                                tracing::warn!(error = %e, %workload, "recording requeue");
                            }
                        }
                    }
                    let result = match (r.kind, requeue) {
                        (ObjKind::Pod, _) => w.evict(r, *grace).await,
                        (ObjKind::Job, _) => w.suspend(r, *requeue, now).await,
                        (_, Some(n)) => w.record_requeue(r, *n, now).await,
                        (_, None) => Ok(None),
                    };
                    match seen(cache, r, result) {
                        Ok(()) => {
                            evicted += 1;
                            evictions.clear(r);
                            let (event, note) = if by.is_empty() {
                                ("Evicted", format!("workload {workload} evicted ({reason})"))
                            } else {
                                (
                                    "Preempted",
                                    format!("workload {workload} preempted ({reason}) by {by}"),
                                )
                            };
                            w.event(r, event, &note, true, now).await;
                        }
                        Err(e) if e.is_not_found() => {
                            evicted += 1;
                            evictions.clear(r);
                        }
                        Err(e) if eviction_refused(&e).is_some() => {
                            let why = eviction_refused(&e).unwrap_or_default();
                            let delay = evictions.refused(r, now, &why);
                            tracing::info!(%workload, pod = %r.name, delay_ms = delay, %why,
                                           "eviction refused (PodDisruptionBudget); retrying later");
                        }
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, %workload, "evict");
                            if requeue.is_some() && carrier(r) {
                                tracing::warn!(%workload, "requeue state not recorded on the owner; eviction deferred to the next pass");
                                break;
                            }
                        }
                    }
                }
                if evicted == objects.len() {
                    done.push(index);
                }
                w.writes_answered(workload);
            }
            Action::RequeueState {
                namespace,
                set,
                forget,
            } => match w
                .write_requeue_state(namespace, set, forget, &plan.records, now)
                .await
            {
                Ok(written) if written == requeue_state::Written::default() => {}
                Ok(written) => {
                    tracing::info!(%namespace, set = set.len(), forget = forget.len(),
                                   stored = written.stored, deleted = written.deleted,
                                   "requeue state written");
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(error = %e, %namespace, "writing requeue state; retried next pass");
                    unrecorded.extend(set.iter().map(|e| e.workload.clone()));
                }
            },
            Action::Pending { .. } => reasons.push(action),
            Action::PodsReady {
                workload, object, ..
            } => {
                let result = w.record_ready(object, now).await;
                match seen(cache, object, result) {
                    Ok(()) => done.push(index),
                    Err(e) => {
                        failed += 1;
                        tracing::warn!(error = %e, %workload, "recording pods ready");
                    }
                }
                w.writes_answered(workload);
            }
            Action::Replicas { owner, value } => {
                let result = w.annotate_replicas(owner, value).await;
                if let Err(e) = seen(cache, owner, result) {
                    failed += 1;
                    tracing::warn!(error = %e, owner = %owner.name, "annotating admitted replicas");
                }
            }
        }
    }
    // Collected first: a closure held across the awaits would make the pass's future
    // not `Send` for every lifetime (rustc's higher-ranked closure limitation).
    let writes: Vec<_> = reasons
        .into_iter()
        .map(|a| write_reason(w, a, cache, now))
        .collect();
    failed += at_most(writes, REASON_WRITES_IN_FLIGHT)
        .await
        .into_iter()
        .sum::<usize>();
    Applied { failed, done }
}

/// How many waiting workloads' reasons are written at once: each is one request to
/// its own objects, so a pass that moves a long queue's line waits for a few round
/// trips to the API server, not one per workload.
pub const REASON_WRITES_IN_FLIGHT: usize = 16;

/// Writes a `Pending` action's reason on its objects (a Job's on the Job alone) and,
/// when the reason is new, an Event; returns how many writes failed.
async fn write_reason(
    w: &impl Writes,
    action: &Action,
    cache: Option<&Cache>,
    now: Millis,
) -> usize {
    let Action::Pending {
        workload,
        objects,
        reason,
        message,
        new_reason,
    } = action
    else {
        return 0;
    };
    let mut failed = 0;
    let carriers = if objects.first().is_some_and(|o| o.kind == ObjKind::Job) {
        1
    } else {
        objects.len()
    };
    for r in objects.iter().take(carriers) {
        let result = w.record_pending(r, reason, message, now).await;
        if let Err(e) = seen(cache, r, result) {
            failed += 1;
            tracing::warn!(error = %e, %workload, "recording pending reason");
        }
    }
    if let (Some(r), true) = (objects.first(), *new_reason) {
        w.event(r, reason, message, false, now).await;
    }
    failed
}

/// The pass's status writes, after its actions ([`apply_with`]): each ClusterQueue's
/// counts, then `records` in their order. Returns how many queue writes failed and the
/// records to write again next pass.
pub(crate) async fn write_status(
    w: &impl Writes,
    plan: &Plan,
    records: Vec<Update>,
    now: Millis,
) -> (usize, Vec<Update>) {
    let mut failed = 0;
    for (name, (admitted, pending)) in &plan.queue_counts {
        if let Err(e) = w.write_queue_status(name, *admitted, *pending).await {
            failed += 1;
            tracing::warn!(error = %e, queue = %name, "writing ClusterQueue status");
        }
    }
    (failed, w.write_records(&records, now).await)
}

/// One pass with nothing remembered from earlier passes (see [`pass_with`]).
pub async fn pass(client: &kube::Client, cfg: &Config, now: Millis) -> Result<Plan> {
    pass_with(client, cfg, &mut PassState::new(cfg), now).await
}

/// One pass: snapshot (from `state.cache` when set, else by LIST), decide, apply.
/// Returns the plan (for tests and logs); [`Error::NotSynced`] while the cache has not
/// completed its first LISTs.
pub async fn pass_with(
    client: &kube::Client,
    cfg: &Config,
    state: &mut PassState,
    now: Millis,
) -> Result<Plan> {
    let mut problems = Vec::new();
    state.settled = None;
    let generation = state.cache.as_ref().map(|c| c.generation());
    let took;
    let mut plan = match &state.cache {
        Some(cache) if !cache.synced() => return Err(Error::NotSynced),
        Some(cache) => {
            state.evictions.prune(now, |r| {
                let key = (r.namespace.clone(), r.name.clone());
                cache.pods.iter().any(|s| s.contains(&key))
            });
            let blocked = state.evictions.blocked().clone();
            let started = std::time::Instant::now();
            let plan = match &state.incremental {
                Some(inc) if state.assume => {
                    let assumed = state.deferred.writing().now();
                    // Held only while deciding (no await): a pass is not interleaved.
                    let kept = lock(inc).decide_assuming(cache, cfg, now, &blocked, &assumed);
                    match kept {
                        Some(plan) => plan,
                        None => {
                            // From scratch: the objects as written.
                            state.deferred.join(cache).await;
                            lock(inc).decide(cache, cfg, now, &blocked)
                        }
                    }
                }
                Some(inc) => lock(inc).decide(cache, cfg, now, &blocked),
                None => decide_cached(cache, cfg, now, &blocked),
            };
            took = started.elapsed();
            plan
        }
        None => {
            let mut snap = snapshot(client, cfg, now, &mut problems).await?;
            let pods: std::collections::BTreeSet<(String, String)> = snap
                .pods
                .iter()
                .map(|p| {
                    (
                        p["metadata"]["namespace"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                        p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            state.evictions.prune(now, |r| {
                pods.contains(&(r.namespace.clone(), r.name.clone()))
            });
            snap.blocked = state.evictions.blocked().clone();
            let started = std::time::Instant::now();
            let plan = decide(&snap);
            took = started.elapsed();
            plan
        }
    };
    problems.append(&mut plan.problems);
    for p in &problems {
        tracing::warn!(problem = %p, "unusable object");
    }
    plan.problems = problems;
    let cache = state.cache.clone();
    if let Some(c) = cache.as_ref().filter(|_| assumable(state, &plan)) {
        write_behind(client, cfg, state, c, &plan, took, now);
        return Ok(plan);
    }
    if let Some(c) = cache.as_deref().filter(|_| state.deferred.writes_plans()) {
        // This plan's writes follow those of the plans under way.
        state.deferred.join(c).await;
    }
    let applied = apply_counted(
        client,
        cfg,
        &plan,
        &mut state.evictions,
        cache.as_deref(),
        now,
    )
    .await;
    if let Some(m) = &state.metrics {
        m.record_pass(&plan, &applied.done, now, took);
    }
    let writes = KubeWrites {
        client,
        cfg,
        cache: cache.as_deref(),
        writing: None,
    };
    let earlier = state.deferred.take_unwritten();
    let (records, later) = pass_records(state, cache.as_deref(), &plan, earlier.records);
    if let Some(c) = cache.as_deref() {
        state.deferred.before_writing(c, &keys(&records)).await;
    }
    let (queues_failed, unwritten) = write_status(&writes, &plan, records, now).await;
    if let (Some(c), Some((later, written))) = (&cache, later) {
        state.deferred.start(client, c, None, later, written, now);
    }
    // Failures of writes passes deferred count too (a settled pass would not retry).
    let failed =
        applied.failed + queues_failed + unwritten.len() + state.deferred.failed() + earlier.failed;
    state.deferred.keep_unwritten(0, unwritten);
    if failed > 0 {
        tracing::info!(failed, "some writes failed; the next pass retries");
    }
    if let Some(generation) = generation {
        let timed = cfg.pods_ready.is_some() || !state.evictions.blocked().is_empty();
        if failed == 0 && plan.actions.is_empty() && !timed {
            state.settled = Some(Settled {
                generation,
                next_timer: plan.next_timer,
            });
        }
    }
    Ok(plan)
}

fn lock(inc: &Mutex<Incremental>) -> std::sync::MutexGuard<'_, Incremental> {
    inc.lock().unwrap_or_else(|e| e.into_inner())
}

fn keys(records: &[Update]) -> BTreeSet<String> {
    records.iter().map(|u| u.key.clone()).collect()
}

/// A cached pass's deferrable record updates, and every record it has an update for.
type Later = (Vec<Update>, BTreeSet<String>);

/// The records a pass writes: `records` (what earlier passes left unwritten) first, in
/// their order, then the finished workloads', then the plan's. A cached pass defers the ones that
/// only tell a place: those come back second, with every record the pass has an update
/// for.
fn pass_records(
    state: &mut PassState,
    cache: Option<&Cache>,
    plan: &Plan,
    mut records: Vec<Update>,
) -> (Vec<Update>, Option<Later>) {
    if let Some(cache) = cache {
        records.extend(state.finish.updates(cache));
    }
    records.extend(plan.records.iter().cloned());
    match cache {
        Some(_) => {
            let written = keys(&records);
            let (records, later) = deferred_records::split(records);
            (records, Some((later, written)))
        }
        None => (records, None),
    }
}

/// Whether this cached pass's writes can go behind it ([`PassState::assuming_admissions`]):
/// its plan admits, records readiness, evicts for a pods-ready timeout (writing the
/// requeue state) or tells reasons, nothing else. A preemption is written in its pass:
/// a refused eviction's backoff holds the next pass's preemptions back.
fn assumable(state: &PassState, plan: &Plan) -> bool {
    state.assume
        && state.incremental.is_some()
        && !plan.actions.is_empty()
        && plan.actions.iter().all(|a| {
            matches!(
                a,
                Action::Admit { .. }
                    | Action::PodsReady { .. }
                    | Action::Pending { .. }
                    | Action::RequeueState { .. }
                    | Action::Evict {
                        requeue: Some(_),
                        ..
                    }
            )
        })
}

/// The writes of `plan` the passes after it assume while they are under way.
fn assumed_writes(plan: &Plan) -> Assumed {
    let mut assumed = Assumed::default();
    for a in &plan.actions {
        match a {
            Action::Admit { workload, .. } | Action::PodsReady { workload, .. } => {
                assumed.recorded.insert(workload.clone());
            }
            Action::Evict { workload, .. } => {
                assumed.evicting.insert(workload.clone());
            }
            _ => {}
        }
    }
    assumed
}

/// Hands the plan's writes (its actions, the queues' status, its records) to the task
/// after the ones under way; the passes after this one assume its admissions and
/// readiness records.
fn write_behind(
    client: &kube::Client,
    cfg: &Config,
    state: &mut PassState,
    cache: &Arc<Cache>,
    plan: &Plan,
    took: Duration,
    now: Millis,
) {
    let earlier = state.deferred.take_unwritten().records;
    let (records, later) = pass_records(state, Some(cache), plan, earlier);
    let (later, written) = later.unwrap_or_default();
    let assumed = assumed_writes(plan);
    // What the writes and the metrics read of the plan (not its admitted set, which
    // grows with the cluster, nor its records, written below).
    let ours = Plan {
        actions: plan.actions.clone(),
        queue_counts: plan.queue_counts.clone(),
        subjects: plan.subjects.clone(),
        queues: plan.queues.clone(),
        local_queues: plan.local_queues.clone(),
        ..Plan::default()
    };
    let metrics = state.metrics.clone();
    let (client2, cfg2, cache2) = (client.clone(), cfg.clone(), Arc::clone(cache));
    let writing = Arc::clone(state.deferred.writing());
    let record_keys = keys(&records);
    // Those records' places are asked again by this plan's own updates, as a pass that
    // writes them itself forgets their earlier asks (`before_writing`): an earlier ask
    // left behind, once its failed write is dropped for this one, is answered by nothing.
    for key in &record_keys {
        cache.asked_places.forget(key);
    }
    let writes: deferred_records::PlanWrites = Box::new(move |earlier: Vec<Update>| {
        Box::pin(async move {
            let w = KubeWrites {
                client: &client2,
                cfg: &cfg2,
                cache: Some(&cache2),
                writing: Some(&writing),
            };
            // An assumed plan evicts only for pods-ready timeouts, which no backoff holds
            // back (a refused one is asked again by the next pass): its book is its own.
            let mut evictions =
                EvictionBackoff::new(cfg2.eviction_backoff_base, cfg2.eviction_backoff_max);
            let applied = apply_with(&w, &cfg2, &ours, &mut evictions, Some(&cache2), now).await;
            if let Some(m) = metrics {
                m.record_pass(&ours, &applied.done, now, took);
            }
            let mut all = earlier;
            all.extend(records);
            let (queues_failed, records) = write_status(&w, &ours, all, now).await;
            let failed = applied.failed + queues_failed + records.len();
            if failed > 0 {
                tracing::info!(failed, "some writes failed; the next pass retries");
            }
            deferred_records::Unwritten { failed, records }
        })
    });
    let behind = deferred_records::Plan {
        writes,
        records: record_keys,
        assumed,
    };
    state
        .deferred
        .start(client, cache, Some(behind), later, written, now);
}

/// Runs the controller until `shutdown`: watches, leader election, passes.
pub async fn run(
    client: kube::Client,
    cfg: Config,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> Result<()> {
    run_measured(client, cfg, clock, None, shutdown).await
}

/// [`run`], each pass updating `metrics` when set.
pub async fn run_measured(
    client: kube::Client,
    cfg: Config,
    clock: Arc<dyn Clock>,
    metrics: Option<Arc<ControllerMetrics>>,
    shutdown: CancellationToken,
) -> Result<()> {
    let notify = Arc::new(Notify::new());
    let cache = Arc::new(Cache::for_labels(cfg.queue_labels()));
    cache.spawn_feeders(&client, notify.clone(), &shutdown);
    let mut elector = Elector::new(
        client.clone(),
        &cfg.lease_namespace,
        &cfg.lease_name,
        &cfg.identity,
        cfg.lease_duration,
    );
    let renew = Duration::from_millis((cfg.lease_duration / 3).max(200));
    let wait = renew.min(cfg.resync);
    let mut state = PassState::with_cache(&cfg, cache).assuming_admissions(notify.clone());
    state.metrics = metrics;
    // A settled pass is still redone once per resync interval, as a safety net.
    let mut last_pass: Option<Millis> = None;
    let resync_ms = cfg.resync.as_millis() as Millis;
    loop {
        let now = clock.now();
        if !elector.tick(now).await {
            state.unsettle();
            state.records_written().await;
            if let Some(m) = &state.metrics {
                m.forget_books();
            }
        } else if state.settled(now) && last_pass.is_some_and(|t| now.saturating_sub(t) < resync_ms)
        {
            tracing::trace!("nothing changed since the last pass; skipped");
        } else {
            last_pass = Some(now);
            match pass_with(&client, &cfg, &mut state, now).await {
                Ok(_) => {}
                Err(Error::NotSynced) => tracing::debug!("caches not synced yet"),
                Err(e) => tracing::warn!(error = %e, "pass failed; retrying"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
    state.records_written().await;
    // A clean shutdown hands the Lease over at once; a failure here only means the
    // standby waits out the term, as after a crash.
    if let Err(e) = elector.release(clock.now()).await {
        tracing::warn!(error = %e, "releasing the lease");
    }
    Ok(())
}
