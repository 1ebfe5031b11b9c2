//! The extender's HTTP shell: `POST /filter`, `POST /prioritize`, `POST /bind` decoded
//! and encoded here, decided by [`Books`]; the bind's two writes; and the watch loop
//! that keeps the books current ([`keep_books`]).
//!
//! Bounds as the webhook's ([`Limits`]): connections capped (one over the cap is
//! dropped), per-connection header/request/idle timeouts, body ≤ `max_body` (413).
//!
//! ```text
//! /bind: GET pod (UID checked) ─► Books::reserve (no lock held while fitting)
//!        ─► PATCH pod: tessera.io/vgpu-assignment ─► POST pods/<name>/binding
//!        a failed write releases the reservation; the scheduler retries the pod
//! ```

use super::records::{self, AssignmentRecord, ASSIGNMENT_ANNOTATION};
use super::state::{BindError, Books};
use super::wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    MAX_EXTENDER_PRIORITY,
};
use crate::controller::cache::{feed, Store};
use crate::controller::error::{Error, Result};
use crate::controller::metrics::ExtenderMetrics;
use crate::controller::webhook_server::{
    accept_backoff, drive, error, next_connection, read_body, reply, ConnectionSlots, Limits,
};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, Patch, PatchParams, PostParams};
use kube::Api;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The extender: its books, the client its binds write with, and what it counts
/// (served on the controller's `/metrics`).
pub struct Extender {
    pub books: Arc<Books>,
    pub client: kube::Client,
    pub limits: Limits,
    pub metrics: ExtenderMetrics,
}

/// Serves the extender on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    extender: Arc<Extender>,
    shutdown: CancellationToken,
) -> Result<()> {
    let slots = ConnectionSlots::new(&extender.limits);
    let mut backoff = accept_backoff();
    let mut listener = listener;
    loop {
        let Some((io, peer)) =
            next_connection(&mut listener, &mut backoff, &shutdown, "extender", || {}).await
        else {
            return Ok(());
        };
        let Some(slot) = slots.admit() else {
            debug!(%peer, "extender: too many connections; dropped");
            continue;
        };
        let (extender, shutdown) = (extender.clone(), shutdown.clone());
        tokio::spawn(async move {
            let Some(slot) = slot.await else {
                debug!(%peer, "extender: no free connection slot; dropped");
                return;
            };
            let limits = extender.limits.clone();
            drive(io, peer, limits, shutdown, move |req| {
                let extender = extender.clone();
                async move { extender.handle(req).await }
            })
            .await;
            drop(slot);
        });
    }
}

fn json<T: Serialize>(value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => reply(StatusCode::OK, body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding: {e}")),
    }
}

impl Extender {
    async fn handle(&self, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let verb = match (req.method().as_str(), req.uri().path()) {
            ("POST", path @ ("/filter" | "/prioritize" | "/bind")) => path.to_string(),
            (_, "/filter" | "/prioritize" | "/bind") => {
                return error(StatusCode::METHOD_NOT_ALLOWED, "use POST".into())
            }
            _ => return error(StatusCode::NOT_FOUND, "not found".into()),
        };
        let max = self.limits.max_body;
        let body = match read_body(req.into_body(), max).await {
            Ok(b) => b,
            Err(answer) => return answer,
        };
        let now = Timestamp::now();
        let started = std::time::Instant::now();
        let answer = match verb.as_str() {
            "/bind" => match serde_json::from_slice::<ExtenderBindingArgs>(&body) {
                Ok(args) => {
                    let result = self.bind(&args, now).await;
                    let bound = if result.error.is_empty() {
                        "bound"
                    } else {
                        "refused"
                    };
                    self.metrics.bound(bound);
                    json(&result)
                }
                Err(e) => {
                    self.metrics.bound("refused");
                    bad_request("ExtenderBindingArgs", &e)
                }
            },
            _ => match serde_json::from_slice::<ExtenderArgs>(&body) {
                Ok(args) if verb == "/filter" => {
                    let result = self.filter(&args, now);
                    self.metrics.filtered(result.outcome());
                    json(&result)
                }
                Ok(args) => json(&self.prioritize(&args, now)),
                Err(e) => {
                    if verb == "/filter" {
                        self.metrics.filtered("error");
                    }
                    bad_request("ExtenderArgs", &e)
                }
            },
        };
        self.metrics
            .observe(verb.trim_start_matches('/'), started.elapsed());
        answer
    }

