//! Durable requeue state of pod workloads that have no object outliving their pods: pod
//! groups and single pods without a serving owner. Their `waitForPodsReady` requeue
//! count and eviction time live in their `Workload` record's `status.requeueState`
//! ([`super::requeue_book`]), so pods deleted and recreated (by a user or an operator)
//! under the same group or pod name, and a restarted controller, go on with the same
//! backoff and deactivation.
//!
//! ```text
//! pass: records ─► read ─► Book (workload key → Requeue; unreadable states reported, ignored)
//!       timeout ─► Action::RequeueState{set} ─(written first)─► Evict (skipped if the write failed)
//!       Ready / finished ─► Action::RequeueState{forget: owners} ─► state cleared, owners back
//!       no pods past the TTL ─► Action::RequeueState{forget: no owners} ─► record deleted
//! write: record (cache, else GET; POST when none) ─► owners off (PUT) ─► merged state
//!        (PUT status, with resourceVersion) ─409─► GET again (at most WRITE_ATTEMPTS)
//! ```
//! A state only ever moves forward ([`super::readiness::latest`]: more requeues, then the
//! later eviction), so two writers (two controller replicas around a leader change) can
//! neither lose an increment nor count one timeout twice; a forget clears or deletes a
//! record only if it still holds the state the pass read (a delete carries the
//! resourceVersion it read as a precondition).

use super::cache::Cache;
use super::error::{Error, Result};
use super::readiness::{hold, latest, Hold};
pub(crate) use super::requeue_book::{kept_here, Entry, Forget};
use super::requeue_book::{read_one, seen};
use super::time::{rfc3339, Millis};
use super::workload_record::{record_name, RequeueState, Update, KEY_ANNOTATION};
use super::workload_writer::{
    get, observe, owned_by_key, owner_refs_of, resource, status_of, to_dynamic,
};
use crate::quota::WaitForPodsReady;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Reads tried on 409 Conflict / AlreadyExists before the write fails.
pub const WRITE_ATTEMPTS: usize = 5;

/// What [`write`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Records whose state (or owners) were written.
    pub stored: usize,
    /// Records deleted.
    pub deleted: usize,
}

/// The pass's other record updates, written with a state set on the same record.
#[derive(Clone, Copy)]
pub struct With<'a> {
    /// Every update of the pass (those of other workloads are not read).
    pub records: &'a [Update],
    pub now: Millis,
}

/// Writes `set` and `forget` (by record name) into namespace's records, retrying on
/// conflicts; the first record that cannot be written ends the write with its error.
/// `cfg` gives the `requeueAt` written; a state goes in one status write with the
/// pass's updates of its record (`with`: an eviction's conditions), which the record
/// writer then finds written. What is written goes into `cache` at once.
pub async fn write(
    client: &kube::Client,
    namespace: &str,
    set: &[Entry],
    forget: &BTreeMap<String, Forget>,
    cfg: Option<&WaitForPodsReady>,
    with: With<'_>,
    cache: Option<&Cache>,
) -> Result<Written> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource());
    let mut out = Written::default();
    let now = rfc3339(with.now);
    for e in set {
        let name = record_name(&e.workload);
        let updates: Vec<&Update> = with
            .records
            .iter()
            .filter(|u| u.key == e.workload)
            .collect();
        let wrote = with_retries(&api, namespace, &name, cache, |stored| {
            set_step(namespace, &name, e, cfg, (&updates, &now), stored)
        })
        .await?;
        out.stored += usize::from(wrote > 0);
    }
    for (name, f) in forget {
        let ctx = ForgetCtx {
            client,
            namespace,
            cache,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match forget_one(&api, &ctx, name, f, attempt > 1).await {
                Ok(Forgot::Nothing) => break,
                Ok(Forgot::Cleared) => {
                    out.stored += 1;
                    break;
                }
                Ok(Forgot::Deleted) => {
                    out.deleted += 1;
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(namespace, record = %name, attempt, "requeue state changed meanwhile; reading again");
                }
                Err(e) => {
                    return Err(Error::api(format!(
                        "forget requeue state of Workload {namespace}/{name}"
                    ))(e))
                }
            }
        }
    }
    Ok(out)
}

