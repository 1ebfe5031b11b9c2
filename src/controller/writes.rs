//! The writes a pass makes, behind one narrow trait: [`Writes`] (ungate or unsuspend,
//! delete a partial admission's extra pod, evict or suspend, record a requeue, pods
//! ready, a pending reason, admitted replicas, the requeue state, Events, the Workload
//! records and the ClusterQueues' status counts). The
//! reconciler's rules — what is written in which order, what a failed write defers, what
//! a refused eviction does — live in `reconciler::apply_with` over any `Writes`, so they
//! are unit-tested without HTTP (`apply_tests.rs`); [`KubeWrites`] is the one that calls
//! the API server.
//!
//! Each write edits the cache's copy of the object (a GET without a cache) and PUTs it
//! back with that resourceVersion; a copy behind the API server gets 409 and the write
//! starts once more from a GET; a 409 after that is a concurrent change, and the next
//! pass decides again. An edit that changes nothing sends nothing. A pending reason is
//! announced with an Event only when the reason is new, not when its message alone
//! changes (a queue place moving). A write answers the
//! object as stored ([`Written`], for the cache).

use super::cache::Cache;
use super::config::Config;
use super::deferred_records::Writing;
use super::error::{Error, Result};
use super::model::{ObjKind, ObjRef};
use super::pods_ready::{
    EVICTED_AT_ANNOTATION, PODS_READY_AT_ANNOTATION, REQUEUE_COUNT_ANNOTATION,
};
use super::readiness::Hold;
use super::requeue_state::{self, Entry, Forget};
use super::resources::{crd_resource, QUEUE_KINDS};
use super::serving::ADMITTED_REPLICAS_ANNOTATION;
use super::time::{rfc3339, Millis};
use super::workload_record::Update;
use super::workloads::{annotation, is_gated};
use super::{
    ADMISSION_GATE, ADMITTED_AT_ANNOTATION, ADMITTED_COUNT_ANNOTATION, CONDITION_TYPE,
    ORIGINAL_PARALLELISM_ANNOTATION, PENDING_MESSAGE_ANNOTATION, PENDING_REASON_ANNOTATION,
};
use crate::quota::events::split_place;
use crate::quota::WaitForPodsReady;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;

