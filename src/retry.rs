//! Retry delays: how long a loop waits before it tries again after a failure. One
//! exponential policy from [`backon`] for all of them (watches, registrations, slice
//! publishing, claim status writes, accepts, evictions): a first delay, doubling per
//! failure up to a cap, no jitter, and for the few that give up, a number of tries.
//! [`Backoff`] adds what the long-lived loops need on top: starting over after a success.
//!
//! The loops sleep themselves, on tokio and beside their cancellation token, so shutdown
//! stops a wait at once and tests run them on paused time; this module has no timer and
//! is pure.
//!
//! The crate doubles in `f32` seconds: the first delay and the cap are exact, a delay in
//! between that is not a binary fraction of a second is within a microsecond of its exact
//! value (10 ms doubles to 20 ms, then 39.999999 ms).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// `initial`, doubling per failure up to `max` (a `max` below `initial` caps every
/// delay after the first), without jitter and without end; bound the number of delays
/// with [`ExponentialBuilder::with_max_times`].
pub fn doubling(initial: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(initial)
        .with_factor(2.0)
        .with_max_delay(max)
        .without_max_times()
}

/// The sequence of delays one policy yields.
type Delays = <ExponentialBuilder as BackoffBuilder>::Backoff;

/// The delays of a loop that keeps retrying: [`doubling`] from `initial` to `max`,
/// started over by [`Self::reset`] after a success.
#[derive(Debug)]
pub struct Backoff {
    policy: ExponentialBuilder,
    max: Duration,
    delays: Delays,
}

impl Backoff {
    /// Waits of `initial`, doubling per failure up to `max`.
    pub fn doubling(initial: Duration, max: Duration) -> Self {
        let policy = doubling(initial, max);
        Self {
            policy,
            max: max.max(initial),
            delays: policy.build(),
        }
    }

    /// The wait after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        // Without a limit on the number of delays the sequence never ends; the cap is
        // what it would yield.
        self.delays.next().unwrap_or(self.max)
    }

    /// It worked: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.delays = self.policy.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn delays_double_up_to_the_cap_and_stay_there() {
        let mut b = Backoff::doubling(ms(1_000), ms(30_000));
        let delays: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        let want = [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000];
        assert_eq!(delays, want.map(ms));
        // Far past the cap it neither overflows nor ends.
        assert_eq!((0..200).map(|_| b.next_delay()).last(), Some(ms(30_000)));
    }

    #[test]
    fn a_reset_starts_over_from_the_first_delay() {
        let mut b = Backoff::doubling(ms(500), ms(4_000));
        b.next_delay();
        b.next_delay();
        assert_eq!(b.next_delay(), ms(2_000));
        b.reset();
        assert_eq!([b.next_delay(), b.next_delay()], [ms(500), ms(1_000)]);
    }

    #[test]
    fn a_cap_below_the_first_delay_caps_the_later_ones() {
        let mut b = Backoff::doubling(ms(100), ms(60));
        assert_eq!([b.next_delay(), b.next_delay()], [ms(100), ms(60)]);
    }

    #[test]
    fn delays_that_are_no_binary_fraction_stay_within_a_microsecond() {
        let mut b = Backoff::doubling(ms(10), ms(30_000));
        for n in 0..12 {
            let exact = ms(10 << n).min(ms(30_000));
            let got = b.next_delay();
            assert!(
                got.abs_diff(exact) < Duration::from_micros(1),
                "{n}: {got:?}"
            );
        }
    }

    #[test]
    fn a_number_of_tries_ends_the_delays() {
        let delays: Vec<Duration> = doubling(ms(100), ms(5_000))
            .with_max_times(3)
            .build()
            .collect();
        assert_eq!(delays.len(), 3);
        assert_eq!(delays[0], ms(100));
        assert!(delays[2].abs_diff(ms(400)) < Duration::from_micros(1));
    }
}
