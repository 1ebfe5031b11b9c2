//! The autoscaler's metrics, with KEDA's operator names and labels (`keda_` →
//! `tessera_`), so a KEDA dashboard or alert carries over by renaming the prefix:
//!
//! | metric | labels | KEDA's |
//! |---|---|---|
//! | `tessera_scaler_active` | namespace, scaledObject, scaler, triggerIndex, metric, type | `keda_scaler_active` |
//! | `tessera_scaler_metrics_value` | same | `keda_scaler_metrics_value` |
//! | `tessera_scaler_metrics_latency_seconds` | same | `keda_scaler_metrics_latency_seconds` |
//! | `tessera_scaler_detail_errors_total` | same | `keda_scaler_detail_errors_total` |
//! | `tessera_scaled_object_errors_total` | namespace, scaledObject | `keda_scaled_object_errors_total` |
//! | `tessera_internal_scale_loop_latency_seconds` | namespace, type, resource | `keda_internal_scale_loop_latency_seconds` |
//! | `tessera_scaler_replicas` | namespace, scaledObject, state (`target`, `desired`, `serving`) | Tessera's |
//!
//! `scaler` is `prometheusScaler` (the only trigger type), `metric` KEDA's external metric
//! name `s<index>-prometheus`, `type` `scaledobject`. `tessera_scaler_replicas` shows what
//! the coupling adds: replicas the target asks for (`target`), the decision (`desired`)
//! and those admitted and placed (`serving`). A scaler's series go when the scaler does.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)]
pub struct TriggerLabels {
    pub namespace: String,
    pub scaledObject: String,
    pub scaler: String,
    pub triggerIndex: String,
    pub metric: String,
    pub r#type: String,
}