/// Every write a pass makes. `Err` is the API server's answer (409, 404, 429, …).
pub trait Writes {
    /// Ungates a pod / unsuspends a Job, adding `selector` to its node selector.
    fn admit(
        &self,
        r: &ObjRef,
        selector: &BTreeMap<String, String>,
        partial: Option<u32>,
        now: Millis,
    ) -> impl Future<Output = Result<Written>> + Send;
    /// Deletes a still-gated pod a partial admission left out; `Ok(false)`: not gated.
    fn delete_excess(&self, r: &ObjRef) -> impl Future<Output = Result<bool>> + Send;
    /// Evicts a pod through the Eviction API with its grace period.
    fn evict(&self, r: &ObjRef, grace: i64) -> impl Future<Output = Result<Written>> + Send;
    /// Suspends a Job (`requeue`: a pods-ready timeout's new count, recorded on it).
    fn suspend(
        &self,
        r: &ObjRef,
        requeue: Option<u32>,
        now: Millis,
    ) -> impl Future<Output = Result<Written>> + Send;
    /// Records a pods-ready timeout's count and time on a pod or serving owner.
    fn record_requeue(
        &self,
        r: &ObjRef,
        count: u32,
        now: Millis,
    ) -> impl Future<Output = Result<Written>> + Send;
    /// Records that the workload's pods were all Ready.
    fn record_ready(&self, r: &ObjRef, now: Millis)
        -> impl Future<Output = Result<Written>> + Send;
    /// Records why the workload waits (a pod condition, a Job's annotations).
    fn record_pending(
        &self,
        r: &ObjRef,
        reason: &str,
        message: &str,
        now: Millis,
    ) -> impl Future<Output = Result<Written>> + Send;
    /// Writes a serving owner's admitted replicas.
    fn annotate_replicas(
        &self,
        r: &ObjRef,
        value: &str,
    ) -> impl Future<Output = Result<Written>> + Send;
    /// Writes requeue states onto a namespace's records, with the pass's other updates
    /// of those records (`records`: one status write, not two), and forgets states.
    fn write_requeue_state(
        &self,
        namespace: &str,
        set: &[Entry],
        forget: &BTreeMap<String, Forget>,
        records: &[Update],
        now: Millis,
    ) -> impl Future<Output = Result<requeue_state::Written>> + Send;
    /// The requeue hold of `workload` as the API server has it now (newer than the pass
    /// may have read).
    fn fresh_hold(
        &self,
        cfg: &WaitForPodsReady,
        workload: &str,
        now: Millis,
    ) -> impl Future<Output = Result<Option<Hold>>> + Send;
    /// Writes Workload records ([`super::workload_writer`]); gives back the updates whose
    /// write failed, in the order given.
    fn write_records(
        &self,
        updates: &[Update],
        now: Millis,
    ) -> impl Future<Output = Vec<Update>> + Send;
    /// Writes a ClusterQueue's `status.admittedWorkloads` / `pendingWorkloads` (nothing
    /// when they already hold those counts).
    fn write_queue_status(
        &self,
        name: &str,
        admitted: usize,
        pending: usize,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The writes of workload `workload`'s admission or readiness record are answered
    /// (landed or failed): passes no longer assume them
    /// ([`super::deferred_records::Writing`]).
    fn writes_answered(&self, _workload: &str) {}
    /// Records an Event about `r` (a failure is logged, never fails the pass).
    fn event(
        &self,
        r: &ObjRef,
        reason: &str,
        note: &str,
        warning: bool,
        now: Millis,
    ) -> impl Future<Output = ()> + Send;
}

/// [`Writes`] against the API server; the cache (when passes read one) learns at once
/// what a delete did, and an eviction's pod is read back for it.
pub struct KubeWrites<'a> {
    pub client: &'a kube::Client,
    pub cfg: &'a Config,
    pub cache: Option<&'a Cache>,
    /// The admissions passes assume while they are written (none when passes wait).
    pub writing: Option<&'a Writing>,
}

impl Writes for KubeWrites<'_> {
    async fn admit(
        &self,
        r: &ObjRef,
        selector: &BTreeMap<String, String>,
        partial: Option<u32>,
        now: Millis,
    ) -> Result<Written> {
        admit(self.client, self.cache, r, selector, partial, now).await
    }

    async fn delete_excess(&self, r: &ObjRef) -> Result<bool> {
        delete_excess(self.client, r, self.cache).await
    }

    async fn evict(&self, r: &ObjRef, grace: i64) -> Result<Written> {
        evict_pod(self.client, r, grace, self.cache.is_some()).await
    }

    async fn suspend(&self, r: &ObjRef, requeue: Option<u32>, now: Millis) -> Result<Written> {
        suspend_job(self.client, self.cache, r, requeue, now).await
    }

    async fn record_requeue(&self, r: &ObjRef, count: u32, now: Millis) -> Result<Written> {
        record_requeue(self.client, self.cache, r, count, now).await
    }

    async fn record_ready(&self, r: &ObjRef, now: Millis) -> Result<Written> {
        record_ready(self.client, self.cache, r, now).await
    }

    async fn record_pending(
        &self,
        r: &ObjRef,
        reason: &str,
        message: &str,
        now: Millis,
    ) -> Result<Written> {
        record_pending(self.client, self.cache, r, reason, message, now).await
    }

    async fn annotate_replicas(&self, r: &ObjRef, value: &str) -> Result<Written> {
        annotate_replicas(self.client, self.cache, r, value).await
    }

    async fn write_requeue_state(
        &self,
        namespace: &str,
        set: &[Entry],
        forget: &BTreeMap<String, Forget>,
        records: &[Update],
        now: Millis,
    ) -> Result<requeue_state::Written> {
        let cfg = self.cfg.pods_ready.as_ref();
        let with = requeue_state::With { records, now };
        requeue_state::write(self.client, namespace, set, forget, cfg, with, self.cache).await
    }

    async fn fresh_hold(
        &self,
        cfg: &WaitForPodsReady,
        workload: &str,
        now: Millis,
    ) -> Result<Option<Hold>> {
        requeue_state::fresh_hold(self.client, cfg, workload, now).await
    }

    async fn write_records(&self, updates: &[Update], now: Millis) -> Vec<Update> {
        super::workload_writer::write(self.client, updates, self.cache, now).await
    }

    async fn write_queue_status(&self, name: &str, admitted: usize, pending: usize) -> Result<()> {
        queue_status(self.client, self.cache, name, admitted, pending).await
    }

    fn writes_answered(&self, workload: &str) {
        if let Some(w) = self.writing {
            w.answered(workload);
        }
    }

    async fn event(&self, r: &ObjRef, reason: &str, note: &str, warning: bool, now: Millis) {
        emit(self.client, self.cfg, r, reason, note, warning, now).await
    }
}

