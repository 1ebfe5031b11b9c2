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
//! Writes GET the object and PUT it back with that resourceVersion: a concurrent change
//! makes the write fail with 409 and the next pass decides again. What the API server
//! answers to a write goes into the cache at once, so the next pass reads its own writes
//! even before their watch events arrive. A cached pass decides from the changes since
//! the last one ([`super::incremental`]; [`PassState::with_cache_rebuilding`] decides
//! each from scratch). Without a cache ([`pass`], [`PassState::new`]) a pass LISTs
//! everything instead.

use super::cache::{Cache, Key};
pub use super::config::Config;
use super::decide::decide;
use super::error::{Error, Result};
use super::evictions::EvictionBackoff;
use super::incremental::{decide_cached, IncStats, Incremental};
use super::lease::Elector;
use super::metrics::ControllerMetrics;
use super::model::{Action, ObjKind, ObjRef, Plan};
use super::pods_ready::{
    EVICTED_AT_ANNOTATION, PODS_READY_AT_ANNOTATION, REQUEUE_COUNT_ANNOTATION,
};
use super::requeue_state;
use super::resources::{crd_resource, QUEUE_KINDS};
use super::serving::ADMITTED_REPLICAS_ANNOTATION;
pub use super::snapshot::{list_priority_classes, snapshot, snapshot_cached};
use super::time::{rfc3339, Millis};
use super::workload_record::Update;
use super::workload_writer;
use super::workloads::{annotation, is_gated};
use super::{
    ADMISSION_GATE, ADMITTED_AT_ANNOTATION, ADMITTED_COUNT_ANNOTATION, CONDITION_TYPE,
    ORIGINAL_PARALLELISM_ANNOTATION, PENDING_MESSAGE_ANNOTATION, PENDING_REASON_ANNOTATION,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What the controller remembers between passes: when to retry evictions that a
/// PodDisruptionBudget refused, and (optionally) the watch-fed cache a pass reads
/// instead of LISTing. Every decision is still made from the objects themselves.
#[derive(Clone)]
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
    /// Workload record updates whose write failed: written before the next pass's.
    unwritten_records: Vec<Update>,
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
            .field("unwritten_records", &self.unwritten_records.len())
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
            unwritten_records: Vec::new(),
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

fn api_for(client: &kube::Client, r: &ObjRef) -> Api<DynamicObject> {
    let ar = match r.kind {
        ObjKind::Pod => ApiResource::erase::<Pod>(&()),
        ObjKind::Job => ApiResource::erase::<Job>(&()),
        ObjKind::Deployment => ApiResource::erase::<Deployment>(&()),
        ObjKind::ReplicaSet => ApiResource::erase::<ReplicaSet>(&()),
        ObjKind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
    };
    Api::namespaced_with(client.clone(), &r.namespace, &ar)
}

fn to_dynamic(v: Value, what: &str) -> Result<DynamicObject> {
    serde_json::from_value(v).map_err(|source| Error::Json {
        what: what.to_string(),
        source,
    })
}

async fn get_value(api: &Api<DynamicObject>, r: &ObjRef) -> Result<Value> {
    let obj = api
        .get(&r.name)
        .await
        .map_err(Error::api(format!("get {}/{}", r.namespace, r.name)))?;
    serde_json::to_value(obj).map_err(|source| Error::Json {
        what: format!("encode {}", r.name),
        source,
    })
}

/// Deletes a gated pod a partial admission left out of its group. It is read first and
/// deleted with that resourceVersion as a precondition, so a pod ungated meanwhile (or
/// changed in any way) is never deleted: the next pass decides again. `Ok(false)`: it
/// was not gated any more. The cache learns the outcome at once.
async fn delete_excess(client: &kube::Client, r: &ObjRef, cache: Option<&Cache>) -> Result<bool> {
    let api = api_for(client, r);
    let v = get_value(&api, r).await?;
    if !is_gated(&v) {
        return Ok(false);
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: v["metadata"]["resourceVersion"].as_str().map(String::from),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let answer = api
        .delete(&r.name, &dp)
        .await
        .map_err(Error::api(format!("delete {}/{}", r.namespace, r.name)))?;
    if let Some(cache) = cache {
        // An unscheduled pod goes at once; one with finalizers stays, being deleted.
        match answer.left().and_then(written) {
            Some(v) if !v["metadata"]["deletionTimestamp"].is_null() => cache.observe("Pod", &v),
            _ => cache.forget("Pod", &(r.namespace.clone(), r.name.clone())),
        }
    }
    Ok(true)
}

fn set_annotation(v: &mut Value, key: &str, value: Option<&str>) {
    let meta = &mut v["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    if let Some(a) = meta["annotations"].as_object_mut() {
        match value {
            Some(x) => {
                a.insert(key.to_string(), json!(x));
            }
            None => {
                a.remove(key);
            }
        }
    }
}

fn merge_selector(target: &mut Value, selector: &BTreeMap<String, String>) {
    if selector.is_empty() {
        return;
    }
    if !target["nodeSelector"].is_object() {
        target["nodeSelector"] = json!({});
    }
    for (k, v) in selector {
        target["nodeSelector"][k] = json!(v);
    }
}

/// The object as the API server stored it after a write (for the cache).
type Written = Option<Value>;

fn written(obj: DynamicObject) -> Written {
    serde_json::to_value(obj).ok()
}

async fn replace(api: &Api<DynamicObject>, r: &ObjRef, v: Value) -> Result<Written> {
    let obj = to_dynamic(v, &r.name)?;
    let obj = api
        .replace(&r.name, &PostParams::default(), &obj)
        .await
        .map_err(Error::api(format!("update {}/{}", r.namespace, r.name)))?;
    Ok(written(obj))
}

/// Ungates a pod / unsuspends a Job. `partial` (a partial admission) is recorded on a
/// pod and becomes a Job's `parallelism`, its old value kept to put back on eviction.
async fn admit(
    client: &kube::Client,
    r: &ObjRef,
    selector: &BTreeMap<String, String>,
    partial: Option<u32>,
    now: Millis,
) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    set_annotation(&mut v, ADMITTED_AT_ANNOTATION, Some(&rfc3339(now)));
    match r.kind {
        ObjKind::Pod => {
            if let Some(k) = partial {
                set_annotation(&mut v, ADMITTED_COUNT_ANNOTATION, Some(&k.to_string()));
            }
            let spec = &mut v["spec"];
            if let Some(gates) = spec["schedulingGates"].as_array_mut() {
                gates.retain(|g| g["name"] != ADMISSION_GATE);
                if gates.is_empty() {
                    if let Some(s) = spec.as_object_mut() {
                        s.remove("schedulingGates");
                    }
                }
            }
            merge_selector(spec, selector);
        }
        ObjKind::Job => {
            v["spec"]["suspend"] = json!(false);
            if let Some(p) = partial {
                let full = v["spec"]["parallelism"].as_u64().unwrap_or(1);
                if annotation(&v, ORIGINAL_PARALLELISM_ANNOTATION).is_none() {
                    set_annotation(
                        &mut v,
                        ORIGINAL_PARALLELISM_ANNOTATION,
                        Some(&full.to_string()),
                    );
                }
                v["spec"]["parallelism"] = json!(p);
            }
            merge_selector(&mut v["spec"]["template"]["spec"], selector);
            set_annotation(&mut v, PENDING_REASON_ANNOTATION, None);
            set_annotation(&mut v, PENDING_MESSAGE_ANNOTATION, None);
        }
        ObjKind::Deployment | ObjKind::ReplicaSet | ObjKind::StatefulSet => return Ok(None),
    }
    replace(&api, r, v).await
}

/// Writes `tessera.io/admitted-replicas` on a serving owner.
async fn annotate_replicas(client: &kube::Client, r: &ObjRef, value: &str) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    set_annotation(&mut v, ADMITTED_REPLICAS_ANNOTATION, Some(value));
    replace(&api, r, v).await
}

