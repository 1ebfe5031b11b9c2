//! Durable requeue state of pod workloads that have no object outliving their pods: pod
//! groups and single pods without a serving owner. Their `waitForPodsReady` requeue
//! count and eviction time live in one ConfigMap per namespace,
//! `tessera-requeue-state` (label `tessera.io/requeue-state: v1`), one `data` entry per
//! workload, so pods deleted and recreated (by a user or an operator) under the same
//! group or pod name, and a restarted controller, go on with the same backoff and
//! deactivation.
//!
//! ```text
//! pass: ConfigMaps ─► read ─► Book (workload key → Requeue; corrupt entries reported, ignored)
//!       timeout ─► Action::RequeueState{set} ─(written first)─► Evict (skipped if the write failed)
//!       Ready / finished / no pods past the TTL ─► Action::RequeueState{forget}
//! write: GET ─► merge (monotonic set, compare-and-delete forget, bounded) ─► PUT with
//!        resourceVersion (or POST; or, left empty, DELETE with a resourceVersion
//!        precondition) ─409─► GET again (at most WRITE_ATTEMPTS)
//! ```
//! An entry only ever moves forward ([`super::readiness::latest`]: more requeues, then the
//! later eviction), so two writers (two controller replicas around a leader change) can
//! neither lose an increment nor count one timeout twice; a forget removes an entry only
//! if it still holds the value the pass read.

use super::cache::Cache;
use super::error::{Error, Result};
use super::readiness::{hold, Hold};
pub(crate) use super::requeue_book::{
    entry_name, kept_here, merge, read, Book, Entry, CONFIGMAP_NAME, FORMAT, LABEL, MAX_ENTRIES,
};
use super::time::Millis;
use crate::quota::WaitForPodsReady;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};
use serde_json::Value;
use std::collections::BTreeMap;

/// GET-merge-PUT rounds tried on 409 Conflict / AlreadyExists before the write fails.
pub const WRITE_ATTEMPTS: usize = 5;

fn api_error(what: String) -> impl FnOnce(kube::Error) -> Error {
    Error::api(what)
}

/// What [`write`] did to the namespace's ConfigMap.
#[derive(Debug, PartialEq)]
pub enum Written {
    /// Nothing to change.
    Unchanged,
    /// Created or updated: the ConfigMap as stored.
    Stored(Value),
    /// Its last entry forgotten: deleted, so no empty ConfigMap is left behind.
    Deleted,
}

/// Writes `set` and `forget` into namespace's ConfigMap (creating it, or deleting it
/// once it holds no entry), retrying on conflicts. The delete carries the
/// resourceVersion read as a precondition, so an entry another writer set meanwhile is
/// never deleted with it. What is written goes into `cache` at once.
pub async fn write(
    client: &kube::Client,
    namespace: &str,
    set: &[Entry],
    forget: &BTreeMap<String, String>,
    cache: Option<&Cache>,
) -> Result<Written> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let what = format!("requeue state {namespace}/{CONFIGMAP_NAME}");
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api
            .get_opt(CONFIGMAP_NAME)
            .await
            .map_err(api_error(format!("get {what}")))?;
        let mut data = current
            .as_ref()
            .and_then(|c| c.data.clone())
            .unwrap_or_default();
        let before = data.clone();
        let dropped = merge(&mut data, set, forget);
        for name in &dropped {
            tracing::warn!(namespace, entry = %name, max = MAX_ENTRIES,
                           "requeue state full: oldest entry dropped");
        }
        let labelled = current.as_ref().is_some_and(|c| {
            c.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.get(LABEL).map(String::as_str) == Some(FORMAT))
        });
        if data.is_empty() {
            let Some(rv) = current
                .as_ref()
                .and_then(|c| c.metadata.resource_version.clone())
            else {
                return Ok(Written::Unchanged);
            };
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(rv),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(CONFIGMAP_NAME, &dp).await {
                Ok(_) => {
                    if let Some(cache) = cache {
                        cache
                            .requeue_states
                            .remove(&(namespace.to_string(), CONFIGMAP_NAME.to_string()));
                    }
                    return Ok(Written::Deleted);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Written::Unchanged),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(namespace, attempt, reason = %s.reason,
                                    "requeue state changed meanwhile; merging again");
                    continue;
                }
                Err(e) => return Err(api_error(format!("delete {what} (attempt {attempt})"))(e)),
            }
        }
        if data == before && (labelled || current.is_none()) {
            return Ok(Written::Unchanged);
        }
        let result = match current {
            Some(mut cm) => {
                cm.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(LABEL.into(), FORMAT.into());
                cm.data = Some(data);
                api.replace(CONFIGMAP_NAME, &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(CONFIGMAP_NAME.into()),
                        namespace: Some(namespace.into()),
                        labels: Some([(LABEL.to_string(), FORMAT.to_string())].into()),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(stored) => {
                let v = serde_json::to_value(stored).map_err(|e| {
                    Error::api(format!("read back {what}"))(kube::Error::SerdeError(e))
                })?;
                if let Some(cache) = cache {
                    cache.requeue_states.upsert(v.clone());
                }
                return Ok(Written::Stored(v));
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => {
                tracing::debug!(namespace, attempt, reason = %s.reason,
                                "requeue state changed meanwhile; merging again");
            }
            Err(e) => return Err(api_error(format!("write {what} (attempt {attempt})"))(e)),
        }
    }
}

/// What the ConfigMap on the API server holds workload `key` back for at `now`, read
/// fresh (once per namespace into `read_now`): an admission decided from a cache whose
/// ConfigMap lagged behind its pods is checked against it before it is written.
pub async fn fresh_hold(
    client: &kube::Client,
    cfg: &WaitForPodsReady,
    key: &str,
    now: Millis,
    read_now: &mut BTreeMap<String, Book>,
) -> Result<Option<Hold>> {
    let Some((ns, _)) = entry_name(key).filter(|_| kept_here(key)) else {
        return Ok(None);
    };
    if !read_now.contains_key(&ns) {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let cm = api
            .get_opt(CONFIGMAP_NAME)
            .await
            .map_err(api_error(format!(
                "get requeue state {ns}/{CONFIGMAP_NAME}"
            )))?;
        let values: Vec<Value> = cm
            .and_then(|c| serde_json::to_value(c).ok())
            .into_iter()
            .collect();
        read_now.insert(ns.clone(), read(&values));
    }
    Ok(read_now
        .get(&ns)
        .and_then(|b| b.requeue(key))
        .and_then(|r| hold(cfg, r, now)))
}
