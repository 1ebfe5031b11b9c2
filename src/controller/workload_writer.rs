//! Writes the `Workload` records a pass's [`Update`]s describe
//! ([`super::workload_record`]): created with their spec and owners on first sight, the
//! spec replaced when it changed, the status merged and written through the `status`
//! subresource only when the merge changes it.
//!
//! ```text
//! update ─► stored (cache once synced, else GET) ─none─► POST (spec, owners) ─┐
//!                                              └─────────────────────────────┴─► PUT (spec changed) ─► PUT status (merged ≠ stored)
//!                                              409 on any write ─► GET, merge again (at most WRITE_ATTEMPTS)
//! ```
//! The API server creates an object without its `status` when the kind has a status
//! subresource, so a new record always takes two writes. Owners are the workload's pods
//! or Job, by UID (an owner whose UID is not known is left out): the API server's garbage
//! collector deletes a record with the objects it describes. A record whose
//! `tessera.io/workload-key` names another workload is left alone (reported).

use super::cache::Cache;
use super::error::{Error, Result};
use super::in_flight::at_most;
use super::requeue_book::kept_here;
use super::resources::crd_resource;
use super::time::{rfc3339, Millis};
use super::workload_record::{OwnerRef, Update, WorkloadSpec, WorkloadStatus, KEY_ANNOTATION};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// 409 Conflict / AlreadyExists answers taken (each followed by a fresh GET) before a
/// record's write fails.
pub const WRITE_ATTEMPTS: usize = 3;

/// The Workload kind's API resource.
pub fn resource() -> ApiResource {
    crd_resource("Workload", "workloads")
}

/// How many records are written at once (each its own object).
pub const RECORDS_IN_FLIGHT: usize = 16;

/// Writes every update: a workload's in order (a later one applies on top of an
/// earlier one), [`RECORDS_IN_FLIGHT`] workloads at a time. Returns the updates whose
/// write failed, to try again, in the order given.
pub async fn write(
    client: &kube::Client,
    updates: &[Update],
    cache: Option<&Cache>,
    now: Millis,
) -> Vec<Update> {
    let mut per_workload: Vec<Vec<usize>> = Vec::new();
    let mut slot: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, u) in updates.iter().enumerate() {
        let at = *slot.entry(u.key.as_str()).or_insert_with(|| {
            per_workload.push(Vec::new());
            per_workload.len() - 1
        });
        per_workload[at].push(i);
    }
    let writes: Vec<_> = per_workload
        .into_iter()
        .map(|indices| write_in_order(client, updates, indices, cache, now))
        .collect();
    let mut failed: Vec<usize> = at_most(writes, RECORDS_IN_FLIGHT)
        .await
        .into_iter()
        .flatten()
        .collect();
    failed.sort_unstable();
    failed.into_iter().map(|i| updates[i].clone()).collect()
}

/// Writes `updates[i]` for each of `indices` in turn; gives the indices that failed.
async fn write_in_order(
    client: &kube::Client,
    updates: &[Update],
    indices: Vec<usize>,
    cache: Option<&Cache>,
    now: Millis,
) -> Vec<usize> {
    let mut failed = Vec::new();
    for i in indices {
        let u = &updates[i];
        if let Err(e) = write_one(client, u, cache, now).await {
            tracing::warn!(error = %e, workload = %u.key, "writing Workload record; retried next pass");
            failed.push(i);
        }
    }
    failed
}

