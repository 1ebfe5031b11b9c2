//! An API-server double over real HTTP/1.1 on loopback: an in-memory object store for any
//! resource path, with the behaviours clients rely on.
//!
//! Modelled: GET, LIST (counted with their bytes, [`ApiServer::list_stats`]; with `fieldSelector` equality on dotted paths, `labelSelector`
//! `k=v`, `k==v`, `k!=v`, `k` (exists) and `!k` terms), WATCH from a resourceVersion (newline-delimited `WatchEvent`s, ADDED /
//! MODIFIED / DELETED), POST (with `generateName`, 409 AlreadyExists), PUT (409 Conflict on
//! a stale `metadata.resourceVersion`), PUT of the `status` subresource (only `status` is
//! taken from the body; 409 on a stale resourceVersion), both atomic (one racing a DELETE
//! answers 404 and does not bring the object back; one racing another write, 409),
//! DELETE (404 NotFound; atomically 409 Conflict when DeleteOptions'
//! `preconditions.resourceVersion` is not the stored one), after which the garbage
//! collector's rule applies (an object all of whose `ownerReferences` UIDs are gone is
//! deleted too); one global resourceVersion
//! bumped on every write; `metadata.uid` and `creationTimestamp` set on create. Like an API
//! server whose feature gates are off, it can drop fields on write ([`ApiServer::drop_field`]),
//! so a client sees the object stored without them.
//! The Eviction subresource (`POST …/pods/<name>/eviction`) starts a graceful delete and
//! is recorded ([`ApiServer::evictions`]); for pods named in
//! [`ApiServer::block_evictions`] it answers 429 TooManyRequests, as when a
//! PodDisruptionBudget allows no disruption. [`ApiServer::compact`] ends open watches
//! with `410 Gone`, as an etcd compaction does.
//! [`ApiServer::fail_requests`] makes chosen requests fail with `500 InternalError` (a
//! driver's writes, a cluster-wide LIST) until [`ApiServer::stop_failing`], and
//! [`ApiServer::crash_after_writes`] every request after the next N writes (a client
//! killed mid-way);
//! [`ApiServer::before_next_write`] lets another client write just before a POST/PUT/DELETE.
//! PATCH is a JSON merge patch (RFC 7386, also for strategic merge patches of maps);
//! the Binding subresource (`POST …/pods/<name>/binding`) sets `spec.nodeName` once
//! ([`ApiServer::bindings`]); the Scale subresource (`GET`/`PATCH …/<name>/scale`) of
//! Deployments, StatefulSets and ReplicaSets (404 for other kinds) and of kinds served
//! with it ([`ApiServer::serve_kind`]); discovery (`GET /api/v1`, `/apis/<g>/<v>`:
//! `APIResourceList` with each kind's plural and subresources). A PATCH of
//! `…/<name>/status` takes only `status`; a PUT or PATCH of the main resource leaves
//! `status` as stored. LIST with `limit` answers in pages of one snapshot (`continue`,
//! `remainingItemCount`; `410 Expired` for a token compacted away); a WATCH ends after
//! its `timeoutSeconds`, and with `allowWatchBookmarks=true` gets BOOKMARKs when a test
//! asks for them ([`ApiServer::send_bookmarks_every`]). A field selector on a label the
//! resource does not register is `400 BadRequest` ("field label not supported"); a POST
//! with a name that is not a DNS subdomain is `422 Invalid`. Each POST gets a distinct
//! `creationTimestamp` (one second after the previous; the real one has one-second
//! resolution too). [`ApiServer::delay_requests`] answers every request but a WATCH a
//! fixed time late, as a server across a network is (the round trip a client waits).
//! Not modelled: authentication, admission, field managers / server-side apply.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

#[derive(Default)]
struct Store {
    /// Collection path (e.g. `/apis/resource.k8s.io/v1/resourceslices`) → name → object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    resource_version: u64,
    generated: u64,
    /// Dotted paths (`spec.devices.*.consumesCounters`) removed from objects on write.
    dropped: Vec<String>,
    /// Requests seen: (method, path).
    log: Vec<(String, String)>,
    /// Every change, for watches that start from an older resourceVersion.
    history: Vec<Change>,
    /// Writes another client makes just before the next `status` PUTs (one per PUT).
    before_status_put: Vec<StatusHook>,
    /// Bodies of `POST …/pods/<name>/eviction` requests, in order.
    evictions: Vec<Value>,
    /// Bodies of the Bindings created (`POST …/pods/<name>/binding`), in order.
    bindings: Vec<Value>,
    /// Cluster-wide LIST/WATCH of a namespaced resource (`/api/v1/pods`) also returns
    /// the objects of every namespace (off by default).
    across_namespaces: bool,
    /// Pods (by name) whose eviction a PodDisruptionBudget refuses (429).
    eviction_blocked: std::collections::BTreeSet<String>,
    /// LIST requests answered and the bytes of their bodies.
    lists: u64,
    list_bytes: u64,
    /// History before this resourceVersion is compacted ([`ApiServer::compact`]).
    compacted: u64,
    /// Writes another client makes right after the next LIST of a collection was read
    /// (collection path → hook, [`ApiServer::after_next_list`]).
    after_list: Vec<(String, ListHook)>,
    /// Requests answered `500` ([`ApiServer::fail_requests`]): methods and path prefix.
    failing: Vec<(Vec<String>, String)>,
    /// Writes still answered before every request fails ([`ApiServer::crash_after_writes`]).
    writes_left: Option<usize>,
    /// Requests refused since the crash.
    refused_after_crash: usize,
    /// Writes another client makes just before the next POST/PUT to a collection
    /// (method, collection path, hook; [`ApiServer::before_next_write`]).
    before_write: Vec<(String, String, ListHook)>,
    /// Objects created by POST so far: each gets a creationTimestamp one second after
    /// the last (the real server stamps the current time, at one-second resolution).
    created: u64,
    /// LIST pages still to serve: continue token → (the snapshot's resourceVersion, the
    /// items after the page served).
    continues: BTreeMap<String, (u64, Vec<Value>)>,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    bookmark_every: Option<std::time::Duration>,
    /// A WATCH from a compacted resourceVersion is refused with an HTTP 410 on the
    /// request instead of an `ERROR` event in a 200 stream (some servers and proxies do).
    refuse_old_watch_requests: bool,
    /// Kinds served beyond the built-in ones ([`ApiServer::serve_kind`]): group version
    /// → (plural, kind, has `/scale`).
    extra_kinds: BTreeMap<String, Vec<(String, String, bool)>>,
    /// How late every request but a WATCH is answered ([`ApiServer::delay_requests`]).
    delay: Option<std::time::Duration>,
    /// Requests other than WATCHes being answered now, and the most at once.
    in_flight: usize,
    max_in_flight: usize,
}

