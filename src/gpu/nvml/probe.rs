//! Recovery probing, as pure logic: what one probe of a GPU found ([`ProbeSample`]), and
//! when a GPU that reported a fault counts as recovered ([`RecoveryWatch`]).
//!
//! The backend does not decide whether a fault matters (that is
//! [`crate::gpu::health`]'s job): every XID or ECC event starts probing its GPU, and
//! after [`ProbeConfig::clean_needed`] consecutive clean probes, [`ProbeConfig::interval`]
//! apart, the backend reports `Recovered`. A `Recovered` for a GPU the tracker never
//! marked unhealthy (an application XID) is a no-op there.
//!
//! Time is passed in (`now`), so tests drive it without sleeping.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Probe cadence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Time between two probes of one GPU.
    pub interval: Duration,
    /// Consecutive clean probes before the GPU counts as recovered.
    pub clean_needed: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            clean_needed: 3,
        }
    }
}

/// What one probe found. `None`: the GPU does not support that check (it then does not
/// hold recovery back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSample {
    /// NVML still resolves the GPU by UUID.
    pub reachable: bool,
    /// `nvmlDeviceGetMemoryInfo` succeeds.
    pub memory_ok: bool,
    /// Pages wait for retirement (needs a reset), pre-Ampere.
    pub retirement_pending: Option<bool>,
    /// A row remapping waits for a reset, Ampere and newer.
    pub remap_pending: Option<bool>,
    /// A row remapping failed: the GPU needs service.
    pub remap_failed: Option<bool>,
}

impl ProbeSample {
    /// A GPU NVML could not even find.
    pub fn unreachable() -> Self {
        Self {
            reachable: false,
            memory_ok: false,
            retirement_pending: None,
            remap_pending: None,
            remap_failed: None,
        }
    }

    /// Responsive and nothing waits for a reset.
    pub fn is_clean(&self) -> bool {
        self.reachable
            && self.memory_ok
            && self.retirement_pending != Some(true)
            && self.remap_pending != Some(true)
            && self.remap_failed != Some(true)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    next_due: Instant,
    streak: u32,
}

/// GPUs being probed after a fault, with their clean streaks.
#[derive(Debug, Clone)]
pub struct RecoveryWatch {
    config: ProbeConfig,
    gpus: BTreeMap<String, Pending>,
}

impl RecoveryWatch {
    pub fn new(config: ProbeConfig) -> Self {
        Self {
            config,
            gpus: BTreeMap::new(),
        }
    }

    /// A fault was reported for `gpu`: (re)start probing it with a zero streak.
    pub fn fault(&mut self, gpu: &str, now: Instant) {
        self.gpus.insert(
            gpu.to_string(),
            Pending {
                next_due: now + self.config.interval,
                streak: 0,
            },
        );
    }

    /// GPUs whose next probe is due at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.gpus
            .iter()
            .filter(|(_, p)| p.next_due <= now)
            .map(|(gpu, _)| gpu.clone())
            .collect()
    }

    /// The earliest time a probe is due, if any GPU is being watched.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.gpus.values().map(|p| p.next_due).min()
    }

    /// Record a probe of `gpu`. Returns true when this probe completes the clean streak:
    /// the GPU has recovered and is no longer watched. A dirty probe resets the streak.
    pub fn record(&mut self, gpu: &str, clean: bool, now: Instant) -> bool {
        let Some(p) = self.gpus.get_mut(gpu) else {
            return false;
        };
        p.streak = if clean { p.streak + 1 } else { 0 };
        if p.streak >= self.config.clean_needed {
            self.gpus.remove(gpu);
            return true;
        }
        p.next_due = now + self.config.interval;
        false
    }

    pub fn is_watching(&self, gpu: &str) -> bool {
        self.gpus.contains_key(gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean() -> ProbeSample {
        ProbeSample {
            reachable: true,
            memory_ok: true,
            retirement_pending: Some(false),
            remap_pending: Some(false),
            remap_failed: Some(false),
        }
    }

    #[test]
    fn sample_cleanliness_table() {
        let unsupported = ProbeSample {
            retirement_pending: None,
            remap_pending: None,
            remap_failed: None,
            ..clean()
        };
        let cases = [
            ("all clean", clean(), true),
            ("checks unsupported", unsupported, true),
            ("unreachable", ProbeSample::unreachable(), false),
            (
                "memory info fails",
                ProbeSample {
                    memory_ok: false,
                    ..clean()
                },
                false,
            ),
            (
                "retirement pending",
                ProbeSample {
                    retirement_pending: Some(true),
                    ..clean()
                },
                false,
            ),
            (
                "remap pending",
                ProbeSample {
                    remap_pending: Some(true),
                    ..clean()
                },
                false,
            ),
            (
                "remap failed",
                ProbeSample {
                    remap_failed: Some(true),
                    ..clean()
                },
                false,
            ),
        ];
        for (name, sample, want) in cases {
            assert_eq!(sample.is_clean(), want, "{name}");
        }
    }

    #[test]
    fn three_clean_probes_five_seconds_apart_recover() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = RecoveryWatch::new(ProbeConfig::default());
        w.fault("GPU-a", t0);
        assert!(
            w.due(t0 + s(4)).is_empty(),
            "first probe waits one interval"
        );
        assert_eq!(w.due(t0 + s(5)), vec!["GPU-a".to_string()]);
        assert!(!w.record("GPU-a", true, t0 + s(5)));
        assert!(w.due(t0 + s(9)).is_empty());
        assert!(!w.record("GPU-a", true, t0 + s(10)));
        assert!(w.record("GPU-a", true, t0 + s(15)), "third clean probe");
        assert!(!w.is_watching("GPU-a"));
        assert_eq!(w.next_deadline(), None);
        assert!(!w.record("GPU-a", true, t0 + s(20)), "not watched any more");
    }

    #[test]
    fn dirty_probe_or_new_fault_resets_the_streak() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = RecoveryWatch::new(ProbeConfig::default());
        w.fault("GPU-a", t0);
        assert!(!w.record("GPU-a", true, t0 + s(5)));
        assert!(!w.record("GPU-a", true, t0 + s(10)));
        assert!(!w.record("GPU-a", false, t0 + s(15)), "dirty");
        assert!(!w.record("GPU-a", true, t0 + s(20)));
        assert!(!w.record("GPU-a", true, t0 + s(25)));
        w.fault("GPU-a", t0 + s(26));
        assert_eq!(w.next_deadline(), Some(t0 + s(31)));
        assert!(!w.record("GPU-a", true, t0 + s(31)));
        assert!(!w.record("GPU-a", true, t0 + s(36)));
        assert!(w.record("GPU-a", true, t0 + s(41)));
    }

    #[test]
    fn gpus_are_probed_independently() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = RecoveryWatch::new(ProbeConfig {
            interval: s(1),
            clean_needed: 1,
        });
        w.fault("GPU-a", t0);
        w.fault("GPU-b", t0 + s(2));
        assert_eq!(w.due(t0 + s(1)), vec!["GPU-a".to_string()]);
        assert_eq!(w.next_deadline(), Some(t0 + s(1)));
        assert!(w.record("GPU-a", true, t0 + s(1)));
        assert!(w.is_watching("GPU-b"));
        assert_eq!(w.due(t0 + s(3)), vec!["GPU-b".to_string()]);
    }
}
