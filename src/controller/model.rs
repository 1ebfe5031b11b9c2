//! What one pass reads and what it decides: the [`Snapshot`] of the API server in, the
//! [`Plan`] of [`Action`]s out, and the object references both name. A leaf of the pass
//! modules: [`super::decide`], [`super::incremental`], [`super::pods_ready`] and the
//! [`super::reconciler`] that applies a plan all take their types from here.

use super::requeue_book::{Entry, Forget};
use super::serving::{Owner, ServingKind};
use super::time::Millis;
use super::workload_record::Update;
use crate::quota::api::{ClusterQueue, LocalQueue, ResourceFlavor, WorkloadPriorityClass};
use crate::quota::{LocalQueueGauges, QueueGauges, WaitForPodsReady};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Everything a pass reads from the API server.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub now: Millis,
    pub flavors: Vec<ResourceFlavor>,
    pub cluster_queues: Vec<ClusterQueue>,
    pub local_queues: Vec<LocalQueue>,
    pub priority_classes: Vec<WorkloadPriorityClass>,
    pub namespaces: Vec<(String, BTreeMap<String, String>)>,
    /// Pods (JSON as the API server returns them); only those naming a queue matter.
    pub pods: Vec<Value>,
    /// batch/v1 Jobs.
    pub jobs: Vec<Value>,
    /// apps/v1 ReplicaSets, Deployments and StatefulSets (owners of serving replicas).
    pub replica_sets: Vec<Value>,
    pub deployments: Vec<Value>,
    pub stateful_sets: Vec<Value>,
    /// resource.k8s.io ResourceClaimTemplates and ResourceClaims pods refer to.
    pub claim_templates: Vec<Value>,
    pub claims: Vec<Value>,
    /// DRA device class name → quota resource (Kueue's `deviceClassMappings`); a class
    /// not listed counts as a resource of its own name.
    pub device_classes: BTreeMap<String, String>,
    /// Pods whose eviction was refused (429, a PodDisruptionBudget) and when to retry.
    pub blocked: BTreeMap<ObjRef, Blocked>,
    /// Kueue's `waitForPodsReady`, when enabled.
    pub pods_ready: Option<WaitForPodsReady>,
    /// The `Workload` records, whose `status.requeueState` keeps the requeue state of
    /// pod groups and pods without a serving owner ([`super::requeue_state`]; read only
    /// with `waitForPodsReady`).
    pub records: Vec<Value>,
    /// The place each waiting workload's `Workload` record shows
    /// (`status.positionInClusterQueue`), by workload key: a workload's place is
    /// written there alone (its pods carry the reason and the sentence).
    pub record_places: BTreeMap<String, String>,
    /// The ClusterQueue each admitted workload's `Workload` record names
    /// (`status.admission.clusterQueue`), by workload key.
    pub admitted_by: BTreeMap<String, String>,
}

/// Kind of object a workload is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjKind {
    Pod,
    Job,
    /// Owners of serving replicas (only annotated, never admitted themselves).
    Deployment,
    ReplicaSet,
    StatefulSet,
}

impl ObjKind {
    /// The API kind (`Pod`, `Job`, …), as the cache's stores name theirs.
    pub fn name(self) -> &'static str {
        match self {
            ObjKind::Pod => "Pod",
            ObjKind::Job => "Job",
            ObjKind::Deployment => "Deployment",
            ObjKind::ReplicaSet => "ReplicaSet",
            ObjKind::StatefulSet => "StatefulSet",
        }
    }
}

impl From<ServingKind> for ObjKind {
    fn from(k: ServingKind) -> Self {
        match k {
            ServingKind::Deployment => ObjKind::Deployment,
            ServingKind::ReplicaSet => ObjKind::ReplicaSet,
            ServingKind::StatefulSet => ObjKind::StatefulSet,
        }
    }
}

/// One object of a workload.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjRef {
    pub kind: ObjKind,
    pub namespace: String,
    pub name: String,
}

