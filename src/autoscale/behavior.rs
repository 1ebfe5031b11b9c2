//! The HPA's `behavior`, as the Kubernetes horizontal-pod-autoscaler controller applies
//! it to a raw recommendation:
//!
//! 1. **Stabilization.** Every raw recommendation is remembered with its time. A scale-up
//!    goes only as high as the *lowest* recommendation within the scale-up window, a
//!    scale-down only as low as the *highest* within the scale-down window, so a spike or
//!    a dip shorter than the window does not move the target.
//! 2. **Rate limits.** Each policy bounds the change over its period, counted from the
//!    replicas the target had at the period's start (the changes made within the
//!    period are remembered): `Pods` adds or removes at most `value` pods, `Percent` at
//!    most `value` % of the start. `selectPolicy: Max` takes the policy allowing the
//!    largest change, `Min` the smallest, `Disabled` none.
//!
//! Pure: the history is a value the caller keeps, times are milliseconds passed in.

use super::spec::{RatePolicy, Rules, Select};
use crate::quota::quantity::Time;
use std::collections::VecDeque;

/// What the behaviour remembers between decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// `(time, raw recommendation)`, oldest first.
    recommendations: VecDeque<(Time, u32)>,
    /// `(time, replicas added)` of the scale-ups made.
    ups: VecDeque<(Time, u32)>,
    /// `(time, replicas removed)` of the scale-downs made.
    downs: VecDeque<(Time, u32)>,
    /// The first recommendation has been seeded with the replicas found (as the HPA
    /// controller does for a new autoscaler, so that a fresh start does not scale down
    /// before a window has passed).
    seeded: bool,
}

impl History {
    /// Forgets what no window or period can reach any more.
    fn prune(&mut self, now: Time, up: &Rules, down: &Rules) {
        let keep = up.stabilization_ms.max(down.stabilization_ms);
        while self
            .recommendations
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > keep)
        {
            self.recommendations.pop_front();
        }
        for (events, rules) in [(&mut self.ups, up), (&mut self.downs, down)] {
            let longest = rules.policies.iter().map(RatePolicy::period_ms).max();
            let longest = longest.unwrap_or(0);
            while events
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) >= longest)
            {
                events.pop_front();
            }
        }
    }

    /// Records a change of the target made at `now`.
    pub fn record_change(&mut self, now: Time, from: u32, to: u32) {
        if to > from {
            self.ups.push_back((now, to - from));
        } else if to < from {
            self.downs.push_back((now, from - to));
        }
    }
}

/// Sum of the changes in `events` strictly within `period_ms` before `now`.
fn changed_within(events: &VecDeque<(Time, u32)>, now: Time, period_ms: u64) -> u32 {
    events
        .iter()
        .filter(|(t, _)| now.saturating_sub(*t) < period_ms)
        .fold(0u32, |sum, (_, n)| sum.saturating_add(*n))
}

/// The recommendation after the stabilization windows (HPA's
/// `stabilizeRecommendationWithBehaviors`); `raw` is remembered.
pub fn stabilize(
    history: &mut History,
    now: Time,
    current: u32,
    raw: u32,
    up: &Rules,
    down: &Rules,
) -> u32 {
    if !history.seeded {
        history.seeded = true;
        history.recommendations.push_back((now, current));
    }
    history.prune(now, up, down);
    let (mut up_rec, mut down_rec) = (raw, raw);
    for &(t, r) in &history.recommendations {
        let age = now.saturating_sub(t);
        if age < up.stabilization_ms {
            up_rec = up_rec.min(r);
        }
        if age < down.stabilization_ms {
            down_rec = down_rec.max(r);
        }
    }
    history.recommendations.push_back((now, raw));
    current.max(up_rec).min(down_rec)
}

/// The highest target the scale-up policies allow from `current` at `now`.
pub fn scale_up_limit(history: &History, now: Time, current: u32, rules: &Rules) -> u32 {
    let proposals = rules.policies.iter().map(|p| {
        let start = current.saturating_sub(changed_within(&history.ups, now, p.period_ms()));
        match *p {
            RatePolicy::Pods { value, .. } => start.saturating_add(value),
            RatePolicy::Percent { value, .. } => {
                let grown = (u64::from(start) * (100 + u64::from(value))).div_ceil(100);
                u32::try_from(grown).unwrap_or(u32::MAX)
            }
        }
    });
    match rules.select {
        Select::Disabled => current,
        Select::Max => proposals.max().unwrap_or(current).max(current),
        Select::Min => proposals.min().unwrap_or(current).max(current),
    }
}