/// POSTs a `policy/v1` Eviction with the pod's grace period in `deleteOptions`; the
/// answer is a Status, so the pod is read back (for the cache) only when `read_back`.
async fn evict_pod(
    client: &kube::Client,
    r: &ObjRef,
    grace: i64,
    read_back: bool,
) -> Result<Written> {
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": r.name, "namespace": r.namespace},
        "deleteOptions": {"gracePeriodSeconds": grace},
    });
    let path = format!(
        "/api/v1/namespaces/{}/pods/{}/eviction",
        r.namespace, r.name
    );
    let what = format!("evict {}/{}", r.namespace, r.name);
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .map_err(|e| Error::Api {
            what: what.clone(),
            source: kube::Error::HttpError(e),
        })?;
    client
        .request::<Value>(req)
        .await
        .map_err(Error::api(what))?;
    if !read_back {
        return Ok(None);
    }
    // Terminating (deletionTimestamp set); if it cannot be read, its watch event will do.
    Ok(get_value(&api_for(client, r), r).await.ok())
}

/// Suspends a Job; `requeue` (a pods-ready timeout) records the requeue count and time.
async fn suspend_job(
    client: &kube::Client,
    r: &ObjRef,
    requeue: Option<u32>,
    now: Millis,
) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    v["spec"]["suspend"] = json!(true);
    // A partial admission is over: the Job queues again with its full size.
    if let Some(full) =
        annotation(&v, ORIGINAL_PARALLELISM_ANNOTATION).and_then(|p| p.parse::<u32>().ok())
    {
        v["spec"]["parallelism"] = json!(full);
    }
    set_annotation(&mut v, ORIGINAL_PARALLELISM_ANNOTATION, None);
    set_annotation(&mut v, ADMITTED_AT_ANNOTATION, None);
    set_annotation(&mut v, PODS_READY_AT_ANNOTATION, None);
    if let Some(n) = requeue {
        set_annotation(&mut v, REQUEUE_COUNT_ANNOTATION, Some(&n.to_string()));
        set_annotation(&mut v, EVICTED_AT_ANNOTATION, Some(&rfc3339(now)));
    }
    replace(&api, r, v).await
}