async fn write_one(
    client: &kube::Client,
    u: &Update,
    cache: Option<&Cache>,
    now: Millis,
) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &u.namespace, &resource());
    let what = || format!("Workload {}/{}", u.namespace, u.name);
    let cached = cache
        .filter(|c| c.records.synced())
        .map(|c| c.records.get(&(u.namespace.clone(), u.name.clone())));
    let mut stored = match cached {
        Some(v) => v,
        None => get(&api, &u.name).await?,
    };
    let (mut conflicts, mut writes) = (0, 0);
    // At most three writes (create, spec, status); a server that keeps dropping what is
    // written does not make this loop forever.
    while writes < 3 && !done(u, stored.as_ref(), now) {
        let result = match &stored {
            None => create(&api, client, u, cache).await,
            Some(v) => update(&api, client, u, v, cache, now).await,
        };
        match result {
            // The merged status written: nothing is left to write (the answer goes to the
            // cache as it is, not checked again).
            Ok(Some((v, Step::Status))) => {
                if let Some(c) = cache {
                    c.records.write_through(v);
                }
                return Ok(());
            }
            Ok(Some((v, Step::Object))) => {
                observe(cache, &v);
                stored = Some(v);
                writes += 1;
            }
            Ok(None) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts += 1;
                if conflicts >= WRITE_ATTEMPTS {
                    return Err(Error::Conflicting(what()));
                }
                stored = get(&api, &u.name).await?;
            }
            Err(e) => return Err(Error::api(what())(e)),
        }
    }
    Ok(())
}

/// Whether `stored` already holds what `u` asks for (or belongs to another workload:
/// nothing to write either).
fn done(u: &Update, stored: Option<&Value>, now: Millis) -> bool {
    let Some(v) = stored else {
        return false;
    };
    if !owned_by_key(v, &u.key) {
        tracing::warn!(workload = %u.key, name = %u.name,
                       "a Workload of this name belongs to another workload; left alone");
        return true;
    }
    let status = status_of(v);
    let merged = u.apply(&status, &rfc3339(now));
    merged == status && spec_written(u, v) && !needs_owners(u, v, &merged)
}

/// Whether stored record `v` has no owners while it should: it holds no requeue state
/// (which alone keeps a record ownerless, `requeue_book`) and `u` names the workload's
/// objects. A controller stopped between forgetting a state and giving the record its
/// owners back leaves one so; this update gives them back, so the garbage collector
/// deletes it with them.
fn needs_owners(u: &Update, v: &Value, merged: &WorkloadStatus) -> bool {
    let ownerless = v["metadata"]["ownerReferences"]
        .as_array()
        .is_none_or(|o| o.is_empty());
    ownerless && !u.owners.is_empty() && merged.requeue_state.is_none()
}

pub(super) fn owned_by_key(v: &Value, key: &str) -> bool {
    v["metadata"]["annotations"][KEY_ANNOTATION].as_str() == Some(key)
}

pub(super) fn status_of(v: &Value) -> WorkloadStatus {
    serde_json::from_value(v["status"].clone()).unwrap_or_default()
}

fn spec_written(u: &Update, v: &Value) -> bool {
    let stored: Option<WorkloadSpec> = serde_json::from_value(v["spec"].clone()).ok();
    u.spec.is_none() || stored.as_ref() == u.spec.as_ref()
}

pub(super) async fn get(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>> {
    let obj = api
        .get_opt(name)
        .await
        .map_err(Error::api(format!("get Workload {name}")))?;
    Ok(obj.and_then(|o| serde_json::to_value(o).ok()))
}

pub(super) fn observe(cache: Option<&Cache>, v: &Value) {
    if let Some(c) = cache {
        c.records.write_through(v.clone());
    }
}

/// The owner references of `u`'s objects whose UIDs are known (from the cache, else GET).
async fn owner_refs(client: &kube::Client, u: &Update, cache: Option<&Cache>) -> Vec<Value> {
    owner_refs_of(client, &u.namespace, &u.owners, cache).await
}

/// The owner references of `owners` in `namespace` whose UIDs are known.
pub(super) async fn owner_refs_of(
    client: &kube::Client,
    namespace: &str,
    owners: &[OwnerRef],
    cache: Option<&Cache>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for o in owners {
        if let Some(uid) = uid_of(client, namespace, o, cache).await {
            let api_version = if o.kind == "Job" { "batch/v1" } else { "v1" };
            out.push(
                json!({"apiVersion": api_version, "kind": o.kind, "name": o.name, "uid": uid,
                            "controller": o.kind == "Job"}),
            );
        }
    }
    out
}

async fn uid_of(
    client: &kube::Client,
    namespace: &str,
    o: &OwnerRef,
    cache: Option<&Cache>,
) -> Option<String> {
    let key = (namespace.to_string(), o.name.clone());
    let stores = cache.map(|c| if o.kind == "Job" { &c.jobs } else { &c.pods });
    let from_cache = stores
        .into_iter()
        .flatten()
        .find_map(|s| s.get(&key))
        .and_then(|v| v["metadata"]["uid"].as_str().map(String::from));
    if from_cache.is_some() {
        return from_cache;
    }
    let ar = if o.kind == "Job" {
        ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&())
    } else {
        ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&())
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let obj = api.get_opt(&o.name).await.ok().flatten()?;
    obj.metadata.uid
}

