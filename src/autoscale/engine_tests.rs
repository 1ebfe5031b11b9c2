//! The engine's decisions on KEDA's and the HPA's documented behaviour, poll by poll.

use super::engine::{Coupling, Decision, Observation, Reading, Scaler, Why};
use super::spec::ScalerSpec;
use proptest::prelude::*;

const S: u64 = 1000;

fn scaler(extra: &str, coupling: Coupling) -> Scaler {
    let yaml = format!(
        "scaleTargetRef: {{name: llm}}\n{extra}\ntriggers:\n- type: prometheus\n  metadata: {{serverAddress: 'http://prom:9090', query: 'sum(queue)', threshold: '100', activationThreshold: '5'}}\n"
    );
    let spec: ScalerSpec = crate::yaml::from_str(&yaml).expect("a spec");
    Scaler::new(spec.validate().expect("valid"), coupling)
}

fn at(target: u32, reading: Reading) -> Observation {
    Observation {
        target,
        serving: target,
        readings: vec![reading],
    }
}

fn value(v: f64) -> Reading {
    Reading::Value(v)
}

#[test]
fn average_value_asks_for_value_over_threshold_within_the_rate_limits() {
    let mut s = scaler("", Coupling::Quota);
    let d = s.step(&at(1, value(250.0)), 0);
    assert_eq!(d.replicas, 3, "ceil(250 / 100), within max(1 × 2, 1 + 4)");
    assert!(matches!(d.why, Why::Metric { raw: 3, .. }), "{:?}", d.why);
    let d = s.step(&at(3, value(2_000.0)), 15 * S);
    assert_eq!(
        d.replicas, 7,
        "raw 20, but +4 pods per 15 s (3 were added 15 s ago, outside the period)"
    );
}

#[test]
fn a_ratio_within_ten_percent_changes_nothing() {
    let mut s = scaler("", Coupling::Quota);
    assert_eq!(
        s.step(&at(2, value(215.0)), 0).replicas,
        2,
        "215 / 200 = 1.075"
    );
    assert_eq!(
        s.step(&at(2, value(230.0)), 15 * S).replicas,
        3,
        "1.15 is outside"
    );
}

#[test]
fn from_zero_only_an_active_trigger_scales_and_to_min_or_one() {
    let mut s = scaler("", Coupling::Quota);
    let d = s.step(&at(0, value(5.0)), 0);
    assert_eq!(
        (d.replicas, d.active),
        (0, false),
        "5 is not above the activation threshold"
    );
    let d = s.step(&at(0, value(6.0)), 30 * S);
    assert_eq!((d.replicas, d.active, d.why), (1, true, Why::Activated));
    let mut s = scaler("minReplicaCount: 3\nidleReplicaCount: 1\n", Coupling::Quota);
    assert_eq!(
        s.step(&at(1, value(50.0)), 0).replicas,
        3,
        "from idle to min"
    );
}

#[test]
fn scales_to_zero_only_after_the_cooldown_without_activity() {
    let mut s = scaler("cooldownPeriod: 300\n", Coupling::Quota);
    assert_eq!(s.step(&at(2, value(150.0)), 0).replicas, 2);
    let d = s.step(&at(2, value(0.0)), 120 * S);
    assert!(
        d.replicas >= 1,
        "inside the cooldown the HPA keeps at least one: {d:?}"
    );
    let d = s.step(&at(1, value(0.0)), 299 * S);
    assert_eq!(d.replicas, 1);
    let d = s.step(&at(1, value(0.0)), 300 * S);
    assert_eq!((d.replicas, d.why), (0, Why::Deactivated));
}

#[test]
fn with_a_minimum_and_no_idle_count_it_never_deactivates() {
    let mut s = scaler("minReplicaCount: 2\ncooldownPeriod: 0\n", Coupling::Quota);
    assert_eq!(
        s.step(&at(5, value(0.0)), 0).replicas,
        5,
        "the scale-down window holds 5 first"
    );
    assert_eq!(s.step(&at(5, value(0.0)), 301 * S).replicas, 2);
}

