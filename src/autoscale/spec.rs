//! An InferenceScaler's spec with KEDA's ScaledObject field names (a KEDA user copies
//! theirs and renames the kind), read with unknown fields refused, and validated into
//! [`Settings`]: every default filled in (KEDA's and the HPA's), every field checked, and
//! an error naming the field that is wrong.
//!
//! Defaults: `pollingInterval` 30 s, `cooldownPeriod` 300 s, `minReplicaCount` 0,
//! `maxReplicaCount` 100; HPA behaviour when unset: scale-up without a stabilization
//! window, at most +100 % or +4 pods per 15 s (the larger); scale-down after a 300 s
//! window, at most -100 % per 15 s.

use serde::{Deserialize, Serialize};

/// A spec that cannot be acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.{field}: {reason}")]
pub struct SpecError {
    /// The field's path under `spec` (`advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.policies[0].periodSeconds`).
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `spec` of an InferenceScaler (KEDA's ScaledObject names).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalerSpec {
    pub scale_target_ref: ScaleTargetRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polling_interval: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_period: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_replica_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replica_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replica_count: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced: Option<Advanced>,
    #[serde(default)]
    pub triggers: Vec<Trigger>,
    /// Tessera's extension (not in KEDA): when a scale-up may preempt training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<RawPreemption>,
}

/// `spec.preemption`: new replicas that need preemption wait `persistSeconds` for their
/// demand to persist, unless the metrics ask for `urgentRatio` × the replicas or more.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPreemption {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persist_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urgent_ratio: Option<f64>,
    /// How long capacity freed by a scale-down is lent only to cheap-to-reclaim work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_freed_seconds: Option<i64>,
    /// Work that loses at most this much when reclaimed (its checkpoint interval or its
    /// runtime) may borrow held capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cheap_rework_seconds: Option<i64>,
}

/// The object scaled: anything with a `/scale` subresource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleTargetRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
}

/// Replicas to run while the metric cannot be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fallback {
    pub failure_threshold: i64,
    pub replicas: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Advanced {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizontal_pod_autoscaler_config: Option<HpaConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HpaConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<RawBehavior>,
}

/// `autoscaling/v2` HorizontalPodAutoscalerBehavior.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawBehavior {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<RawRules>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<RawRules>,
}

/// `autoscaling/v2` HPAScalingRules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stabilization_window_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<RawPolicy>>,
}

/// `autoscaling/v2` HPAScalingPolicy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: i64,
    pub period_seconds: i64,
}

/// A KEDA trigger; only `prometheus` is served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Trigger {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `AverageValue` (default) or `Value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_type: Option<String>,
    /// KEDA's trigger metadata: strings, as in a ScaledObject.
    pub metadata: std::collections::BTreeMap<String, String>,
}

/// How the metric's value is compared with the threshold (HPA's external metric types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MetricType {
    /// The value is divided among the replicas: desired = ceil(value / threshold).
    AverageValue,
    /// The value is compared as is: desired = ceil(replicas × value / threshold).
    Value,
}

/// A validated Prometheus trigger.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrometheusTrigger {
    pub server_address: String,
    pub query: String,
    pub threshold: f64,
    pub activation_threshold: f64,
    pub metric_type: MetricType,
    /// An empty result reads as 0 (KEDA's default) instead of an error.
    pub ignore_null_values: bool,
}

/// Which of a direction's policies limits the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Select {
    /// The policy allowing the largest change (HPA's default).
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// One rate limit: at most `value` pods or percent per `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RatePolicy {
    Pods { value: u32, period_ms: u64 },
    Percent { value: u32, period_ms: u64 },
}

impl RatePolicy {
    pub fn period_ms(&self) -> u64 {
        match *self {
            RatePolicy::Pods { period_ms, .. } | RatePolicy::Percent { period_ms, .. } => period_ms,
        }
    }
}

/// Validated scaling rules of one direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rules {
    pub stabilization_ms: u64,
    pub select: Select,
    pub policies: Vec<RatePolicy>,
}