/// Writes `status.admittedWorkloads` / `pendingWorkloads` of ClusterQueue `name` when
/// they differ (from the cache's copy when it holds them, else as read).
async fn queue_status(
    client: &kube::Client,
    cache: Option<&Cache>,
    name: &str,
    admitted: usize,
    pending: usize,
) -> Result<()> {
    let want = json!({"admittedWorkloads": admitted, "pendingWorkloads": pending});
    let holds = |status: &Value| {
        status["admittedWorkloads"] == want["admittedWorkloads"]
            && status["pendingWorkloads"] == want["pendingWorkloads"]
    };
    let (kind, plural) = QUEUE_KINDS[1];
    if let Some(cached) = cache.and_then(|c| c.queues[1].get(&(String::new(), name.to_string()))) {
        if holds(&cached["status"]) {
            return Ok(());
        }
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource(kind, plural));
    let what = || format!("ClusterQueue {name} status");
    let Some(mut cq) = api.get_opt(name).await.map_err(Error::api(what()))? else {
        return Ok(());
    };
    if holds(cq.data.get("status").unwrap_or(&Value::Null)) {
        return Ok(());
    }
    cq.data["status"] = want.clone();
    let stored = api
        .replace_status(name, &PostParams::default(), &cq)
        .await
        .map_err(Error::api(what()))?;
    if let (Some(c), Some(v)) = (cache, written(stored)) {
        c.observe(kind, &v);
    }
    Ok(())
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

/// Which endpoint a read-modify-write PUTs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Main,
    Status,
}

/// Reads `r`, lets `edit` change it and PUTs it back with the resourceVersion read;
/// an edit that changes nothing writes nothing (`Ok(None)`). The read is the cache's copy when
/// passes read one (no GET: the pass's write is one request); if that copy lags behind
/// the API server the PUT fails with 409 and the write starts once more from a GET, as
/// a write without a cache does. A 409 after that is the pass's answer: the object
/// changed meanwhile, and the next pass decides again.
async fn update(
    client: &kube::Client,
    r: &ObjRef,
    cache: Option<&Cache>,
    part: Part,
    edit: impl Fn(&mut Value),
) -> Result<Written> {
    let api = api_for(client, r);
    let key = (r.namespace.clone(), r.name.clone());
    if let Some(v) = cache.and_then(|c| c.object(r.kind.name(), &key)) {
        let Some(v) = edited(v, &edit) else {
            return Ok(None);
        };
        match put(&api, r, v, part).await {
            Err(e) if e.is_conflict() => {
                tracing::debug!(object = %r.name, "cached copy behind the API server; read again")
            }
            done => return done,
        }
    }
    match edited(get_value(&api, r).await?, &edit) {
        Some(v) => put(&api, r, v, part).await,
        None => Ok(None),
    }
}

/// `v` after `edit`, or `None` when the edit changed nothing.
fn edited(mut v: Value, edit: impl Fn(&mut Value)) -> Option<Value> {
    let before = v.clone();
    edit(&mut v);
    (v != before).then_some(v)
}

