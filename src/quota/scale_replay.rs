//! `tessera plan` replays inference autoscaling: `InferenceScaler` documents scale the
//! Deployments and StatefulSets of the scenario by the pure autoscaling engine
//! ([`crate::autoscale`]), reading their triggers' queries from plan-only `MetricSeries`
//! documents, while the quota engine admits, queues and preempts the replicas. An
//! operator sees a scaler's decisions, the admissions and the preemptions they cause, over
//! time, before applying it.
//!
//! ```text
//! every pollingInterval (per scaler, from when it is applied):
//!   readings = MetricSeries[query] at t ─► Scaler::step(target, serving = admitted replicas)
//!   ─► replicas changed? ─► the target's replicas submitted / finished (as re-applying it)
//!                          ─► a `Scaled` event ─► the quota engine schedules
//! ```
//!
//! A `MetricSeries` is a step function: each sample holds from its `at` until the next;
//! before the first there is no series (an empty result). A sample may be `missing: true`
//! (an empty result) or `down: true` (Prometheus unreachable).

use super::api::ObjectMeta;
use super::engine::Engine;
use super::error::{Error, Result};
use super::events::{Event, EventType};
use super::hold::HoldFreed;
use super::model::WorkloadInfo;
use super::quantity::{parse_duration, Time};
use crate::autoscale::{
    Coupling, Decision, Observation, Reading, Scaler, ScalerSpec, Settings, Why,
};
use serde::Deserialize;
use std::collections::HashMap;

/// After the last object or sample, polls go on this long (cooldowns and scale-down
/// windows play out) unless `--until` says otherwise.
pub const POLL_TAIL: Time = 3_600_000;

/// An `InferenceScaler` document.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct ScalerDoc {
    pub metadata: ObjectMeta,
    pub spec: ScalerSpec,
}

