//! Watch-fed caches of the objects a pass reads, so a pass snapshots from memory instead
//! of LISTing the API server (one LIST per kind at start and after a watch breaks).
//!
//! One [`Store`] per (kind, label selector), keyed by namespace/name. Its feeder
//! ([`feed`]) LISTs, then WATCHes from the list's resourceVersion: ADDED/MODIFIED upsert,
//! DELETED removes, BOOKMARK advances the resourceVersion; a watch that ends is resumed
//! from the last resourceVersion seen; a `410 Gone` (history compacted) or any other
//! error re-LISTs. The controller's own writes are put into the stores at once
//! ([`Cache::observe`]) so the next pass reads its writes even before their watch event
//! arrives; a store never goes back to an older resourceVersion of an object (the
//! versions are compared as integers, as etcd issues them; an unparsable one is taken
//! as newer).

use super::requeue_book;
use super::resources::{crd_resource, dra_resource, QUEUE_KINDS};
use crate::quota::objects::QUEUE_LABELS;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Namespace ("" for cluster-scoped objects) and name.
pub type Key = (String, String);

fn key_of(v: &Value) -> Key {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_string(),
        m["name"].as_str().unwrap_or("").to_string(),
    )
}

fn rv_of(v: &Value) -> &str {
    v["metadata"]["resourceVersion"].as_str().unwrap_or("")
}

/// Whether resourceVersion `new` is not older than `old`.
fn not_older(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(n), Ok(o)) => n >= o,
        _ => true,
    }
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<Key, Value>,
    /// Set by the first successful LIST (or a 404 of an optional kind).
    synced: bool,
    /// Changes applied so far (a pass can tell whether anything moved).
    generation: u64,
    /// The generation of each key's last upsert or removal since the last LIST, and
    /// the same by generation (so a reader asks for the keys changed after its own).
    changed: BTreeMap<Key, u64>,
    log: BTreeMap<u64, Key>,
    /// The generation of the last LIST (everything may have changed then).
    replaced_at: u64,
}

impl Inner {
    fn record(&mut self, k: Key) {
        let g = self.generation;
        if let Some(old) = self.changed.insert(k.clone(), g) {
            self.log.remove(&old);
        }
        self.log.insert(g, k);
    }
}

/// What changed in a store after a given generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changes {
    /// A LIST replaced the contents since: anything may have changed.
    All,
    /// These keys were upserted or removed (each once, in no particular order).
    Keys(Vec<Key>),
}

/// The cached objects of one kind and selector.
pub struct Store {
    /// The kind and the label selector its feeder uses.
    pub resource: ApiResource,
    pub selector: Option<String>,
    /// A kind the cluster may not serve (404 reads as no objects).
    pub optional: bool,
    inner: RwLock<Inner>,
}