/// One request toward a record's state.
enum Step {
    /// Nothing (left) to write.
    Done,
    Create(Value),
    Replace(Value),
    ReplaceStatus(Value),
}

/// Runs `step` on the record (cached, else read) until it has nothing left to write;
/// a conflict reads the record again. Returns how many writes were made.
async fn with_retries(
    api: &Api<DynamicObject>,
    namespace: &str,
    name: &str,
    cache: Option<&Cache>,
    step: impl Fn(Option<&Value>) -> std::result::Result<Step, String>,
) -> Result<usize> {
    let what = || format!("requeue state of Workload {namespace}/{name}");
    let mut stored = cached(cache, namespace, name);
    if stored.is_none() {
        stored = get(api, name).await?;
    }
    let (mut conflicts, mut writes) = (0, 0);
    // At most three writes (create, owners, status).
    while writes < 3 {
        let step =
            step(stored.as_ref()).map_err(|why| Error::Unexpected(format!("{}: {why}", what())))?;
        let pp = PostParams::default();
        let result = match step {
            Step::Done => return Ok(writes),
            Step::Create(v) => {
                api.create(&pp, &to_dynamic(v).map_err(Error::api(what()))?)
                    .await
            }
            Step::Replace(v) => {
                api.replace(name, &pp, &to_dynamic(v).map_err(Error::api(what()))?)
                    .await
            }
            Step::ReplaceStatus(v) => {
                api.replace_status(name, &pp, &to_dynamic(v).map_err(Error::api(what()))?)
                    .await
            }
        };
        match result {
            Ok(o) => {
                let v = serde_json::to_value(o).ok();
                if let Some(v) = &v {
                    observe(cache, v);
                }
                stored = v;
                writes += 1;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts += 1;
                if conflicts >= WRITE_ATTEMPTS {
                    return Err(Error::Conflicting(what()));
                }
                stored = get(api, name).await?;
            }
            Err(e) => return Err(Error::api(what())(e)),
        }
    }
    Ok(writes)
}

fn cached(cache: Option<&Cache>, namespace: &str, name: &str) -> Option<Value> {
    cache
        .filter(|c| c.records.synced())
        .and_then(|c| c.records.get(&(namespace.to_string(), name.to_string())))
}

/// The next write that records `e` on `stored`: the record created (without owners),
/// its owners taken off (it must outlive the pods the timeout evicts), then its status
/// with `updates` applied (at `now`, RFC 3339) and the state moved forward.
fn set_step(
    namespace: &str,
    name: &str,
    e: &Entry,
    cfg: Option<&WaitForPodsReady>,
    (updates, now): (&[&Update], &str),
    stored: Option<&Value>,
) -> std::result::Result<Step, String> {
    let Some(v) = stored else {
        return Ok(Step::Create(json!({
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {KEY_ANNOTATION: e.workload}},
            "spec": {"queueName": ""},
        })));
    };
    if !owned_by_key(v, &e.workload) {
        return Err(format!(
            "the record belongs to another workload, not {}",
            e.workload
        ));
    }
    if v["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| !o.is_empty())
    {
        let mut v = v.clone();
        v["metadata"]["ownerReferences"] = json!([]);
        return Ok(Step::Replace(v));
    }
    let stored_status = status_of(v);
    let mut status = updates
        .iter()
        .fold(stored_status.clone(), |s, u| u.apply(&s, now));
    let current = status
        .requeue_state
        .as_ref()
        .and_then(RequeueState::requeue);
    let next = latest(current, Some(e.requeue));
    if next != current {
        status.requeue_state = next.map(|r| RequeueState::of(r, cfg));
    }
    if status == stored_status {
        return Ok(Step::Done);
    }
    let mut v = v.clone();
    v["status"] = json!(status);
    Ok(Step::ReplaceStatus(v))
}

