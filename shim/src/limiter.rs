//! SM limiting: a token bucket on the launch path plus a feedback controller that sets
//! the refill rate from measured utilization.
//!
//! Cost is counted in *waves*: a launch of `b` blocks on a GPU with `s` SMs costs
//! `ceil(b / s)` waves (a graph launch costs one). Normalising by SM count is what lets the
//! same controller work on 20-SM and 188-SM parts; the feedback loop then learns how much
//! GPU time a wave takes, so no kernel timing is guessed.
//!
//! The launch path is one atomic subtract; only a launch that overdraws the bucket waits
//! (sleeping until the debt is repaid). A watcher thread refills the bucket every tick and,
//! every period, compares NVML utilization with the target:
//! `rate ← rate · (target / measured)^GAIN`, clamped per step. The rate only grows while
//! launches are actually being held back, so an idle or light workload does not wind it up.
//!
//! NVML's utilization is an average over its own sample period (1/6 s to 1 s depending on
//! the part; on an H200 the reading changed every 200 ms), so a reading polled every
//! [`PERIOD`] is often the same stale sample twice. Correcting twice on one sample, and
//! raising hard on the first samples (which still average the idle time before the process
//! launched anything), made the loop overshoot for about 2 s at start on a real H200 (a
//! 30 % limit gave 40 % of the unlimited throughput over the first 8 s). So the controller:
//! - acts only on a reading that changed, or that has stood for [`STALE`];
//! - never raises on the first reading taken while launches were held (it averages in the
//!   time before them), and raises by at most [`MAX_RAISE`] per step;
//! - cuts by the largest step on a saturated reading (≥ 99 %), which only says "at least
//!   100 %" and so cannot size the cut.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Token unit: one wave is 1000 tokens.
pub const WAVE: i64 = 1000;
/// Refill tick of the watcher thread.
pub const TICK: Duration = Duration::from_millis(2);
/// Feedback period (one NVML utilization sample).
pub const PERIOD: Duration = Duration::from_millis(100);
/// A reading unchanged for this long is acted on again (a steady load, or a saturated one).
pub const STALE: Duration = Duration::from_millis(200);
/// Longest a single launch is ever held (never wedge the application).
pub const MAX_HOLD: Duration = Duration::from_secs(2);
const GAIN: f64 = 0.8;
const MIN_STEP: f64 = 0.25;
/// Largest raise per step.
const MAX_RAISE: f64 = 2.0;
/// Burst allowance in seconds of rate.
const BURST_S: f64 = 0.01;
/// Starting rate in waves per second, before the first feedback.
const INITIAL_WAVES_PER_S: f64 = 1000.0;

/// Launch-side state of one device's limit.
pub struct Throttle {
    target_pct: u8,
    sm_count: u32,
    tokens: AtomicI64,
    held: AtomicBool,
}

impl Throttle {
    pub fn new(target_pct: u8, sm_count: u32) -> Throttle {
        Throttle {
            target_pct,
            sm_count: sm_count.max(1),
            tokens: AtomicI64::new(0),
            held: AtomicBool::new(false),
        }
    }

    pub fn target_pct(&self) -> u8 {
        self.target_pct
    }

    /// Tokens a launch of `blocks` blocks costs.
    pub fn cost(&self, blocks: u64) -> i64 {
        let waves = blocks.max(1).div_ceil(u64::from(self.sm_count));
        i64::try_from(waves)
            .unwrap_or(i64::MAX / WAVE)
            .saturating_mul(WAVE)
    }

    /// Take `cost` tokens. True when the bucket is overdrawn and the caller must
    /// [`Throttle::hold`] before launching.
    pub fn take(&self, cost: i64) -> bool {
        self.tokens.fetch_sub(cost, Ordering::AcqRel) - cost < 0
    }

    /// Wait (sleeping with `sleep`) until the bucket is back to zero or `MAX_HOLD` passed.
    pub fn hold(&self, mut sleep: impl FnMut(Duration)) {
        self.held.store(true, Ordering::Relaxed);
        let start = Instant::now();
        while self.tokens.load(Ordering::Acquire) < 0 && start.elapsed() < MAX_HOLD {
            sleep(Duration::from_micros(200));
        }
    }