/// Records a pods-ready timeout on a pod or a serving owner (the requeue count and
/// time), as `suspend_job` does on a Job: the workload's next pods are held by them.
async fn record_requeue(
    client: &kube::Client,
    r: &ObjRef,
    count: u32,
    now: Millis,
) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    set_annotation(&mut v, REQUEUE_COUNT_ANNOTATION, Some(&count.to_string()));
    set_annotation(&mut v, EVICTED_AT_ANNOTATION, Some(&rfc3339(now)));
    replace(&api, r, v).await
}

/// Records that all pods of the object's workload were Ready (once).
async fn record_ready(client: &kube::Client, r: &ObjRef, now: Millis) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    set_annotation(&mut v, PODS_READY_AT_ANNOTATION, Some(&rfc3339(now)));
    replace(&api, r, v).await
}

async fn record_pending(
    client: &kube::Client,
    r: &ObjRef,
    reason: &str,
    message: &str,
    now: Millis,
) -> Result<Written> {
    let api = api_for(client, r);
    let mut v = get_value(&api, r).await?;
    match r.kind {
        ObjKind::Pod => {
            let condition = json!({"type": CONDITION_TYPE, "status": "False", "reason": reason,
                                   "message": message, "lastTransitionTime": rfc3339(now / 1000 * 1000)});
            if !v["status"].is_object() {
                v["status"] = json!({});
            }
            let conds = v["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut conds: Vec<Value> = conds
                .into_iter()
                .filter(|c| c["type"] != CONDITION_TYPE)
                .collect();
            conds.push(condition);
            v["status"]["conditions"] = Value::Array(conds);
            let obj = to_dynamic(v, &r.name)?;
            let obj = api
                .replace_status(&r.name, &PostParams::default(), &obj)
                .await
                .map_err(Error::api(format!(
                    "update status {}/{}",
                    r.namespace, r.name
                )))?;
            Ok(written(obj))
        }
        ObjKind::Job => {
            set_annotation(&mut v, PENDING_REASON_ANNOTATION, Some(reason));
            set_annotation(&mut v, PENDING_MESSAGE_ANNOTATION, Some(message));
            replace(&api, r, v).await
        }
        ObjKind::Deployment | ObjKind::ReplicaSet | ObjKind::StatefulSet => Ok(None),
    }
}

/// An `events.k8s.io/v1` Event about `r` (note capped at the API's 1 kB).
pub fn event_for(
    r: &ObjRef,
    reason: &str,
    note: &str,
    warning: bool,
    now: Millis,
    cfg: &Config,
) -> KubeEvent {
    let mut note = note.to_string();
    if note.len() > 1000 {
        let mut cut = 997;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let (api_version, kind) = match r.kind {
        ObjKind::Pod => ("v1", "Pod"),
        ObjKind::Job => ("batch/v1", "Job"),
        ObjKind::Deployment => ("apps/v1", "Deployment"),
        ObjKind::ReplicaSet => ("apps/v1", "ReplicaSet"),
        ObjKind::StatefulSet => ("apps/v1", "StatefulSet"),
    };
    KubeEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", r.name)),
            namespace: Some(r.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(
            Timestamp::from_millisecond(now as i64).unwrap_or(Timestamp::UNIX_EPOCH),
        )),
        action: Some("Admission".into()),
        reason: Some(reason.to_string()),
        note: Some(note),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        reporting_controller: Some(cfg.reporting_controller.clone()),
        reporting_instance: Some(cfg.identity.clone()),
        regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(r.name.clone()),
            namespace: Some(r.namespace.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn emit(
    client: &kube::Client,
    cfg: &Config,
    r: &ObjRef,
    reason: &str,
    note: &str,
    warning: bool,
    now: Millis,
) {
    let ev = event_for(r, reason, note, warning, now, cfg);
    let api: Api<KubeEvent> = Api::namespaced(client.clone(), &r.namespace);
    if let Err(e) = api.create(&PostParams::default(), &ev).await {
        tracing::warn!(error = %e, object = %r.name, "writing Event");
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

fn kind_name(k: ObjKind) -> &'static str {
    match k {
        ObjKind::Pod => "Pod",
        ObjKind::Job => "Job",
        ObjKind::Deployment => "Deployment",
        ObjKind::ReplicaSet => "ReplicaSet",
        ObjKind::StatefulSet => "StatefulSet",
    }
}

/// Puts a write's outcome into the cache (if any): the stored object, or its absence.
fn seen(cache: Option<&Cache>, r: &ObjRef, result: Result<Written>) -> Result<()> {
    let Some(cache) = cache else {
        return result.map(|_| ());
    };
    match result {
        Ok(Some(v)) => {
            cache.observe(kind_name(r.kind), &v);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            if e.is_not_found() {
                let key: Key = (r.namespace.clone(), r.name.clone());
                cache.forget(kind_name(r.kind), &key);
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
    /// (one refused or failed is evicted again by a later pass, which counts then).
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
    let mut failed = 0;
    let mut done = Vec::new();
    // Workloads whose requeue state could not be written: not evicted in this pass.
    let mut unrecorded: std::collections::BTreeSet<String> = Default::default();
    // Requeue state ConfigMaps read fresh in this apply, per namespace.
    let mut read_now = BTreeMap::new();
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
                // ConfigMap lags behind its pods) defers the admission.
                if let (Some(pr), true) = (&cfg.pods_ready, requeue_state::kept_here(workload)) {
                    match requeue_state::fresh_hold(client, pr, workload, now, &mut read_now).await
                    {
                        Ok(None) => {}
                        Ok(Some(hold)) => {
                            failed += 1;
                            tracing::warn!(%workload, ?hold, "requeue state newer than the pass read; admission deferred");
                            continue;
                        }
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, %workload, "reading requeue state; admission deferred");
                            continue;
                        }
                    }
                }
                tracing::info!(%workload, ?partial, "admitting");
                let mut all_admitted = true;
                let mut any_admitted = false;
                for r in objects {
                    let selector = pod_selectors.get(&r.name).unwrap_or(node_selector);
                    let result = admit(client, r, selector, *partial, now).await;
                    match seen(cache, r, result) {
                        Ok(()) => {
                            any_admitted = true;
                            emit(
                                client,
                                cfg,
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
                    continue;
                }
                for r in excess {
                    match delete_excess(client, r, cache).await {
                        Ok(true) => {
                            let note = format!(
                                "workload {workload} admitted with {} pods: this one is not needed",
                                partial.unwrap_or(0)
                            );
                            emit(client, cfg, r, "NotAdmitted", &note, false, now).await;
                        }
                        Ok(false) => {}
                        Err(e) if e.is_not_found() => {}
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, %workload, pod = %r.name, "deleting a pod left out of a partial admission");
                        }
                    }
                }
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
                        let result = record_requeue(client, r, *n, now).await;
                        if let Err(e) = seen(cache, r, result) {
                            if !e.is_not_found() {
                                failed += 1;
                                tracing::warn!(error = %e, %workload, "recording requeue");
                            }
                        }
                    }
                    let result = match (r.kind, requeue) {
                        (ObjKind::Pod, _) => evict_pod(client, r, *grace, cache.is_some()).await,
                        (ObjKind::Job, _) => suspend_job(client, r, *requeue, now).await,
                        (_, Some(n)) => record_requeue(client, r, *n, now).await,
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
                            emit(client, cfg, r, event, &note, true, now).await;
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
            }
            Action::RequeueState {
                namespace,
                set,
                forget,
            } => match requeue_state::write(client, namespace, set, forget, cache).await {
                Ok(requeue_state::Written::Unchanged) => {}
                Ok(requeue_state::Written::Stored(_)) => {
                    tracing::info!(%namespace, set = set.len(), forget = forget.len(),
                                   "requeue state written");
                }
                Ok(requeue_state::Written::Deleted) => {
                    tracing::info!(%namespace, forget = forget.len(),
                                   "requeue state ConfigMap deleted: no entry left");
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(error = %e, %namespace, "writing requeue state; retried next pass");
                    unrecorded.extend(set.iter().map(|e| e.workload.clone()));
                }
            },
            Action::Pending {
                workload,
                objects,
                reason,
                message,
            } => {
                for r in objects.iter().take(
                    if objects.first().is_some_and(|o| o.kind == ObjKind::Job) {
                        1
                    } else {
                        objects.len()
                    },
                ) {
                    let result = record_pending(client, r, reason, message, now).await;
                    if let Err(e) = seen(cache, r, result) {
                        failed += 1;
                        tracing::warn!(error = %e, %workload, "recording pending reason");
                    }
                }
                if let Some(r) = objects.first() {
                    emit(client, cfg, r, reason, message, false, now).await;
                }
            }
            Action::PodsReady { workload, object } => {
                let result = record_ready(client, object, now).await;
                if let Err(e) = seen(cache, object, result) {
                    failed += 1;
                    tracing::warn!(error = %e, %workload, "recording pods ready");
                }
            }
            Action::Replicas { owner, value } => {
                let result = annotate_replicas(client, owner, value).await;
                if let Err(e) = seen(cache, owner, result) {
                    failed += 1;
                    tracing::warn!(error = %e, owner = %owner.name, "annotating admitted replicas");
                }
            }
        }
    }
    Applied { failed, done }
}

/// Writes `status.admittedWorkloads` / `pendingWorkloads` of each ClusterQueue that
/// changed; returns the number of failed writes.
async fn write_queue_status(client: &kube::Client, plan: &Plan, cache: Option<&Cache>) -> usize {
    let (kind, plural) = QUEUE_KINDS[1];
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource(kind, plural));
    let mut failed = 0;
    for (name, (admitted, pending)) in &plan.queue_counts {
        if let Some(cached) = cache.and_then(|c| c.queues[1].get(&(String::new(), name.clone()))) {
            let status = &cached["status"];
            if status["admittedWorkloads"] == json!(admitted)
                && status["pendingWorkloads"] == json!(pending)
            {
                continue;
            }
        }
        let result = async {
            let Some(mut cq) = api.get_opt(name).await? else {
                return Ok(None);
            };
            let want = json!({"admittedWorkloads": admitted, "pendingWorkloads": pending});
            let status = cq.data.get("status").cloned().unwrap_or(Value::Null);
            if status["admittedWorkloads"] == want["admittedWorkloads"]
                && status["pendingWorkloads"] == want["pendingWorkloads"]
            {
                return Ok(None);
            }
            cq.data["status"] = want;
            api.replace_status(name, &PostParams::default(), &cq)
                .await
                .map(Some)
        }
        .await;
        let result = match (result, cache) {
            (Ok(Some(obj)), Some(c)) => {
                if let Some(v) = written(obj) {
                    c.observe(kind, &v);
                }
                Ok(())
            }
            (r, _) => r.map(|_| ()),
        };
        if let Err(e) = result {
            failed += 1;
            tracing::warn!(error = %e, queue = %name, "writing ClusterQueue status");
        }
    }
    failed
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
                Some(inc) => {
                    // Held only while deciding (no await): a pass is not interleaved.
                    let mut inc = inc.lock().unwrap_or_else(|e| e.into_inner());
                    inc.decide(cache, cfg, now, &blocked)
                }
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
    let mut failed = applied.failed;
    failed += write_queue_status(client, &plan, cache.as_deref()).await;
    let mut records = std::mem::take(&mut state.unwritten_records);
    records.extend(plan.records.iter().cloned());
    state.unwritten_records = workload_writer::write(client, &records, cache.as_deref(), now).await;
    failed += state.unwritten_records.len();
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
    let mut state = PassState::with_cache(&cfg, cache);
    state.metrics = metrics;
    // A settled pass is still redone once per resync interval, as a safety net.
    let mut last_pass: Option<Millis> = None;
    let resync_ms = cfg.resync.as_millis() as Millis;
    loop {
        let now = clock.now();
        if !elector.tick(now).await {
            state.unsettle();
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
    // A clean shutdown hands the Lease over at once; a failure here only means the
    // standby waits out the term, as after a crash.
    if let Err(e) = elector.release(clock.now()).await {
        tracing::warn!(error = %e, "releasing the lease");
    }
    Ok(())
}
