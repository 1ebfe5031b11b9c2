//! Watch-fed caches of the objects a pass reads, so a pass snapshots from memory instead
//! of LISTing the API server (one LIST per kind at start and after a watch breaks).
//!
//! One [`Store`] per (kind, label selector), keyed by namespace/name. Its feeder
//! ([`feed`]) is kube-runtime's [`watcher`]: a paginated LIST, then a WATCH from its
//! resourceVersion with bookmarks, resumed when the server closes it, a LIST again after
//! `410 Gone` (history compacted), backoff on errors. `Init` … `InitDone` replace the
//! store's contents, `Apply` upserts, `Delete` removes. On top of the watcher, the feeder
//! LISTs again at once when the server refuses a WATCH request itself with 410 (the
//! watcher alone would retry that resourceVersion forever), and reads a kind the cluster
//! does not serve (404, an optional kind) as none, looking again every minute.
//!
//! The controller's own writes are put into the stores at once ([`Cache::observe`]) so
//! the next pass reads its writes even before their watch event arrives. Resource
//! versions are opaque (never compared for order): a written object waits for its *echo*,
//! the watch event carrying the written resourceVersion, and the watch events for that
//! object before the echo (older than the write) are skipped, so the store never goes
//! back to what the write replaced. An echo that arrived before the write's answer was
//! processed is recognised from the store's recent events; an echo that never comes (the
//! watch missed it) stops being waited for after [`ECHO_WAIT`], and the object follows
//! the watch again.

use super::asked_places::AskedPlaces;
use super::resources::{crd_resource, dra_resource, QUEUE_KINDS};
use crate::quota::objects::QUEUE_LABELS;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Namespace ("" for cluster-scoped objects) and name.
pub type Key = (String, String);

/// How long a written object waits for its watch echo before it follows the watch again.
pub const ECHO_WAIT: Duration = Duration::from_secs(10);

/// How many recent watch events (key and resourceVersion) a store remembers, to tell a
/// write whose echo came before its answer was processed.
const RECENT_EVENTS: usize = 1024;

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
    /// Objects this instance wrote whose watch echo has not come yet: the written
    /// resourceVersion and when it was written.
    awaiting_echo: HashMap<Key, (String, Instant)>,
    /// The last [`RECENT_EVENTS`] watch events' keys and resourceVersions, in order,
    /// and the same by key (a write looks its echo up without a walk over them all).
    recent: VecDeque<(Key, String)>,
    recent_by_key: HashMap<Key, Vec<String>>,
}

impl Inner {
    fn record(&mut self, k: Key) {
        let g = self.generation;
        if let Some(old) = self.changed.insert(k.clone(), g) {
            self.log.remove(&old);
        }
        self.log.insert(g, k);
    }

    fn set(&mut self, k: Key, v: Value) {
        self.objects.insert(k.clone(), v);
        self.generation += 1;
        self.record(k);
    }

    fn remember(&mut self, k: &Key, rv: &str) {
        if self.recent.len() == RECENT_EVENTS {
            if let Some((old_k, old_rv)) = self.recent.pop_front() {
                if let Some(rvs) = self.recent_by_key.get_mut(&old_k) {
                    if let Some(i) = rvs.iter().position(|r| *r == old_rv) {
                        rvs.remove(i);
                    }
                    if rvs.is_empty() {
                        self.recent_by_key.remove(&old_k);
                    }
                }
            }
        }
        self.recent.push_back((k.clone(), rv.to_string()));
        self.recent_by_key
            .entry(k.clone())
            .or_default()
            .push(rv.to_string());
    }

    /// Whether a recent watch event brought `k` at `rv`.
    fn seen_recently(&self, k: &Key, rv: &str) -> bool {
        self.recent_by_key
            .get(k)
            .is_some_and(|rvs| rvs.iter().any(|r| r == rv))
    }

