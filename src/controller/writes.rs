//! The writes a pass makes, behind one narrow trait: [`Writes`] (ungate or unsuspend,
//! delete a partial admission's extra pod, evict or suspend, record a requeue, pods
//! ready, a pending reason, admitted replicas, the requeue state, Events). The
//! reconciler's rules — what is written in which order, what a failed write defers, what
//! a refused eviction does — live in `reconciler::apply_with` over any `Writes`, so they
//! are unit-tested without HTTP (`apply_tests.rs`); [`KubeWrites`] is the one that calls
//! the API server.
//!
//! Each write GETs the object and PUTs it back with that resourceVersion: a concurrent
//! change makes it fail with 409 and the next pass decides again. A write answers the
//! object as stored ([`Written`], for the cache).

use super::cache::Cache;
use super::config::Config;
use super::error::{Error, Result};
use super::model::{ObjKind, ObjRef};
use super::pods_ready::{
    EVICTED_AT_ANNOTATION, PODS_READY_AT_ANNOTATION, REQUEUE_COUNT_ANNOTATION,
};
use super::readiness::Hold;
use super::requeue_state::{self, Book, Entry};
use super::serving::ADMITTED_REPLICAS_ANNOTATION;
use super::time::{rfc3339, Millis};
use super::workloads::{annotation, is_gated};
use super::{
    ADMISSION_GATE, ADMITTED_AT_ANNOTATION, ADMITTED_COUNT_ANNOTATION, CONDITION_TYPE,
    ORIGINAL_PARALLELISM_ANNOTATION, PENDING_MESSAGE_ANNOTATION, PENDING_REASON_ANNOTATION,
};
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
    /// Writes a namespace's requeue state entries.
    fn write_requeue_state(
        &self,
        namespace: &str,
        set: &[Entry],
        forget: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<requeue_state::Written>> + Send;
    /// The requeue hold of `workload` as the API server has it now (newer than the pass
    /// may have read); `read_now` keeps what was read in this apply.
    fn fresh_hold(
        &self,
        cfg: &WaitForPodsReady,
        workload: &str,
        now: Millis,
        read_now: &mut BTreeMap<String, Book>,
    ) -> impl Future<Output = Result<Option<Hold>>> + Send;
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
}

impl Writes for KubeWrites<'_> {
    async fn admit(
        &self,
        r: &ObjRef,
        selector: &BTreeMap<String, String>,
        partial: Option<u32>,
        now: Millis,
    ) -> Result<Written> {
        admit(self.client, r, selector, partial, now).await
    }

    async fn delete_excess(&self, r: &ObjRef) -> Result<bool> {
        delete_excess(self.client, r, self.cache).await
    }

    async fn evict(&self, r: &ObjRef, grace: i64) -> Result<Written> {
        evict_pod(self.client, r, grace, self.cache.is_some()).await
    }

    async fn suspend(&self, r: &ObjRef, requeue: Option<u32>, now: Millis) -> Result<Written> {
        suspend_job(self.client, r, requeue, now).await
    }

    async fn record_requeue(&self, r: &ObjRef, count: u32, now: Millis) -> Result<Written> {
        record_requeue(self.client, r, count, now).await
    }

    async fn record_ready(&self, r: &ObjRef, now: Millis) -> Result<Written> {
        record_ready(self.client, r, now).await
    }

    async fn record_pending(
        &self,
        r: &ObjRef,
        reason: &str,
        message: &str,
        now: Millis,
    ) -> Result<Written> {
        record_pending(self.client, r, reason, message, now).await
    }

    async fn annotate_replicas(&self, r: &ObjRef, value: &str) -> Result<Written> {
        annotate_replicas(self.client, r, value).await
    }

    async fn write_requeue_state(
        &self,
        namespace: &str,
        set: &[Entry],
        forget: &BTreeMap<String, String>,
    ) -> Result<requeue_state::Written> {
        requeue_state::write(self.client, namespace, set, forget, self.cache).await
    }

    async fn fresh_hold(
        &self,
        cfg: &WaitForPodsReady,
        workload: &str,
        now: Millis,
        read_now: &mut BTreeMap<String, Book>,
    ) -> Result<Option<Hold>> {
        requeue_state::fresh_hold(self.client, cfg, workload, now, read_now).await
    }

    async fn event(&self, r: &ObjRef, reason: &str, note: &str, warning: bool, now: Millis) {
        emit(self.client, self.cfg, r, reason, note, warning, now).await
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
pub type Written = Option<Value>;

pub fn written(obj: DynamicObject) -> Written {
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