/// Counts a request in flight while it lives.
struct InFlight(Arc<Mutex<Store>>);

impl InFlight {
    fn start(store: &Arc<Mutex<Store>>) -> InFlight {
        let mut st = store.lock().unwrap();
        st.in_flight += 1;
        st.max_in_flight = st.max_in_flight.max(st.in_flight);
        InFlight(store.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.lock() {
            st.in_flight -= 1;
        }
    }
}

type StatusHook = Box<dyn FnOnce(&mut Value) + Send>;
type ListHook = Box<dyn FnOnce(&ApiServer) + Send>;

#[derive(Clone, Debug)]
struct Change {
    collection: String,
    kind: &'static str,
    object: Value,
}

/// Handle to the running double.
#[derive(Clone)]
pub struct ApiServer {
    pub url: String,
    store: Arc<Mutex<Store>>,
    changes: broadcast::Sender<Change>,
}

impl ApiServer {
    /// An empty store.
    pub async fn empty() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (changes, _) = broadcast::channel(1024);
        let server = ApiServer {
            url,
            store: Arc::new(Mutex::new(Store {
                resource_version: 1,
                ..Default::default()
            })),
            changes,
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        server
    }

    /// A store holding one Node.
    pub async fn start(node_name: &str) -> ApiServer {
        let s = Self::empty().await;
        s.put_object(
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name, "labels": {}}}),
        );
        s
    }

    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Drop a dotted field path (`*` matches every list element) from every written object.
    pub fn drop_field(&self, path: &str) {
        self.store.lock().unwrap().dropped.push(path.to_string());
    }

    /// Just before the next PUT of an object's `status`, another client changes the stored
    /// object with `change` (bumping its resourceVersion), so that PUT conflicts.
    pub fn before_next_status_put(&self, change: impl FnOnce(&mut Value) + Send + 'static) {
        self.store
            .lock()
            .unwrap()
            .before_status_put
            .push(Box::new(change));
    }

    /// Right after the next LIST of `collection` (e.g. the cluster-wide
    /// `/apis/resource.k8s.io/v1/resourceclaims`) has read the store, and before its answer
    /// is sent, `change` runs (as another client writing at that instant): the lister
    /// never sees the change in that answer, and anything it does after reading the
    /// answer happens after the change. One hook per LIST, in order.
    pub fn after_next_list(
        &self,
        collection: &str,
        change: impl FnOnce(&ApiServer) + Send + 'static,
    ) {
        self.store
            .lock()
            .unwrap()
            .after_list
            .push((collection.to_string(), Box::new(change)));
    }

    /// Just before the next `method` (`POST`, `PUT` or `DELETE`) to an object of
    /// `collection` (e.g. `/api/v1/namespaces/team/configmaps`) is handled, `change` runs
    /// (as another client writing at that instant): a PUT or a DELETE carrying the
    /// resourceVersion read before (as its precondition) gets 409 Conflict, a POST of an
    /// object `change` created gets 409 AlreadyExists.
    /// One hook per write, in order.
    pub fn before_next_write(
        &self,
        method: &str,
        collection: &str,
        change: impl FnOnce(&ApiServer) + Send + 'static,
    ) {
        self.store.lock().unwrap().before_write.push((
            method.to_string(),
            collection.to_string(),
            Box::new(change),
        ));
    }

    /// From now on, requests with one of `methods` whose path (without the query) starts
    /// with `path_prefix` are answered `500 InternalError` and change nothing (counted in
    /// [`Self::requests`]), until [`Self::stop_failing`].
    pub fn fail_requests(&self, methods: &[&str], path_prefix: &str) {
        self.store.lock().unwrap().failing.push((
            methods.iter().map(|m| m.to_string()).collect(),
            path_prefix.to_string(),
        ));
    }

    /// The client dies after `n` more writes (POST, PUT, PATCH, DELETE): from then on
    /// every request over HTTP fails with `500` and changes nothing, as if its process
    /// were gone mid-way, until [`Self::stop_failing`].
    pub fn crash_after_writes(&self, n: usize) {
        self.store.lock().unwrap().writes_left = Some(n);
    }

    /// Whether a request came after the client's [`Self::crash_after_writes`] ran out
    /// (it would have done more).
    pub fn crashed(&self) -> bool {
        self.store.lock().unwrap().refused_after_crash > 0
    }

    /// From now on every request but a WATCH is answered `delay` late (a round trip
    /// to a server across a network; the requests of concurrent clients overlap).
    pub fn delay_requests(&self, delay: std::time::Duration) {
        self.store.lock().unwrap().delay = Some(delay);
    }

    /// The most requests (WATCHes aside) answered at once so far, and forgets it.
    pub fn take_max_in_flight(&self) -> usize {
        let mut st = self.store.lock().unwrap();
        let now = st.in_flight;
        std::mem::replace(&mut st.max_in_flight, now)
    }

    /// Ends every [`Self::fail_requests`] and [`Self::crash_after_writes`].
    pub fn stop_failing(&self) {
        let mut st = self.store.lock().unwrap();
        st.failing.clear();
        st.writes_left = None;
        st.refused_after_crash = 0;
    }

    /// Create or replace an object directly (as another client would).
    pub fn put_object(&self, collection: &str, object: Value) {
        let mut st = self.store.lock().unwrap();
        let change = Self::store_locked(&mut st, collection, object);
        drop(st);
        let _ = self.changes.send(change);
    }

    /// Replaces `object` only if the stored one still has resourceVersion `read_rv` (what
    /// the writer read): the API server's update is atomic, so a write racing a delete
    /// or another write fails (404 / 409) instead of bringing the object back.
    fn replace_object(
        &self,
        collection: &str,
        object: Value,
        read_rv: &Value,
    ) -> Result<(), StatusCode> {
        let mut st = self.store.lock().unwrap();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let current = st.objects.get(collection).and_then(|m| m.get(&name));
        match current {
            None => return Err(StatusCode::NOT_FOUND),
            Some(c) if &c["metadata"]["resourceVersion"] != read_rv => {
                return Err(StatusCode::CONFLICT)
            }
            Some(_) => {}
        }
        let change = Self::store_locked(&mut st, collection, object);
        drop(st);
        let _ = self.changes.send(change);
        Ok(())
    }

    fn store_locked(st: &mut Store, collection: &str, mut object: Value) -> Change {
        st.resource_version += 1;
        let rv = st.resource_version.to_string();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        object["metadata"]["resourceVersion"] = json!(rv);
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        let existed = st
            .objects
            .entry(collection.to_string())
            .or_default()
            .insert(name, object.clone())
            .is_some();
        let change = Change {
            collection: collection.to_string(),
            kind: if existed { "MODIFIED" } else { "ADDED" },
            object,
        };
        st.history.push(change.clone());
        change
    }

    /// Delete an object directly (as another client — or a restarting kubelet — would).
    pub fn delete_object(&self, collection: &str, name: &str) -> bool {
        self.delete_if(collection, name, None).is_ok()
    }

    /// The garbage collector's rule: an object whose `ownerReferences` name only owners
    /// that no longer exist (by UID) is deleted, and so on down the chain. An object
    /// without owner references is never collected.
    fn collect_garbage(&self) {
        let orphan = {
            let st = self.store.lock().unwrap();
            let uids: std::collections::BTreeSet<&str> = st
                .objects
                .values()
                .flat_map(|m| m.values())
                .filter_map(|o| o["metadata"]["uid"].as_str())
                .collect();
            st.objects.iter().find_map(|(collection, m)| {
                m.iter().find_map(|(name, o)| {
                    let owners = o["metadata"]["ownerReferences"].as_array()?;
                    let gone = !owners.is_empty()
                        && owners
                            .iter()
                            .all(|r| !r["uid"].as_str().is_some_and(|u| uids.contains(u)));
                    gone.then(|| (collection.clone(), name.clone()))
                })
            })
        };
        if let Some((collection, name)) = orphan {
            // Deleting it collects the next one.
            let _ = self.delete_if(&collection, &name, None);
        }
    }

    /// DELETE as the API server does it, atomically: 404 when absent, 409 when the
    /// precondition's resourceVersion is not the stored one.
    fn delete_if(
        &self,
        collection: &str,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> Result<(), StatusCode> {
        let mut st = self.store.lock().unwrap();
        let current = st.objects.get(collection).and_then(|m| m.get(name));
        match (current, precondition_rv) {
            (None, _) => return Err(StatusCode::NOT_FOUND),
            (Some(c), Some(rv)) if c["metadata"]["resourceVersion"] != rv => {
                return Err(StatusCode::CONFLICT)
            }
            _ => {}
        }
        st.resource_version += 1;
        let rv = st.resource_version.to_string();
        let removed = st.objects.get_mut(collection).and_then(|m| m.remove(name));
        match removed {
            Some(mut object) => {
                object["metadata"]["resourceVersion"] = json!(rv);
                let change = Change {
                    collection: collection.to_string(),
                    kind: "DELETED",
                    object,
                };
                st.history.push(change.clone());
                drop(st);
                let _ = self.changes.send(change);
                self.collect_garbage();
                Ok(())
            }
            None => Err(StatusCode::NOT_FOUND),
        }
    }

    /// Object `name` of `collection` as stored (a copy), without copying the others.
    pub fn object(&self, collection: &str, name: &str) -> Option<Value> {
        let st = self.store.lock().unwrap();
        st.objects.get(collection)?.get(name).cloned()
    }

    /// How many objects of `collection` `f` holds for, read in place (no copies).
    pub fn count(&self, collection: &str, f: impl Fn(&Value) -> bool) -> usize {
        let st = self.store.lock().unwrap();
        st.objects
            .get(collection)
            .map_or(0, |m| m.values().filter(|o| f(o)).count())
    }

    pub fn objects(&self, collection: &str) -> Vec<Value> {
        let st = self.store.lock().unwrap();
        st.objects
            .get(collection)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every request seen, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        let st = self.store.lock().unwrap();
        st.log.iter().map(|(m, p)| format!("{m} {p}")).collect()
    }

    /// Compacts the change history, as etcd does: every open watch receives an `ERROR`
    /// event with a `410 Gone` Status and ends, and a watch from an older
    /// resourceVersion is answered the same way (the client must LIST again).
    ///
    /// With [`ApiServer::refuse_old_watch_requests`], open watches end without an event
    /// instead (as a server timeout ends them), so the clients' next WATCH, from a
    /// compacted resourceVersion, is the request refused with 410.
    pub fn compact(&self) {
        let mut st = self.store.lock().unwrap();
        st.compacted = st.resource_version;
        st.history.clear();
        let kind = match st.refuse_old_watch_requests {
            true => "CLOSE",
            false => "ERROR",
        };
        drop(st);
        let _ = self.changes.send(Change {
            collection: String::new(),
            kind,
            object: gone(),
        });
    }

    /// LIST requests answered so far and the bytes of their response bodies.
    pub fn list_stats(&self) -> (u64, u64) {
        let st = self.store.lock().unwrap();
        (st.lists, st.list_bytes)
    }

    /// Number of write requests (POST/PUT/DELETE) seen so far.
    pub fn writes(&self) -> usize {
        let st = self.store.lock().unwrap();
        st.log.iter().filter(|(m, _)| m != "GET").count()
    }

    /// Set (or with None remove) a label on the (only) node.
    pub fn set_label(&self, key: &str, value: Option<&str>) {
        let mut node = self.objects("/api/v1/nodes").remove(0);
        match value {
            Some(v) => node["metadata"]["labels"][key] = json!(v),
            None => {
                if let Some(l) = node["metadata"]["labels"].as_object_mut() {
                    l.remove(key);
                }
            }
        }
        self.put_object("/api/v1/nodes", node);
    }

    /// Events created in namespace `default`.
    pub fn events(&self) -> Vec<Value> {
        self.objects("/apis/events.k8s.io/v1/namespaces/default/events")
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
        let method = req.method().clone();
        let path = req.uri().path().trim_end_matches('/').to_string();
        let query = parse_query(req.uri().query().unwrap_or(""));
        let watch = query.get("watch").is_some_and(|w| w == "true");
        let _counted = (!watch).then(|| InFlight::start(&self.store));
        let delay = self.store.lock().unwrap().delay;
        if let (Some(d), false) = (delay, watch) {
            tokio::time::sleep(d).await;
        }
        let fails = {
            let mut st = self.store.lock().unwrap();
            st.log.push((
                method.to_string(),
                format!("{path}?{}", req.uri().query().unwrap_or("")),
            ));
            let write = method != Method::GET;
            let crashed = match st.writes_left.as_mut() {
                Some(0) => {
                    st.refused_after_crash += 1;
                    true
                }
                Some(n) if write => {
                    *n -= 1;
                    false
                }
                _ => false,
            };
            crashed
                || st
                    .failing
                    .iter()
                    .any(|(m, p)| m.iter().any(|m| m == method.as_str()) && path.starts_with(p))
        };
        if fails {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "injected failure (ApiServer::fail_requests)",
            );
        }
        if method == Method::GET {
            if let Some(list) = self.discovery(&path) {
                return json_response(StatusCode::OK, list);
            }
        }
        // `/…/<collection>` or `/…/<collection>/<name>`: collections end in a plural.
        let (collection, name) = split_path(&path);
        if matches!(method, Method::POST | Method::PUT | Method::DELETE)
            && !path.ends_with("/status")
        {
            let hook = {
                let mut st = self.store.lock().unwrap();
                st.before_write
                    .iter()
                    .position(|(m, c, _)| m == method.as_str() && *c == collection)
                    .map(|i| st.before_write.remove(i).2)
            };
            if let Some(change) = hook {
                change(self);
            }
        }
        if path.ends_with("/scale") {
            if let Some(name) = &name {
                return self.scale(method, &collection, name, req).await;
            }
        }
        if method == Method::PUT && path.ends_with("/status") {
            if let Some(name) = &name {
                return self.put_status(&collection, name, req).await;
            }
        }
        match (method, name) {
            (Method::GET, Some(name)) => match self.get(&collection, &name) {
                Some(o) => json_response(StatusCode::OK, o),
                None => not_found(&name),
            },
            (Method::GET, None) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                self.watch(collection, query)
            }
            (Method::GET, None) => {
                if let Err(field) = supported_fields(&collection, &query) {
                    return status(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        &format!("field label not supported: {field}"),
                    );
                }
                if let Some(token) = query.get("continue").filter(|t| !t.is_empty()) {
                    return self.next_page(token, &query);
                }
                let st = self.store.lock().unwrap();
                let items: Vec<Value> = if st.across_namespaces {
                    st.objects
                        .iter()
                        .filter(|(c, _)| in_collection(c, &collection))
                        .flat_map(|(_, m)| m.values().filter(|o| selects(o, &query)).cloned())
                        .collect()
                } else {
                    st.objects
                        .get(&collection)
                        .map(|m| m.values().filter(|o| selects(o, &query)).cloned().collect())
                        .unwrap_or_default()
                };
                let rv = st.resource_version;
                drop(st);
                let body = serde_json::to_vec(&self.page(rv, items, &query)).unwrap();
                let mut st = self.store.lock().unwrap();
                st.lists += 1;
                st.list_bytes += body.len() as u64;
                let hook = st
                    .after_list
                    .iter()
                    .position(|(c, _)| *c == collection)
                    .map(|i| st.after_list.remove(i).1);
                drop(st);
                if let Some(change) = hook {
                    change(self);
                }
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(BodyExt::boxed(Full::new(Bytes::from(body))))
                    .unwrap()
            }
            (Method::POST, None) => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
                };
                let name = match object["metadata"]["name"].as_str() {
                    Some(n) => n.to_string(),
                    None => {
                        let prefix = object["metadata"]["generateName"]
                            .as_str()
                            .unwrap_or("obj-");
                        let mut st = self.store.lock().unwrap();
                        st.generated += 1;
                        format!("{prefix}{:05}", st.generated)
                    }
                };
                if let Err(why) = valid_name(&name) {
                    return invalid(&format!("metadata.name: Invalid value: {name:?}: {why}"));
                }
                if self.get(&collection, &name).is_some() {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("{name} already exists"),
                    );
                }
                object["metadata"]["name"] = json!(name);
                object["metadata"]["uid"] = json!(format!("uid-{name}"));
                object["metadata"]["creationTimestamp"] = json!(self.next_creation());
                self.drop_configured(&mut object);
                self.put_object(&collection, object);
                self.written(StatusCode::CREATED, &collection, &name)
            }
            (Method::PUT, Some(name)) => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
                };
                let Some(current) = self.get(&collection, &name) else {
                    return not_found(&name);
                };
                let sent_rv = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
                if !sent_rv.is_empty() && sent_rv != current["metadata"]["resourceVersion"] {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified",
                    );
                }
                object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                object["metadata"]["creationTimestamp"] =
                    current["metadata"]["creationTimestamp"].clone();
                // The main resource's write leaves `status` as stored (the subresource
                // writes it).
                keep_status(&mut object, &current);
                self.drop_configured(&mut object);
                let read_rv = current["metadata"]["resourceVersion"].clone();
                if let Err(code) = self.replace_object(&collection, object, &read_rv) {
                    return lost_write(code, &name);
                }
                self.written(StatusCode::OK, &collection, &name)
            }
            (Method::DELETE, Some(name)) => {
                // DeleteOptions in the body: a resourceVersion precondition is honoured.
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let options: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let precondition = options["preconditions"]["resourceVersion"].as_str();
                let current = self.get(&collection, &name);
                match self.delete_if(&collection, &name, precondition) {
                    Ok(()) => json_response(StatusCode::OK, current.unwrap_or(Value::Null)),
                    Err(StatusCode::CONFLICT) => status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {name}: Precondition failed: ResourceVersion in precondition: {}, ResourceVersion in object meta: {}",
                            precondition.unwrap_or(""),
                            current
                                .as_ref()
                                .and_then(|c| c["metadata"]["resourceVersion"].as_str())
                                .unwrap_or("")
                        ),
                    ),
                    Err(_) => not_found(&name),
                }
            }
            (Method::POST, Some(name)) if path.ends_with("/binding") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                self.bind(&collection, &name, &body)
            }
            (Method::PATCH, Some(name)) => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
                };
                let Some(mut object) = self.get(&collection, &name) else {
                    return not_found(&name);
                };
                let read_rv = object["metadata"]["resourceVersion"].clone();
                let current = object.clone();
                if path.ends_with("/status") {
                    // The status subresource takes only `status`.
                    if let Some(st) = patch.get("status") {
                        merge_patch(&mut object["status"], st);
                    }
                } else {
                    merge_patch(&mut object, &patch);
                    keep_status(&mut object, &current);
                }
                if let Err(code) = self.replace_object(&collection, object, &read_rv) {
                    return lost_write(code, &name);
                }
                self.written(StatusCode::OK, &collection, &name)
            }
            (Method::POST, Some(name)) if path.ends_with("/eviction") => {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                self.evict(&collection, &name, &body)
            }
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "not supported by the double",
            ),
        }
    }

    /// `<object>/scale` (autoscaling/v1 Scale): GET reads `spec.replicas`,
    /// `status.replicas` and the selector of a Deployment, StatefulSet or ReplicaSet;
    /// PATCH (merge) sets `spec.replicas`. Other kinds have no such subresource: 404, as
    /// the API server answers.
    async fn scale(
        &self,
        method: Method,
        collection: &str,
        name: &str,
        req: Request<Incoming>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let extra_scalable = self
            .store
            .lock()
            .unwrap()
            .extra_kinds
            .values()
            .flatten()
            .any(|(plural, _, scale)| *scale && collection.ends_with(&format!("/{plural}")));
        let scalable = extra_scalable
            || ["/deployments", "/statefulsets", "/replicasets"]
                .iter()
                .any(|k| collection.ends_with(k));
        let Some(mut object) = self.get(collection, name).filter(|_| scalable) else {
            return not_found(name);
        };
        if method == Method::PATCH {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
            };
            let Some(replicas) = patch["spec"]["replicas"].as_i64() else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "spec.replicas: Required value",
                );
            };
            let read_rv = object["metadata"]["resourceVersion"].clone();
            object["spec"]["replicas"] = json!(replicas);
            if let Err(code) = self.replace_object(collection, object, &read_rv) {
                return lost_write(code, name);
            }
            object = self.get(collection, name).unwrap_or_default();
        } else if method != Method::GET {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "not supported by the double",
            );
        }
        let selector = object["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        json_response(
            StatusCode::OK,
            json!({
                "apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": object["metadata"]["namespace"],
                    "resourceVersion": object["metadata"]["resourceVersion"]},
                "spec": {"replicas": object["spec"]["replicas"].as_i64().unwrap_or(1)},
                "status": {"replicas": object["status"]["replicas"].as_i64().unwrap_or(0),
                    "selector": selector},
            }),
        )
    }

    /// PUT `<object>/status`: the stored object with the body's `status`.
    async fn put_status(
        &self,
        collection: &str,
        name: &str,
        req: Request<Incoming>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let Ok(sent) = serde_json::from_slice::<Value>(&body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
        };
        let hook = {
            let mut st = self.store.lock().unwrap();
            (!st.before_status_put.is_empty()).then(|| st.before_status_put.remove(0))
        };
        if let (Some(change), Some(mut current)) = (hook, self.get(collection, name)) {
            change(&mut current);
            self.put_object(collection, current);
        }
        let Some(mut object) = self.get(collection, name) else {
            return not_found(name);
        };
        let sent_rv = sent["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !sent_rv.is_empty() && sent_rv != object["metadata"]["resourceVersion"] {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                "the object has been modified",
            );
        }
        object["status"] = sent["status"].clone();
        self.drop_configured(&mut object);
        let read_rv = object["metadata"]["resourceVersion"].clone();
        if let Err(code) = self.replace_object(collection, object, &read_rv) {
            return lost_write(code, name);
        }
        self.written(StatusCode::OK, collection, name)
    }

    /// The answer to a write of `name`: the object as stored now, or 404 when another
    /// request deleted it in between (the API server serialises the two; the write lost).
    fn written(
        &self,
        code: StatusCode,
        collection: &str,
        name: &str,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        match self.get(collection, name) {
            Some(object) => json_response(code, object),
            None => not_found(name),
        }
    }

    /// The Eviction API (`policy/v1`): records the request and starts a graceful delete,
    /// as the API server does for a running pod: `metadata.deletionTimestamp` and
    /// `deletionGracePeriodSeconds` (from `deleteOptions.gracePeriodSeconds`, else the
    /// pod's `terminationGracePeriodSeconds`) are set; the pod stays until
    /// [`ApiServer::delete_object`] (the kubelet finishing). PodDisruptionBudgets are not
    /// evaluated: a test blocks a pod's eviction with [`ApiServer::block_evictions`].
    fn evict(
        &self,
        collection: &str,
        name: &str,
        body: &[u8],
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let Ok(eviction) = serde_json::from_slice::<Value>(body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
        };
        let blocked = {
            let mut st = self.store.lock().unwrap();
            st.evictions.push(eviction.clone());
            st.eviction_blocked.contains(name)
        };
        let Some(mut pod) = self.get(collection, name) else {
            return not_found(name);
        };
        if blocked {
            // What the API server answers when a PodDisruptionBudget allows no disruption.
            return json_response(
                StatusCode::TOO_MANY_REQUESTS,
                json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                       "reason": "TooManyRequests", "code": 429,
                       "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                       "details": {"causes": [{"reason": "DisruptionBudget",
                           "message": "The disruption budget pdb needs 1 healthy pods and has 1 currently"}]}}),
            );
        }
        if pod["metadata"]["deletionTimestamp"].is_null() {
            let grace = eviction["deleteOptions"]["gracePeriodSeconds"]
                .as_i64()
                .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30);
            pod["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:30Z");
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            self.put_object(collection, pod);
        }
        json_response(
            StatusCode::CREATED,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}),
        )
    }

    /// The Binding subresource (`POST …/pods/<name>/binding`, a v1 Binding): sets the
    /// pod's `spec.nodeName` to the target, atomically; 409 Conflict when the pod is
    /// already bound or the Binding's `metadata.uid` is not the pod's, as the API server.
    fn bind(
        &self,
        collection: &str,
        name: &str,
        body: &[u8],
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let Ok(binding) = serde_json::from_slice::<Value>(body) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid JSON");
        };
        let Some(target) = binding["target"]["name"].as_str().filter(|t| !t.is_empty()) else {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "target.name is required",
            );
        };
        let Some(mut pod) = self.get(collection, name) else {
            return not_found(name);
        };
        if let Some(uid) = binding["metadata"]["uid"]
            .as_str()
            .filter(|u| !u.is_empty())
        {
            if pod["metadata"]["uid"] != uid {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    &format!("Precondition failed: UID in precondition: {uid}"),
                );
            }
        }
        if let Some(bound) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                &format!("pod {name} is already assigned to node {bound:?}"),
            );
        }
        let read_rv = pod["metadata"]["resourceVersion"].clone();
        pod["spec"]["nodeName"] = json!(target);
        if let Err(code) = self.replace_object(collection, pod, &read_rv) {
            return lost_write(code, name);
        }
        self.store.lock().unwrap().bindings.push(binding);
        json_response(
            StatusCode::CREATED,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}),
        )
    }

    /// Bodies of the Bindings created so far.
    pub fn bindings(&self) -> Vec<Value> {
        self.store.lock().unwrap().bindings.clone()
    }

    /// Makes cluster-wide LIST and WATCH of namespaced resources (`/api/v1/pods`,
    /// `/apis/batch/v1/jobs`) return the objects of every namespace, as the API server
    /// does. Off by default (each collection path is its own store).
    pub fn list_across_namespaces(&self) {
        self.store.lock().unwrap().across_namespaces = true;
    }

    /// Serves `kind` (plural `plural`) in `group_version`'s discovery document, with a
    /// `/scale` subresource when `scalable` (a CRD with `subresources.scale`).
    pub fn serve_kind(&self, group_version: &str, plural: &str, kind: &str, scalable: bool) {
        self.store
            .lock()
            .unwrap()
            .extra_kinds
            .entry(group_version.to_string())
            .or_default()
            .push((plural.to_string(), kind.to_string(), scalable));
    }

    /// The discovery document (`APIResourceList`) of `/api/v1` or `/apis/<group>/<version>`:
    /// the core and `apps/v1` kinds the tests use, with the subresources the real server
    /// lists (`deployments/scale`, …), plus those of [`ApiServer::serve_kind`].
    fn discovery(&self, path: &str) -> Option<Value> {
        let seg: Vec<&str> = path.split('/').filter(|x| !x.is_empty()).collect();
        let group_version = match seg.as_slice() {
            ["api", v] => v.to_string(),
            ["apis", g, v] => format!("{g}/{v}"),
            _ => return None,
        };
        let built_in: &[(&str, &str, bool)] = match group_version.as_str() {
            "v1" => &[
                ("pods", "Pod", false),
                ("configmaps", "ConfigMap", false),
                ("namespaces", "Namespace", false),
                ("nodes", "Node", false),
            ],
            "apps/v1" => &[
                ("deployments", "Deployment", true),
                ("replicasets", "ReplicaSet", true),
                ("statefulsets", "StatefulSet", true),
                ("daemonsets", "DaemonSet", false),
            ],
            _ => &[],
        };
        let st = self.store.lock().unwrap();
        let extra = st
            .extra_kinds
            .get(&group_version)
            .cloned()
            .unwrap_or_default();
        let kinds: Vec<(String, String, bool)> = built_in
            .iter()
            .map(|(p, k, s)| (p.to_string(), k.to_string(), *s))
            .chain(extra)
            .collect();
        if kinds.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for (plural, kind, scalable) in kinds {
            let namespaced = !matches!(kind.as_str(), "Namespace" | "Node");
            resources.push(json!({"name": plural, "singularName": kind.to_lowercase(),
                "namespaced": namespaced, "kind": kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}));
            resources.push(
                json!({"name": format!("{plural}/status"), "singularName": "",
                "namespaced": namespaced, "kind": kind, "verbs": ["get", "patch", "update"]}),
            );
            if scalable {
                resources.push(
                    json!({"name": format!("{plural}/scale"), "singularName": "",
                    "namespaced": namespaced, "group": "autoscaling", "version": "v1",
                    "kind": "Scale", "verbs": ["get", "patch", "update"]}),
                );
            }
        }
        Some(json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": group_version, "resources": resources}))
    }

    /// Evictions of pod `name` are refused with 429 (a PodDisruptionBudget) while
    /// `blocked`; still recorded in [`ApiServer::evictions`].
    pub fn block_evictions(&self, name: &str, blocked: bool) {
        let mut st = self.store.lock().unwrap();
        if blocked {
            st.eviction_blocked.insert(name.to_string());
        } else {
            st.eviction_blocked.remove(name);
        }
    }

    /// Bodies of the evictions requested so far.
    pub fn evictions(&self) -> Vec<Value> {
        self.store.lock().unwrap().evictions.clone()
    }

    fn get(&self, collection: &str, name: &str) -> Option<Value> {
        let st = self.store.lock().unwrap();
        st.objects
            .get(collection)
            .and_then(|m| m.get(name))
            .cloned()
    }

    fn drop_configured(&self, object: &mut Value) {
        let dropped = self.store.lock().unwrap().dropped.clone();
        for path in dropped {
            let parts: Vec<&str> = path.split('.').collect();
            remove_path(object, &parts);
        }
    }

    /// A LIST answer over `items` as of resourceVersion `rv`: all of them, or with
    /// `limit` the first page and a `continue` token for the rest (the rest of the same
    /// snapshot, as the API server serves it; `remainingItemCount` says how many).
    fn page(&self, rv: u64, mut items: Vec<Value>, query: &BTreeMap<String, String>) -> Value {
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let mut metadata = json!({"resourceVersion": rv.to_string()});
        if let Some(limit) = limit.filter(|l| *l < items.len()) {
            let rest = items.split_off(limit);
            let mut st = self.store.lock().unwrap();
            st.generated += 1;
            let token = format!("page-{rv}-{}", st.generated);
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(rest.len());
            st.continues.insert(token, (rv, rest));
        }
        json!({"apiVersion": "v1", "kind": "List", "metadata": metadata, "items": items})
    }

    /// The page after `token`; `410 Expired` for a token not issued or compacted away.
    fn next_page(
        &self,
        token: &str,
        query: &BTreeMap<String, String>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        let entry = {
            let mut st = self.store.lock().unwrap();
            let compacted = st.compacted;
            st.continues
                .remove(token)
                .filter(|(rv, _)| *rv >= compacted)
        };
        let Some((rv, rest)) = entry else {
            return status(
                StatusCode::GONE,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            );
        };
        let body = self.page(rv, rest, query);
        let mut st = self.store.lock().unwrap();
        st.lists += 1;
        drop(st);
        json_response(StatusCode::OK, body)
    }

    /// The next POST's creationTimestamp: one second after the last.
    fn next_creation(&self) -> String {
        let mut st = self.store.lock().unwrap();
        st.created += 1;
        let t = k8s_openapi::jiff::Timestamp::from_second(1_795_910_400 + st.created as i64)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }

    /// Watches with `allowWatchBookmarks=true` get a BOOKMARK (the current
    /// resourceVersion) this often; by default they get none.
    pub fn send_bookmarks_every(&self, every: std::time::Duration) {
        self.store.lock().unwrap().bookmark_every = Some(every);
    }

    /// A WATCH from a compacted resourceVersion gets an HTTP 410 answer (no stream).
    pub fn refuse_old_watch_requests(&self) {
        self.store.lock().unwrap().refuse_old_watch_requests = true;
    }

    /// A LIST with `limit` is answered in pages (see [`ApiServer::page`]); this is what
    /// a test can read back: the continue tokens still open.
    pub fn open_continues(&self) -> usize {
        self.store.lock().unwrap().continues.len()
    }

    fn watch(
        &self,
        collection: String,
        query: BTreeMap<String, String>,
    ) -> Response<BoxBody<Bytes, Infallible>> {
        // Like the API server, a watch from resourceVersion R first replays every change
        // after R. Subscribing and copying the history under one lock means no change is
        // missed; a live change already replayed is skipped by its resourceVersion.
        let (rx, past, across, compacted, bookmark_every, refuse_old) = {
            let st = self.store.lock().unwrap();
            (
                self.changes.subscribe(),
                st.history.clone(),
                st.across_namespaces,
                st.compacted,
                st.bookmark_every,
                st.refuse_old_watch_requests,
            )
        };
        // The API server ends a watch after `timeoutSeconds` (the client watches again).
        let deadline = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(|t| tokio::time::Instant::now() + std::time::Duration::from_secs(t));
        let bookmarks = query
            .get("allowWatchBookmarks")
            .is_some_and(|b| b == "true")
            .then_some(bookmark_every)
            .flatten();
        let store = self.store.clone();
        let since: u64 = query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if since > 0 && since < compacted && refuse_old {
            return status(StatusCode::GONE, "Expired", "too old resource version");
        }
        if since > 0 && since < compacted {
            let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": gone()})).unwrap();
            line.push(b'\n');
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(BodyExt::boxed(Full::new(Bytes::from(line))))
                .unwrap();
        }
        let rv_of = |c: &Change| -> u64 {
            c.object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let last_past = past.last().map(rv_of).unwrap_or(0);
        let replay: std::collections::VecDeque<Change> = past.into_iter().collect();
        let state = (rx, collection, query, replay, false);
        let stream = futures::stream::unfold(
            state,
            move |(mut rx, collection, query, mut replay, ended)| {
                let store = store.clone();
                async move {
                    if ended {
                        return None;
                    }
                    loop {
                        let (live, next) = match replay.pop_front() {
                            Some(c) => (false, Ok(c)),
                            None => match next_live(&mut rx, deadline, bookmarks).await {
                                Live::Change(c) => (true, c),
                                Live::Ended => return None,
                                Live::Bookmark => {
                                    let mut line = serde_json::to_vec(&bookmark(
                                        &store.lock().unwrap(),
                                        &collection,
                                    ))
                                    .unwrap();
                                    line.push(b'\n');
                                    return Some((
                                        Ok::<_, Infallible>(Frame::data(Bytes::from(line))),
                                        (rx, collection, query, replay, false),
                                    ));
                                }
                            },
                        };
                        match next {
                            Ok(c) if c.kind == "CLOSE" => return None,
                            Ok(c) if c.kind == "ERROR" => {
                                // Compacted: tell the watcher and end the stream.
                                let mut line = serde_json::to_vec(
                                    &json!({"type": "ERROR", "object": c.object}),
                                )
                                .unwrap();
                                line.push(b'\n');
                                return Some((
                                    Ok::<_, Infallible>(Frame::data(Bytes::from(line))),
                                    (rx, collection, query, replay, true),
                                ));
                            }
                            Ok(c) => {
                                let rv = rv_of(&c);
                                if (live && rv <= last_past)
                                    || (c.collection != collection
                                        && !(across && in_collection(&c.collection, &collection)))
                                    || rv <= since
                                    || !selects(&c.object, &query)
                                {
                                    continue;
                                }
                                let mut line = serde_json::to_vec(
                                    &json!({"type": c.kind, "object": c.object}),
                                )
                                .unwrap();
                                line.push(b'\n');
                                return Some((
                                    Ok::<_, Infallible>(Frame::data(Bytes::from(line))),
                                    (rx, collection, query, replay, false),
                                ));
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(_) => return None,
                        }
                    }
                }
            },
        );
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(BodyExt::boxed(StreamBody::new(stream)))
            .unwrap()
    }
}

/// A BOOKMARK event at the current resourceVersion, typed with the collection's kind as
/// the API server sends it.
fn bookmark(st: &Store, collection: &str) -> Value {
    let (api_version, kind) = st
        .objects
        .iter()
        .filter(|(c, _)| in_collection(c, collection))
        .find_map(|(_, m)| m.values().next())
        .map(|o| (o["apiVersion"].clone(), o["kind"].clone()))
        .unwrap_or((json!("v1"), json!("")));
    json!({"type": "BOOKMARK", "object": {"apiVersion": api_version, "kind": kind,
        "metadata": {"resourceVersion": st.resource_version.to_string()}}})
}

/// What a live watch waits for next.
enum Live {
    Change(Result<Change, broadcast::error::RecvError>),
    Bookmark,
    /// `timeoutSeconds` ran out.
    Ended,
}

async fn next_live(
    rx: &mut broadcast::Receiver<Change>,
    deadline: Option<tokio::time::Instant>,
    bookmarks: Option<std::time::Duration>,
) -> Live {
    let ends = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let bookmark = async {
        match bookmarks {
            Some(every) => tokio::time::sleep(every).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        c = rx.recv() => Live::Change(c),
        _ = ends => Live::Ended,
        _ = bookmark => Live::Bookmark,
    }
}

/// The field labels the API server supports for a collection's field selector: every
/// resource's `metadata.name` and `metadata.namespace`, and per resource the ones it
/// registers (the subset clients here use). `Err`: the first unsupported label.
fn supported_fields(collection: &str, query: &BTreeMap<String, String>) -> Result<(), String> {
    let resource = collection.rsplit('/').next().unwrap_or_default();
    let extra: &[&str] = match resource {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "resourceslices" => &["spec.nodeName", "spec.driver"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "reason",
            "type",
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
        ],
        "nodes" => &["spec.unschedulable"],
        _ => &[],
    };
    let fields = query.get("fieldSelector").map(String::as_str).unwrap_or("");
    for term in fields.split(',').filter(|t| !t.is_empty()) {
        let label = term
            .split_once("!=")
            .or_else(|| term.split_once('='))
            .map_or(term, |(l, _)| l);
        if !matches!(label, "metadata.name" | "metadata.namespace") && !extra.contains(&label) {
            return Err(label.to_string());
        }
    }
    Ok(())
}

/// A DNS subdomain name (RFC 1123), as most objects' names must be.
fn valid_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters");
    }
    let ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    });
    if ok {
        Ok(())
    } else {
        Err("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
    }
}