    /// `POST /filter`.
    pub fn filter(&self, args: &ExtenderArgs, now: Timestamp) -> ExtenderFilterResult {
        filter_answer(&self.books, args, now)
    }

    /// `POST /prioritize`.
    pub fn prioritize(&self, args: &ExtenderArgs, now: Timestamp) -> Vec<HostPriority> {
        prioritize_answer(&self.books, args, now)
    }

    /// `POST /bind`: reserve, record the assignment on the pod, create the Binding.
    pub async fn bind(&self, args: &ExtenderBindingArgs, now: Timestamp) -> ExtenderBindingResult {
        match self.try_bind(args, now).await {
            Ok(()) => ExtenderBindingResult::default(),
            Err(why) => {
                info!(pod = %args.pod_name, namespace = %args.pod_namespace, node = %args.node,
                      %why, "bind refused");
                ExtenderBindingResult { error: why }
            }
        }
    }

    async fn try_bind(
        &self,
        args: &ExtenderBindingArgs,
        now: Timestamp,
    ) -> std::result::Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let pod = pods
            .get(&args.pod_name)
            .await
            .map_err(|e| format!("reading pod {}/{}: {e}", args.pod_namespace, args.pod_name))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if uid != args.pod_uid {
            return Err(format!(
                "pod {}/{} is now UID {uid}, not {}; it was recreated",
                args.pod_namespace, args.pod_name, args.pod_uid
            ));
        }
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            // A retried bind whose answer was lost: done already.
            Some(bound) if bound == args.node => return Ok(()),
            Some(bound) if !bound.is_empty() => {
                return Err(format!(
                    "pod {}/{} is already bound to {bound}",
                    args.pod_namespace, args.pod_name
                ))
            }
            _ => {}
        }
        // A pod without vGPUs books none, but its CPU and memory are held on the node
        // until the watch shows it bound.
        let assignment = self
            .books
            .reserve(&pod, &args.node, now)
            .map_err(|e| e.to_string())?;
        if let Some(assignment) = &assignment {
            let record = AssignmentRecord::of(assignment);
            if let Err(e) = self.annotate(&pods, args, Some(&record)).await {
                self.books.release(&uid);
                return Err(e);
            }
        }
        if let Err(e) = self.create_binding(&pods, args).await {
            self.books.release(&uid);
            if assignment.is_some() {
                // Best effort: a leftover annotation only holds room until the pod's
                // next bind rewrites it or the pod goes.
                let _ = self.annotate(&pods, args, None).await;
            }
            return Err(e);
        }
        Ok(())
    }

    async fn annotate(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
        record: Option<&AssignmentRecord>,
    ) -> std::result::Result<(), String> {
        let value = match record {
            Some(r) => serde_json::Value::String(
                serde_json::to_string(r).map_err(|e| format!("encoding the assignment: {e}"))?,
            ),
            None => serde_json::Value::Null,
        };
        // The UID in the patch is a precondition: the API server refuses to change it,
        // so a pod recreated under the same name is not annotated.
        let patch = serde_json::json!({"metadata": {"uid": args.pod_uid,
            "annotations": {ASSIGNMENT_ANNOTATION: value}}});
        let name = &args.pod_name;
        pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("recording the assignment on pod {name}: {e}"))
    }

    async fn create_binding(
        &self,
        pods: &Api<Pod>,
        args: &ExtenderBindingArgs,
    ) -> std::result::Result<(), String> {
        let binding = serde_json::json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace,
                         "uid": args.pod_uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        });
        pods.create_subresource::<serde_json::Value, serde_json::Value>(
            "binding",
            &args.pod_name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("binding pod {} to {}: {e}", args.pod_name, args.node))
    }
}

