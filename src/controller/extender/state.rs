//! The extender's books: one [`NodeBooks`] per vGPU node, kept current from the
//! Nodes' records and the pods' assignment annotations ([`Books::sync`]), read by
//! filter and prioritize, and changed by bind ([`Books::reserve`]) without a node lock.
//! Prioritize and bind's choice of GPUs are the placement engine's ([`Engine`]), over
//! the same books and every node's CPU and memory use.
//!
//! ```text
//! watch events ─► sync: per node, desired = records + annotated pods + binds in flight;
//!                       a node whose desired state differs is replaced (newer version);
//!                       CPU/memory use = pods on the node + binds in flight
//! /filter ─► fit on every candidate (one short lock)
//! /prioritize ─► fit, then the engine's verdict on every node that fits ─► 0..=10
//! /bind ─► the engine's GPUs on the node, copy the node's books, fit with no lock,
//!          reserve(version) under the lock; Conflict → again on the fresh books; the
//!          reservation is "in flight" until the watch shows the pod annotated and bound
//!          (or the bind fails: released)
//! ```
//!
//! No I/O here: the HTTP server and the watch loop call in with decoded objects and
//! the time.

use super::engine::{
    extender_scores, Engine, NodeView, PodShape, WorkloadSource, DEFAULT_LEARNED_PODS,
};
use super::records::{heartbeat_problem, host_request, NodeState, PodAssignment, PodHost};
use crate::vgpu::request::policies;
use crate::vgpu::share::HostRequest;
use crate::vgpu::{
    filter, pod_request, Assignment, GpuRecord, NodeBooks, PodRequest, RequestConfig,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How many times a bind fits again after a conflicting reserve before giving up (the
/// scheduler then retries the pod).
const MAX_BIND_ATTEMPTS: usize = 16;

/// What the books are configured with.
#[derive(Clone, Debug)]
pub struct BooksConfig {
    /// How pods' requests are read (resource prefix, HAMi's defaults).
    pub request: RequestConfig,
    /// A node whose heartbeat is older than this is out of scheduling.
    pub heartbeat_window: Duration,
    /// A bind's reservation not yet seen on the pod by the watch is kept this long.
    pub in_flight_grace: Duration,
    /// What the placement engine measures fragmentation against.
    pub workload: WorkloadSource,
}

impl Default for BooksConfig {
    fn default() -> Self {
        BooksConfig {
            request: RequestConfig::default(),
            heartbeat_window: Duration::from_secs(60),
            in_flight_grace: Duration::from_secs(120),
            workload: WorkloadSource::Learned(DEFAULT_LEARNED_PODS),
        }
    }
}

/// An error answering the scheduler (said in the answer's `error`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The books have not been built from the cluster yet.
    #[error("the vGPU books are not synced with the cluster yet; retry")]
    NotSynced,
    /// The node cannot take the pod now.
    #[error("pod no longer fits: {0}")]
    NoFit(String),
    /// The pod's request cannot be placed as written.
    #[error("{0}")]
    Request(String),
    /// Other binds kept changing the node.
    #[error("node {0}: books changed on every one of {MAX_BIND_ATTEMPTS} attempts; retry")]
    Contended(String),
    /// Booking refused for another reason.
    #[error("{0}")]
    Books(String),
}

/// The filter's answer for one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Nodes that fit, in the order asked.
    pub fits: Vec<String>,
    /// Nodes short of something preemption could free.
    pub failed: BTreeMap<String, String>,
    /// Nodes no preemption helps (no vGPU record, stale heartbeat, a bad request).
    pub unresolvable: BTreeMap<String, String>,
    /// Why the pod fits nowhere (for the log).
    pub summary: Option<String>,
}

/// A bind's reservation the watch has not shown on the pod yet.
struct InFlight {
    /// Its vGPUs (`None`: a pod without vGPUs; only its CPU and memory are held).
    assignment: Option<Assignment>,
    /// The node.
    node: String,
    /// Its CPU and memory.
    host: HostRequest,
    /// When it was reserved.
    at: Timestamp,
    /// A sync has seen the pod since (so its absence later means it was deleted).
    seen: bool,
}