impl Store {
    pub fn new(resource: ApiResource, selector: Option<String>, optional: bool) -> Store {
        Store {
            resource,
            selector,
            optional,
            inner: RwLock::new(Inner::default()),
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep going.
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the contents with a LIST taken at resourceVersion `rv`; objects this
    /// instance wrote after `rv` (already in the store) are kept.
    pub fn replace(&self, items: Vec<Value>, rv: &str) {
        let mut inner = self.write();
        let mut objects: BTreeMap<Key, Value> =
            items.into_iter().map(|v| (key_of(&v), v)).collect();
        for (k, old) in &inner.objects {
            let newer = match objects.get(k) {
                Some(listed) => !not_older(rv_of(listed), rv_of(old)),
                None => rv_of(old).parse::<u64>().ok() > rv.parse::<u64>().ok(),
            };
            if newer {
                objects.insert(k.clone(), old.clone());
            }
        }
        inner.objects = objects;
        inner.synced = true;
        inner.generation += 1;
        inner.replaced_at = inner.generation;
        inner.changed.clear();
        inner.log.clear();
    }

    /// An object added or changed (from a watch or from this instance's own write).
    pub fn upsert(&self, v: Value) {
        let mut inner = self.write();
        let k = key_of(&v);
        if let Some(old) = inner.objects.get(&k) {
            let (new_rv, old_rv) = (rv_of(&v), rv_of(old));
            // Older, or the watch echo of this instance's own write: nothing changes.
            if !not_older(new_rv, old_rv) || (!new_rv.is_empty() && new_rv == old_rv) {
                return;
            }
        }
        inner.objects.insert(k.clone(), v);
        inner.generation += 1;
        inner.record(k);
    }

    /// Upsert only when the object is already cached (a write-through: the write did
    /// not change what the selector matches).
    fn update_if_present(&self, v: &Value) {
        let present = self.read().objects.contains_key(&key_of(v));
        if present {
            self.upsert(v.clone());
        }
    }

    pub fn remove(&self, key: &Key) {
        let mut inner = self.write();
        if inner.objects.remove(key).is_some() {
            inner.generation += 1;
            inner.record(key.clone());
        }
    }

    /// The keys changed after generation `since` (as read from [`Store::generation`]),
    /// without copying any object: what an incremental pass re-reads.
    pub fn changes_since(&self, since: u64) -> Changes {
        let inner = self.read();
        if inner.replaced_at > since {
            return Changes::All;
        }
        Changes::Keys(
            inner
                .log
                .range(since + 1..)
                .map(|(_, k)| k.clone())
                .collect(),
        )
    }

    /// Whether an object with `key` is cached.
    pub fn contains(&self, key: &Key) -> bool {
        self.read().objects.contains_key(key)
    }

    pub fn synced(&self) -> bool {
        self.read().synced
    }

    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every cached object, in namespace/name order.
    pub fn values(&self) -> Vec<Value> {
        self.read().objects.values().cloned().collect()
    }

    /// Copies of the cached objects for which `keep` holds.
    pub fn values_where(&self, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.read()
            .objects
            .values()
            .filter(|v| keep(v))
            .cloned()
            .collect()
    }

    /// `f` of every cached object, where it gives something (reads without copying
    /// the objects).
    pub fn filter_map<T>(&self, f: impl FnMut(&Value) -> Option<T>) -> Vec<T> {
        self.read().objects.values().filter_map(f).collect()
    }

    pub fn get(&self, key: &Key) -> Option<Value> {
        self.read().objects.get(key).cloned()
    }
}

/// Every store a pass reads.
pub struct Cache {
    pub namespaces: Store,
    /// ResourceFlavor, ClusterQueue, LocalQueue, WorkloadPriorityClass (as `QUEUE_KINDS`).
    pub queues: [Store; 4],
    /// Pods and Jobs naming a queue: one store per label (a selector cannot say "this
    /// label or that one"; a watch tells DELETED when an object stops matching).
    pub pods: Vec<Store>,
    pub jobs: Vec<Store>,
    pub replica_sets: Store,
    pub deployments: Store,
    pub stateful_sets: Store,
    pub claim_templates: Store,
    pub claims: Store,
    /// The `waitForPodsReady` requeue state ConfigMaps ([`super::requeue_state`]).
    pub requeue_states: Store,
    /// The controller's own `Workload` records ([`super::workload_record`]): what it
    /// wrote, so an unchanged record is not written again. Not a pass input (not in
    /// [`Cache::stores`]): a record changing wakes no pass.
    pub records: Store,
}

impl Default for Cache {
    fn default() -> Self {
        Self::new()
    }
}

impl Cache {
    /// Stores for both queue labels (Tessera's and Kueue's).
    pub fn new() -> Cache {
        Self::for_labels(&QUEUE_LABELS)
    }

    /// Stores whose pods and Jobs are those carrying one of `queue_labels`.
    pub fn for_labels(queue_labels: &[&str]) -> Cache {
        let labelled = |ar: ApiResource| -> Vec<Store> {
            queue_labels
                .iter()
                .map(|l| Store::new(ar.clone(), Some(l.to_string()), false))
                .collect()
        };
        Cache {
            namespaces: Store::new(ApiResource::erase::<Namespace>(&()), None, false),
            queues: QUEUE_KINDS.map(|(k, p)| Store::new(crd_resource(k, p), None, false)),
            pods: labelled(ApiResource::erase::<Pod>(&())),
            jobs: labelled(ApiResource::erase::<Job>(&())),
            replica_sets: Store::new(ApiResource::erase::<ReplicaSet>(&()), None, false),
            deployments: Store::new(ApiResource::erase::<Deployment>(&()), None, false),
            stateful_sets: Store::new(ApiResource::erase::<StatefulSet>(&()), None, false),
            claim_templates: Store::new(
                dra_resource("ResourceClaimTemplate", "resourceclaimtemplates"),
                None,
                true,
            ),
            claims: Store::new(dra_resource("ResourceClaim", "resourceclaims"), None, true),
            requeue_states: Store::new(
                ApiResource::erase::<ConfigMap>(&()),
                Some(requeue_book::LABEL.to_string()),
                false,
            ),
            records: Store::new(crd_resource("Workload", "workloads"), None, true),
        }
    }

    /// Every store, for feeding and for sync checks.
    pub fn stores(&self) -> Vec<&Store> {
        let mut out = vec![&self.namespaces];
        out.extend(self.queues.iter());
        out.extend(self.pods.iter());
        out.extend(self.jobs.iter());
        out.extend([
            &self.replica_sets,
            &self.deployments,
            &self.stateful_sets,
            &self.claim_templates,
            &self.claims,
            &self.requeue_states,
        ]);
        out
    }

    /// Whether every store has completed its first LIST.
    pub fn synced(&self) -> bool {
        self.stores().iter().all(|s| s.synced())
    }

    /// Sum of the stores' generations: unchanged means no object changed.
    pub fn generation(&self) -> u64 {
        self.stores().iter().map(|s| s.generation()).sum()
    }

    /// Records an object this instance just wrote (the API server's answer) in the
    /// stores of its kind that already hold it.
    pub fn observe(&self, kind: &str, v: &Value) {
        for s in self.stores() {
            if s.resource.kind == kind {
                s.update_if_present(v);
            }
        }
    }

    /// Forgets an object this instance found gone (404).
    pub fn forget(&self, kind: &str, key: &Key) {
        for s in self.stores() {
            if s.resource.kind == kind {
                s.remove(key);
            }
        }
    }

    /// Every store fed from the API server: the pass inputs ([`Cache::stores`]) and the
    /// records.
    pub fn fed_stores(&self) -> Vec<&Store> {
        let mut out = self.stores();
        out.push(&self.records);
        out
    }

    /// Starts one feeder per fed store; `notify` is poked on every change of a pass
    /// input (the records' feeder pokes no one: a record changing wakes no pass).
    pub fn spawn_feeders(
        self: &Arc<Self>,
        client: &kube::Client,
        notify: Arc<Notify>,
        shutdown: &CancellationToken,
    ) {
        let inputs = self.stores().len();
        for i in 0..self.fed_stores().len() {
            let cache = self.clone();
            let notify = match i < inputs {
                true => notify.clone(),
                false => Arc::new(Notify::new()),
            };
            let (client, shutdown) = (client.clone(), shutdown.child_token());
            tokio::spawn(async move {
                if let Some(store) = cache.fed_stores().get(i) {
                    feed(client, store, notify, shutdown).await;
                }
            });
        }
    }
}

fn to_value(o: DynamicObject) -> Option<Value> {
    serde_json::to_value(o).ok()
}

/// What ended a watch stream.
enum WatchEnd {
    /// The server closed it (timeout): resume from the last resourceVersion.
    Closed,
    /// 410 Gone (history compacted): LIST again at once.
    Gone,
    /// Another error or a broken connection: LIST again after a pause.
    Relist,
    Shutdown,
}

/// Keeps `store` in step with the API server until `shutdown` (LIST, then WATCH).
pub async fn feed(
    client: kube::Client,
    store: &Store,
    notify: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &store.resource);
    let (mut lp, mut wp) = (ListParams::default(), WatchParams::default().timeout(290));
    if let Some(sel) = &store.selector {
        lp = lp.labels(sel);
        wp = wp.labels(sel);
    }
    let kind = store.resource.plural.clone();
    let pause = |secs| {
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                _ = shutdown.cancelled() => false,
                _ = tokio::time::sleep(Duration::from_secs(secs)) => true,
            }
        }
    };
    loop {
        let mut rv = match api.list(&lp).await {
            Ok(l) => {
                let rv = l.metadata.resource_version.unwrap_or_default();
                store.replace(l.items.into_iter().filter_map(to_value).collect(), &rv);
                rv
            }
            Err(kube::Error::Api(s)) if store.optional && s.code == 404 => {
                // The cluster does not serve this kind (yet): none, look again later.
                store.replace(Vec::new(), "");
                notify.notify_one();
                if !pause(60).await {
                    return;
                }
                continue;
            }
            Err(e) => {
                tracing::debug!(error = %e, %kind, "list for cache");
                if !pause(2).await {
                    return;
                }
                continue;
            }
        };
        notify.notify_one();
        loop {
            match watch_once(&api, &wp, &mut rv, store, &notify, &shutdown).await {
                WatchEnd::Closed => continue,
                WatchEnd::Gone => break,
                WatchEnd::Relist => {
                    if !pause(1).await {
                        return;
                    }
                    break;
                }
                WatchEnd::Shutdown => return,
            }
        }
    }
}