impl Rules {
    /// HPA's scale-up default: no window, +100 % or +4 pods per 15 s, the larger.
    pub fn hpa_up() -> Rules {
        Rules {
            stabilization_ms: 0,
            select: Select::Max,
            policies: vec![
                RatePolicy::Percent {
                    value: 100,
                    period_ms: 15_000,
                },
                RatePolicy::Pods {
                    value: 4,
                    period_ms: 15_000,
                },
            ],
        }
    }

    /// HPA's scale-down default: a 300 s window, -100 % per 15 s.
    pub fn hpa_down() -> Rules {
        Rules {
            stabilization_ms: 300_000,
            select: Select::Max,
            policies: vec![RatePolicy::Percent {
                value: 100,
                period_ms: 15_000,
            }],
        }
    }
}

/// The validated spec the engine runs on (times in milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    pub polling_ms: u64,
    pub cooldown_ms: u64,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub idle_replicas: Option<u32>,
    /// `(failure_threshold, replicas)`.
    pub fallback: Option<(u32, u32)>,
    pub scale_up: Rules,
    pub scale_down: Rules,
    pub triggers: Vec<PrometheusTrigger>,
    /// New replicas that need preemption wait this long for their demand to persist.
    pub persist_ms: u64,
    /// ... unless the metrics ask for this many times the replicas (0: never urgent).
    pub urgent_ratio: f64,
    /// Capacity a scale-down frees is held this long (0: not held) ...
    pub hold_freed_ms: u64,
    /// ... from borrowers that would lose more than this when reclaimed.
    pub cheap_rework_ms: u64,
}

/// Default of `preemption.holdFreedSeconds`: an hour. On the daily load of
/// `benches/scaling_flap.rs` ten minutes let long jobs take the capacity back between
/// spikes (more preemptions than without a hold), half an hour left some spikes
/// unserved, an hour none (benches/README.md, "Inference scaling beside training").
const HOLD_FREED_DEFAULT_S: i64 = 3600;
/// Default of `preemption.cheapReworkSeconds`: five minutes of lost work per reclaim.
const CHEAP_REWORK_DEFAULT_S: i64 = 300;

/// Largest replica count accepted (the `/scale` subresource's int32).
const MAX_REPLICAS: i64 = i32::MAX as i64;
/// Longest period, window or interval accepted: one day (HPA caps windows at 3600 s and
/// policy periods at 1800 s; KEDA has no cap, so intervals get a generous one).
const MAX_SECONDS: i64 = 86_400;

fn count(field: &str, v: Option<i64>, default: i64) -> Result<u32, SpecError> {
    let v = v.unwrap_or(default);
    if !(0..=MAX_REPLICAS).contains(&v) {
        return Err(invalid(
            field,
            format!("{v} is not a replica count (0..={MAX_REPLICAS})"),
        ));
    }
    Ok(v as u32)
}

fn seconds(
    field: &str,
    v: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
) -> Result<u64, SpecError> {
    let v = v.unwrap_or(default);
    if !(min..=max).contains(&v) {
        return Err(invalid(
            field,
            format!("{v} seconds is outside {min}..={max}"),
        ));
    }
    Ok(v as u64 * 1000)
}