struct Node {
    state: NodeState,
    books: NodeBooks,
    /// The GPUs and assignments the books were last rebuilt from: a sync rebuilds
    /// only when these change (a record the rebuild refused is not retried, and
    /// re-logged, on every sync).
    built_from: (Vec<GpuRecord>, Vec<Assignment>),
    /// CPU and memory its pods and the binds in flight to it take.
    host_used: HostRequest,
}

impl Node {
    fn view(&self) -> NodeView<'_> {
        NodeView {
            books: &self.books,
            allocatable: self.state.allocatable,
            used: self.host_used,
        }
    }
}

struct Inner {
    synced: bool,
    nodes: BTreeMap<String, Node>,
    /// Pod UID → a bind's reservation not yet seen on the pod.
    in_flight: BTreeMap<String, InFlight>,
    engine: Engine,
}

/// The shared books.
pub struct Books {
    config: BooksConfig,
    inner: Mutex<Inner>,
}

impl Books {
    pub fn new(config: BooksConfig) -> Books {
        let engine = Engine::new(config.workload.clone());
        Books {
            config,
            inner: Mutex::new(Inner {
                synced: false,
                nodes: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                engine,
            }),
        }
    }

    pub fn config(&self) -> &BooksConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere while holding it leaves nothing half-changed
        // that a later sync does not rebuild.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the books have been built from the cluster once.
    pub fn synced(&self) -> bool {
        self.lock().synced
    }

