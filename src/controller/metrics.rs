//! The controller's Prometheus metrics: one [`ControllerMetrics`] owning a
//! `tessera_`-prefixed registry, updated after each pass from what
//! [`super::pass_metrics`] computes (pure) and served as OpenMetrics text on the probes
//! listener (`GET /metrics` on `--probe-addr`). Names, labels and values are Kueue's
//! with `kueue_` → `tessera_` (docs/controller-metrics.md has the table):
//!
//! | metric | labels |
//! |---|---|
//! | `tessera_pending_workloads` | cluster_queue, status (`active`, `inadmissible`) |
//! | `tessera_admitted_workloads_total` | cluster_queue |
//! | `tessera_admission_wait_time_seconds` (histogram) | cluster_queue |
//! | `tessera_evicted_workloads_total` | cluster_queue, reason |
//! | `tessera_preempted_workloads_total` | preempting_cluster_queue, reason |
//! | `tessera_admission_attempts_total` | result (`success`, `inadmissible`) |
//! | `tessera_admission_attempt_duration_seconds` (histogram) | result |
//! | `tessera_cluster_queue_status` | cluster_queue, status (`pending`, `active`, `terminating`) |
//! | `tessera_cluster_queue_resource_usage`, `_resource_reservation`, `_nominal_quota`, `_borrowing_limit`, `_lending_limit` | cohort, cluster_queue, flavor, resource |
//! | `tessera_admitted_active_workloads` | cluster_queue |
//! | `tessera_local_queue_pending_workloads` | name, namespace, status (`active`, `inadmissible`) |
//! | `tessera_local_queue_admitted_workloads_total`, `_admission_wait_time_seconds` (histogram), `_admitted_active_workloads` | name, namespace |
//! | `tessera_local_queue_evicted_workloads_total` | name, namespace, reason |
//! | `tessera_local_queue_status` | name, namespace, active (`True`, `False`, `Unknown`) |
//! | `tessera_local_queue_resource_usage`, `_resource_reservation` | name, namespace, flavor, resource |
//! | `tessera_extender_filter_requests_total` | result (`fit`, `unschedulable`, `error`) |
//! | `tessera_extender_bind_requests_total` | result (`bound`, `refused`) |
//! | `tessera_extender_request_duration_seconds` (histogram) | verb (`filter`, `prioritize`, `bind`) |
//! | `tessera_scaler_*`, `tessera_scaled_object_errors_total`, ... | KEDA's ([`super::scaler_metrics`]) |
//!
//! Gauges hold the last pass's books: a ClusterQueue or quota gone from them loses its
//! series at the next update. Only the leader runs passes: a standby's gauges stay empty,
//! and a leader that loses the Lease drops its own ([`ControllerMetrics::forget_books`]).