/// The answer to `POST /filter` from `books`.
pub fn filter_answer(books: &Books, args: &ExtenderArgs, now: Timestamp) -> ExtenderFilterResult {
    if !books.synced() {
        return ExtenderFilterResult {
            error: BindError::NotSynced.to_string(),
            ..Default::default()
        };
    }
    let names = args.node_names();
    let out = books.filter(&args.pod, &names, now);
    if let Some(summary) = &out.summary {
        debug!(pod = ?args.pod.metadata.name, %summary, "fits no node");
    }
    let passed: Vec<String> = out.fits;
    let nodes = args.nodes.as_ref().map(|list| {
        let fit: std::collections::HashSet<&str> = passed.iter().map(String::as_str).collect();
        let items: Vec<&serde_json::Value> = list
            .items
            .iter()
            .filter(|n| {
                n["metadata"]["name"]
                    .as_str()
                    .is_some_and(|name| fit.contains(name))
            })
            .collect();
        serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "items": items})
    });
    ExtenderFilterResult {
        nodenames: args.nodenames.is_some().then_some(passed),
        nodes,
        failed_nodes: out.failed,
        failed_and_unresolvable_nodes: out.unresolvable,
        error: String::new(),
    }
}

/// The answer to `POST /prioritize` from `books`: every candidate scored 0..=10 by
/// the placement engine ([`Books::prioritize`]); those that do not fit get 0.
pub fn prioritize_answer(books: &Books, args: &ExtenderArgs, now: Timestamp) -> Vec<HostPriority> {
    books
        .prioritize(&args.pod, &args.node_names(), now)
        .into_iter()
        .map(|(host, score)| HostPriority {
            host,
            score: i64::from(score).min(MAX_EXTENDER_PRIORITY),
        })
        .collect()
}

fn bad_request(what: &str, e: &serde_json::Error) -> Response<Full<Bytes>> {
    error(
        StatusCode::BAD_REQUEST,
        format!("body is not a valid {what}: {e}"),
    )
}

/// Binds `addr` for the extender (errors name the flag).
pub async fn bind_listener(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|source| Error::Io {
        what: format!("--extender-addr {addr}"),
        source,
    })
}

/// Keeps `books` current from the cluster until `shutdown`: Nodes and Pods are
/// watched into caches ([`feed`]); after each change (a short pause gathers a burst)
/// the books are synced with every node's record and every pod's assignment.
pub async fn keep_books(client: kube::Client, books: Arc<Books>, shutdown: CancellationToken) {
    let stores = Arc::new([
        Store::new(ApiResource::erase::<Node>(&()), None, false),
        Store::new(ApiResource::erase::<Pod>(&()), None, false),
    ]);
    let notify = Arc::new(Notify::new());
    for i in 0..stores.len() {
        let (client, stores, notify, shutdown) = (
            client.clone(),
            stores.clone(),
            notify.clone(),
            shutdown.child_token(),
        );
        tokio::spawn(async move { feed(client, &stores[i], notify, shutdown).await });
    }
    let mut last_problems = Vec::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = notify.notified() => {}
            // Heartbeats age without events; bind reservations expire.
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let [nodes, pods] = &*stores;
        if !(nodes.synced() && pods.synced()) {
            continue;
        }
        let node_states = nodes.filter_map(records::node_state);
        let present = pods.filter_map(records::pod_host).into_iter().collect();
        let mut problems = Vec::new();
        let assignments = pods
            .filter_map(records::pod_assignment)
            .into_iter()
            .filter_map(|r| r.map_err(|e| problems.push(e)).ok())
            .collect();
        problems.extend(books.sync(node_states, assignments, &present, Timestamp::now()));
        // Said once, not on every sync while it lasts.
        if problems != last_problems {
            for p in &problems {
                warn!(problem = %p, "vGPU books");
            }
            last_problems = problems;
        }
    }
}