/// What the reconciler does.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Ungate these pods / unsuspend this Job, adding the flavors' node labels to the
    /// node selector. `partial` is the pod count of a partial admission: a Job's new
    /// `parallelism`, recorded on a pod group's ungated pods; `excess` are the gated
    /// pods of such a group beyond it, deleted once the others are ungated.
    Admit {
        workload: String,
        objects: Vec<ObjRef>,
        node_selector: BTreeMap<String, String>,
        /// A pod group of several pod sets: each pod's own selector (its pod set's
        /// flavors' labels), by pod name, in place of `node_selector`.
        pod_selectors: BTreeMap<String, BTreeMap<String, String>>,
        partial: Option<u32>,
        excess: Vec<ObjRef>,
    },
    /// Evict these pods through the Eviction API with their grace period (seconds) /
    /// suspend this Job. `by` is the preemptor (empty for a pods-ready timeout);
    /// `requeue` is the new requeue count of a workload evicted for a pods-ready timeout,
    /// recorded on every object (a serving owner listed here is only annotated).
    Evict {
        workload: String,
        objects: Vec<(ObjRef, i64)>,
        reason: String,
        by: String,
        requeue: Option<u32>,
    },
    /// All pods of the admitted workload are Ready: record it (the timeout is over).
    /// `queued_at` / `admitted_at`: when it was created or last requeued, and admitted,
    /// as its objects say (for the ready-wait metrics).
    PodsReady {
        workload: String,
        object: ObjRef,
        queued_at: Millis,
        admitted_at: Millis,
    },
    /// Record why the workload waits (pod condition / Job annotations), and an Event
    /// when the reason is new: a message alone changing (a queue position moving) is
    /// written but not announced.
    Pending {
        workload: String,
        objects: Vec<ObjRef>,
        reason: String,
        message: String,
        new_reason: bool,
    },
    /// Annotate a serving owner with its admitted / desired replicas (`"2/4"`).
    Replicas { owner: ObjRef, value: String },
    /// Write the requeue state of pod groups and pods without a serving owner onto their
    /// records in one namespace ([`super::requeue_state`]): `set` comes before the
    /// evictions of the same pass, which are not done when it fails; `forget` (record
    /// name → how) clears or deletes states that still hold the value read.
    RequeueState {
        namespace: String,
        set: Vec<Entry>,
        forget: BTreeMap<String, Forget>,
    },
}

/// The outcome of one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Objects that could not be used (logged by the reconciler).
    pub problems: Vec<String>,
    /// Workloads admitted after this pass (running before, or admitted now).
    pub admitted: BTreeSet<String>,
    /// Per ClusterQueue: (admitted, pending) workloads.
    pub queue_counts: BTreeMap<String, (usize, usize)>,
    /// Per serving owner: (admitted, desired) replicas.
    pub serving: BTreeMap<Owner, (u32, u32)>,
    /// The engine's earliest timer after this pass (a minimum runtime running out, …):
    /// until then, the same objects decide the same.
    pub next_timer: Option<Millis>,
    /// Every ClusterQueue's books after this pass, sorted by name (the metrics' gauges).
    pub queues: Vec<QueueGauges>,
    /// Every LocalQueue's books after this pass, sorted by namespace and name.
    pub local_queues: Vec<LocalQueueGauges>,
    /// The workloads this plan admits or evicts and the preemptors it names, by key:
    /// what the metrics count them under.
    pub subjects: BTreeMap<String, Subject>,
    /// What this plan says about the `Workload` records of the workloads it names.
    pub records: Vec<Update>,
}

/// A workload the metrics count ([`Plan::subjects`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// The ClusterQueue it waits or runs in.
    pub cluster_queue: String,
    /// The LocalQueue it was submitted to: `(namespace, name)`.
    pub local_queue: (String, String),
    /// When it was created, or requeued (what its wait for admission runs from).
    pub created: Millis,
    /// The engine admitted it in this pass (an `Admit` that only finishes an earlier
    /// admission, after a restart or a failed write, is not a new admission).
    pub admitted_now: bool,
}

/// A pod whose eviction was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// Not retried before this time.
    pub until: Millis,
    /// The backoff that set `until` (stable between two tries, so the pending message
    /// does not change every pass).
    pub delay: Millis,
    /// Refusals in a row.
    pub attempts: u32,
    /// The API server's message.
    pub why: String,
}
