//! The extender's books: one [`NodeBooks`] per vGPU node, kept current from the
//! Nodes' records and the pods' assignment annotations ([`Books::sync`]), read by
//! filter and prioritize, and changed by bind ([`Books::reserve`]) without a node lock.
//!
//! ```text
//! watch events ─► sync: per node, desired = records + annotated pods + binds in flight;
//!                       a node whose desired state differs is replaced (newer version)
//! /filter, /prioritize ─► fit on every candidate (one short lock)
//! /bind ─► copy the node's books, fit with no lock, reserve(version) under the lock;
//!          Conflict → fit again on the fresh books; the reservation is "in flight"
//!          until the watch shows the pod's annotation (or the bind fails: released)
//! ```
//!
//! No I/O here: the HTTP server and the watch loop call in with decoded objects and
//! the time.

use super::records::{heartbeat_problem, NodeState, PodAssignment};
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
}

impl Default for BooksConfig {
    fn default() -> Self {
        BooksConfig {
            request: RequestConfig::default(),
            heartbeat_window: Duration::from_secs(60),
            in_flight_grace: Duration::from_secs(120),
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
    /// Nodes that fit, with their 0..=10 score, in the order asked.
    pub fits: Vec<(String, u8)>,
    /// Nodes short of something preemption could free.
    pub failed: BTreeMap<String, String>,
    /// Nodes no preemption helps (no vGPU record, stale heartbeat, a bad request).
    pub unresolvable: BTreeMap<String, String>,
    /// Why the pod fits nowhere (for the log).
    pub summary: Option<String>,
}

/// A bind's reservation the watch has not shown on the pod yet.
struct InFlight {
    assignment: Assignment,
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
}

#[derive(Default)]
struct Inner {
    synced: bool,
    nodes: BTreeMap<String, Node>,
    /// Pod UID → a bind's reservation not yet seen on the pod.
    in_flight: BTreeMap<String, InFlight>,
}

/// The shared books.
pub struct Books {
    config: BooksConfig,
    inner: Mutex<Inner>,
}

impl Books {
    pub fn new(config: BooksConfig) -> Books {
        Books {
            config,
            inner: Mutex::new(Inner::default()),
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

    /// Brings the books in line with the cluster: `nodes` (every vGPU node's state),
    /// `pods` (every pod's recorded assignment) and `present` (the UIDs of every pod).
    /// A bind's reservation not yet shown on its pod is kept until the pod shows it, or
    /// is seen and then gone (deleted), or for the grace period at most. Returns the
    /// problems found (unreadable or overcommitting records), for the log.
    pub fn sync(
        &self,
        nodes: Vec<NodeState>,
        pods: Vec<PodAssignment>,
        present: &BTreeSet<String>,
        now: Timestamp,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let mut inner = self.lock();
        let mut pods: Vec<PodAssignment> = pods.into_iter().filter(|p| !p.finished).collect();
        pods.sort_by(|a, b| {
            (&a.created, &a.assignment.pod_uid).cmp(&(&b.created, &b.assignment.pod_uid))
        });
        let recorded: BTreeSet<&str> = pods.iter().map(|p| p.assignment.pod_uid.as_str()).collect();
        let grace_ms = i64::try_from(self.config.in_flight_grace.as_millis()).unwrap_or(i64::MAX);
        inner.in_flight.retain(|uid, f| {
            let here = present.contains(uid);
            let shown = recorded.contains(uid.as_str());
            let deleted = f.seen && !here;
            let expired = now.as_millisecond().saturating_sub(f.at.as_millisecond()) > grace_ms;
            let keep = !(shown || deleted || expired);
            f.seen |= here;
            keep
        });
        let mut desired: BTreeMap<String, Vec<Assignment>> = BTreeMap::new();
        for p in &pods {
            desired
                .entry(p.assignment.node.clone())
                .or_default()
                .push(p.assignment.clone());
        }
        for f in inner.in_flight.values() {
            desired
                .entry(f.assignment.node.clone())
                .or_default()
                .push(f.assignment.clone());
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
        problems
    }

    /// Filter and prioritize in one: every candidate node fitted for the pod.
    pub fn filter(&self, pod: &Pod, candidates: &[String], now: Timestamp) -> Filtered {
        let mut out = Filtered::default();
        let request = match pod_request(pod, &self.config.request) {
            Ok(Some(r)) => r,
            // Not a vGPU pod: nothing of the extender's to judge.
            Ok(None) => {
                out.fits = candidates.iter().map(|n| (n.clone(), 0)).collect();
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
            match self.usable(&inner, name, now) {
                Ok(books) => usable.push(books),
                Err(why) => {
                    out.unresolvable.insert(name.clone(), why);
                }
            }
        }
        let outcome = filter(usable, &uid, &request);
        drop(inner);
        out.summary = outcome.summary(&request);
        out.failed = outcome.reasons();
        out.fits = outcome
            .fits
            .into_iter()
            .map(|f| (f.node, f.score))
            .collect();
        out
    }

    /// The node's books if it may take pods now, else why not.
    fn usable<'a>(
        &self,
        inner: &'a Inner,
        name: &str,
        now: Timestamp,
    ) -> Result<&'a NodeBooks, String> {
        let Some(node) = inner.nodes.get(name) else {
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
            None => Ok(&node.books),
        }
    }

    /// Books the pod on `node` for a bind: fits on a copy of the node's books with no
    /// lock held, reserves with the version fitted against, and fits again on a
    /// conflict. A pod already booked on `node` gets its booking back (a retried bind);
    /// one booked elsewhere is released there first.
    pub fn reserve(&self, pod: &Pod, node: &str, now: Timestamp) -> Result<Assignment, BindError> {
        let request = match pod_request(pod, &self.config.request) {
            Ok(Some(r)) => r,
            Ok(None) => return Err(BindError::Request("the pod asks for no vGPUs".into())),
            Err(e) => return Err(BindError::Request(e.to_string())),
        };
        let uid = pod_uid(pod);
        for _ in 0..MAX_BIND_ATTEMPTS {
            let copy = {
                let mut inner = self.lock();
                if !inner.synced {
                    return Err(BindError::NotSynced);
                }
                if let Some(held) = held_on(&inner, &uid, node) {
                    return Ok(held);
                }
                release_locked(&mut inner, &uid);
                self.usable(&inner, node, now)
                    .map_err(BindError::NoFit)?
                    .clone()
            };
            match self.try_reserve(&copy, &uid, &request, now)? {
                Some(assignment) => return Ok(assignment),
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
        now: Timestamp,
    ) -> Result<Option<Assignment>, BindError> {
        let assignment = copy
            .fit(uid, request)
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
                let flight = InFlight {
                    assignment: assignment.clone(),
                    at: now,
                    seen: false,
                };
                inner.in_flight.insert(uid.to_string(), flight);
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
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn held_on(inner: &Inner, uid: &str, node: &str) -> Option<Assignment> {
    inner.nodes.get(node)?.books.assignment(uid).cloned()
}

fn release_locked(inner: &mut Inner, uid: &str) {
    inner.in_flight.remove(uid);
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

    fn used(books: &Books) -> u64 {
        let b = books.node_books("n").expect("node n");
        b.gpus().map(|(_, u)| u.memory_mib).sum()
    }

    #[test]
    fn a_bind_is_held_until_its_pod_shows_it_and_released_when_the_pod_ends() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        let none = BTreeSet::new();
        assert_eq!(
            books.reserve(&pod("a", 1024), "n", now),
            Err(BindError::NotSynced)
        );
        books.sync(vec![node(true)], vec![], &none, now);
        let a = books.reserve(&pod("a", 10_240), "n", now).expect("fits");
        // A retried bind gets the same booking back.
        assert_eq!(books.reserve(&pod("a", 10_240), "n", now), Ok(a.clone()));
        // The watch has not shown the pod yet: the reservation stays.
        books.sync(vec![node(true)], vec![], &none, now);
        assert_eq!((used(&books), books.in_flight()), (10_240, 1));
        // Shown with its annotation: it stands on the record.
        let present: BTreeSet<String> = ["a".to_string()].into();
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
        books.sync(vec![node(true)], vec![], &BTreeSet::new(), now);
        books.reserve(&pod("a", 1_024), "n", now).expect("fits");
        books.reserve(&pod("b", 2_048), "n", now).expect("fits");
        let both: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        books.sync(vec![node(true)], vec![], &both, now);
        assert_eq!(used(&books), 3_072);
        // a deleted after it was seen: released at once; b never shown: kept.
        let only_b: BTreeSet<String> = ["b".to_string()].into();
        books.sync(vec![node(true)], vec![], &only_b, now);
        assert_eq!(used(&books), 2_048);
        let later = at("2026-12-01T00:05:00Z");
        books.sync(vec![node(true)], vec![], &BTreeSet::new(), later);
        assert_eq!((used(&books), books.in_flight()), (0, 0));
    }

    #[test]
    fn a_node_described_anew_moves_its_version_and_keeps_its_pods() {
        let now = at("2026-12-01T00:00:10Z");
        let books = Books::new(BooksConfig::default());
        books.sync(vec![node(true)], vec![], &BTreeSet::new(), now);
        let a = books.reserve(&pod("a", 1_024), "n", now).expect("fits");
        let before = books.node_books("n").expect("n").version();
        let present: BTreeSet<String> = ["a".to_string()].into();
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
        let present: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
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
}