pub(super) fn to_dynamic(v: Value) -> std::result::Result<DynamicObject, kube::Error> {
    serde_json::from_value(v).map_err(kube::Error::SerdeError)
}

/// Which write of a record was made: its object (created, or its spec or owners
/// replaced; the status may be left to write) or its status (the last).
enum Step {
    Object,
    Status,
}

/// POSTs the record with its spec and owners (the status follows in [`update`]).
async fn create(
    api: &Api<DynamicObject>,
    client: &kube::Client,
    u: &Update,
    cache: Option<&Cache>,
) -> std::result::Result<Option<(Value, Step)>, kube::Error> {
    // A pod group's or lone pod's record holding a requeue state outlives its pods
    // (`requeue_book`): it gets its owners when the state is forgotten.
    let holds_state = matches!(&u.requeue_state, Some(Some(_)));
    let owners = match holds_state && kept_here(&u.key) {
        true => Vec::new(),
        false => owner_refs(client, u, cache).await,
    };
    let obj = json!({
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "Workload",
        "metadata": {
            "name": u.name,
            "namespace": u.namespace,
            "annotations": {KEY_ANNOTATION: u.key},
            "ownerReferences": owners,
        },
        "spec": u.spec.clone().unwrap_or_default(),
    });
    let created = api
        .create(&PostParams::default(), &to_dynamic(obj)?)
        .await?;
    Ok(serde_json::to_value(created)
        .ok()
        .map(|v| (v, Step::Object)))
}

/// Replaces the spec when it changed (with the owners when they are missing,
/// [`needs_owners`]), then the status when the merge changes it; `None` when nothing was
/// written.
async fn update(
    api: &Api<DynamicObject>,
    client: &kube::Client,
    u: &Update,
    stored: &Value,
    cache: Option<&Cache>,
    now: Millis,
) -> std::result::Result<Option<(Value, Step)>, kube::Error> {
    let status = status_of(stored);
    let merged = u.apply(&status, &rfc3339(now));
    let owners = match needs_owners(u, stored, &merged) {
        true => owner_refs(client, u, cache).await,
        false => Vec::new(),
    };
    let spec = u.spec.as_ref().filter(|_| !spec_written(u, stored));
    if spec.is_some() || !owners.is_empty() {
        let mut v = stored.clone();
        if let Some(spec) = spec {
            v["spec"] = json!(spec);
        }
        if !owners.is_empty() {
            v["metadata"]["ownerReferences"] = json!(owners);
        }
        let replaced = api
            .replace(&u.name, &PostParams::default(), &to_dynamic(v)?)
            .await?;
        return Ok(serde_json::to_value(replaced)
            .ok()
            .map(|v| (v, Step::Object)));
    }
    if merged == status {
        return Ok(None);
    }
    let mut v = stored.clone();
    v["status"] = json!(merged);
    let replaced = api
        .replace_status(&u.name, &PostParams::default(), &to_dynamic(v)?)
        .await?;
    Ok(serde_json::to_value(replaced)
        .ok()
        .map(|v| (v, Step::Status)))
}