    /// Fixes the placement engine's workload to these pods (with
    /// [`WorkloadSource::Fixed`]), as `tessera simulate` measures against its whole pod
    /// list; pods whose request cannot be read are left out. Takes effect at once (before
    /// the first [`Books::sync`], with it).
    pub fn set_workload<'a>(&self, pods: impl IntoIterator<Item = &'a Pod>) {
        let shapes: Vec<PodShape> = pods
            .into_iter()
            .filter_map(|pod| {
                let request = pod_request(pod, &self.config.request).ok()?;
                Some((request, pod_host_request(pod)))
            })
            .collect();
        self.lock().engine.set_workload(shapes);
    }

    /// Brings the books in line with the cluster: `nodes` (every vGPU node's state),
    /// `pods` (every pod's recorded assignment) and `present` (every pod by UID, with
    /// where it runs and its CPU and memory). A bind's reservation not yet shown on its
    /// pod (annotated and bound) is kept until the pod shows it, or is seen and then
    /// gone (deleted), or for the grace period at most. Returns the problems found
    /// (unreadable or overcommitting records), for the log.
    pub fn sync(
        &self,
        nodes: Vec<NodeState>,
        pods: Vec<PodAssignment>,
        present: &BTreeMap<String, PodHost>,
        now: Timestamp,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut pods: Vec<PodAssignment> = pods.into_iter().filter(|p| !p.finished).collect();
        pods.sort_by(|a, b| {
            (&a.created, &a.assignment.pod_uid).cmp(&(&b.created, &b.assignment.pod_uid))
        });
        let recorded: BTreeSet<&str> = pods.iter().map(|p| p.assignment.pod_uid.as_str()).collect();
        let grace_ms = i64::try_from(self.config.in_flight_grace.as_millis()).unwrap_or(i64::MAX);
        inner.in_flight.retain(|uid, f| {
            let here = present.get(uid);
            let bound = here.is_some_and(|p| p.node.is_some());
            let finished = here.is_some_and(|p| p.finished);
            let annotated = f.assignment.is_none() || recorded.contains(uid.as_str());
            let shown = finished || (bound && annotated);
            let deleted = f.seen && here.is_none();
            let expired = now.as_millisecond().saturating_sub(f.at.as_millisecond()) > grace_ms;
            let keep = !(shown || deleted || expired);
            f.seen |= here.is_some();
            keep
        });
        let mut desired: BTreeMap<String, Vec<Assignment>> = BTreeMap::new();
        for p in &pods {
            desired
                .entry(p.assignment.node.clone())
                .or_default()
                .push(p.assignment.clone());
        }
        let mut host_used: BTreeMap<&str, HostRequest> = BTreeMap::new();
        for p in present.values() {
            if let Some(node) = p.holds() {
                let used = host_used.entry(node).or_default();
                *used = used.plus(p.request);
            }
        }
        for (uid, f) in &inner.in_flight {
            if let Some(a) = f
                .assignment
                .as_ref()
                .filter(|_| !recorded.contains(uid.as_str()))
            {
                desired.entry(a.node.clone()).or_default().push(a.clone());
            }
            if present.get(uid).and_then(PodHost::holds).is_none() {
                let used = host_used.entry(f.node.as_str()).or_default();
                *used = used.plus(f.host);
            }
        }
        let mut next = BTreeMap::new();
        for state in nodes {
            let gpus = state.gpus.clone().unwrap_or_default();
            let assignments = desired.remove(&state.name).unwrap_or_default();
            let wanted = (gpus, assignments);
            let books = match inner.nodes.remove(&state.name) {
                Some(old) if old.built_from == wanted || holds(&old.books, &wanted) => old.books,
                Some(old) => {
                    let (books, errors) = old.books.replaced(wanted.0.clone(), wanted.1.clone());
                    problems.extend(errors.iter().map(|e| e.to_string()));
                    books
                }
                None => {
                    let (books, errors) =
                        NodeBooks::rebuild(&state.name, wanted.0.clone(), wanted.1.clone());
                    problems.extend(errors.iter().map(|e| e.to_string()));
                    books
                }
            };
            let node = Node {
                host_used: host_used
                    .get(state.name.as_str())
                    .copied()
                    .unwrap_or_default(),
                state,
                books,
                built_from: wanted,
            };
            next.insert(node.state.name.clone(), node);
        }
        for node in desired.keys() {
            problems.push(format!(
                "pods hold vGPUs on {node}, which publishes no vGPU record"
            ));
        }
        inner.nodes = next;
        inner.synced = true;
        let engine_nodes = inner
            .nodes
            .iter()
            .filter(|(_, n)| n.state.gpus.is_ok())
            .map(|(name, n)| (name.as_str(), n.view()));
        if let Err(problem) = inner.engine.sync(engine_nodes) {
            problems.push(problem);
        }
        problems
    }

    /// Every candidate node fitted for the pod.
    pub fn filter(&self, pod: &Pod, candidates: &[String], now: Timestamp) -> Filtered {
        let mut out = Filtered::default();
        let request = match pod_request(pod, &self.config.request) {
            Ok(Some(r)) => r,
            // Not a vGPU pod: nothing of the extender's to judge.
            Ok(None) => {
                out.fits = candidates.to_vec();
                return out;
            }
            Err(e) => {
                let why = e.to_string();
                out.unresolvable = candidates
                    .iter()
                    .map(|n| (n.clone(), why.clone()))
                    .collect();
                out.summary = Some(why);
                return out;
            }
        };
        let uid = pod_uid(pod);
        let inner = self.lock();
        let mut usable = Vec::new();
        for name in candidates {
            match self.usable(&inner.nodes, name, now) {
                Ok(node) => usable.push(&node.books),
                Err(why) => {
                    out.unresolvable.insert(name.clone(), why);
                }
            }
        }
        let outcome = filter(usable, &uid, &request);
        drop(inner);
        out.summary = outcome.summary(&request);
        out.failed = outcome.reasons();
        out.fits = outcome.fits.into_iter().map(|f| f.node).collect();
        out
    }

    /// Every candidate scored 0..=10 by the placement engine: each node the pod fits
    /// gets the rank of the engine's verdict on it (by Tessera's policy, or binpack or
    /// spread as the pod's `hami.io/node-scheduler-policy` asks), so the node the
    /// engine would choose scores highest; the others get 0. A pod without vGPUs is
    /// scored on CPU and memory alone. The pod joins the engine's learned workload.
    pub fn prioritize(
        &self,
        pod: &Pod,
        candidates: &[String],
        now: Timestamp,
    ) -> Vec<(String, u8)> {
        let mut scores: BTreeMap<&str, u8> = BTreeMap::new();
        if let Ok(request) = pod_request(pod, &self.config.request) {
            let host = pod_host_request(pod);
            let uid = pod_uid(pod);
            let mut guard = self.lock();
            let Inner { nodes, engine, .. } = &mut *guard;
            engine.observe(&uid, request.as_ref(), host);
            let mut views = Vec::new();
            for name in candidates {
                let Ok(node) = self.usable(nodes, name, now) else {
                    continue;
                };
                if request
                    .as_ref()
                    .is_none_or(|r| node.books.fit(&uid, r).is_ok())
                {
                    views.push((name.as_str(), node.view()));
                }
            }
            let policy = match &request {
                Some(r) => r.node_policy,
                None => policies(pod, &self.config.request)
                    .ok()
                    .and_then(|(_, node)| node),
            };
            let verdicts = engine.verdicts(&views, request.as_ref(), host, policy);
            for ((name, _), score) in views.iter().zip(extender_scores(&verdicts)) {
                scores.insert(name, score);
            }
        }
        candidates
            .iter()
            .map(|n| (n.clone(), scores.get(n.as_str()).copied().unwrap_or(0)))
            .collect()
    }

    /// The node if it may take pods now, else why not.
    fn usable<'a>(
        &self,
        nodes: &'a BTreeMap<String, Node>,
        name: &str,
        now: Timestamp,
    ) -> Result<&'a Node, String> {
        let Some(node) = nodes.get(name) else {
            return Err(format!(
                "{name}: publishes no vGPU devices (annotation {})",
                super::records::DEVICES_ANNOTATION
            ));
        };
        if let Err(why) = &node.state.gpus {
            return Err(why.clone());
        }
        match heartbeat_problem(&node.state, now, self.config.heartbeat_window) {
            Some(why) => Err(why),
            None => Ok(node),
        }
    }

    /// Books the pod on `node` for a bind: the placement engine picks the GPUs (by
    /// Tessera's policy, or binpack or spread as `hami.io/gpu-scheduler-policy`
    /// asks), the books fit on a copy of the node's with no lock held, preferring
    /// those GPUs, and reserve with the version fitted against; on a conflict, again.
    /// A pod already booked on `node` gets its booking back (a retried bind); one
    /// booked elsewhere is released there first. A pod without vGPUs books nothing
    /// (`None`); its CPU and memory are held on the node until the watch shows it bound.
    pub fn reserve(
        &self,
        pod: &Pod,
        node: &str,
        now: Timestamp,
    ) -> Result<Option<Assignment>, BindError> {
        let request = pod_request(pod, &self.config.request)
            .map_err(|e| BindError::Request(e.to_string()))?;
        let uid = pod_uid(pod);
        let host = pod_host_request(pod);
        let Some(request) = request else {
            let mut inner = self.lock();
            release_locked(&mut inner, &uid);
            hold(&mut inner, &uid, node, None, host, now);
            return Ok(None);
        };
        for _ in 0..MAX_BIND_ATTEMPTS {
            let (copy, prefer) = {
                let mut guard = self.lock();
                if !guard.synced {
                    return Err(BindError::NotSynced);
                }
                if let Some(held) = held_on(&guard, &uid, node) {
                    return Ok(Some(held));
                }
                release_locked(&mut guard, &uid);
                let Inner { nodes, engine, .. } = &mut *guard;
                let target = self.usable(nodes, node, now).map_err(BindError::NoFit)?;
                let prefer = engine.gpus(
                    node,
                    target.view(),
                    Some(&request),
                    host,
                    request.gpu_policy,
                );
                (target.books.clone(), prefer)
            };
            match self.try_reserve(&copy, &uid, &request, &prefer, host, now)? {
                Some(assignment) => return Ok(Some(assignment)),
                None => continue,
            }
        }
        Err(BindError::Contended(node.to_string()))
    }

    /// One fit on `copy` and a reserve against its version; `None` on a conflict.
    fn try_reserve(
        &self,
        copy: &NodeBooks,
        uid: &str,
        request: &PodRequest,
        prefer: &[usize],
        host: HostRequest,
        now: Timestamp,
    ) -> Result<Option<Assignment>, BindError> {
        let assignment = copy
            .fit_preferring(uid, request, prefer)
            .map_err(|s| BindError::NoFit(s.to_string()))?;
        let mut inner = self.lock();
        let Some(node) = inner.nodes.get_mut(copy.node()) else {
            return Err(BindError::NoFit(format!(
                "{}: no longer a vGPU node",
                copy.node()
            )));
        };
        match node.books.reserve(copy.version(), assignment.clone()) {
            Ok(_) => {
                let held = Some(assignment.clone());
                hold(&mut inner, uid, copy.node(), held, host, now);
                Ok(Some(assignment))
            }
            Err(crate::vgpu::BooksError::Conflict { .. }) => Ok(None),
            Err(e) => Err(BindError::Books(e.to_string())),
        }
    }

    /// Frees what the pod holds (a bind that failed after reserving).
    pub fn release(&self, pod_uid: &str) {
        release_locked(&mut self.lock(), pod_uid);
    }

    /// The assignment the pod holds, wherever.
    pub fn assignment(&self, pod_uid: &str) -> Option<Assignment> {
        let inner = self.lock();
        inner
            .nodes
            .values()
            .find_map(|n| n.books.assignment(pod_uid).cloned())
    }

    /// Binds whose reservation the watch has not shown on the pod yet.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight.len()
    }

    /// A copy of one node's books (tests, diagnostics).
    pub fn node_books(&self, node: &str) -> Option<NodeBooks> {
        self.lock().nodes.get(node).map(|n| n.books.clone())
    }

    /// The CPU and memory the books count as taken on `node` (tests, diagnostics).
    pub fn host_used(&self, node: &str) -> Option<HostRequest> {
        self.lock().nodes.get(node).map(|n| n.host_used)
    }
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The pod's CPU and memory requests, read as the watch reads every pod.
fn pod_host_request(pod: &Pod) -> HostRequest {
    pod.spec
        .as_ref()
        .and_then(|spec| serde_json::to_value(spec).ok())
        .map_or_else(HostRequest::default, |spec| host_request(&spec))
}