#[test]
fn a_missing_metric_never_scales_down_and_falls_back_after_the_threshold() {
    let mut s = scaler(
        "fallback: {failureThreshold: 3, replicas: 6}\ncooldownPeriod: 0\n",
        Coupling::Quota,
    );
    let down = Reading::Failed("connection refused".into());
    for (i, t) in [0, 30, 60].into_iter().enumerate() {
        let d = s.step(&at(2, down.clone()), t * S);
        if i < 2 {
            assert_eq!(d.replicas, 2, "poll {i}: held, not scaled to zero: {d:?}");
            assert!(!d.fallback && d.active);
            assert!(
                d.why.to_string().contains("connection refused"),
                "{}",
                d.why
            );
        } else {
            assert_eq!((d.replicas, d.fallback), (6, true), "{d:?}");
        }
    }
    let d = s.step(&at(6, value(100.0)), 90 * S);
    assert!(!d.fallback, "a good poll ends the fallback");
}

#[test]
fn empty_results_nan_and_infinity_are_failures_unless_null_values_are_ignored() {
    let strict = "triggers:\n- type: prometheus\n  metadata: {serverAddress: 'http://p', query: q, threshold: '10', ignoreNullValues: 'false'}\n";
    let spec: ScalerSpec =
        crate::yaml::from_str(&format!("scaleTargetRef: {{name: x}}\n{strict}")).unwrap();
    let mut s = Scaler::new(spec.validate().unwrap(), Coupling::Quota);
    for r in [Reading::Empty, value(f64::NAN), value(f64::INFINITY)] {
        let d = s.step(&at(3, r.clone()), 0);
        assert!(matches!(d.why, Why::MetricFailed { .. }), "{r:?}: {d:?}");
        assert_eq!(d.replicas, 3);
    }
    let mut lenient = scaler("cooldownPeriod: 0\n", Coupling::Quota);
    let d = lenient.step(&at(3, Reading::Empty), 0);
    assert_eq!(
        (d.replicas, d.why),
        (0, Why::Deactivated),
        "empty reads as 0"
    );
}

#[test]
fn with_two_triggers_the_larger_wins_and_one_failing_only_allows_up() {
    let yaml = "scaleTargetRef: {name: x}\ntriggers:\n- type: prometheus\n  metadata: {serverAddress: 'http://p', query: a, threshold: '10'}\n- type: prometheus\n  metadata: {serverAddress: 'http://p', query: b, threshold: '100'}\n";
    let spec: ScalerSpec = crate::yaml::from_str(yaml).unwrap();
    let mut s = Scaler::new(spec.validate().unwrap(), Coupling::Quota);
    let obs = |target, a: Reading, b: Reading| Observation {
        target,
        serving: target,
        readings: vec![a, b],
    };
    assert_eq!(s.step(&obs(2, value(30.0), value(100.0)), 0).replicas, 3);
    let d = s.step(
        &obs(3, Reading::Failed("timeout".into()), value(50.0)),
        15 * S,
    );
    assert_eq!(
        d.replicas, 3,
        "b alone asks for 1: not lowered while a fails"
    );
    let d = s.step(
        &obs(3, Reading::Failed("timeout".into()), value(600.0)),
        30 * S,
    );
    assert_eq!(d.replicas, 6, "b alone asks for 6: raised");
}

#[test]
fn coupled_it_does_not_raise_the_target_while_replicas_wait() {
    let waiting = Observation {
        target: 4,
        serving: 2,
        readings: vec![value(800.0)],
    };
    let mut coupled = scaler("", Coupling::Quota);
    let d: Decision = coupled.step(&waiting, 0);
    assert_eq!(
        (d.replicas, d.why.clone()),
        (4, Why::WaitingForCapacity { serving: 2 }),
        "{d:?}"
    );
    let mut keda = scaler("", Coupling::Off);
    assert_eq!(
        keda.step(&waiting, 0).replicas,
        8,
        "KEDA + HPA raise it anyway"
    );
}