impl ScalerSpec {
    /// The settings this spec means, or the first field that is wrong.
    pub fn validate(&self) -> Result<Settings, SpecError> {
        if self.scale_target_ref.name.trim().is_empty() {
            return Err(invalid("scaleTargetRef.name", "is empty"));
        }
        let min_replicas = count("minReplicaCount", self.min_replica_count, 0)?;
        let max_replicas = count("maxReplicaCount", self.max_replica_count, 100)?;
        if max_replicas == 0 {
            return Err(invalid("maxReplicaCount", "must be at least 1"));
        }
        if min_replicas > max_replicas {
            return Err(invalid(
                "minReplicaCount",
                format!("{min_replicas} is above maxReplicaCount {max_replicas}"),
            ));
        }
        let idle_replicas = match self.idle_replica_count {
            None => None,
            Some(v) => {
                let idle = count("idleReplicaCount", Some(v), 0)?;
                if idle >= min_replicas {
                    return Err(invalid(
                        "idleReplicaCount",
                        format!("{idle} must be less than minReplicaCount ({min_replicas})"),
                    ));
                }
                Some(idle)
            }
        };
        let fallback = match &self.fallback {
            None => None,
            Some(f) => {
                if !(1..=MAX_REPLICAS).contains(&f.failure_threshold) {
                    return Err(invalid(
                        "fallback.failureThreshold",
                        format!("{} is not a positive count", f.failure_threshold),
                    ));
                }
                let replicas = count("fallback.replicas", Some(f.replicas), 0)?;
                Some((f.failure_threshold as u32, replicas))
            }
        };
        let behavior = self
            .advanced
            .as_ref()
            .and_then(|a| a.horizontal_pod_autoscaler_config.as_ref())
            .and_then(|h| h.behavior.clone())
            .unwrap_or_default();
        let base = "advanced.horizontalPodAutoscalerConfig.behavior";
        let triggers = self
            .triggers
            .iter()
            .enumerate()
            .map(|(i, t)| trigger(&format!("triggers[{i}]"), t))
            .collect::<Result<Vec<_>, _>>()?;
        if triggers.is_empty() {
            return Err(invalid("triggers", "needs at least one trigger"));
        }
        Ok(Settings {
            polling_ms: seconds("pollingInterval", self.polling_interval, 30, 1, MAX_SECONDS)?,
            cooldown_ms: seconds("cooldownPeriod", self.cooldown_period, 300, 0, MAX_SECONDS)?,
            min_replicas,
            max_replicas,
            idle_replicas,
            fallback,
            scale_up: rules(
                &format!("{base}.scaleUp"),
                behavior.scale_up.as_ref(),
                Direction::Up,
            )?,
            scale_down: rules(
                &format!("{base}.scaleDown"),
                behavior.scale_down.as_ref(),
                Direction::Down,
            )?,
            triggers,
            persist_ms: seconds(
                "preemption.persistSeconds",
                self.preemption.as_ref().and_then(|p| p.persist_seconds),
                120,
                0,
                MAX_SECONDS,
            )?,
            urgent_ratio: urgent_ratio(self.preemption.as_ref().and_then(|p| p.urgent_ratio))?,
            hold_freed_ms: seconds(
                "preemption.holdFreedSeconds",
                self.preemption.as_ref().and_then(|p| p.hold_freed_seconds),
                HOLD_FREED_DEFAULT_S,
                0,
                MAX_SECONDS,
            )?,
            cheap_rework_ms: seconds(
                "preemption.cheapReworkSeconds",
                self.preemption
                    .as_ref()
                    .and_then(|p| p.cheap_rework_seconds),
                CHEAP_REWORK_DEFAULT_S,
                0,
                MAX_SECONDS,
            )?,
        })
    }
}

fn urgent_ratio(v: Option<f64>) -> Result<f64, SpecError> {
    match v {
        None => Ok(3.0),
        Some(r) if r == 0.0 || (r.is_finite() && r > 1.0) => Ok(r),
        Some(r) => Err(invalid(
            "preemption.urgentRatio",
            format!("{r} must be above 1 (or 0: never urgent)"),
        )),
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Up,
    Down,
}

/// HPA's defaults for a direction, overridden field by field as HPA does.
fn rules(field: &str, raw: Option<&RawRules>, dir: Direction) -> Result<Rules, SpecError> {
    let (window, default_policies) = match dir {
        Direction::Up => (0, Rules::hpa_up().policies),
        Direction::Down => (300, Rules::hpa_down().policies),
    };
    let raw = raw.cloned().unwrap_or_default();
    let stabilization_ms = seconds(
        &format!("{field}.stabilizationWindowSeconds"),
        raw.stabilization_window_seconds,
        window,
        0,
        3600,
    )?;
    let select = match raw.select_policy.as_deref() {
        None | Some("Max") => Select::Max,
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        Some(other) => {
            return Err(invalid(
                format!("{field}.selectPolicy"),
                format!("{other:?} is not one of Max, Min, Disabled"),
            ))
        }
    };
    let policies = match raw.policies {
        None => default_policies,
        Some(list) if list.is_empty() && select != Select::Disabled => {
            return Err(invalid(
                format!("{field}.policies"),
                "is empty; leave it out for the defaults or set selectPolicy: Disabled",
            ))
        }
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, p)| policy(&format!("{field}.policies[{i}]"), p))
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(Rules {
        stabilization_ms,
        select,
        policies,
    })
}