    /// Add `amount` tokens, keeping at most `cap`.
    pub fn refill(&self, amount: i64, cap: i64) {
        let _ = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(if t >= cap {
                    t
                } else {
                    t.saturating_add(amount).min(cap)
                })
            });
    }

    /// Whether a launch was held since the last call (and reset the flag).
    pub fn take_held(&self) -> bool {
        self.held.swap(false, Ordering::Relaxed)
    }

    pub fn tokens(&self) -> i64 {
        self.tokens.load(Ordering::Acquire)
    }
}

/// The feedback controller (owned by the watcher thread).
#[derive(Debug, Clone)]
pub struct Controller {
    target: f64,
    /// Tokens per second.
    rate: f64,
    /// The last reading acted on, and when.
    last: Option<(u32, Instant)>,
    /// Whether a reading taken while launches were held has been seen.
    seen_held: bool,
}

impl Controller {
    pub fn new(target_pct: u8) -> Controller {
        Controller {
            target: f64::from(target_pct),
            rate: INITIAL_WAVES_PER_S * WAVE as f64 * f64::from(target_pct) / 100.0,
            last: None,
            seen_held: false,
        }
    }

    /// Whether `reading` (taken at `now`) is a new NVML sample worth acting on: it differs
    /// from the last one acted on, or that one has stood for [`STALE`]. Records it if so.
    pub fn fresh(&mut self, reading: u32, now: Instant) -> bool {
        let fresh = match self.last {
            Some((r, at)) => r != reading || now.saturating_duration_since(at) >= STALE,
            None => true,
        };
        if fresh {
            self.last = Some((reading, now));
        }
        fresh
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Tokens to add after `dt`, and the bucket cap.
    pub fn refill(&self, dt: Duration) -> (i64, i64) {
        let add = (self.rate * dt.as_secs_f64()) as i64;
        let cap = ((self.rate * BURST_S) as i64).max(WAVE);
        (add, cap)
    }

    /// One feedback step with the measured utilization (percent) of the last period and
    /// whether launches were held back during it.
    pub fn update(&mut self, measured_pct: f64, held: bool) {
        let m = measured_pct.clamp(0.0, 100.0);
        let first_held = held && !self.seen_held;
        self.seen_held |= held;
        let factor = if m >= 99.0 && self.target < 98.0 {
            // Saturated: the load may be any multiple of the target.
            MIN_STEP
        } else if m > self.target + 0.5 {
            // Too busy: slow down in proportion.
            (self.target / m).powf(GAIN)
        } else if held && !first_held && m < self.target - 0.5 {
            // Held back yet under target: the rate is too low.
            (self.target / m.max(1.0)).powf(GAIN)
        } else {
            1.0
        };
        self.rate = (self.rate * factor.clamp(MIN_STEP, MAX_RAISE)).clamp(1.0, 1e12);
    }
}

/// The watcher loop for one device: refill every [`TICK`], feed back every [`PERIOD`].
/// `sample` returns the device's utilization percent over the last period.
pub fn watch(th: &Throttle, mut sample: impl FnMut() -> Option<u32>) -> ! {
    let mut ctl = Controller::new(th.target_pct());
    let mut last = Instant::now();
    let mut last_feedback = last;
    loop {
        std::thread::sleep(TICK);
        let now = Instant::now();
        let (add, cap) = ctl.refill(now - last);
        th.refill(add, cap);
        last = now;
        if now - last_feedback >= PERIOD {
            last_feedback = now;
            if let Some(util) = sample().filter(|&u| ctl.fresh(u, now)) {
                let held = th.take_held();
                ctl.update(f64::from(util), held);
                if crate::log::enabled(crate::config::LogLevel::Debug) {
                    crate::log::debug(&format!(
                        "sm limit {}%: measured {util}%, held {held}, rate {:.0} waves/s",
                        th.target_pct(),
                        ctl.rate() / WAVE as f64
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_scales_with_sm_count() {
        // (sms, blocks, waves)
        let cases = [
            (108, 1, 1),
            (108, 108, 1),
            (108, 109, 2),
            (188, 188, 1),
            (188, 1000, 6),
            (20, 1000, 50),
            (0, 5, 5),
        ];
        for (sms, blocks, waves) in cases {
            assert_eq!(
                Throttle::new(50, sms).cost(blocks),
                waves * WAVE,
                "{sms} SMs, {blocks} blocks"
            );
        }
    }

    #[test]
    fn bucket_debt_and_refill() {
        let t = Throttle::new(50, 10);
        t.refill(3 * WAVE, 2 * WAVE);
        assert_eq!(t.tokens(), 2 * WAVE, "capped");
        assert!(!t.take(WAVE));
        assert!(t.take(2 * WAVE), "overdrawn");
        assert_eq!(t.tokens(), -WAVE);
        t.refill(WAVE / 2, 2 * WAVE);
        let mut slept = 0;
        let t2 = &t;
        t.hold(|_| {
            slept += 1;
            t2.refill(WAVE, 2 * WAVE);
        });
        assert_eq!(slept, 1);
        assert!(t.take_held());
        assert!(!t.take_held());
    }

    /// Simulated GPU: util = rate (waves/s) × wave time, capped at 100%. The controller
    /// must bring it within a point of the target from far above and far below.
    #[test]
    fn controller_converges_on_a_linear_plant() {
        for target in [10u8, 30, 50, 70] {
            for wave_ms in [0.05, 1.0, 20.0] {
                let mut c = Controller::new(target);
                let mut util = 0.0;
                for _ in 0..30 {
                    let waves_per_s = c.rate() / WAVE as f64;
                    util = (waves_per_s * wave_ms / 1000.0 * 100.0).min(100.0);
                    c.update(util, true);
                }
                assert!(
                    (util - f64::from(target)).abs() < 1.0,
                    "target {target} wave {wave_ms}ms: {util}"
                );
            }
        }
    }

    /// The plant seen on a real H200: NVML's reading is the mean busy share over its last
    /// 200 ms sample, refreshed every 200 ms, while the watcher polls every 100 ms; the
    /// first sample still averages in idle time from before the first launch. The workload
    /// always has work queued (a matmul loop). Returns the busy share per 100 ms step.
    fn sampled_plant(target: u8, wave_ms: f64, steps: usize) -> Vec<f64> {
        let mut c = Controller::new(target);
        let t0 = Instant::now();
        let mut busy: Vec<f64> = vec![0.0]; // one idle step before the first launch
        let mut reading = 0u32;
        for k in 1..=steps {
            let waves_per_s = c.rate() / WAVE as f64;
            busy.push((waves_per_s * wave_ms / 1000.0 * 100.0).min(100.0));
            if k % 2 == 0 {
                reading = ((busy[k] + busy[k - 1]) / 2.0).round() as u32;
            }
            let now = t0 + PERIOD * k as u32;
            if c.fresh(reading, now) {
                c.update(f64::from(reading), true);
            }
        }
        busy.remove(0);
        busy
    }

    #[test]
    fn controller_settles_fast_on_a_sampled_plant() {
        // wave time 0.7 ms: the matmul loop of hack/gpu-check.sh on an H200. 10 ms waves
        // start 10x over the initial rate guess (1 ms per wave).
        for target in [30u8, 50, 70] {
            for (wave_ms, over) in [(0.5, 6.0), (0.7, 6.0), (2.4, 6.0), (10.0, 15.0f64)] {
                let busy = sampled_plant(target, wave_ms, 50);
                let t = f64::from(target);
                // The first 2 s, as a throughput share: what a short job gets.
                let first: f64 = busy[..20].iter().sum::<f64>() / 20.0;
                assert!(
                    first <= t + over && first >= t - 6.0,
                    "target {target} wave {wave_ms}ms: first 2 s at {first:.1}%: {busy:?}"
                );
                for (k, b) in busy.iter().enumerate().skip(15) {
                    assert!(
                        (b - t).abs() <= 2.0,
                        "target {target} wave {wave_ms}ms: step {k} at {b:.1}%: {busy:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_repeated_reading_is_acted_on_once_until_stale() {
        let mut c = Controller::new(50);
        let t0 = Instant::now();
        assert!(c.fresh(92, t0));
        assert!(!c.fresh(92, t0 + PERIOD), "same sample polled again");
        assert!(c.fresh(60, t0 + PERIOD * 2), "a new value");
        assert!(!c.fresh(60, t0 + PERIOD * 3));
        assert!(
            c.fresh(60, t0 + PERIOD * 2 + STALE),
            "stood for STALE: a new sample"
        );
    }

    #[test]
    fn rate_does_not_grow_when_nothing_is_held() {
        let mut c = Controller::new(50);
        let r = c.rate();
        c.update(5.0, false);
        assert_eq!(c.rate(), r);
        c.update(90.0, false);
        assert!(c.rate() < r);
    }
}