#[test]
fn coupled_a_value_metric_scales_from_the_replicas_that_serve() {
    let yaml = "scaleTargetRef: {name: x}\ntriggers:\n- type: prometheus\n  metricType: Value\n  metadata: {serverAddress: 'http://p', query: latency, threshold: '100'}\n";
    let spec: ScalerSpec = crate::yaml::from_str(yaml).unwrap();
    let settings = spec.validate().unwrap();
    // 6 replicas asked, 3 serve, latency at 1.5 × the threshold: the 3 that serve need
    // ceil(1.5 × 3) = 5; counting the 3 that wait as serving asks for ceil(1.5 × 6) = 9.
    let obs = Observation {
        target: 6,
        serving: 3,
        readings: vec![value(150.0)],
    };
    let mut coupled = Scaler::new(settings.clone(), Coupling::Quota);
    let mut keda = Scaler::new(settings, Coupling::Off);
    let d = coupled.step(&obs, 0);
    assert_eq!(
        d.replicas, 6,
        "5 asked from the 3 that serve: held, not raised: {d:?}"
    );
    assert_eq!(
        keda.step(&obs, 0).replicas,
        9,
        "runaway: 3 wait, 3 more asked"
    );
    let calm = Observation {
        readings: vec![value(90.0)],
        ..obs
    };
    let d = coupled.step(&calm, 15 * S);
    assert_eq!(
        (d.replicas, d.why),
        (3, Why::ReleasedWaiting { serving: 3 }),
        "the 3 that serve suffice"
    );
}

fn reading() -> impl Strategy<Value = Reading> {
    prop_oneof![
        6 => (0.0f64..5_000.0).prop_map(Reading::Value),
        1 => Just(Reading::Empty),
        1 => Just(Reading::Failed("down".into())),
        1 => Just(Reading::Value(f64::NAN)),
    ]
}

proptest! {
    /// Whatever the metric does: replicas stay within 0..=max, within [max(min, 1), max]
    /// unless deactivated, a failed poll never lowers them (fallback aside), and a
    /// scale-up never exceeds the default policies (max(2 × t, t + 4) per 15 s).
    #[test]
    fn decisions_stay_within_bounds_and_rate_limits(
        polls in prop::collection::vec((reading(), 0u32..3, 1u64..40), 1..60),
        min in 0u32..4,
        spread in 1u32..30,
    ) {
        let max = min + spread;
        let extra = format!("minReplicaCount: {min}\nmaxReplicaCount: {max}\ncooldownPeriod: 60\nfallback: {{failureThreshold: 4, replicas: {max}}}\n");
        let mut s = scaler(&extra, Coupling::Quota);
        let (mut target, mut now) = (min, 0u64);
        let mut ups: Vec<(u64, u32)> = Vec::new();
        for (r, pending, gap) in polls {
            now += gap * S;
            let failed = matches!(r, Reading::Failed(_)) || matches!(r, Reading::Value(v) if v.is_nan());
            let obs = Observation { target, serving: target.saturating_sub(pending), readings: vec![r] };
            let d = s.step(&obs, now);
            prop_assert!(d.replicas <= max, "{d:?}");
            if failed && !d.fallback {
                prop_assert!(d.replicas >= target, "a failed poll lowered {target} to {d:?}");
            }
            if d.why != Why::Deactivated && d.replicas > 0 {
                prop_assert!(d.replicas >= min.max(1), "{d:?}");
            }
            if matches!(d.why, Why::Metric { .. }) && d.replicas > target {
                let added: u32 = ups.iter().filter(|(t, _)| now - t < 15 * S).map(|(_, n)| n).sum();
                let start = target - added.min(target);
                prop_assert!(d.replicas <= (2 * start).max(start + 4), "{target} → {d:?}");
            }
            if d.replicas > target {
                ups.push((now, d.replicas - target));
            }
            target = d.replicas;
        }
    }
}

#[test]
fn a_coupled_scale_up_that_is_not_urgent_waits_to_preempt() {
    let mut s = scaler(
        "preemption: {persistSeconds: 180, urgentRatio: 2}\n",
        Coupling::Quota,
    );
    let d = s.step(&at(2, value(300.0)), 0);
    assert_eq!(
        (d.replicas, d.preempt_after),
        (3, Some(180 * S)),
        "3 < 2 × 2: not urgent"
    );
    let mut s = scaler(
        "preemption: {persistSeconds: 180, urgentRatio: 2}\n",
        Coupling::Quota,
    );
    let d = s.step(&at(2, value(400.0)), 0);
    assert_eq!(
        (d.replicas, d.preempt_after),
        (4, None),
        "4 ≥ 2 × 2: urgent"
    );
    let mut keda = scaler("", Coupling::Off);
    assert_eq!(keda.step(&at(2, value(300.0)), 0).preempt_after, None);
}