    /// Whether the watch event (`k`, `rv`) is to be skipped because it comes before the
    /// echo of this instance's write; the echo itself ends the wait.
    fn before_echo(&mut self, k: &Key, rv: &str, now: Instant) -> bool {
        let Some((written, at)) = self.awaiting_echo.get(k) else {
            return false;
        };
        let echo = written == rv;
        if echo || now.duration_since(*at) >= ECHO_WAIT {
            self.awaiting_echo.remove(k);
            return echo;
        }
        true
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

    /// Replaces the contents with a LIST. An object this instance wrote whose echo has
    /// not come keeps the written version (the LIST may predate the write; its echo then
    /// follows on the WATCH from the LIST).
    pub fn replace(&self, items: Vec<Value>) {
        let mut inner = self.write();
        let mut objects: BTreeMap<Key, Value> =
            items.into_iter().map(|v| (key_of(&v), v)).collect();
        let awaiting: Vec<Key> = inner.awaiting_echo.keys().cloned().collect();
        for k in awaiting {
            match (objects.get(&k), inner.objects.get(&k)) {
                (Some(listed), Some(written)) if rv_of(listed) != rv_of(written) => {
                    objects.insert(k, written.clone());
                }
                _ => {
                    inner.awaiting_echo.remove(&k);
                }
            }
        }
        inner.objects = objects;
        inner.synced = true;
        inner.generation += 1;
        inner.replaced_at = inner.generation;
        inner.changed.clear();
        inner.log.clear();
    }

    /// An object added or changed, from the watch.
    pub fn upsert(&self, v: Value) {
        self.upsert_at(v, Instant::now());
    }

    fn upsert_at(&self, v: Value, now: Instant) {
        let mut inner = self.write();
        let k = key_of(&v);
        let rv = rv_of(&v).to_string();
        inner.remember(&k, &rv);
        if inner.before_echo(&k, &rv, now) {
            return;
        }
        if inner
            .objects
            .get(&k)
            .is_some_and(|old| !rv.is_empty() && rv_of(old) == rv)
        {
            return;
        }
        inner.set(k, v);
    }

    /// An object this instance just wrote (the API server's answer): stored at once, and
    /// the watch events before its echo are skipped.
    pub fn write_through(&self, v: Value) {
        self.write_through_at(v, Instant::now());
    }

    fn write_through_at(&self, v: Value, now: Instant) {
        let mut inner = self.write();
        let k = key_of(&v);
        let rv = rv_of(&v).to_string();
        let echoed = !rv.is_empty() && inner.seen_recently(&k, &rv);
        let same = inner.objects.get(&k).is_some_and(|old| rv_of(old) == rv);
        if echoed || same {
            // The watch already brought this version (and maybe later ones).
            return;
        }
        if !rv.is_empty() {
            inner.awaiting_echo.insert(k.clone(), (rv, now));
        }
        inner.set(k, v);
    }

    /// Writes through only when the object is already cached (the write did not change
    /// what the selector matches).
    fn update_if_present(&self, v: &Value) {
        let present = self.read().objects.contains_key(&key_of(v));
        if present {
            self.write_through(v.clone());
        }
    }

    /// An object deleted (from the watch, or found gone by this instance).
    pub fn remove(&self, key: &Key) {
        let mut inner = self.write();
        inner.awaiting_echo.remove(key);
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

    /// `f` of the object with `key`, without copying it.
    pub fn read_with<T>(&self, key: &Key, f: impl FnOnce(&Value) -> T) -> Option<T> {
        self.read().objects.get(key).map(f)
    }

    /// The objects of namespace `ns`, in name order (a range of the store, not a scan).
    pub fn in_namespace(&self, ns: &str) -> Vec<Value> {
        let inner = self.read();
        let from = (ns.to_string(), String::new());
        inner
            .objects
            .range(from..)
            .take_while(|((n, _), _)| n == ns)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Whether any object of namespace `ns` is cached (a range of the store, not a scan).
    pub fn any_in_namespace(&self, ns: &str) -> bool {
        let from = (ns.to_string(), String::new());
        self.read()
            .objects
            .range(from..)
            .next()
            .is_some_and(|((n, _), _)| n == ns)
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
    /// The controller's own `Workload` records ([`super::workload_record`]): what it
    /// wrote, so an unchanged record is not written again, and the requeue state of pod
    /// groups and lone pods ([`super::requeue_state`]), which a pass reads. Not in
    /// [`Cache::stores`]: a record changing wakes no pass (a requeue state matters only
    /// with `waitForPodsReady`, whose passes are timed).
    pub records: Store,
    /// The places asked of records in writes not yet answered: a pass reads a record's
    /// place through them ([`super::deferred_records`]).
    pub asked_places: AskedPlaces,
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
            records: Store::new(crd_resource("Workload", "workloads"), None, true),
            asked_places: AskedPlaces::default(),
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
        ]);
        out
    }

    /// Whether every store, the records' included, has completed its first LIST (a
    /// restarted controller decides only once it has read the requeue states back).
    pub fn synced(&self) -> bool {
        self.fed_stores().iter().all(|s| s.synced())
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

    /// The cached copy of the `kind` object `key`, if a store of that kind holds it
    /// (what a write starts from instead of a GET: its resourceVersion makes a stale copy
    /// fail with 409).
    pub fn object(&self, kind: &str, key: &Key) -> Option<Value> {
        self.stores()
            .into_iter()
            .filter(|s| s.resource.kind == kind)
            .find_map(|s| s.get(key))
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

/// Why a feeder starts a new watcher.
enum Restart {
    /// At once (a fresh LIST).
    Now,
    /// After a pause (a kind the cluster does not serve).
    After(Duration),
}

/// Keeps `store` in step with the API server until `shutdown`.
pub async fn feed(
    client: kube::Client,
    store: &Store,
    notify: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::all_with(client, &store.resource);
    let mut config = watcher::Config::default().timeout(290);
    if let Some(sel) = &store.selector {
        config = config.labels(sel);
    }
    loop {
        let restart = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = follow(watcher(api.clone(), config.clone()), store, &notify) => r,
        };
        if let Restart::After(pause) = restart {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Applies one watcher's events to `store` until it has to be replaced.
async fn follow(
    events: impl futures::Stream<Item = watcher::Result<Event<DynamicObject>>>,
    store: &Store,
    notify: &Notify,
) -> Restart {
    let kind = &store.resource.plural;
    let events = events.default_backoff();
    futures::pin_mut!(events);
    let mut listed: Vec<Value> = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(o)) => listed.extend(to_value(o)),
            Ok(Event::InitDone) => {
                store.replace(std::mem::take(&mut listed));
                notify.notify_one();
            }
            Ok(Event::Apply(o)) => {
                if let Some(v) = to_value(o) {
                    store.upsert(v);
                    notify.notify_one();
                }
            }
            Ok(Event::Delete(o)) => {
                if let Some(v) = to_value(o) {
                    store.remove(&key_of(&v));
                    notify.notify_one();
                }
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s)))
                if store.optional && s.code == 404 =>
            {
                // The cluster does not serve this kind (yet): none, look again later.
                store.replace(Vec::new());
                notify.notify_one();
                return Restart::After(Duration::from_secs(60));
            }
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) if s.code == 410 => {
                tracing::debug!(%kind, "watch refused as too old; listing again");
                return Restart::Now;
            }
            // The watcher retries (with backoff), re-LISTing where it must.
            Err(e) => tracing::debug!(error = %e, %kind, "cache watch"),
        }
    }
    Restart::Now
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