fn policy(field: &str, p: &RawPolicy) -> Result<RatePolicy, SpecError> {
    if p.value <= 0 || p.value > MAX_REPLICAS {
        return Err(invalid(
            format!("{field}.value"),
            format!("{} must be positive", p.value),
        ));
    }
    let period_ms = seconds(
        &format!("{field}.periodSeconds"),
        Some(p.period_seconds),
        0,
        1,
        1800,
    )?;
    let value = p.value as u32;
    match p.kind.as_str() {
        "Pods" => Ok(RatePolicy::Pods { value, period_ms }),
        "Percent" => Ok(RatePolicy::Percent { value, period_ms }),
        other => Err(invalid(
            format!("{field}.type"),
            format!("{other:?} is not Pods or Percent"),
        )),
    }
}

fn trigger(field: &str, t: &Trigger) -> Result<PrometheusTrigger, SpecError> {
    if t.kind != "prometheus" {
        return Err(invalid(
            format!("{field}.type"),
            format!("{:?} is not served (only prometheus)", t.kind),
        ));
    }
    let meta = |key: &str| t.metadata.get(key).map(|v| v.trim());
    let required = |key: &str| {
        meta(key)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| invalid(format!("{field}.metadata.{key}"), "is required"))
    };
    let number = |key: &str, v: &str| {
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| {
                invalid(
                    format!("{field}.metadata.{key}"),
                    format!("{v:?} is not a number"),
                )
            })
    };
    let server_address = required("serverAddress")?;
    if !(server_address.starts_with("http://") || server_address.starts_with("https://")) {
        return Err(invalid(
            format!("{field}.metadata.serverAddress"),
            format!("{server_address:?} is not an http:// or https:// URL"),
        ));
    }
    let query = required("query")?;
    let threshold = number("threshold", required("threshold")?)?;
    if threshold <= 0.0 {
        return Err(invalid(
            format!("{field}.metadata.threshold"),
            format!("{threshold} must be above 0"),
        ));
    }
    let activation_threshold = match meta("activationThreshold") {
        None | Some("") => 0.0,
        Some(v) => number("activationThreshold", v)?,
    };
    let ignore_null_values = match meta("ignoreNullValues") {
        None | Some("") | Some("true") => true,
        Some("false") => false,
        Some(v) => {
            return Err(invalid(
                format!("{field}.metadata.ignoreNullValues"),
                format!("{v:?} is not true or false"),
            ))
        }
    };
    let metric_type = match t.metric_type.as_deref() {
        None | Some("AverageValue") => MetricType::AverageValue,
        Some("Value") => MetricType::Value,
        Some(other) => {
            return Err(invalid(
                format!("{field}.metricType"),
                format!(
                    "{other:?} is not AverageValue or Value (Utilization needs a resource metric)"
                ),
            ))
        }
    };
    Ok(PrometheusTrigger {
        server_address: server_address.to_string(),
        query: query.to_string(),
        threshold,
        activation_threshold,
        metric_type,
        ignore_null_values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> Result<ScalerSpec, String> {
        crate::yaml::from_str(yaml).map_err(|e| e.to_string())
    }

    const KEDA_EXAMPLE: &str = r#"
scaleTargetRef: {name: llm-server}
pollingInterval: 15
cooldownPeriod: 120
minReplicaCount: 0
maxReplicaCount: 20
fallback: {failureThreshold: 3, replicas: 6}
advanced:
  horizontalPodAutoscalerConfig:
    behavior:
      scaleDown:
        stabilizationWindowSeconds: 60
        policies: [{type: Percent, value: 50, periodSeconds: 30}]
triggers:
- type: prometheus
  metadata:
    serverAddress: http://prometheus.monitoring:9090
    query: sum(rate(http_requests_total{service="llm"}[1m]))
    threshold: "100"
    activationThreshold: "5"
"#;

    #[test]
    fn a_keda_scaled_object_spec_reads_with_every_default_filled_in() {
        let s = spec(KEDA_EXAMPLE).unwrap().validate().unwrap();
        assert_eq!((s.polling_ms, s.cooldown_ms), (15_000, 120_000));
        assert_eq!(
            (s.min_replicas, s.max_replicas, s.idle_replicas),
            (0, 20, None)
        );
        assert_eq!(s.fallback, Some((3, 6)));
        assert_eq!(s.scale_up.stabilization_ms, 0);
        assert_eq!(s.scale_up.policies.len(), 2, "HPA's scale-up defaults");
        assert_eq!(s.scale_down.stabilization_ms, 60_000);
        assert_eq!(
            s.scale_down.policies,
            [RatePolicy::Percent {
                value: 50,
                period_ms: 30_000
            }]
        );
        let t = &s.triggers[0];
        assert_eq!((t.threshold, t.activation_threshold), (100.0, 5.0));
        assert_eq!(t.metric_type, MetricType::AverageValue);
        assert!(t.ignore_null_values);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let cases = [
            ("minReplicaCount: 5\nmaxReplicaCount: 2", "spec.minReplicaCount"),
            ("minReplicaCount: -1", "spec.minReplicaCount"),
            ("maxReplicaCount: 0", "spec.maxReplicaCount"),
            ("minReplicaCount: 1\nidleReplicaCount: 1", "spec.idleReplicaCount"),
            ("cooldownPeriod: -5", "spec.cooldownPeriod"),
            ("pollingInterval: 0", "spec.pollingInterval"),
            ("fallback: {failureThreshold: 0, replicas: 2}", "spec.fallback.failureThreshold"),
            (
                "advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleUp: {stabilizationWindowSeconds: -1}}}}",
                "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.stabilizationWindowSeconds",
            ),
            (
                "advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleDown: {policies: [{type: Pods, value: 1, periodSeconds: 0}]}}}}",
                "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.policies[0].periodSeconds",
            ),
            (
                "advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleDown: {policies: [{type: Pod, value: 1, periodSeconds: 15}]}}}}",
                "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.policies[0].type",
            ),
            (
                "advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleUp: {selectPolicy: Largest}}}}",
                "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.selectPolicy",
            ),
        ];
        let trigger = "triggers: [{type: prometheus, metadata: {serverAddress: 'http://p:9090', query: up, threshold: '1'}}]";
        for (extra, field) in cases {
            let yaml = format!("scaleTargetRef: {{name: x}}\n{extra}\n{trigger}\n");
            let err = spec(&yaml).unwrap().validate().unwrap_err();
            assert!(err.to_string().starts_with(field), "{extra}: {err}");
        }
    }

    #[test]
    fn bad_triggers_name_the_field() {
        let cases = [
            ("{type: cpu, metadata: {}}", "spec.triggers[0].type"),
            ("{type: prometheus, metadata: {query: up, threshold: '1'}}", "spec.triggers[0].metadata.serverAddress"),
            ("{type: prometheus, metadata: {serverAddress: 'p:9090', query: up, threshold: '1'}}", "spec.triggers[0].metadata.serverAddress"),
            ("{type: prometheus, metadata: {serverAddress: 'http://p', threshold: '1'}}", "spec.triggers[0].metadata.query"),
            ("{type: prometheus, metadata: {serverAddress: 'http://p', query: up, threshold: ten}}", "spec.triggers[0].metadata.threshold"),
            ("{type: prometheus, metadata: {serverAddress: 'http://p', query: up, threshold: '0'}}", "spec.triggers[0].metadata.threshold"),
            ("{type: prometheus, metadata: {serverAddress: 'http://p', query: up, threshold: NaN}}", "spec.triggers[0].metadata.threshold"),
            ("{type: prometheus, metadata: {serverAddress: 'http://p', query: up, threshold: '1', ignoreNullValues: yes}}", "spec.triggers[0].metadata.ignoreNullValues"),
            ("{type: prometheus, metricType: Utilization, metadata: {serverAddress: 'http://p', query: up, threshold: '1'}}", "spec.triggers[0].metricType"),
        ];
        for (t, field) in cases {
            let yaml = format!("scaleTargetRef: {{name: x}}\ntriggers: [{t}]\n");
            let err = spec(&yaml).unwrap().validate().unwrap_err();
            assert!(err.to_string().starts_with(field), "{t}: {err}");
        }
        let none = spec("scaleTargetRef: {name: x}\n")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(none.field, "triggers");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = spec("scaleTargetRef: {name: x}\nminReplicas: 1\n").unwrap_err();
        assert!(err.contains("minReplicas"), "{err}");
    }
}