/// The lowest target the scale-down policies allow from `current` at `now`.
pub fn scale_down_limit(history: &History, now: Time, current: u32, rules: &Rules) -> u32 {
    let proposals = rules.policies.iter().map(|p| {
        let start = current.saturating_add(changed_within(&history.downs, now, p.period_ms()));
        match *p {
            RatePolicy::Pods { value, .. } => start.saturating_sub(value),
            RatePolicy::Percent { value, .. } => {
                let kept = u64::from(start) * u64::from(100u32.saturating_sub(value)) / 100;
                u32::try_from(kept).unwrap_or(u32::MAX)
            }
        }
    });
    match rules.select {
        Select::Disabled => current,
        // The largest change is the lowest target.
        Select::Max => proposals.min().unwrap_or(current).min(current),
        Select::Min => proposals.max().unwrap_or(current).min(current),
    }
}

/// `desired` bounded by the rate limits of its direction.
pub fn limit_rate(
    history: &History,
    now: Time,
    current: u32,
    desired: u32,
    up: &Rules,
    down: &Rules,
) -> u32 {
    if desired > current {
        desired.min(scale_up_limit(history, now, current, up))
    } else if desired < current {
        desired.max(scale_down_limit(history, now, current, down))
    } else {
        desired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(window_s: u64, select: Select, policies: Vec<RatePolicy>) -> Rules {
        Rules {
            stabilization_ms: window_s * 1000,
            select,
            policies,
        }
    }

    fn hpa_up() -> Rules {
        Rules::hpa_up()
    }

    fn hpa_down() -> Rules {
        Rules::hpa_down()
    }

    #[test]
    fn hpa_defaults_double_or_add_four_on_the_way_up() {
        let h = History::default();
        assert_eq!(scale_up_limit(&h, 0, 1, &hpa_up()), 5, "max(1 × 2, 1 + 4)");
        assert_eq!(
            scale_up_limit(&h, 0, 10, &hpa_up()),
            20,
            "max(10 × 2, 10 + 4)"
        );
        assert_eq!(
            scale_up_limit(&h, 0, 0, &hpa_up()),
            4,
            "from zero only Pods grows"
        );
    }

    #[test]
    fn changes_within_the_period_count_against_the_limit() {
        let mut h = History::default();
        let up = rules(
            0,
            Select::Max,
            vec![RatePolicy::Pods {
                value: 4,
                period_ms: 60_000,
            }],
        );
        h.record_change(0, 2, 6);
        assert_eq!(
            scale_up_limit(&h, 30_000, 6, &up),
            6,
            "4 added 30 s ago: none left"
        );
        assert_eq!(
            scale_up_limit(&h, 60_000, 6, &up),
            10,
            "the period has passed"
        );
    }

    #[test]
    fn select_min_takes_the_smaller_change_and_disabled_none() {
        let h = History::default();
        let policies = vec![
            RatePolicy::Percent {
                value: 50,
                period_ms: 15_000,
            },
            RatePolicy::Pods {
                value: 1,
                period_ms: 15_000,
            },
        ];
        assert_eq!(
            scale_up_limit(&h, 0, 10, &rules(0, Select::Min, policies.clone())),
            11
        );
        assert_eq!(
            scale_down_limit(&h, 0, 10, &rules(0, Select::Min, policies.clone())),
            9
        );
        assert_eq!(
            scale_down_limit(&h, 0, 10, &rules(0, Select::Max, policies.clone())),
            5
        );
        assert_eq!(
            scale_down_limit(&h, 0, 10, &rules(0, Select::Disabled, policies)),
            10
        );
    }

    #[test]
    fn a_dip_shorter_than_the_scale_down_window_does_not_scale_down() {
        let (up, down) = (hpa_up(), hpa_down());
        let mut h = History::default();
        assert_eq!(stabilize(&mut h, 0, 10, 10, &up, &down), 10);
        assert_eq!(
            stabilize(&mut h, 60_000, 10, 2, &up, &down),
            10,
            "10 was asked 60 s ago"
        );
        assert_eq!(stabilize(&mut h, 299_000, 10, 3, &up, &down), 10);
        // 10 left the window; the highest within it is now 3.
        assert_eq!(stabilize(&mut h, 301_000, 10, 2, &up, &down), 3);
    }

    #[test]
    fn a_spike_shorter_than_the_scale_up_window_does_not_scale_up() {
        let up = rules(60, Select::Max, hpa_up().policies);
        let down = rules(0, Select::Max, hpa_down().policies);
        let mut h = History::default();
        assert_eq!(stabilize(&mut h, 0, 2, 2, &up, &down), 2);
        assert_eq!(
            stabilize(&mut h, 15_000, 2, 9, &up, &down),
            2,
            "2 is within 60 s"
        );
        assert_eq!(
            stabilize(&mut h, 61_000, 2, 9, &up, &down),
            9,
            "9 for the whole window"
        );
    }
}
