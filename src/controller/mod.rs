//! The quota controller (`tessera controller`): Kueue-style admission of pods, pod
//! groups and batch Jobs through scheduling gates and `spec.suspend`, with the pure
//! [`crate::quota`] engine deciding.
//!
//! - [`crd`]: the `tessera.io/v1alpha1` queue CRDs, derived from the engine's types.
//! - [`webhook`] (pure) and [`webhook_server`] (HTTPS): gate pods, suspend Jobs;
//!   [`tls`]: its certificate, reloaded when the files rotate; [`certs`]: or made,
//!   stored in a Secret and rotated by the controller itself (`--cert-mode=self`).
//! - Leaves every pass module imports, importing nothing of the controller above them:
//!   [`time`] (milliseconds, RFC 3339), [`model`] (the pass's [`model::Snapshot`] in,
//!   its [`model::Plan`] of actions out), [`readiness`] (what objects record about
//!   readiness and requeues, pure), [`requeue_book`] (the requeue states read from
//!   the `Workload` records, pure), [`resources`] (API resources for the CRDs and DRA kinds).
//! - [`decide`] (pure): snapshot of the API server → admit / evict / pending actions;
//!   `workloads` reads the live objects as workloads; [`incremental`] keeps the engine
//!   between passes over the watch-fed cache and applies only what changed;
//!   [`serving`] (Deployment/StatefulSet replicas) and [`claims`] (DRA devices) feed it.
//! - [`config`]: the configuration file (Kueue's `waitForPodsReady`, device classes).
//! - [`pods_ready`]: `waitForPodsReady` timeouts and requeue backoff;
//!   [`requeue_state`]: the requeue state of pod groups and pods without a serving
//!   owner, kept on their `Workload` record, which outlives their pods.
//! - [`evictions`]: retry backoff of evictions a PodDisruptionBudget refuses.
//! - [`snapshot`]: reads a pass's objects (by LIST, or from the watch-fed [`cache`]);
//!   [`reconciler`]: applies the actions, runs the loop.
//! - [`lease`]: leader election over a `coordination.k8s.io/v1` Lease.
//! - [`autoscaler`]: the live InferenceScaler loop (KEDA's polling, the pure
//!   [`crate::autoscale`] engine deciding, `/scale` patched).
//! - [`metrics`]: the Prometheus registry with Kueue's metric names (`GET /metrics` on the
//!   probe listener), updated after each pass from [`pass_metrics`] (pure: gauges from the
//!   plan's books, counters from the actions applied).
//! - [`extender`]: the kube-scheduler extender for HAMi-style vGPU pods (`--extender-addr`);
//!   [`vgpu_webhook`] (pure, `POST /vgpu`): checks vGPU pods and sends them to the
//!   scheduler profile that calls it.

#[cfg(test)]
mod apply_tests;
pub(crate) mod asked_places;
pub mod autoscaler;
pub mod cache;
pub mod certs;
pub mod claim_templates;
pub(crate) mod claims;
pub mod config;
pub mod crd;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub(crate) mod deferred_records;
pub(crate) mod error;
pub mod evictions;
pub mod extender;
mod finish_watch;
pub(crate) mod finished;
pub(crate) mod holds;
pub(crate) mod in_flight;
pub(crate) mod incremental;
#[cfg(test)]
mod incremental_tests;
pub(crate) mod lease;
pub mod metrics;
pub(crate) mod model;
pub(crate) mod pass_metrics;
pub(crate) mod pods_ready;
pub(crate) mod readiness;
pub mod reconciler;
mod record_updates;
pub(crate) mod requeue_book;
pub(crate) mod requeue_state;
#[cfg(test)]
mod requeue_state_tests;
pub(crate) mod resources;
pub mod scaler_metrics;
pub(crate) mod serving;
pub(crate) mod snapshot;
pub mod time;
pub mod tls;
pub mod vgpu_webhook;
pub mod webhook;
pub mod webhook_server;
pub(crate) mod workload_record;
pub(crate) mod workload_writer;
mod workloads;
pub(crate) mod writes;

pub use error::{Error, Result};

/// Scheduling gate the webhook adds and the controller removes on admission.
pub const ADMISSION_GATE: &str = "tessera.io/admission";
/// Priority value fixed by the webhook from the priority-class label at creation.
pub const PRIORITY_ANNOTATION: &str = "tessera.io/priority";
/// When the controller admitted the object (RFC 3339): survives restarts.
pub const ADMITTED_AT_ANNOTATION: &str = "tessera.io/admitted-at";
/// Pending reason of a suspended Job (pods carry it as a condition).
pub const PENDING_REASON_ANNOTATION: &str = "tessera.io/pending-reason";
/// Pending message of a suspended Job.
pub const PENDING_MESSAGE_ANNOTATION: &str = "tessera.io/pending-message";
/// Pod condition holding the pending reason (`status: "False"`, reason, message).
pub const CONDITION_TYPE: &str = "tessera.io/Admitted";
/// A partially admitted Job's `spec.parallelism` before admission lowered it; put back
/// when the Job is suspended again (evicted), so it queues with its full size.
pub const ORIGINAL_PARALLELISM_ANNOTATION: &str = "tessera.io/original-parallelism";
/// On the ungated pods of a partially admitted pod group: how many of its pods were
/// admitted (the rest, still gated, are deleted).
pub const ADMITTED_COUNT_ANNOTATION: &str = "tessera.io/admitted-count";
