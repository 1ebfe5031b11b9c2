//! One InferenceScaler's decisions, poll by poll, with KEDA's semantics on top of the
//! HPA's algorithm, and Tessera's coupling with quota:
//!
//! ```text
//! readings ─► any failed? ─yes─► failures += 1 ─► ≥ fallback.failureThreshold? ─► fallback replicas
//!    │                              └─ otherwise: only up, from the triggers that answered; never down
//!    no
//!    ▼
//! active = some value > activationThreshold
//!    ├─ target at 0 (or idle) and active ──────────────► activate: max(minReplicaCount, 1)
//!    ├─ not active for cooldownPeriod, min 0 or idle set ► deactivate: idleReplicaCount or 0
//!    └─ otherwise the HPA: raw = max over triggers (10 % tolerance) ─► stabilization windows
//!         ─► rate policies ─► [max(min, 1), max] ─► coupled: no raise while replicas wait
//! ```
//!
//! **Coupled with quota** ([`Coupling::Quota`]): a replica that the quota or the placement
//! has not admitted is not capacity. A `Value` metric is scaled from the replicas that
//! serve, not from the target; and while some replicas of the target still wait, the
//! target is not raised further (HPA and KEDA keep raising it: runaway pending pods).
//! [`Coupling::Off`] is KEDA + HPA as they are, for comparison.
//!
//! Pure: no I/O; the caller reads the metrics, passes the time, and applies the replicas.

use super::behavior::{limit_rate, stabilize, History};
use super::spec::{MetricType, PrometheusTrigger, Settings};
use crate::quota::quantity::Time;
use serde::Serialize;
use std::fmt;

/// HPA's tolerance: a usage ratio within 10 % of 1 changes nothing.
pub const TOLERANCE: f64 = 0.1;

/// What one trigger's query returned this poll.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// One sample.
    Value(f64),
    /// No series (read as 0 when the trigger ignores null values).
    Empty,
    /// The query could not be answered (server down, timeout, several series, bad PromQL).
    Failed(String),
}

/// What the engine is told each poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The target's replicas now (`/scale` `spec.replicas`).
    pub target: u32,
    /// Replicas admitted by quota and placed (the capacity that serves).
    pub serving: u32,
    /// One reading per trigger, in the spec's order.
    pub readings: Vec<Reading>,
}

/// Whether scaling knows about quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Coupling {
    /// KEDA + HPA as they are: replicas count as capacity whether or not they run.
    Off,
    /// Only admitted, placed replicas count; no raise while replicas wait.
    #[default]
    Quota,
}

/// Why the replicas are what they are.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Why {
    /// The HPA's computation (`raw` before behaviour, `stabilized` after the windows).
    Metric { raw: u32, stabilized: u32 },
    /// Scaled from zero (or idle) because a value crossed its activation threshold.
    Activated,
    /// Back to zero (or idle) after `cooldownPeriod` without activity.
    Deactivated,
    /// Too many failed polls: `fallback.replicas`.
    Fallback { failures: u32 },
    /// Some trigger failed: held (or raised by the triggers that answered), never lowered.
    MetricFailed { failures: u32, reason: String },
    /// Replicas of the target still wait for quota or placement: not raised.
    WaitingForCapacity { serving: u32 },
    /// The metrics ask for fewer than the target while some replicas still wait: the
    /// waiting ones are released at once (they serve nothing), whatever the windows.
    ReleasedWaiting { serving: u32 },
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Metric { raw, stabilized } => write!(
                f,
                "metrics ask for {raw} replicas ({stabilized} after the stabilization windows)"
            ),
            Why::Activated => f.write_str("a trigger crossed its activation threshold"),
            Why::Deactivated => f.write_str("no trigger active for the cooldown period"),
            Why::Fallback { failures } => {
                write!(f, "{failures} failed polls in a row: fallback replicas")
            }
            Why::MetricFailed { failures, reason } => write!(
                f,
                "metric unavailable ({failures} failed polls in a row: {reason}); not scaling down"
            ),
            Why::WaitingForCapacity { serving } => write!(
                f,
                "only {serving} replicas admitted and placed; not raising the target while the rest wait"
            ),
            Why::ReleasedWaiting { serving } => write!(
                f,
                "demand fell while replicas waited for quota; the waiting ones released ({serving} serve)"
            ),
        }
    }
}

/// One poll's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The target's replicas to set (equal to the observed target: no change).
    pub replicas: u32,
    /// KEDA's `Active` condition.
    pub active: bool,
    /// KEDA's `Fallback` condition.
    pub fallback: bool,
    pub why: Why,
    /// Replicas this decision adds may preempt only from then on (coupled scale-ups
    /// that are not urgent); `None`: at once.
    pub preempt_after: Option<Time>,
    /// A coupled scale-down: the capacity the removed replicas free is lent until then
    /// only to work that loses at most `Settings::cheap_rework_ms` when reclaimed.
    pub hold_freed_until: Option<Time>,
}