/// `422 Invalid`, as the API server answers an object that fails validation.
fn invalid(message: &str) -> Response<BoxBody<Bytes, Infallible>> {
    status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
}

/// `status` as stored: a write of the main resource does not change it.
fn keep_status(object: &mut Value, stored: &Value) {
    let Some(o) = object.as_object_mut() else {
        return;
    };
    match stored.get("status") {
        Some(st) => {
            o.insert("status".into(), st.clone());
        }
        None => {
            o.remove("status");
        }
    }
}

/// Whether objects stored under `stored` belong to a LIST of `requested`: the same
/// collection, or `requested` is the cluster-wide form (`/api/v1/pods`) of a namespaced
/// `stored` one (`/api/v1/namespaces/<ns>/pods`).
fn in_collection(stored: &str, requested: &str) -> bool {
    if stored == requested {
        return true;
    }
    let Some((base, resource)) = requested.rsplit_once('/') else {
        return false;
    };
    stored
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix("/namespaces/"))
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(ns, res)| !ns.is_empty() && res == resource)
}

fn split_path(path: &str) -> (String, Option<String>) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/<res>[/<name>], /api/v1/namespaces/<ns>/<res>[/<name>],
    // /apis/<g>/<v>/<res>[/<name>], /apis/<g>/<v>/namespaces/<ns>/<res>[/<name>]
    let base = if segments.first() == Some(&"api") {
        2
    } else {
        3
    };
    let namespaced = segments.get(base) == Some(&"namespaces") && segments.len() > base + 2;
    let coll_len = if namespaced { base + 3 } else { base + 1 };
    let collection = format!("/{}", segments[..coll_len.min(segments.len())].join("/"));
    let name = segments.get(coll_len).map(|s| s.to_string());
    (collection, name)
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// `fieldSelector=a.b=x,c=y` and `labelSelector=k=v` equality terms.
fn selects(object: &Value, query: &BTreeMap<String, String>) -> bool {
    let fields = query.get("fieldSelector").map(String::as_str).unwrap_or("");
    let labels = query.get("labelSelector").map(String::as_str).unwrap_or("");
    let field_ok = fields.split(',').filter(|t| !t.is_empty()).all(|term| {
        let Some((path, want)) = term.split_once('=') else {
            return false;
        };
        let mut v = object;
        for p in path.split('.') {
            v = &v[p];
        }
        v.as_str() == Some(want.trim_start_matches('='))
    });
    let label_ok = labels.split(',').filter(|t| !t.is_empty()).all(|term| {
        let label = |k: &str| object["metadata"]["labels"][k].as_str();
        if let Some((k, want)) = term.split_once("!=") {
            return label(k) != Some(want);
        }
        match term.split_once('=') {
            Some((k, want)) => label(k) == Some(want.trim_start_matches('=')),
            // `key` (exists) and `!key` (does not exist).
            None => match term.strip_prefix('!') {
                Some(k) => label(k).is_none(),
                None => label(term).is_some(),
            },
        }
    });
    field_ok && label_ok
}