#[test]
fn coupled_waiting_replicas_are_released_as_soon_as_demand_falls() {
    let mut s = scaler("", Coupling::Quota);
    let waiting = Observation {
        target: 4,
        serving: 2,
        readings: vec![value(150.0)],
    };
    let d = s.step(&waiting, 0);
    assert_eq!(
        (d.replicas, d.why),
        (2, Why::ReleasedWaiting { serving: 2 }),
        "no 300 s window for replicas that serve nothing"
    );
    let mut keda = scaler("", Coupling::Off);
    assert_eq!(
        keda.step(&waiting, 0).replicas,
        4,
        "HPA holds them for its scale-down window"
    );
}

#[test]
fn a_coupled_scale_down_holds_the_capacity_it_frees() {
    let fast_down = "advanced: {horizontalPodAutoscalerConfig: {behavior: {scaleDown: {stabilizationWindowSeconds: 0}}}}\n";
    let mut s = scaler(
        &format!("{fast_down}preemption: {{holdFreedSeconds: 1800}}\n"),
        Coupling::Quota,
    );
    let d = s.step(&at(4, value(150.0)), 10 * S);
    assert_eq!((d.replicas, d.hold_freed_until), (2, Some(1810 * S)));
    let d = s.step(&at(2, value(150.0)), 25 * S);
    assert_eq!(d.hold_freed_until, None, "no scale-down, no new hold");
    let mut off = scaler(
        &format!("{fast_down}preemption: {{holdFreedSeconds: 0}}\n"),
        Coupling::Quota,
    );
    assert_eq!(off.step(&at(4, value(150.0)), 0).hold_freed_until, None);
    let mut keda = scaler(fast_down, Coupling::Off);
    let d = keda.step(&at(4, value(150.0)), 0);
    assert_eq!((d.replicas, d.hold_freed_until), (2, None));
}

/// Scaling to zero after the cooldown frees capacity too: coupled, it is held.
#[test]
fn scaling_to_zero_holds_what_it_frees() {
    let spec = "minReplicaCount: 0\ncooldownPeriod: 60\npreemption: {holdFreedSeconds: 1800}\n";
    let mut s = scaler(spec, Coupling::Quota);
    s.step(&at(2, value(150.0)), 0);
    let d = s.step(&at(2, value(0.0)), 120 * S);
    assert_eq!(d.replicas, 0, "{:?}", d.why);
    assert!(matches!(d.why, Why::Deactivated), "{:?}", d.why);
    assert_eq!(d.hold_freed_until, Some(1920 * S));
    // Already at zero: nothing freed, nothing held.
    assert_eq!(s.step(&at(0, value(0.0)), 200 * S).hold_freed_until, None);
    let mut keda = scaler(spec, Coupling::Off);
    keda.step(&at(2, value(150.0)), 0);
    let d = keda.step(&at(2, value(0.0)), 120 * S);
    assert_eq!((d.replicas, d.hold_freed_until), (0, None));
}

#[test]
fn demand_that_comes_back_within_the_hold_counts_as_persisting() {
    let run = |hold: u64| {
        let mut s = scaler(
            &format!(
                "preemption: {{persistSeconds: 120, urgentRatio: 0, holdFreedSeconds: {hold}}}\n"
            ),
            Coupling::Quota,
        );
        let d = s.step(&at(2, value(300.0)), 0);
        assert_eq!((d.replicas, d.preempt_after), (3, Some(120 * S)));
        // The spike ends before the wait does; the waiting replica is released.
        for t in (15..=120).step_by(15) {
            s.step(&at(2, value(150.0)), t * S);
        }
        s.step(&at(2, value(300.0)), 600 * S)
    };
    let d = run(1800);
    assert_eq!(
        (d.replicas, d.preempt_after),
        (3, Some(120 * S)),
        "back within the hold: the wait counts from the first spike, so it may preempt now"
    );
    let d = run(300);
    assert_eq!(
        (d.replicas, d.preempt_after),
        (3, Some(720 * S)),
        "back after the hold: a new wait"
    );
}