impl Decision {
    /// A decision that is not a fallback and may preempt at once.
    fn new(replicas: u32, active: bool, why: Why) -> Decision {
        Decision {
            replicas,
            active,
            fallback: false,
            why,
            preempt_after: None,
            hold_freed_until: None,
        }
    }
}

/// A scaler's state between polls.
#[derive(Debug, Clone)]
pub struct Scaler {
    settings: Settings,
    coupling: Coupling,
    history: History,
    failures: u32,
    last_active: Option<Time>,
    /// Since when the metrics have asked, poll after poll, for more replicas than serve:
    /// the demand whose persistence a non-urgent scale-up waits for.
    excess_since: Option<Time>,
    /// Since when the metrics have asked for no more than serve (ends an excess once it
    /// lasts half the persistence window: a one-poll dip does not restart the wait).
    calm_since: Option<Time>,
    /// The last excess that ended: `(since, ended)`. Demand that comes back within the
    /// hold window continues it, so a recurring spike counts as persisting.
    last_excess: Option<(Time, Time)>,
}

impl Scaler {
    pub fn new(settings: Settings, coupling: Coupling) -> Self {
        Scaler {
            settings,
            coupling,
            history: History::default(),
            failures: 0,
            last_active: None,
            excess_since: None,
            calm_since: None,
            last_excess: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The decision for this poll at `now`; the caller applies `replicas`.
    pub fn step(&mut self, obs: &Observation, now: Time) -> Decision {
        let values: Vec<Result<f64, String>> = self
            .settings
            .triggers
            .iter()
            .zip(obs.readings.iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(t, r)| value(t, r))
            .collect();
        let failed = values.iter().find_map(|v| v.as_ref().err()).cloned();
        let decision = match failed {
            Some(reason) => self.after_failure(obs, now, &values, reason),
            None => {
                self.failures = 0;
                let values: Vec<f64> = values.into_iter().flatten().collect();
                self.after_success(obs, now, &values)
            }
        };
        if decision.replicas != obs.target {
            self.history
                .record_change(now, obs.target, decision.replicas);
        }
        decision
    }

    fn after_failure(
        &mut self,
        obs: &Observation,
        now: Time,
        values: &[Result<f64, String>],
        reason: String,
    ) -> Decision {
        self.failures = self.failures.saturating_add(1);
        // Activity is unknown: the cooldown does not run on a missing metric.
        self.last_active = Some(now);
        let s = &self.settings;
        if let Some((threshold, replicas)) = s.fallback {
            if self.failures >= threshold {
                return Decision {
                    replicas: replicas.clamp(s.min_replicas, s.max_replicas),
                    active: true,
                    fallback: true,
                    preempt_after: None,
                    hold_freed_until: None,
                    why: Why::Fallback {
                        failures: self.failures,
                    },
                };
            }
        }
        // The triggers that answered may raise the target, never lower it (the HPA with
        // several metrics does the same when one fails).
        let answered: Vec<(usize, f64)> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().ok().map(|x| (i, *x)))
            .collect();
        let up = (obs.target > 0)
            .then(|| self.raw(obs, answered.iter().copied()))
            .flatten()
            .unwrap_or(obs.target);
        Decision {
            replicas: up.clamp(obs.target, s.max_replicas.max(obs.target)),
            active: true,
            fallback: false,
            preempt_after: None,
            hold_freed_until: None,
            why: Why::MetricFailed {
                failures: self.failures,
                reason,
            },
        }
    }

    fn after_success(&mut self, obs: &Observation, now: Time, values: &[f64]) -> Decision {
        let s = &self.settings;
        let active = s
            .triggers
            .iter()
            .zip(values)
            .any(|(t, v)| *v > t.activation_threshold);
        if active {
            self.last_active = Some(now);
        }
        let floor = s.idle_replicas.unwrap_or(0);
        let decision = |replicas, why| Decision::new(replicas, active, why);
        if obs.target <= floor && s.idle_replicas.is_some() || obs.target == 0 {
            return if active {
                decision(s.min_replicas.max(1), Why::Activated)
            } else {
                decision(obs.target, Why::Deactivated)
            };
        }
        let may_deactivate = s.min_replicas == 0 || s.idle_replicas.is_some();
        let cooled = self
            .last_active
            .is_none_or(|t| now.saturating_sub(t) >= s.cooldown_ms);
        if !active && may_deactivate && cooled {
            let mut d = decision(floor, Why::Deactivated);
            // Scaling to zero frees capacity like any coupled scale-down: held too.
            if self.coupling == Coupling::Quota && floor < obs.target && s.hold_freed_ms > 0 {
                d.hold_freed_until = Some(now.saturating_add(s.hold_freed_ms));
            }
            return d;
        }
        self.scale(obs, now, values, active)
    }

    /// The HPA's computation and, coupled, the rules for replicas that wait.
    fn scale(&mut self, obs: &Observation, now: Time, values: &[f64], active: bool) -> Decision {
        let raw = self
            .raw(obs, values.iter().copied().enumerate())
            .unwrap_or(obs.target);
        self.track_excess(raw, obs.serving, now);
        let s = &self.settings;
        let (up, down) = (&s.scale_up, &s.scale_down);
        let stabilized = stabilize(&mut self.history, now, obs.target, raw, up, down);
        let limited = limit_rate(&self.history, now, obs.target, stabilized, up, down);
        let floor = s.min_replicas.max(1);
        let replicas = limited.clamp(floor, s.max_replicas);
        let decision = |replicas, why| Decision::new(replicas, active, why);
        if self.coupling == Coupling::Off {
            return decision(replicas, Why::Metric { raw, stabilized });
        }
        let serving = obs.serving;
        if serving < obs.target && replicas > obs.target {
            return decision(obs.target, Why::WaitingForCapacity { serving });
        }
        if serving < obs.target && raw <= serving {
            let keep = serving.clamp(floor, s.max_replicas).min(obs.target);
            return decision(keep, Why::ReleasedWaiting { serving });
        }
        let mut d = decision(replicas, Why::Metric { raw, stabilized });
        if replicas > obs.target && !self.urgent(raw, obs.target) {
            let since = self.excess_since.unwrap_or(now);
            d.preempt_after = Some(since.saturating_add(s.persist_ms));
        }
        if replicas < obs.target && s.hold_freed_ms > 0 {
            d.hold_freed_until = Some(now.saturating_add(s.hold_freed_ms));
        }
        d
    }

    /// Follows the demand above the replicas that serve: it starts at the first poll
    /// asking for more, and ends only once no more has been asked for half the
    /// persistence window. Demand that comes back within the hold window
    /// (`holdFreedSeconds`) continues the excess it ended: a spike that recurs has
    /// persisted, and the replicas it adds may preempt at once; the capacity they take
    /// is then held for them after they scale down (`quota/hold.rs`).
    fn track_excess(&mut self, raw: u32, serving: u32, now: Time) {
        if raw > serving {
            self.calm_since = None;
            if self.excess_since.is_none() {
                let recurs = self
                    .last_excess
                    .filter(|(_, ended)| now.saturating_sub(*ended) < self.settings.hold_freed_ms);
                self.excess_since = Some(recurs.map_or(now, |(since, _)| since));
            }
            return;
        }
        let calm = *self.calm_since.get_or_insert(now);
        if now.saturating_sub(calm) >= self.settings.persist_ms / 2 {
            if let Some(since) = self.excess_since.take() {
                self.last_excess = Some((since, calm));
            }
        }
    }

    /// Whether the metrics ask for so much more that a scale-up may preempt at once.
    fn urgent(&self, raw: u32, target: u32) -> bool {
        let ratio = self.settings.urgent_ratio;
        ratio > 0.0 && f64::from(raw) >= ratio * f64::from(target.max(1))
    }

    /// The HPA's replica count: the largest over the given triggers' values.
    fn raw(&self, obs: &Observation, values: impl Iterator<Item = (usize, f64)>) -> Option<u32> {
        let base = match self.coupling {
            Coupling::Off => obs.target,
            Coupling::Quota => obs.serving.min(obs.target),
        };
        values
            .filter_map(|(i, v)| {
                let t = self.settings.triggers.get(i)?;
                Some(replicas_for(t, v, obs.target, base))
            })
            .max()
    }
}

/// A reading as a number, or why it is not one.
fn value(t: &PrometheusTrigger, r: Option<&Reading>) -> Result<f64, String> {
    match r {
        None => Err("no reading".into()),
        Some(Reading::Failed(why)) => Err(why.clone()),
        Some(Reading::Empty) if t.ignore_null_values => Ok(0.0),
        Some(Reading::Empty) => {
            Err("the query returned no series (ignoreNullValues: false)".into())
        }
        Some(Reading::Value(v)) if v.is_finite() => Ok(*v),
        Some(Reading::Value(v)) => Err(format!("the query returned {v}")),
    }
}

/// HPA's external-metric formula for one trigger: `target` replicas now, `base` of them
/// counted as serving.
pub fn replicas_for(t: &PrometheusTrigger, value: f64, target: u32, base: u32) -> u32 {
    let value = value.max(0.0);
    let (ratio, desired) = match t.metric_type {
        MetricType::AverageValue => {
            let ratio = value / (t.threshold * f64::from(target.max(1)));
            (ratio, (value / t.threshold).ceil())
        }
        MetricType::Value => {
            let ratio = value / t.threshold;
            (ratio, (ratio * f64::from(base.max(1))).ceil())
        }
    };
    if (ratio - 1.0).abs() <= TOLERANCE && base == target {
        return target;
    }
    if desired >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        desired as u32
    }
}