impl TriggerLabels {
    /// The labels of trigger `index` of scaler `namespace/name`.
    pub fn new(namespace: &str, name: &str, index: usize) -> Self {
        TriggerLabels {
            namespace: namespace.into(),
            scaledObject: name.into(),
            scaler: "prometheusScaler".into(),
            triggerIndex: index.to_string(),
            metric: format!("s{index}-prometheus"),
            r#type: "scaledobject".into(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)]
pub struct ObjectLabels {
    pub namespace: String,
    pub scaledObject: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct LoopLabels {
    pub namespace: String,
    pub r#type: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
#[allow(non_snake_case)]
pub struct ReplicaLabels {
    pub namespace: String,
    pub scaledObject: String,
    pub state: String,
}

type FloatGauges<L> = Family<L, Gauge<f64, AtomicU64>>;

/// What one poll of one scaler measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollRecord {
    /// Per trigger, in spec order: the value read (`None`: the query failed), whether
    /// it is above the activation threshold, and how long the query took.
    pub triggers: Vec<(Option<f64>, bool, Duration)>,
    /// How late the poll ran after it was due.
    pub lag: Duration,
    /// The poll failed somewhere (target unreadable, a query failed).
    pub failed: bool,
    /// `(target, desired, serving)` replicas, when the target was read.
    pub replicas: Option<(u32, u32, u32)>,
}

/// The autoscaler's families (cloned handles share the series).
#[derive(Clone, Debug, Default)]
pub struct ScalerMetrics {
    pub active: Family<TriggerLabels, Gauge>,
    pub value: FloatGauges<TriggerLabels>,
    pub latency: FloatGauges<TriggerLabels>,
    pub trigger_errors: Family<TriggerLabels, Counter>,
    pub object_errors: Family<ObjectLabels, Counter>,
    pub loop_latency: FloatGauges<LoopLabels>,
    pub replicas: Family<ReplicaLabels, Gauge>,
}

impl ScalerMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ScalerMetrics::default();
        registry.register(
            "scaler_active",
            "Whether the trigger is active: its value above its activationThreshold (1) or not (0)",
            m.active.clone(),
        );
        registry.register(
            "scaler_metrics_value",
            "The trigger's last value, as the scaling formula used it",
            m.value.clone(),
        );
        registry.register(
            "scaler_metrics_latency_seconds",
            "How long the trigger's last query took",
            m.latency.clone(),
        );
        registry.register(
            "scaler_detail_errors",
            "Failed queries per trigger (server down, timeout, several series, NaN, an empty result not ignored)",
            m.trigger_errors.clone(),
        );
        registry.register(
            "scaled_object_errors",
            "Polls of the InferenceScaler that failed somewhere (its target or a trigger)",
            m.object_errors.clone(),
        );
        registry.register(
            "internal_scale_loop_latency_seconds",
            "How late the InferenceScaler's last poll ran after it was due",
            m.loop_latency.clone(),
        );
        registry.register(
            "scaler_replicas",
            "The target's replicas (target), the last decision (desired) and the replicas admitted and placed (serving)",
            m.replicas.clone(),
        );
        m
    }

    /// Records one poll of scaler `namespace/name`.
    pub fn record(&self, namespace: &str, name: &str, poll: &PollRecord) {
        for (i, (value, active, took)) in poll.triggers.iter().enumerate() {
            let labels = TriggerLabels::new(namespace, name, i);
            self.latency.get_or_create(&labels).set(took.as_secs_f64());
            match value {
                Some(v) => {
                    self.value.get_or_create(&labels).set(*v);
                    self.active.get_or_create(&labels).set(i64::from(*active));
                }
                None => {
                    self.trigger_errors.get_or_create(&labels).inc();
                }
            }
        }
        let object = ObjectLabels {
            namespace: namespace.into(),
            scaledObject: name.into(),
        };
        if poll.failed {
            self.object_errors.get_or_create(&object).inc();
        }
        self.loop_latency
            .get_or_create(&loop_labels(namespace, name))
            .set(poll.lag.as_secs_f64());
        if let Some((target, desired, serving)) = poll.replicas {
            for (state, n) in [
                ("target", target),
                ("desired", desired),
                ("serving", serving),
            ] {
                self.replicas
                    .get_or_create(&replica_labels(namespace, name, state))
                    .set(i64::from(n));
            }
        }
    }

    /// Removes every series of scaler `namespace/name` (it was deleted, or its spec
    /// changed and its triggers may have), its `triggers` triggers included.
    pub fn forget(&self, namespace: &str, name: &str, triggers: usize) {
        for i in 0..triggers {
            let labels = TriggerLabels::new(namespace, name, i);
            self.active.remove(&labels);
            self.value.remove(&labels);
            self.latency.remove(&labels);
            self.trigger_errors.remove(&labels);
        }
        self.object_errors.remove(&ObjectLabels {
            namespace: namespace.into(),
            scaledObject: name.into(),
        });
        self.loop_latency.remove(&loop_labels(namespace, name));
        for state in ["target", "desired", "serving"] {
            self.replicas
                .remove(&replica_labels(namespace, name, state));
        }
    }
}

fn loop_labels(namespace: &str, name: &str) -> LoopLabels {
    LoopLabels {
        namespace: namespace.into(),
        r#type: "scaledobject".into(),
        resource: name.into(),
    }
}

fn replica_labels(namespace: &str, name: &str, state: &str) -> ReplicaLabels {
    ReplicaLabels {
        namespace: namespace.into(),
        scaledObject: name.into(),
        state: state.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn scrape(registry: &Registry) -> String {
        let mut out = String::new();
        encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn a_poll_shows_under_kedas_names_and_labels_and_goes_with_its_scaler() {
        let mut registry = Registry::with_prefix("tessera");
        let m = ScalerMetrics::register(&mut registry);
        let poll = PollRecord {
            triggers: vec![
                (Some(250.0), true, Duration::from_millis(12)),
                (None, false, Duration::from_millis(3000)),
            ],
            lag: Duration::from_millis(180),
            failed: true,
            replicas: Some((2, 3, 2)),
        };
        m.record("web", "chat", &poll);
        let text = scrape(&registry);
        let first = r#"namespace="web",scaledObject="chat",scaler="prometheusScaler",triggerIndex="0",metric="s0-prometheus",type="scaledobject""#;
        let second = first
            .replace("triggerIndex=\"0\"", "triggerIndex=\"1\"")
            .replace("s0-", "s1-");
        for line in [
            format!("tessera_scaler_metrics_value{{{first}}} 250.0"),
            format!("tessera_scaler_active{{{first}}} 1"),
            format!("tessera_scaler_metrics_latency_seconds{{{first}}} 0.012"),
            format!("tessera_scaler_detail_errors_total{{{second}}} 1"),
            "tessera_scaled_object_errors_total{namespace=\"web\",scaledObject=\"chat\"} 1".into(),
            "tessera_internal_scale_loop_latency_seconds{namespace=\"web\",type=\"scaledobject\",resource=\"chat\"} 0.18".into(),
            "tessera_scaler_replicas{namespace=\"web\",scaledObject=\"chat\",state=\"desired\"} 3".into(),
        ] {
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        assert!(
            !text.contains(&format!("tessera_scaler_metrics_value{{{second}}}")),
            "a failed query has no value"
        );
        m.forget("web", "chat", 2);
        let text = scrape(&registry);
        assert!(!text.contains("scaledObject=\"chat\""), "{text}");
        assert!(!text.contains("resource=\"chat\""), "{text}");
    }
}