use super::model::Plan;
use super::pass_metrics::{self, QuotaRow};
use super::time::Millis;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QueueLabels {
    pub cluster_queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QueueStatusLabels {
    pub cluster_queue: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct EvictedLabels {
    pub cluster_queue: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PreemptedLabels {
    pub preempting_cluster_queue: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct VerbLabels {
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QuotaLabels {
    pub cohort: String,
    pub cluster_queue: String,
    pub flavor: String,
    pub resource: String,
}

/// A LocalQueue: Kueue's `name` and `namespace` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LocalQueueLabels {
    pub name: String,
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LocalQueueStatusLabels {
    pub name: String,
    pub namespace: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LocalQueueActiveLabels {
    pub name: String,
    pub namespace: String,
    pub active: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LocalQueueEvictedLabels {
    pub name: String,
    pub namespace: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LocalQuotaLabels {
    pub name: String,
    pub namespace: String,
    pub flavor: String,
    pub resource: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type FloatGauges = Family<QuotaLabels, Gauge<f64, AtomicU64>>;

fn wait_histogram() -> Histogram {
    Histogram::new(pass_metrics::wait_buckets())
}

/// Prometheus's default buckets (seconds), Kueue's for its attempt duration.
fn default_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

/// Extender requests take well under a millisecond to decide: 100 µs … ~2.6 s.
fn request_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.5, 12,
    ))
}

/// The scheduler extender's counters (in the controller's registry when the extender
/// runs in the controller process; a default one counts unseen, for tests).
#[derive(Clone, Debug)]
pub struct ExtenderMetrics {
    pub filter_requests: Family<ResultLabels, Counter>,
    pub bind_requests: Family<ResultLabels, Counter>,
    pub request_duration: HistogramFamily<VerbLabels>,
}

impl Default for ExtenderMetrics {
    fn default() -> Self {
        ExtenderMetrics {
            filter_requests: Family::default(),
            bind_requests: Family::default(),
            request_duration: Family::new_with_constructor(request_histogram as fn() -> Histogram),
        }
    }
}

impl ExtenderMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = ExtenderMetrics::default();
        registry.register(
            "extender_filter_requests",
            "Scheduler extender filter requests by result: fit (some node passes), unschedulable (none), error",
            m.filter_requests.clone(),
        );
        registry.register(
            "extender_bind_requests",
            "Scheduler extender bind requests by result: bound or refused",
            m.bind_requests.clone(),
        );
        registry.register(
            "extender_request_duration_seconds",
            "Time the scheduler extender took to answer a request, per verb",
            m.request_duration.clone(),
        );
        m
    }

    /// One request of `verb` answered in `took`.
    pub fn observe(&self, verb: &str, took: Duration) {
        self.request_duration
            .get_or_create(&VerbLabels { verb: verb.into() })
            .observe(took.as_secs_f64());
    }

    /// A filter request's result.
    pub fn filtered(&self, result: &str) {
        self.filter_requests
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// A bind request's result.
    pub fn bound(&self, result: &str) {
        self.bind_requests
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }
}

/// The gauge series the last update wrote (removed when the next one does not).
#[derive(Default, Debug)]
struct Written {
    pending: BTreeSet<QueueStatusLabels>,
    status: BTreeSet<QueueStatusLabels>,
    quota: BTreeSet<QuotaLabels>,
    borrowing: BTreeSet<QuotaLabels>,
    lending: BTreeSet<QuotaLabels>,
    admitted_active: BTreeSet<QueueLabels>,
    lq_pending: BTreeSet<LocalQueueStatusLabels>,
    lq_status: BTreeSet<LocalQueueActiveLabels>,
    lq_admitted_active: BTreeSet<LocalQueueLabels>,
    lq_quota: BTreeSet<LocalQuotaLabels>,
}

/// Everything the controller measures.
#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    pub pending: Family<QueueStatusLabels, Gauge>,
    pub admitted: Family<QueueLabels, Counter>,
    pub wait: HistogramFamily<QueueLabels>,
    pub evicted: Family<EvictedLabels, Counter>,
    pub preempted: Family<PreemptedLabels, Counter>,
    pub attempts: Family<ResultLabels, Counter>,
    pub attempt_duration: HistogramFamily<ResultLabels>,
    pub status: Family<QueueStatusLabels, Gauge>,
    pub usage: FloatGauges,
    pub reservation: FloatGauges,
    pub nominal: FloatGauges,
    pub borrowing: FloatGauges,
    pub lending: FloatGauges,
    pub admitted_active: Family<QueueLabels, Gauge>,
    /// Kueue's LocalQueue metrics (`local_queue_*`).
    pub lq_pending: Family<LocalQueueStatusLabels, Gauge>,
    pub lq_admitted: Family<LocalQueueLabels, Counter>,
    pub lq_wait: HistogramFamily<LocalQueueLabels>,
    pub lq_evicted: Family<LocalQueueEvictedLabels, Counter>,
    pub lq_admitted_active: Family<LocalQueueLabels, Gauge>,
    pub lq_status: Family<LocalQueueActiveLabels, Gauge>,
    pub lq_usage: Family<LocalQuotaLabels, Gauge<f64, AtomicU64>>,
    pub lq_reservation: Family<LocalQuotaLabels, Gauge<f64, AtomicU64>>,
    /// Kueue's quota-reservation families: without admission checks a workload's quota
    /// is reserved in the pass that admits it, so these follow the admission ones.
    pub quota_reserved: Family<QueueLabels, Counter>,
    pub quota_reserved_wait: HistogramFamily<QueueLabels>,
    pub reserving_active: Family<QueueLabels, Gauge>,
    pub lq_quota_reserved: Family<LocalQueueLabels, Counter>,
    pub lq_quota_reserved_wait: HistogramFamily<LocalQueueLabels>,
    pub lq_reserving_active: Family<LocalQueueLabels, Gauge>,
    /// Kueue's `waitForPodsReady` families: creation or requeue → all pods Ready, and
    /// admission → all pods Ready.
    pub ready_wait: HistogramFamily<QueueLabels>,
    pub admitted_until_ready: HistogramFamily<QueueLabels>,
    pub lq_ready_wait: HistogramFamily<LocalQueueLabels>,
    pub lq_admitted_until_ready: HistogramFamily<LocalQueueLabels>,
    pub extender: ExtenderMetrics,
    /// The autoscaler's (`scaler_metrics.rs`): KEDA's names.
    pub scaler: super::scaler_metrics::ScalerMetrics,
    written: Mutex<Written>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tessera");
        let m = ControllerMetrics {
            pending: Family::default(),
            admitted: Family::default(),
            wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            evicted: Family::default(),
            preempted: Family::default(),
            attempts: Family::default(),
            attempt_duration: Family::new_with_constructor(default_histogram as fn() -> Histogram),
            status: Family::default(),
            usage: Family::default(),
            reservation: Family::default(),
            nominal: Family::default(),
            borrowing: Family::default(),
            lending: Family::default(),
            admitted_active: Family::default(),
            lq_pending: Family::default(),
            lq_admitted: Family::default(),
            lq_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            lq_evicted: Family::default(),
            lq_admitted_active: Family::default(),
            lq_status: Family::default(),
            lq_usage: Family::default(),
            lq_reservation: Family::default(),
            quota_reserved: Family::default(),
            quota_reserved_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            reserving_active: Family::default(),
            lq_quota_reserved: Family::default(),
            lq_quota_reserved_wait: Family::new_with_constructor(
                wait_histogram as fn() -> Histogram,
            ),
            lq_reserving_active: Family::default(),
            ready_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            admitted_until_ready: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            lq_ready_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            lq_admitted_until_ready: Family::new_with_constructor(
                wait_histogram as fn() -> Histogram,
            ),
            extender: ExtenderMetrics::register(&mut registry),
            scaler: super::scaler_metrics::ScalerMetrics::register(&mut registry),
            written: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register(
            "pending_workloads",
            "Pending workloads per cluster_queue and status: active (in the admission queue) or inadmissible (a failed attempt; not retried until the cluster changes)",
            m.pending.clone(),
        );
        registry.register(
            "admitted_workloads",
            "Workloads admitted per cluster_queue",
            m.admitted.clone(),
        );
        registry.register(
            "admission_wait_time_seconds",
            "Time from a workload's creation or requeue until its admission, per cluster_queue",
            m.wait.clone(),
        );
        registry.register(
            "evicted_workloads",
            "Workloads evicted per cluster_queue and reason (Preempted, PodsReadyTimeout, ClusterQueueStopped)",
            m.evicted.clone(),
        );
        registry.register(
            "preempted_workloads",
            "Workloads preempted per preempting_cluster_queue and reason (InClusterQueue, InCohortReclamation, InCohortFairSharing, InCohortReclaimWhileBorrowing)",
            m.preempted.clone(),
        );
        registry.register(
            "admission_attempts",
            "Admission passes with waiting workloads: success (at least one admitted) or inadmissible",
            m.attempts.clone(),
        );
        registry.register(
            "admission_attempt_duration_seconds",
            "Time one admission pass took to decide, per result",
            m.attempt_duration.clone(),
        );
        registry.register(
            "cluster_queue_status",
            "1 for the cluster_queue's status (pending, active, terminating), 0 for the others",
            m.status.clone(),
        );
        registry.register(
            "cluster_queue_resource_usage",
            "Quota used by the cluster_queue's admitted (and still terminating) workloads, per flavor and resource",
            m.usage.clone(),
        );
        registry.register(
            "cluster_queue_resource_reservation",
            "Quota the cluster_queue reserves (used, plus held for preemptors waiting for their victims), per flavor and resource",
            m.reservation.clone(),
        );
        registry.register(
            "cluster_queue_nominal_quota",
            "The cluster_queue's nominal quota per flavor and resource",
            m.nominal.clone(),
        );
        registry.register(
            "cluster_queue_borrowing_limit",
            "The cluster_queue's borrowing limit per flavor and resource (no series: no limit)",
            m.borrowing.clone(),
        );
        registry.register(
            "cluster_queue_lending_limit",
            "The cluster_queue's lending limit per flavor and resource (no series: no limit)",
            m.lending.clone(),
        );
        registry.register(
            "admitted_active_workloads",
            "Admitted workloads per cluster_queue (unsuspended and not finished)",
            m.admitted_active.clone(),
        );
        registry.register(
            "local_queue_pending_workloads",
            "Pending workloads per local queue (name, namespace) and status: active (in the admission queue) or inadmissible (a failed attempt; not retried until the cluster changes)",
            m.lq_pending.clone(),
        );
        registry.register(
            "local_queue_admitted_workloads",
            "Workloads admitted per local queue (name, namespace)",
            m.lq_admitted.clone(),
        );
        registry.register(
            "local_queue_admission_wait_time_seconds",
            "Time from a workload's creation or requeue until its admission, per local queue (name, namespace)",
            m.lq_wait.clone(),
        );
        registry.register(
            "local_queue_evicted_workloads",
            "Workloads evicted per local queue (name, namespace) and reason (Preempted, PodsReadyTimeout, ClusterQueueStopped)",
            m.lq_evicted.clone(),
        );
        registry.register(
            "local_queue_admitted_active_workloads",
            "Admitted workloads per local queue (name, namespace)",
            m.lq_admitted_active.clone(),
        );
        registry.register(
            "local_queue_status",
            "1 for the local queue's Active condition (True: its cluster queue exists and is active; False otherwise), 0 for the others",
            m.lq_status.clone(),
        );
        registry.register(
            "local_queue_resource_usage",
            "Quota used by the local queue's admitted (and still terminating) workloads, per flavor and resource",
            m.lq_usage.clone(),
        );
        registry.register(
            "local_queue_resource_reservation",
            "Quota the local queue's workloads reserve (used, plus held for its preemptors waiting for their victims), per flavor and resource",
            m.lq_reservation.clone(),
        );
        let reserved = [
            (
                "quota_reserved_workloads",
                "Workloads that got quota reserved per cluster_queue (here at their admission: no admission checks)",
            ),
            (
                "quota_reserved_wait_time_seconds",
                "Time from a workload's creation or requeue until its quota reservation, per cluster_queue",
            ),
            (
                "reserving_active_workloads",
                "Workloads reserving quota per cluster_queue (the admitted ones: no admission checks)",
            ),
        ];
        registry.register(reserved[0].0, reserved[0].1, m.quota_reserved.clone());
        registry.register(reserved[1].0, reserved[1].1, m.quota_reserved_wait.clone());
        registry.register(reserved[2].0, reserved[2].1, m.reserving_active.clone());
        registry.register(
            "local_queue_quota_reserved_workloads",
            "Workloads that got quota reserved per local queue (name, namespace)",
            m.lq_quota_reserved.clone(),
        );
        registry.register(
            "local_queue_quota_reserved_wait_time_seconds",
            "Time from a workload's creation or requeue until its quota reservation, per local queue (name, namespace)",
            m.lq_quota_reserved_wait.clone(),
        );
        registry.register(
            "local_queue_reserving_active_workloads",
            "Workloads reserving quota per local queue (name, namespace)",
            m.lq_reserving_active.clone(),
        );
        registry.register(
            "ready_wait_time_seconds",
            "Time from a workload's creation or requeue until all its pods were Ready, per cluster_queue (waitForPodsReady)",
            m.ready_wait.clone(),
        );
        registry.register(
            "admitted_until_ready_wait_time_seconds",
            "Time from a workload's admission until all its pods were Ready, per cluster_queue (waitForPodsReady)",
            m.admitted_until_ready.clone(),
        );
        registry.register(
            "local_queue_ready_wait_time_seconds",
            "Time from a workload's creation or requeue until all its pods were Ready, per local queue (name, namespace; waitForPodsReady)",
            m.lq_ready_wait.clone(),
        );
        registry.register(
            "local_queue_admitted_until_ready_wait_time_seconds",
            "Time from a workload's admission until all its pods were Ready, per local queue (name, namespace; waitForPodsReady)",
            m.lq_admitted_until_ready.clone(),
        );
        ControllerMetrics { registry, ..m }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Records one pass: its `plan`, the indices of the actions the reconciler applied
    /// (`done`), when (`now`) and how long it took to decide (`took`).
    pub fn record_pass(&self, plan: &Plan, done: &[usize], now: Millis, took: Duration) {
        let inc = pass_metrics::increments(plan, done, now);
        for (cq, waited) in &inc.admitted {
            let l = QueueLabels {
                cluster_queue: cq.clone(),
            };
            self.admitted.get_or_create(&l).inc();
            self.wait.get_or_create(&l).observe(*waited);
            self.quota_reserved.get_or_create(&l).inc();
            self.quota_reserved_wait.get_or_create(&l).observe(*waited);
        }
        for (cq, reason) in &inc.evicted {
            self.evicted
                .get_or_create(&EvictedLabels {
                    cluster_queue: cq.clone(),
                    reason: reason.clone(),
                })
                .inc();
        }
        for ((namespace, name), waited) in &inc.lq_admitted {
            let l = LocalQueueLabels {
                name: name.clone(),
                namespace: namespace.clone(),
            };
            self.lq_admitted.get_or_create(&l).inc();
            self.lq_wait.get_or_create(&l).observe(*waited);
            self.lq_quota_reserved.get_or_create(&l).inc();
            self.lq_quota_reserved_wait
                .get_or_create(&l)
                .observe(*waited);
        }
        for r in &inc.ready {
            let l = QueueLabels {
                cluster_queue: r.cluster_queue.clone(),
            };
            self.ready_wait.get_or_create(&l).observe(r.since_queued);
            self.admitted_until_ready
                .get_or_create(&l)
                .observe(r.since_admitted);
            let (namespace, name) = r.local_queue.clone();
            let l = LocalQueueLabels { name, namespace };
            self.lq_ready_wait.get_or_create(&l).observe(r.since_queued);
            self.lq_admitted_until_ready
                .get_or_create(&l)
                .observe(r.since_admitted);
        }
        for ((namespace, name), reason) in &inc.lq_evicted {
            self.lq_evicted
                .get_or_create(&LocalQueueEvictedLabels {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    reason: reason.clone(),
                })
                .inc();
        }
        for (cq, reason) in &inc.preempted {
            self.preempted
                .get_or_create(&PreemptedLabels {
                    preempting_cluster_queue: cq.clone(),
                    reason: reason.clone(),
                })
                .inc();
        }
        if let Some(result) = pass_metrics::attempt_result(&plan.queues, &inc) {
            let l = ResultLabels {
                result: result.into(),
            };
            self.attempts.get_or_create(&l).inc();
            self.attempt_duration
                .get_or_create(&l)
                .observe(took.as_secs_f64());
        }
        self.set_gauges(&pass_metrics::gauges(&plan.queues, &plan.local_queues));
    }

    /// Drops every queue gauge (this replica no longer holds the Lease: its books are
    /// the new leader's to report).
    pub fn forget_books(&self) {
        self.set_gauges(&pass_metrics::Gauges::default());
    }

    fn set_gauges(&self, g: &pass_metrics::Gauges) {
        let mut now = Written::default();
        let status_labels = |cq: &str, s: &str| QueueStatusLabels {
            cluster_queue: cq.to_string(),
            status: s.to_string(),
        };
        for (cq, s, v) in &g.pending {
            let l = status_labels(cq, s);
            self.pending.get_or_create(&l).set(*v);
            now.pending.insert(l);
        }
        for (cq, s, v) in &g.status {
            let l = status_labels(cq, s);
            self.status.get_or_create(&l).set(*v);
            now.status.insert(l);
        }
        for r in &g.quota {
            let l = quota_labels(r);
            self.usage.get_or_create(&l).set(r.usage);
            self.reservation.get_or_create(&l).set(r.reservation);
            self.nominal.get_or_create(&l).set(r.nominal);
            if let Some(b) = r.borrowing_limit {
                self.borrowing.get_or_create(&l).set(b);
                now.borrowing.insert(l.clone());
            }
            if let Some(b) = r.lending_limit {
                self.lending.get_or_create(&l).set(b);
                now.lending.insert(l.clone());
            }
            now.quota.insert(l);
        }
        for (cq, v) in &g.admitted_active {
            let l = QueueLabels {
                cluster_queue: cq.clone(),
            };
            self.admitted_active.get_or_create(&l).set(*v);
            self.reserving_active.get_or_create(&l).set(*v);
            now.admitted_active.insert(l);
        }
        let lq = |(namespace, name): &(String, String)| LocalQueueLabels {
            name: name.clone(),
            namespace: namespace.clone(),
        };
        for (id, s, v) in &g.lq_pending {
            let l = LocalQueueStatusLabels {
                name: id.1.clone(),
                namespace: id.0.clone(),
                status: s.to_string(),
            };
            self.lq_pending.get_or_create(&l).set(*v);
            now.lq_pending.insert(l);
        }
        for (id, s, v) in &g.lq_status {
            let l = LocalQueueActiveLabels {
                name: id.1.clone(),
                namespace: id.0.clone(),
                active: s.to_string(),
            };
            self.lq_status.get_or_create(&l).set(*v);
            now.lq_status.insert(l);
        }
        for (id, v) in &g.lq_admitted_active {
            let l = lq(id);
            self.lq_admitted_active.get_or_create(&l).set(*v);
            self.lq_reserving_active.get_or_create(&l).set(*v);
            now.lq_admitted_active.insert(l);
        }
        for r in &g.lq_quota {
            let l = LocalQuotaLabels {
                name: r.name.clone(),
                namespace: r.namespace.clone(),
                flavor: r.flavor.clone(),
                resource: r.resource.clone(),
            };
            self.lq_usage.get_or_create(&l).set(r.usage);
            self.lq_reservation.get_or_create(&l).set(r.reservation);
            now.lq_quota.insert(l);
        }
        let mut last = self.written.lock().unwrap_or_else(|e| e.into_inner());
        for l in last.pending.difference(&now.pending) {
            self.pending.remove(l);
        }
        for l in last.status.difference(&now.status) {
            self.status.remove(l);
        }
        for l in last.quota.difference(&now.quota) {
            self.usage.remove(l);
            self.reservation.remove(l);
            self.nominal.remove(l);
        }
        for l in last.borrowing.difference(&now.borrowing) {
            self.borrowing.remove(l);
        }
        for l in last.lending.difference(&now.lending) {
            self.lending.remove(l);
        }
        for l in last.admitted_active.difference(&now.admitted_active) {
            self.admitted_active.remove(l);
            self.reserving_active.remove(l);
        }
        for l in last.lq_pending.difference(&now.lq_pending) {
            self.lq_pending.remove(l);
        }
        for l in last.lq_status.difference(&now.lq_status) {
            self.lq_status.remove(l);
        }
        for l in last.lq_admitted_active.difference(&now.lq_admitted_active) {
            self.lq_admitted_active.remove(l);
            self.lq_reserving_active.remove(l);
        }
        for l in last.lq_quota.difference(&now.lq_quota) {
            self.lq_usage.remove(l);
            self.lq_reservation.remove(l);
        }
        *last = now;
    }
}

fn quota_labels(r: &QuotaRow) -> QuotaLabels {
    QuotaLabels {
        cohort: r.cohort.clone(),
        cluster_queue: r.cluster_queue.clone(),
        flavor: r.flavor.clone(),
        resource: r.resource.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{QueueGauges, QueueStatus, ResourceGauges};

    fn queue(name: &str, gpus: i64) -> QueueGauges {
        QueueGauges {
            name: name.into(),
            cohort: String::new(),
            active: 1,
            inadmissible: 2,
            admitted: 1,
            status: QueueStatus::Active,
            resources: vec![ResourceGauges {
                flavor: "h100".into(),
                resource: "nvidia.com/gpu".into(),
                nominal: gpus * 1000,
                borrowing_limit: None,
                lending_limit: None,
                usage: 1000,
                reservation: 1000,
            }],
        }
    }

    #[test]
    fn pods_ready_fills_kueues_ready_wait_histograms_per_cluster_and_local_queue() {
        use crate::controller::model::{Action, ObjKind, ObjRef, Subject};
        let now = 1_000_000;
        let plan = Plan {
            actions: vec![Action::PodsReady {
                workload: "team/pod-x".into(),
                object: ObjRef {
                    kind: ObjKind::Pod,
                    namespace: "team".into(),
                    name: "x".into(),
                },
                queued_at: now - 90_000,
                admitted_at: now - 30_000,
            }],
            subjects: [(
                "team/pod-x".to_string(),
                Subject {
                    cluster_queue: "a".into(),
                    local_queue: ("team".into(), "la".into()),
                    created: now - 90_000,
                    admitted_now: false,
                },
            )]
            .into(),
            ..Plan::default()
        };
        let m = ControllerMetrics::new();
        m.record_pass(&plan, &[0], now, Duration::from_millis(1));
        let page = m.encode();
        for line in [
            "tessera_ready_wait_time_seconds_sum{cluster_queue=\"a\"} 90.0",
            "tessera_admitted_until_ready_wait_time_seconds_sum{cluster_queue=\"a\"} 30.0",
            "tessera_local_queue_ready_wait_time_seconds_count{name=\"la\",namespace=\"team\"} 1",
            "tessera_local_queue_admitted_until_ready_wait_time_seconds_sum{name=\"la\",namespace=\"team\"} 30.0",
        ] {
            assert!(page.contains(line), "{line} in\n{page}");
        }
        // Not recorded (its write failed): nothing observed.
        let m = ControllerMetrics::new();
        m.record_pass(&plan, &[], now, Duration::from_millis(1));
        assert!(!m.encode().contains("ready_wait_time_seconds_count{"));
    }

    #[test]
    fn gauges_follow_the_books_and_a_queue_gone_loses_its_series() {
        let m = ControllerMetrics::new();
        let plan = Plan {
            queues: vec![queue("a", 4), queue("b", 2)],
            ..Plan::default()
        };
        m.record_pass(&plan, &[], 0, Duration::from_millis(3));
        let page = m.encode();
        for line in [
            "tessera_pending_workloads{cluster_queue=\"a\",status=\"inadmissible\"} 2",
            "tessera_cluster_queue_status{cluster_queue=\"b\",status=\"active\"} 1",
            "tessera_cluster_queue_nominal_quota{cohort=\"\",cluster_queue=\"a\",flavor=\"h100\",resource=\"nvidia.com/gpu\"} 4.0",
            "tessera_admission_attempts_total{result=\"inadmissible\"} 1",
            "tessera_reserving_active_workloads{cluster_queue=\"b\"} 1",
        ] {
            assert!(page.contains(line), "{line} missing from\n{page}");
        }
        let plan = Plan {
            queues: vec![queue("a", 4)],
            ..Plan::default()
        };
        m.record_pass(&plan, &[], 0, Duration::from_millis(3));
        let page = m.encode();
        assert!(!page.contains("cluster_queue=\"b\""), "{page}");
        assert!(page.contains("cluster_queue=\"a\""), "{page}");
        m.forget_books();
        let page = m.encode();
        assert!(!page.contains("tessera_pending_workloads{"), "{page}");
        assert!(
            !page.contains("tessera_reserving_active_workloads{"),
            "{page}"
        );
        assert!(
            !page.contains("tessera_cluster_queue_nominal_quota{"),
            "{page}"
        );
        // The counters stay.
        assert!(page.contains("tessera_admission_attempts_total{"), "{page}");
    }
}