    fn x_of(s: &Store, name: &str) -> Value {
        s.get(&("team".into(), name.into())).unwrap()["x"].clone()
    }

    /// Resource versions are opaque: none of these is compared for order.
    #[test]
    fn a_write_skips_the_watch_events_before_its_echo() {
        let s = store();
        let t = Instant::now();
        s.upsert_at(obj("team", "a", "k", 1), t);
        s.write_through_at(obj("team", "a", "m", 2), t);
        let g = s.generation();
        // A watch event from before the write (another client's change it replaced).
        s.upsert_at(obj("team", "a", "c", 3), t);
        assert_eq!(x_of(&s, "a"), 2, "not back to what the write replaced");
        // The echo: nothing changes, and the object follows the watch again.
        s.upsert_at(obj("team", "a", "m", 2), t);
        assert_eq!(s.generation(), g);
        s.upsert_at(obj("team", "a", "b", 4), t);
        assert_eq!(x_of(&s, "a"), 4);
        // The same version again changes nothing.
        s.upsert_at(obj("team", "a", "b", 4), t);
        assert_eq!(s.generation(), g + 1);
    }

    #[test]
    fn a_write_whose_echo_came_first_changes_nothing() {
        let s = store();
        let t = Instant::now();
        s.upsert_at(obj("team", "a", "k", 1), t);
        // The echo of the write, then another client's change, both before the answer.
        s.upsert_at(obj("team", "a", "m", 2), t);
        s.upsert_at(obj("team", "a", "c", 3), t);
        s.write_through_at(obj("team", "a", "m", 2), t);
        assert_eq!(x_of(&s, "a"), 3, "the later change stays");
        s.upsert_at(obj("team", "a", "d", 4), t);
        assert_eq!(x_of(&s, "a"), 4, "and the watch is followed");
    }