async fn put(api: &Api<DynamicObject>, r: &ObjRef, v: Value, part: Part) -> Result<Written> {
    let obj = to_dynamic(v, &r.name)?;
    let pp = PostParams::default();
    let answer = match part {
        Part::Main => api.replace(&r.name, &pp, &obj).await,
        Part::Status => api.replace_status(&r.name, &pp, &obj).await,
    };
    let what = match part {
        Part::Main => "update",
        Part::Status => "update status",
    };
    answer
        .map(written)
        .map_err(Error::api(format!("{what} {}/{}", r.namespace, r.name)))
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
pub type Written = Option<Value>;

pub fn written(obj: DynamicObject) -> Written {
    serde_json::to_value(obj).ok()
}

/// Ungates a pod / unsuspends a Job. `partial` (a partial admission) is recorded on a
/// pod and becomes a Job's `parallelism`, its old value kept to put back on eviction.
async fn admit(
    client: &kube::Client,
    cache: Option<&Cache>,
    r: &ObjRef,
    selector: &BTreeMap<String, String>,
    partial: Option<u32>,
    now: Millis,
) -> Result<Written> {
    if !matches!(r.kind, ObjKind::Pod | ObjKind::Job) {
        return Ok(None);
    }
    update(client, r, cache, Part::Main, |v| {
        set_annotation(v, ADMITTED_AT_ANNOTATION, Some(&rfc3339(now)));
        if r.kind == ObjKind::Pod {
            if let Some(k) = partial {
                set_annotation(v, ADMITTED_COUNT_ANNOTATION, Some(&k.to_string()));
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
        } else {
            v["spec"]["suspend"] = json!(false);
            if let Some(p) = partial {
                let full = v["spec"]["parallelism"].as_u64().unwrap_or(1);
                if annotation(v, ORIGINAL_PARALLELISM_ANNOTATION).is_none() {
                    set_annotation(v, ORIGINAL_PARALLELISM_ANNOTATION, Some(&full.to_string()));
                }
                v["spec"]["parallelism"] = json!(p);
            }
            merge_selector(&mut v["spec"]["template"]["spec"], selector);
            set_annotation(v, PENDING_REASON_ANNOTATION, None);
            set_annotation(v, PENDING_MESSAGE_ANNOTATION, None);
        }
    })
    .await
}

/// Writes `tessera.io/admitted-replicas` on a serving owner.
async fn annotate_replicas(
    client: &kube::Client,
    cache: Option<&Cache>,
    r: &ObjRef,
    value: &str,
) -> Result<Written> {
    update(client, r, cache, Part::Main, |v| {
        set_annotation(v, ADMITTED_REPLICAS_ANNOTATION, Some(value));
    })
    .await
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
    cache: Option<&Cache>,
    r: &ObjRef,
    requeue: Option<u32>,
    now: Millis,
) -> Result<Written> {
    update(client, r, cache, Part::Main, |v| {
        v["spec"]["suspend"] = json!(true);
        // A partial admission is over: the Job queues again with its full size.
        if let Some(full) =
            annotation(v, ORIGINAL_PARALLELISM_ANNOTATION).and_then(|p| p.parse::<u32>().ok())
        {
            v["spec"]["parallelism"] = json!(full);
        }
        set_annotation(v, ORIGINAL_PARALLELISM_ANNOTATION, None);
        set_annotation(v, ADMITTED_AT_ANNOTATION, None);
        set_annotation(v, PODS_READY_AT_ANNOTATION, None);
        if let Some(n) = requeue {
            set_annotation(v, REQUEUE_COUNT_ANNOTATION, Some(&n.to_string()));
            set_annotation(v, EVICTED_AT_ANNOTATION, Some(&rfc3339(now)));
        }
    })
    .await
}

/// Records a pods-ready timeout on a pod or a serving owner (the requeue count and
/// time), as `suspend_job` does on a Job: the workload's next pods are held by them.
async fn record_requeue(
    client: &kube::Client,
    cache: Option<&Cache>,
    r: &ObjRef,
    count: u32,
    now: Millis,
) -> Result<Written> {
    update(client, r, cache, Part::Main, |v| {
        set_annotation(v, REQUEUE_COUNT_ANNOTATION, Some(&count.to_string()));
        set_annotation(v, EVICTED_AT_ANNOTATION, Some(&rfc3339(now)));
    })
    .await
}

/// Records that all pods of the object's workload were Ready (once).
async fn record_ready(
    client: &kube::Client,
    cache: Option<&Cache>,
    r: &ObjRef,
    now: Millis,
) -> Result<Written> {
    update(client, r, cache, Part::Main, |v| {
        set_annotation(v, PODS_READY_AT_ANNOTATION, Some(&rfc3339(now)));
    })
    .await
}

/// Records why a workload waits: a pod's `CONDITION_TYPE` condition (status False),
/// whose `lastTransitionTime` moves only when it was not False already (Kubernetes'
/// rule for conditions: a new reason or message is not a transition), or a Job's
/// annotations. Serving owners carry no reason.
async fn record_pending(
    client: &kube::Client,
    cache: Option<&Cache>,
    r: &ObjRef,
    reason: &str,
    message: &str,
    now: Millis,
) -> Result<Written> {
    // The place the message names is written to the `Workload` record alone: a line
    // that moves rewrites no pod.
    let (message, _) = split_place(message);
    match r.kind {
        ObjKind::Pod => {
            update(client, r, cache, Part::Status, |v| {
                pending_condition(v, reason, message, now);
            })
            .await
        }
        ObjKind::Job => {
            update(client, r, cache, Part::Main, |v| {
                set_annotation(v, PENDING_REASON_ANNOTATION, Some(reason));
                set_annotation(v, PENDING_MESSAGE_ANNOTATION, Some(message));
            })
            .await
        }
        ObjKind::Deployment | ObjKind::ReplicaSet | ObjKind::StatefulSet => Ok(None),
    }
}

/// Sets the pod's pending condition to `reason` / `message`.
fn pending_condition(pod: &mut Value, reason: &str, message: &str, now: Millis) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conds = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let since = conds
        .iter()
        .find(|c| c["type"] == CONDITION_TYPE && c["status"] == "False")
        .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
        .unwrap_or_else(|| rfc3339(now / 1000 * 1000));
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c["type"] != CONDITION_TYPE)
        .collect();
    conds.push(
        json!({"type": CONDITION_TYPE, "status": "False", "reason": reason,
                      "message": message, "lastTransitionTime": since}),
    );
    pod["status"]["conditions"] = Value::Array(conds);
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

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_763_467_200_000; // 2025-11-18T12:00:00Z

    fn condition(pod: &Value) -> Value {
        pod["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == CONDITION_TYPE))
            .cloned()
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_pending_condition_moves_its_transition_time_only_when_it_becomes_false() {
        let mut pod = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"},
            {"type": CONDITION_TYPE, "status": "True", "lastTransitionTime": "2025-11-18T11:00:00Z"}]}});
        pending_condition(&mut pod, "Queued", "position 3", T0);
        let first = condition(&pod);
        assert_eq!(
            first["lastTransitionTime"], "2025-11-18T12:00:00Z",
            "{first}"
        );
        assert_eq!(first["status"], "False");
        // The position moves later: same status, new message, the transition stays.
        pending_condition(&mut pod, "Queued", "position 2", T0 + 60_000);
        let second = condition(&pod);
        assert_eq!(second["message"], "position 2");
        assert_eq!(second["lastTransitionTime"], "2025-11-18T12:00:00Z");
        // A new reason while still False is not a transition either (Kubernetes' rule).
        pending_condition(&mut pod, "Preempted", "by team/x", T0 + 120_000);
        assert_eq!(
            condition(&pod)["lastTransitionTime"],
            "2025-11-18T12:00:00Z"
        );
        // Other conditions are kept; the pod has one condition of the type.
        let conds = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(conds.len(), 2, "{conds:?}");
        assert!(conds.iter().any(|c| c["type"] == "Ready"));
    }

    #[test]
    fn an_edit_that_changes_nothing_is_not_written() {
        let mut pod = json!({"metadata": {"name": "p"}});
        pending_condition(&mut pod, "Queued", "position 3", T0);
        let same = edited(pod.clone(), |v| {
            pending_condition(v, "Queued", "position 3", T0 + 1_000)
        });
        assert!(
            same.is_none(),
            "rewriting the same reason and message is no write"
        );
        let moved = edited(pod, |v| {
            pending_condition(v, "Queued", "position 2", T0 + 1_000)
        });
        assert_eq!(
            moved.map(|v| condition(&v)["message"].clone()),
            Some(json!("position 2"))
        );
    }
}