async fn watch_once(
    api: &Api<DynamicObject>,
    wp: &WatchParams,
    rv: &mut String,
    store: &Store,
    notify: &Notify,
    shutdown: &CancellationToken,
) -> WatchEnd {
    let stream = match api.watch(wp, rv).await {
        Ok(s) => s,
        // A server may refuse a too-old resourceVersion on the request itself rather
        // than in the stream: LIST again at once, as for the in-stream 410.
        Err(kube::Error::Api(s)) if s.code == 410 => return WatchEnd::Gone,
        Err(e) => {
            tracing::debug!(error = %e, kind = %store.resource.plural, "watch");
            return WatchEnd::Relist;
        }
    };
    futures::pin_mut!(stream);
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return WatchEnd::Shutdown,
            n = stream.next() => n,
        };
        match next {
            Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                if let Some(v) = to_value(o) {
                    *rv = rv_of(&v).to_string();
                    store.upsert(v);
                    notify.notify_one();
                }
            }
            Some(Ok(WatchEvent::Deleted(o))) => {
                if let Some(v) = to_value(o) {
                    *rv = rv_of(&v).to_string();
                    store.remove(&key_of(&v));
                    notify.notify_one();
                }
            }
            Some(Ok(WatchEvent::Bookmark(b))) => *rv = b.metadata.resource_version,
            Some(Ok(WatchEvent::Error(e))) => {
                tracing::debug!(code = e.code, message = %e.message, kind = %store.resource.plural,
                                "watch error; listing again");
                return if e.code == 410 {
                    WatchEnd::Gone
                } else {
                    WatchEnd::Relist
                };
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, kind = %store.resource.plural, "watch stream");
                return WatchEnd::Relist;
            }
            None => return WatchEnd::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(ns: &str, name: &str, rv: &str, x: i64) -> Value {
        json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}, "x": x})
    }

    fn store() -> Store {
        Store::new(ApiResource::erase::<Pod>(&()), None, false)
    }

    #[test]
    fn upserts_never_go_back_to_an_older_version() {
        let s = store();
        let cases = [
            // (rv, x, expected x after)
            ("5", 1, 1),
            ("7", 2, 2),
            ("6", 3, 2), // a late watch event after a write-through: ignored
            ("7", 4, 2), // the same version again (its watch echo): nothing changes
            ("8", 4, 4),
            ("opaque", 5, 5),
        ];
        for (rv, x, want) in cases {
            s.upsert(obj("team", "a", rv, x));
            assert_eq!(
                s.get(&("team".into(), "a".into())).unwrap()["x"],
                want,
                "rv {rv}"
            );
        }
    }

    #[test]
    fn a_list_replaces_but_keeps_own_newer_writes() {
        let s = store();
        s.upsert(obj("team", "written", "20", 1));
        s.upsert(obj("team", "gone", "3", 1));
        s.upsert(obj("team", "created-after", "21", 1));
        assert!(!s.synced());
        s.replace(
            vec![obj("team", "written", "9", 0), obj("team", "new", "8", 0)],
            "10",
        );
        assert!(s.synced());
        let names: Vec<String> = s
            .values()
            .iter()
            .map(|v| format!("{}={}", v["metadata"]["name"].as_str().unwrap(), v["x"]))
            .collect();
        assert_eq!(names, ["created-after=1", "new=0", "written=1"]);
    }

    #[test]
    fn removes_and_counts_changes() {
        let s = store();
        let g0 = s.generation();
        s.upsert(obj("", "a", "1", 1));
        s.upsert(obj("", "a", "1", 1));
        s.remove(&("".into(), "a".into()));
        s.remove(&("".into(), "a".into()));
        assert_eq!(s.generation(), g0 + 2);
        assert!(s.is_empty());
    }

    #[test]
    fn reports_the_keys_changed_after_a_generation() {
        let s = store();
        let k = |n: &str| ("team".to_string(), n.to_string());
        s.replace(vec![obj("team", "a", "1", 0)], "1");
        let g = s.generation();
        assert_eq!(
            s.changes_since(0),
            Changes::All,
            "a LIST after the reader's look"
        );
        assert_eq!(s.changes_since(g), Changes::Keys(vec![]));
        s.upsert(obj("team", "b", "2", 0));
        s.upsert(obj("team", "a", "3", 1));
        s.upsert(obj("team", "b", "4", 1));
        s.remove(&k("gone"));
        let Changes::Keys(mut keys) = s.changes_since(g) else {
            panic!("keys expected")
        };
        keys.sort();
        assert_eq!(keys, [k("a"), k("b")]);
        let g2 = s.generation();
        s.remove(&k("a"));
        assert_eq!(s.changes_since(g2), Changes::Keys(vec![k("a")]));
        s.replace(Vec::new(), "9");
        assert_eq!(s.changes_since(g2), Changes::All);
    }

    #[test]
    fn write_through_only_touches_stores_holding_the_object() {
        let c = Cache::new();
        c.pods[0].upsert(obj("team", "p", "1", 0));
        c.observe("Pod", &obj("team", "p", "2", 1));
        c.observe("Pod", &obj("team", "q", "3", 1));
        assert_eq!(c.pods[0].get(&("team".into(), "p".into())).unwrap()["x"], 1);
        assert!(c.pods[1].is_empty());
        assert_eq!(c.pods[0].len(), 1);
        c.forget("Pod", &("team".into(), "p".into()));
        assert!(c.pods[0].is_empty());
    }
}