/// A plan-only `MetricSeries` document.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct SeriesDoc {
    pub metadata: ObjectMeta,
    pub spec: SeriesSpec,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SeriesSpec {
    /// The trigger query this series answers (matched exactly).
    query: String,
    samples: Vec<RawSample>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSample {
    /// Offset from the scenario start (`90s`, `5m`).
    at: String,
    #[serde(default)]
    value: Option<f64>,
    #[serde(default)]
    missing: bool,
    #[serde(default)]
    down: bool,
}

/// A metric over time: `(from, reading)`, sorted.
#[derive(Clone, Debug)]
pub(super) struct Series {
    points: Vec<(Time, Reading)>,
}

impl Series {
    fn at(&self, t: Time) -> Reading {
        let i = self.points.partition_point(|(from, _)| *from <= t);
        match i {
            0 => Reading::Empty,
            i => self.points[i - 1].1.clone(),
        }
    }

    fn last_change(&self) -> Time {
        self.points.last().map_or(0, |(t, _)| *t)
    }
}

impl SeriesDoc {
    /// The query and its series, or the field that is wrong.
    pub(super) fn read(self) -> Result<(String, Series)> {
        let name = self.metadata.name.clone();
        let invalid = |field: String, why: String| Error::Invalid {
            kind: "MetricSeries",
            name: name.clone(),
            field,
            why,
        };
        if self.spec.query.trim().is_empty() {
            return Err(invalid("spec.query".into(), "is empty".into()));
        }
        let mut points = Vec::with_capacity(self.spec.samples.len());
        for (i, s) in self.spec.samples.iter().enumerate() {
            let field = format!("spec.samples[{i}]");
            let at =
                parse_duration(&s.at).map_err(|e| invalid(format!("{field}.at"), e.to_string()))?;
            let reading = match (s.value, s.missing, s.down) {
                (Some(v), false, false) => Reading::Value(v),
                (None, true, false) => Reading::Empty,
                (None, false, true) => {
                    Reading::Failed("Prometheus unreachable (MetricSeries: down)".into())
                }
                _ => {
                    return Err(invalid(
                        field,
                        "needs exactly one of value, missing: true, down: true".into(),
                    ))
                }
            };
            if points.last().is_some_and(|(prev, _)| *prev >= at) {
                return Err(invalid(
                    format!("{field}.at"),
                    "samples must be in increasing time order".into(),
                ));
            }
            points.push((at, reading));
        }
        Ok((self.spec.query, Series { points }))
    }
}

/// The replicas of the scenario's Deployments and StatefulSets, as workloads
/// `name-0`, `name-1`, … in the quota engine. `tessera plan` and the fleet simulation
/// (`crate::sim::fleet`) apply a scaler's decisions through it.
#[derive(Default)]
pub struct Replicas {
    /// `namespace/name` → (kind, one replica's workload, replicas now).
    targets: HashMap<String, (&'static str, WorkloadInfo, u32)>,
}

impl Replicas {
    /// Sets `base`'s replicas to `want` at `at`: new ordinals submitted, the highest
    /// finished (as re-applying the object with fewer replicas does). `scaled` carries a
    /// scaler's coupling: when new replicas may preempt, how the removed ones' capacity
    /// is held.
    pub fn set(
        &mut self,
        engine: &mut Engine,
        at: Time,
        kind: &'static str,
        base: &WorkloadInfo,
        want: u32,
        scaled: Coupled,
    ) -> Result<()> {
        let key = format!("{}/{}", base.namespace, base.name);
        let have = self.targets.get(&key).map_or(0, |(_, _, n)| *n);
        for i in have..want {
            let mut w = base.clone().with_creation(at);
            w.name = format!("{}-{i}", base.name);
            w.preempt_not_before = scaled.preempt_not_before;
            // An ordinal scaled away earlier comes back as a new workload.
            engine.forget_finished(&format!("{key}-{i}"));
            engine.submit(at, w)?;
        }
        for i in (want..have).rev() {
            let name = format!("{key}-{i}");
            let reason = format!("{kind}ScaledDown");
            match scaled.hold {
                Some(hold) => engine.remove_holding(at, &name, &reason, hold)?,
                None => engine.remove_with_reason(at, &name, &reason)?,
            }
        }
        self.targets.insert(key, (kind, base.clone(), want));
        Ok(())
    }

    fn get(&self, key: &str) -> Option<(&'static str, WorkloadInfo, u32)> {
        self.targets.get(key).cloned()
    }
}

/// What a scaler's decision asks of the quota engine besides the replica count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coupled {
    /// New replicas may preempt only from then on.
    pub preempt_not_before: Option<Time>,
    /// Removed replicas' capacity is held (see [`HoldFreed`]).
    pub hold: Option<HoldFreed>,
}

impl Coupled {
    /// The coupling of decision `d` of a scaler with `settings`.
    pub fn of(d: &Decision, settings: &Settings) -> Coupled {
        Coupled {
            preempt_not_before: d.preempt_after,
            hold: d.hold_freed_until.map(|until| HoldFreed {
                until,
                max_rework: settings.cheap_rework_ms,
            }),
        }
    }
}

struct Running {
    /// `namespace/name` of the InferenceScaler.
    key: String,
    /// `namespace/name` of its target.
    target: String,
    queries: Vec<String>,
    scaler: Scaler,
    next_poll: Time,
    /// The reason code of the last event, so that a held state is reported once.
    last_reason: Option<&'static str>,
}

/// The scalers of a plan and the series they read.
#[derive(Default)]
pub(super) struct Replay {
    series: HashMap<String, Series>,
    scalers: Vec<Running>,
}

impl Replay {
    pub(super) fn add_series(&mut self, query: String, series: Series) {
        self.series.insert(query, series);
    }

    /// Starts `doc`'s scaler at `at`; its target must be defined earlier in the file.
    pub(super) fn add_scaler(
        &mut self,
        at: Time,
        doc: &ScalerDoc,
        replicas: &Replicas,
        coupling: Coupling,
    ) -> Result<()> {
        let ns = doc
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = doc.metadata.name.clone();
        let invalid = |field: &str, why: String| Error::Invalid {
            kind: "InferenceScaler",
            name: format!("{ns}/{name}"),
            field: field.into(),
            why,
        };
        let settings = doc
            .spec
            .validate()
            .map_err(|e| invalid(&format!("spec.{}", e.field), e.reason))?;
        let target_ref = &doc.spec.scale_target_ref;
        let kind = target_ref.kind.as_deref().unwrap_or("Deployment");
        if !matches!(kind, "Deployment" | "StatefulSet") {
            return Err(invalid(
                "spec.scaleTargetRef.kind",
                format!("{kind:?} has no /scale subresource in a plan (Deployment or StatefulSet)"),
            ));
        }
        let target = format!("{ns}/{}", target_ref.name);
        match replicas.get(&target) {
            Some((k, _, _)) if k == kind => {}
            _ => {
                return Err(invalid(
                    "spec.scaleTargetRef",
                    format!("{kind} {target} is not defined earlier in the file"),
                ))
            }
        }
        let queries = settings.triggers.iter().map(|t| t.query.clone()).collect();
        self.scalers.retain(|r| r.key != format!("{ns}/{name}"));
        self.scalers.push(Running {
            key: format!("{ns}/{name}"),
            target,
            queries,
            scaler: Scaler::new(settings, coupling),
            next_poll: at,
            last_reason: None,
        });
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.scalers.is_empty()
    }

    /// The time of the last sample of any series.
    pub(super) fn last_change(&self) -> Time {
        self.series
            .values()
            .map(Series::last_change)
            .max()
            .unwrap_or(0)
    }

    /// Runs every poll due before `until` (exclusive), in time order.
    pub(super) fn poll_before(
        &mut self,
        until: Time,
        engine: &mut Engine,
        replicas: &mut Replicas,
        events: &mut Vec<Event>,
    ) -> Result<()> {
        loop {
            let Some(i) = (0..self.scalers.len())
                .filter(|&i| self.scalers[i].next_poll < until)
                .min_by_key(|&i| self.scalers[i].next_poll)
            else {
                return Ok(());
            };
            let series = &self.series;
            let run = &mut self.scalers[i];
            let t = run.next_poll;
            run.next_poll = t.saturating_add(run.scaler.settings().polling_ms);
            engine.advance_to(t)?;
            poll(run, series, t, engine, replicas, events)?;
        }
    }
}

fn poll(
    run: &mut Running,
    series: &HashMap<String, Series>,
    t: Time,
    engine: &mut Engine,
    replicas: &mut Replicas,
    events: &mut Vec<Event>,
) -> Result<()> {
    let Some((kind, base, target)) = replicas.get(&run.target) else {
        return Ok(());
    };
    let serving = (0..target)
        .filter(|i| engine.is_admitted(&format!("{}-{i}", run.target)))
        .count() as u32;
    let readings = run
        .queries
        .iter()
        .map(|q| {
            series.get(q).map_or_else(
                || Reading::Failed(format!("no MetricSeries answers the query {q:?}")),
                |s| s.at(t),
            )
        })
        .collect();
    let d = run.scaler.step(
        &Observation {
            target,
            serving,
            readings,
        },
        t,
    );
    let reason = reason_code(&d, target);
    let report = d.replicas != target || (run.last_reason != Some(reason) && holds_notably(&d.why));
    run.last_reason = Some(reason);
    if !report {
        return Ok(());
    }
    events.extend(engine.take_events());
    let mut ev = Event::new(t, EventType::Scaled, run.key.clone());
    ev.reason = Some(reason.into());
    ev.message = Some(format!(
        "{kind} {}: {target} → {} replicas: {}",
        run.target, d.replicas, d.why
    ));
    events.push(ev);
    if d.replicas != target {
        let coupled = Coupled::of(&d, run.scaler.settings());
        replicas.set(engine, t, kind, &base, d.replicas, coupled)?;
        engine.schedule(t)?;
    }
    Ok(())
}

/// Held states worth one event when they begin.
fn holds_notably(why: &Why) -> bool {
    matches!(
        why,
        Why::MetricFailed { .. } | Why::WaitingForCapacity { .. } | Why::Fallback { .. }
    )
}

fn reason_code(d: &Decision, target: u32) -> &'static str {
    match &d.why {
        Why::Activated => "Activated",
        Why::Deactivated => "Deactivated",
        Why::Fallback { .. } => "Fallback",
        Why::MetricFailed { .. } => "MetricFailed",
        Why::WaitingForCapacity { .. } => "WaitingForCapacity",
        Why::ReleasedWaiting { .. } => "ReleasedWaiting",
        Why::Metric { .. } if d.replicas > target => "ScaledUp",
        Why::Metric { .. } if d.replicas < target => "ScaledDown",
        Why::Metric { .. } => "Held",
    }
}
