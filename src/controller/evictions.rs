//! Evictions refused by the API server with 429 TooManyRequests (a PodDisruptionBudget
//! allows no disruption now): the pod is retried after an exponential backoff rather than
//! on every pass, and the preemptor's pending reason says which eviction is blocked and
//! when it is retried. The only state the controller keeps between passes; lost on a
//! restart, which only means one early retry.

pub use super::model::Blocked;
use super::model::ObjRef;
use super::time::Millis;
use backon::BackoffBuilder;
use std::collections::BTreeMap;
use std::time::Duration;

/// Refused evictions with their retry times.
#[derive(Clone, Debug)]
pub struct EvictionBackoff {
    base: Millis,
    max: Millis,
    blocked: BTreeMap<ObjRef, Blocked>,
}

impl EvictionBackoff {
    /// Retries after `base`, doubling per refusal up to `max`.
    pub fn new(base: Millis, max: Millis) -> Self {
        EvictionBackoff {
            base: base.max(1),
            max: max.max(base),
            blocked: BTreeMap::new(),
        }
    }

    /// Records a refusal at `now`; returns the delay until the next try.
    pub fn refused(&mut self, pod: &ObjRef, now: Millis, why: &str) -> Millis {
        let attempts = self.blocked.get(pod).map_or(0, |b| b.attempts) + 1;
        let delay = self.delay(attempts);
        self.blocked.insert(
            pod.clone(),
            Blocked {
                until: now.saturating_add(delay),
                delay,
                attempts,
                why: why.to_string(),
            },
        );
        delay
    }

    /// The wait after the `attempts`-th refusal in a row: `base`, doubling per refusal up
    /// to `max` (reached after at most 40 doublings).
    fn delay(&self, attempts: u32) -> Millis {
        let doublings = usize::try_from(attempts.saturating_sub(1).min(40)).unwrap_or(40);
        let delay = crate::retry::doubling(
            Duration::from_millis(self.base),
            Duration::from_millis(self.max),
        )
        .build()
        .nth(doublings)
        .map_or(self.max, |d| {
            // To the nearest millisecond: the crate doubles in f32 seconds.
            let ms = d.saturating_add(Duration::from_micros(500)).as_millis();
            Millis::try_from(ms).unwrap_or(Millis::MAX)
        });
        delay.min(self.max)
    }

    /// The eviction went through (or the pod is gone).
    pub fn clear(&mut self, pod: &ObjRef) {
        self.blocked.remove(pod);
    }

    /// Forgets pods that no longer exist and refusals not retried for a whole `max`
    /// after their retry time (no preemption wants them any more).
    pub fn prune(&mut self, now: Millis, exists: impl Fn(&ObjRef) -> bool) {
        let max = self.max;
        self.blocked
            .retain(|pod, b| exists(pod) && now <= b.until.saturating_add(max));
    }

    /// The pods currently refused, for [`super::model::Snapshot::blocked`].
    pub fn blocked(&self) -> &BTreeMap<ObjRef, Blocked> {
        &self.blocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::ObjKind;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let pod = ObjRef {
            kind: ObjKind::Pod,
            namespace: "team".into(),
            name: "p".into(),
        };
        let mut b = EvictionBackoff::new(5_000, 40_000);
        let delays: Vec<Millis> = (0..6).map(|i| b.refused(&pod, i * 1000, "pdb")).collect();
        assert_eq!(delays, [5_000, 10_000, 20_000, 40_000, 40_000, 40_000]);
        assert_eq!(b.blocked()[&pod].until, 5_000 + 40_000);
        assert_eq!(b.blocked()[&pod].attempts, 6);
        b.clear(&pod);
        assert_eq!(b.refused(&pod, 0, "pdb"), 5_000, "a success resets");
        b.prune(1_000, |_| false);
        assert!(b.blocked().is_empty(), "a deleted pod is forgotten");
        b.refused(&pod, 0, "pdb");
        b.prune(5_000 + 40_000, |_| true);
        assert_eq!(b.blocked().len(), 1, "kept while it may be retried");
        b.prune(5_000 + 40_001, |_| true);
        assert!(b.blocked().is_empty(), "stale refusals are forgotten");
    }

    #[test]
    fn delays_are_whole_milliseconds_and_never_overflow() {
        let b = EvictionBackoff::new(10, 300_000);
        let delays: Vec<Millis> = (1..=17).map(|n| b.delay(n)).collect();
        let mut want: Vec<Millis> = (0..15).map(|n| 10 << n).collect();
        want.extend([300_000, 300_000]);
        assert_eq!(delays, want);
        assert_eq!(b.delay(u32::MAX), 300_000);
        let unbounded = EvictionBackoff::new(1, Millis::MAX);
        assert!(unbounded.delay(u32::MAX) >= 1 << 39, "40 doublings");
    }
}