/// JSON merge patch (RFC 7386): objects merge, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in fields {
        if v.is_null() {
            if let Some(t) = target.as_object_mut() {
                t.remove(k);
            }
        } else {
            merge_patch(&mut target[k], v);
        }
    }
}

fn remove_path(v: &mut Value, parts: &[&str]) {
    match parts {
        [] => {}
        [last] => {
            if let Some(o) = v.as_object_mut() {
                o.remove(*last);
            }
        }
        ["*", rest @ ..] => {
            if let Some(a) = v.as_array_mut() {
                for item in a {
                    remove_path(item, rest);
                }
            }
        }
        [first, rest @ ..] => {
            if let Some(next) = v.get_mut(*first) {
                remove_path(next, rest);
            }
        }
    }
}

/// The Status a watch receives when its resourceVersion was compacted away.
fn gone() -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Expired",
           "message": "too old resource version", "code": 410})
}

/// The answer to an update that lost a race: 404 (deleted meanwhile) or 409.
fn lost_write(code: StatusCode, name: &str) -> Response<BoxBody<Bytes, Infallible>> {
    if code == StatusCode::NOT_FOUND {
        not_found(name)
    } else {
        status(code, "Conflict", "the object has been modified")
    }
}

fn not_found(name: &str) -> Response<BoxBody<Bytes, Infallible>> {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("{name} not found"),
    )
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<BoxBody<Bytes, Infallible>> {
    json_response(
        code,
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason,
               "message": message, "code": code.as_u16()}),
    )
}

fn json_response(code: StatusCode, v: Value) -> Response<BoxBody<Bytes, Infallible>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(Bytes::from(
            serde_json::to_vec(&v).unwrap(),
        ))))
        .unwrap()
}