fn held_on(inner: &Inner, uid: &str, node: &str) -> Option<Assignment> {
    inner.nodes.get(node)?.books.assignment(uid).cloned()
}

/// Records a bind in flight: `assignment` (already booked) and the pod's CPU and memory
/// on `node`.
fn hold(
    inner: &mut Inner,
    uid: &str,
    node: &str,
    assignment: Option<Assignment>,
    host: HostRequest,
    now: Timestamp,
) {
    if let Some(n) = inner.nodes.get_mut(node) {
        n.host_used = n.host_used.plus(host);
    }
    let flight = InFlight {
        assignment,
        node: node.to_string(),
        host,
        at: now,
        seen: false,
    };
    inner.in_flight.insert(uid.to_string(), flight);
}

fn release_locked(inner: &mut Inner, uid: &str) {
    if let Some(f) = inner.in_flight.remove(uid) {
        if let Some(n) = inner.nodes.get_mut(&f.node) {
            n.host_used = n.host_used.minus(f.host);
        }
    }
    for node in inner.nodes.values_mut() {
        node.books.release(uid);
    }
}

/// Whether `books` already describe these GPUs and hold exactly these assignments.
fn holds(books: &NodeBooks, (gpus, assignments): &(Vec<GpuRecord>, Vec<Assignment>)) -> bool {
    books.gpus().map(|(g, _)| g).eq(gpus.iter())
        && books.assignments().count() == assignments.len()
        && assignments
            .iter()
            .all(|a| books.assignment(&a.pod_uid) == Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::extender::records::{node_state, pod_assignment};
    use serde_json::{json, Value};

    fn at(s: &str) -> Timestamp {
        s.parse().expect("RFC 3339")
    }

    fn node(healthy: bool) -> NodeState {
        let devices = json!([{"uuid": "g0", "model": "A100", "memoryMiB": 40960, "slots": 4,
                              "healthy": healthy}]);
        node_state(&json!({"metadata": {"name": "n", "annotations": {
            "tessera.io/vgpu-devices": devices.to_string(),
            "tessera.io/vgpu-heartbeat": "2026-12-01T00:00:00Z"}}}))
        .expect("a vGPU node")
    }

    fn pod(name: &str, memory: u64) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": name},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": memory.to_string()}}}]}}))
        .expect("a Pod")
    }

    /// The pod as the watch shows it after the bind, annotated with `a`.
    fn annotated(a: &Assignment, phase: &str) -> PodAssignment {
        let record = super::super::records::AssignmentRecord::of(a);
        let v: Value = json!({"metadata": {"uid": a.pod_uid, "annotations": {
            "tessera.io/vgpu-assignment": serde_json::to_string(&record).expect("encodes")}},
            "status": {"phase": phase}});
        pod_assignment(&v).expect("annotated").expect("readable")
    }

    /// Pods as the watch shows them: UID and the node each is bound to.
    fn seen(pods: &[(&str, Option<&str>)]) -> BTreeMap<String, PodHost> {
        pods.iter()
            .map(|(uid, node)| {
                let host = PodHost {
                    node: node.map(str::to_string),
                    finished: false,
                    request: HostRequest {
                        cpu_milli: 1000,
                        memory_mib: 512,
                    },
                };
                (uid.to_string(), host)
            })
            .collect()
    }

    fn used(books: &Books) -> u64 {
        let b = books.node_books("n").expect("node n");
        b.gpus().map(|(_, u)| u.memory_mib).sum()
    }

    #[test]
    fn a_bind_is_held_until_its_pod_shows_it_and_released_when_the_pod_ends() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        let none = BTreeMap::new();
        assert_eq!(
            books.reserve(&pod("a", 1024), "n", now),
            Err(BindError::NotSynced)
        );
        books.sync(vec![node(true)], vec![], &none, now);
        let a = books
            .reserve(&pod("a", 10_240), "n", now)
            .expect("fits")
            .expect("vGPUs");
        // A retried bind gets the same booking back.
        assert_eq!(
            books.reserve(&pod("a", 10_240), "n", now),
            Ok(Some(a.clone()))
        );
        // The watch has not shown the pod yet: the reservation stays.
        books.sync(vec![node(true)], vec![], &none, now);
        assert_eq!((used(&books), books.in_flight()), (10_240, 1));
        // Shown with its annotation: it stands on the record.
        let present = seen(&[("a", Some("n"))]);
        books.sync(
            vec![node(true)],
            vec![annotated(&a, "Running")],
            &present,
            now,
        );
        assert_eq!((used(&books), books.in_flight()), (10_240, 0));
        // Finished: released.
        books.sync(
            vec![node(true)],
            vec![annotated(&a, "Succeeded")],
            &present,
            now,
        );
        assert_eq!(used(&books), 0);
    }

    #[test]
    fn a_reservation_whose_pod_is_seen_then_gone_or_never_shown_is_dropped() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        books.sync(vec![node(true)], vec![], &BTreeMap::new(), now);
        books
            .reserve(&pod("a", 1_024), "n", now)
            .expect("fits")
            .expect("vGPUs");
        books
            .reserve(&pod("b", 2_048), "n", now)
            .expect("fits")
            .expect("vGPUs");
        let both = seen(&[("a", None), ("b", None)]);
        books.sync(vec![node(true)], vec![], &both, now);
        assert_eq!(used(&books), 3_072);
        // a deleted after it was seen: released at once; b never shown: kept.
        let only_b = seen(&[("b", None)]);
        books.sync(vec![node(true)], vec![], &only_b, now);
        assert_eq!(used(&books), 2_048);
        let later = at("2026-12-01T00:05:00Z");
        books.sync(vec![node(true)], vec![], &BTreeMap::new(), later);
        assert_eq!((used(&books), books.in_flight()), (0, 0));
    }

    #[test]
    fn a_node_described_anew_moves_its_version_and_keeps_its_pods() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        books.sync(vec![node(true)], vec![], &BTreeMap::new(), now);
        let a = books
            .reserve(&pod("a", 1_024), "n", now)
            .expect("fits")
            .expect("vGPUs");
        let before = books.node_books("n").expect("n").version();
        let present = seen(&[("a", Some("n"))]);
        books.sync(
            vec![node(true)],
            vec![annotated(&a, "Running")],
            &present,
            now,
        );
        assert_eq!(
            books.node_books("n").expect("n").version(),
            before,
            "nothing changed"
        );
        books.sync(
            vec![node(false)],
            vec![annotated(&a, "Running")],
            &present,
            now,
        );
        let after = books.node_books("n").expect("n");
        assert!(after.version() > before);
        assert_eq!(after.assignment("a"), Some(&a));
        let out = books.filter(&pod("b", 1_024), &["n".to_string()], now);
        assert_eq!(out.failed["n"], "n: all 1 GPUs unhealthy");
    }

    #[test]
    fn an_overcommitting_record_is_refused_once_not_on_every_sync() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        let big = |uid: &str| Assignment {
            pod_uid: uid.into(),
            node: "n".into(),
            containers: vec![crate::vgpu::books::ContainerAssignment {
                container: "main".into(),
                grants: vec![crate::vgpu::books::Grant {
                    uuid: "g0".into(),
                    memory_mib: 30_000,
                    cores: 0,
                }],
            }],
        };
        let pods = || {
            vec![
                annotated(&big("a"), "Running"),
                annotated(&big("b"), "Running"),
            ]
        };
        let present = seen(&[("a", Some("n")), ("b", Some("n"))]);
        let problems = books.sync(vec![node(true)], pods(), &present, now);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("pod b"), "{problems:?}");
        let version = books.node_books("n").expect("n").version();
        assert_eq!(
            books.sync(vec![node(true)], pods(), &present, now),
            Vec::<String>::new()
        );
        assert_eq!(books.node_books("n").expect("n").version(), version);
        assert_eq!(used(&books), 30_000);
    }

    /// A node of `gpus` GPUs of 16,000 MiB (16 MiB per milli of a GPU), 64 CPUs.
    fn node16(name: &str, gpus: usize) -> NodeState {
        let devices: Vec<Value> = (0..gpus)
            .map(|g| {
                json!({"uuid": format!("{name}-{g}"), "model": "A100",
                            "memoryMiB": 16_000, "slots": 10, "healthy": true})
            })
            .collect();
        node_state(&json!({"metadata": {"name": name, "annotations": {
            "tessera.io/vgpu-devices": Value::Array(devices).to_string(),
            "tessera.io/vgpu-heartbeat": "2026-12-01T00:00:00Z"}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi"}}}))
        .expect("a vGPU node")
    }

    /// A pod of `milli` of one GPU (16 MiB each), one CPU and 1 GiB.
    fn share(name: &str, milli: u64, annotations: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": name,
            "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"nvidia.com/gpu": "1",
                           "nvidia.com/gpumem": (milli * 16).to_string()}}}]}}))
        .expect("a Pod")
    }

    fn granted(a: &Assignment) -> &str {
        &a.containers[0].grants[0].uuid
    }

    #[test]
    fn prioritize_and_bind_follow_the_placement_engine() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig {
            workload: WorkloadSource::Fixed,
            ..BooksConfig::default()
        });
        // The workload packs 550 + 230 + 220 and 650 + 320 on one GPU each.
        let workload: Vec<Pod> = [550, 230, 220, 650, 320]
            .iter()
            .map(|&m| share(&format!("w{m}"), m, json!({})))
            .collect();
        books.set_workload(&workload);
        let nodes = || {
            vec![
                node16("x", 1),
                node16("y", 1),
                node16("z", 1),
                node16("w", 3),
            ]
        };
        books.sync(nodes(), vec![], &BTreeMap::new(), now);
        for (uuid, milli) in [("x-0", 650), ("y-0", 550), ("w-0", 650), ("w-1", 550)] {
            let pin = json!({"nvidia.com/use-gpuuuid": uuid});
            let filler = share(&format!("filler-{uuid}"), milli, pin);
            let node = &uuid[..1];
            let a = books.reserve(&filler, node, now).expect("fits");
            assert_eq!(a.as_ref().map(granted), Some(uuid));
        }
        // A 230 on x leaves 120 (off the plan), on y 220 (waits for a 220), on z 770.
        let xyz = ["x".to_string(), "y".to_string(), "z".to_string()];
        let policy = |p: &str| json!({"hami.io/node-scheduler-policy": p});
        let cases = [
            (json!({}), [8, 10, 9]),
            (policy("binpack"), [10, 9, 8]),
            (policy("spread"), [8, 9, 10]),
        ];
        for (annotations, want) in cases {
            let got = books.prioritize(&share("p", 230, annotations.clone()), &xyz, now);
            let want: Vec<(String, u8)> = xyz.iter().cloned().zip(want).collect();
            assert_eq!(got, want, "{annotations}");
        }
        // A node that does not fit, or is not a vGPU node, scores 0.
        let big = books.prioritize(&share("big", 460, json!({})), &xyz, now);
        assert_eq!(big[0], ("x".to_string(), 0));
        let other = books.prioritize(&share("p", 230, json!({})), &["cpu".to_string()], now);
        assert_eq!(other, [("cpu".to_string(), 0)]);
        // On w, bind takes the GPU the engine picks: Tessera's keeps to the plan.
        let gpu = |p: &str| json!({"hami.io/gpu-scheduler-policy": p});
        let binds = [
            ("tessera", json!({}), "w-1"),
            ("binpack", gpu("binpack"), "w-0"),
            ("spread", gpu("spread"), "w-2"),
        ];
        for (name, annotations, want) in binds {
            let a = books.reserve(&share(name, 230, annotations), "w", now);
            let a = a.expect("fits").expect("vGPUs");
            assert_eq!(granted(&a), want, "{name}");
        }
    }

    #[test]
    fn cpu_and_memory_are_held_from_bind_until_the_pod_shows_bound() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        books.sync(vec![node16("n", 1)], vec![], &BTreeMap::new(), now);
        let cpu_pod: Pod = serde_json::from_value(json!({"metadata": {"name": "c", "uid": "c"},
            "spec": {"containers": [{"name": "main", "resources": {
                "requests": {"cpu": "2", "memory": "4Gi"}}}]}}))
        .expect("a Pod");
        let want = HostRequest {
            cpu_milli: 2000,
            memory_mib: 4096,
        };
        assert_eq!(books.reserve(&cpu_pod, "n", now), Ok(None));
        assert_eq!((books.host_used("n"), books.in_flight()), (Some(want), 1));
        // The watch has not seen it bound: still held; seen bound: counted from the pod.
        let unbound = BTreeMap::from([(
            "c".to_string(),
            PodHost {
                node: None,
                finished: false,
                request: want,
            },
        )]);
        books.sync(vec![node16("n", 1)], vec![], &unbound, now);
        assert_eq!((books.host_used("n"), books.in_flight()), (Some(want), 1));
        let mut bound = unbound.clone();
        if let Some(p) = bound.get_mut("c") {
            p.node = Some("n".into());
        }
        books.sync(vec![node16("n", 1)], vec![], &bound, now);
        assert_eq!((books.host_used("n"), books.in_flight()), (Some(want), 0));
        if let Some(p) = bound.get_mut("c") {
            p.finished = true;
        }
        books.sync(vec![node16("n", 1)], vec![], &bound, now);
        assert_eq!(books.host_used("n"), Some(HostRequest::default()));
        // A bind that fails after reserving gives the CPU and memory back.
        let vgpu = share("v", 100, json!({}));
        books.reserve(&vgpu, "n", now).expect("fits");
        assert_eq!(
            books.host_used("n"),
            Some(HostRequest {
                cpu_milli: 1000,
                memory_mib: 1024
            })
        );
        books.release("v");
        assert_eq!(books.host_used("n"), Some(HostRequest::default()));
    }
}