/// The record `e` leaves behind when every write of [`set_step`] lands (a test's
/// stand-in for the API server; a foreign record is left as it is).
#[cfg(test)]
pub(super) fn recorded(
    namespace: &str,
    e: &Entry,
    cfg: Option<&WaitForPodsReady>,
    mut stored: Option<Value>,
) -> Option<Value> {
    let name = record_name(&e.workload);
    for _ in 0..3 {
        match set_step(namespace, &name, e, cfg, (&[], ""), stored.as_ref()) {
            Ok(Step::Create(v) | Step::Replace(v) | Step::ReplaceStatus(v)) => stored = Some(v),
            Ok(Step::Done) | Err(_) => break,
        }
    }
    stored
}

struct ForgetCtx<'a> {
    client: &'a kube::Client,
    namespace: &'a str,
    cache: Option<&'a Cache>,
}

enum Forgot {
    Nothing,
    Cleared,
    Deleted,
}

/// Forgets record `name`'s state if it still holds `f.seen`: deleted (with its
/// resourceVersion as a precondition), or its owners put back and the state cleared.
async fn forget_one(
    api: &Api<DynamicObject>,
    ctx: &ForgetCtx<'_>,
    name: &str,
    f: &Forget,
    fresh: bool,
) -> std::result::Result<Forgot, kube::Error> {
    let stored = match (fresh, cached(ctx.cache, ctx.namespace, name)) {
        (false, Some(v)) => Some(v),
        _ => api
            .get_opt(name)
            .await?
            .and_then(|o| serde_json::to_value(o).ok()),
    };
    let Some(mut v) = stored.filter(|v| seen(v) == f.seen && !f.seen.is_empty()) else {
        return Ok(Forgot::Nothing);
    };
    let pp = PostParams::default();
    let Some(owners) = &f.owners else {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: v["metadata"]["resourceVersion"].as_str().map(String::from),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        if let Some(c) = ctx.cache {
            c.records
                .remove(&(ctx.namespace.to_string(), name.to_string()));
        }
        return Ok(Forgot::Deleted);
    };
    let unowned = v["metadata"]["ownerReferences"]
        .as_array()
        .is_none_or(|o| o.is_empty());
    if unowned && !owners.is_empty() {
        v["metadata"]["ownerReferences"] =
            json!(owner_refs_of(ctx.client, ctx.namespace, owners, ctx.cache).await);
        let o = api.replace(name, &pp, &to_dynamic(v)?).await?;
        v = serde_json::to_value(o).map_err(kube::Error::SerdeError)?;
        observe(ctx.cache, &v);
    }
    let mut status = status_of(&v);
    status.requeue_state = None;
    v["status"] = json!(status);
    let o = api.replace_status(name, &pp, &to_dynamic(v)?).await?;
    if let Ok(v) = serde_json::to_value(o) {
        observe(ctx.cache, &v);
    }
    Ok(Forgot::Cleared)
}

/// What the record on the API server holds workload `key` back for at `now`, read
/// fresh: an admission decided from a cache whose record lagged behind its pods is
/// checked against it before it is written.
pub async fn fresh_hold(
    client: &kube::Client,
    cfg: &WaitForPodsReady,
    key: &str,
    now: Millis,
) -> Result<Option<Hold>> {
    let Some((ns, _)) = key.split_once('/').filter(|_| kept_here(key)) else {
        return Ok(None);
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource());
    let record = get(&api, &record_name(key)).await?;
    Ok(record
        .as_ref()
        .and_then(read_one)
        .filter(|(k, _)| k == key)
        .and_then(|(_, s)| s.requeue)
        .and_then(|r| hold(cfg, r, now)))
}