    #[test]
    fn an_echo_is_recognised_only_among_the_recent_events() {
        let s = store();
        let t = Instant::now();
        s.upsert_at(obj("team", "a", "m", 2), t);
        // RECENT_EVENTS later events of other objects: the echo is forgotten, so a write
        // answered with that version is stored (it waits for an echo that passed).
        for i in 0..RECENT_EVENTS {
            s.upsert_at(obj("team", &format!("o{i}"), "r", 0), t);
        }
        s.upsert_at(obj("team", "a", "c", 3), t);
        s.write_through_at(obj("team", "a", "m", 2), t);
        assert_eq!(x_of(&s, "a"), 2, "a forgotten echo does not count");
        // One still remembered does: the later change stays.
        s.upsert_at(obj("team", "b", "m", 2), t);
        s.upsert_at(obj("team", "b", "c", 3), t);
        s.write_through_at(obj("team", "b", "m", 2), t);
        assert_eq!(x_of(&s, "b"), 3);
        let inner = s.read();
        assert_eq!(inner.recent.len(), RECENT_EVENTS);
        let indexed: usize = inner.recent_by_key.values().map(Vec::len).sum();
        assert_eq!(indexed, RECENT_EVENTS, "the index forgets with the list");
    }

    #[test]
    fn an_echo_that_never_comes_is_waited_for_a_while_only() {
        let s = store();
        let t = Instant::now();
        s.write_through_at(obj("team", "a", "m", 1), t);
        s.upsert_at(obj("team", "a", "c", 2), t + ECHO_WAIT / 2);
        assert_eq!(x_of(&s, "a"), 1);
        s.upsert_at(obj("team", "a", "d", 3), t + ECHO_WAIT);
        assert_eq!(x_of(&s, "a"), 3);
        s.upsert_at(obj("team", "a", "e", 4), t + ECHO_WAIT);
        assert_eq!(x_of(&s, "a"), 4);
    }

    #[test]
    fn a_list_replaces_but_keeps_writes_awaiting_their_echo() {
        let s = store();
        let t = Instant::now();
        s.upsert_at(obj("team", "written", "p", 0), t);
        s.write_through_at(obj("team", "written", "q", 1), t);
        s.upsert_at(obj("team", "gone", "r", 1), t);
        s.upsert_at(obj("team", "echoed", "s", 0), t);
        s.write_through_at(obj("team", "echoed", "u", 1), t);
        s.upsert_at(obj("team", "echoed", "u", 1), t);
        assert!(!s.synced());
        // A LIST that predates the write to `written` (its echo follows on the WATCH).
        s.replace(vec![
            obj("team", "written", "p", 0),
            obj("team", "echoed", "v", 2),
            obj("team", "new", "w", 0),
        ]);
        assert!(s.synced());
        let names: Vec<String> = s
            .values()
            .iter()
            .map(|v| format!("{}={}", v["metadata"]["name"].as_str().unwrap(), v["x"]))
            .collect();
        assert_eq!(names, ["echoed=2", "new=0", "written=1"]);
        s.upsert_at(obj("team", "written", "q", 1), t);
        s.upsert_at(obj("team", "written", "x", 5), t);
        assert_eq!(x_of(&s, "written"), 5);
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
        s.replace(vec![obj("team", "a", "1", 0)]);
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
        s.replace(Vec::new());
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
