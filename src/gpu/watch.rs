//! Keeping the backend's health watch alive, and undoing a MIG reconfiguration that
//! failed half-way.
//!
//! A driver's event stream can end (NVML's event thread dies, the driver is reloaded) or
//! fail to start. [`keep_watching`] restarts it with exponential backoff and says when it
//! is down and up again, so the node keeps its devices advertised (health as last known)
//! instead of losing health events for good or exiting.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{Error, GpuBackend, HealthSender, MigDeviceInfo, Result};

/// Waits between restarts of a watch: `initial`, doubling up to `max`; back to `initial`
/// after a watch that ran at least `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The sequence of waits.
    pub fn delays(&self) -> crate::retry::Backoff {
        crate::retry::Backoff::doubling(self.initial, self.max)
    }
}

/// When to retry something that failed, with [`Backoff`] (the agent's reload after a
/// GPU driver error).
#[derive(Debug)]
pub struct RetryTimer {
    delays: crate::retry::Backoff,
    next: Option<tokio::time::Instant>,
}

impl Default for RetryTimer {
    fn default() -> Self {
        Self::new(Backoff::default())
    }
}

impl RetryTimer {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            delays: backoff.delays(),
            next: None,
        }
    }

    /// It failed: retry after the next wait (returned).
    pub fn failed(&mut self) -> Duration {
        let wait = self.delays.next_delay();
        self.next = Some(tokio::time::Instant::now() + wait);
        wait
    }

    /// It worked: no retry, and the next failure waits the shortest time again.
    pub fn succeeded(&mut self) {
        self.delays.reset();
        self.next = None;
    }

    /// When the retry is due, if one is pending.
    pub fn due(&self) -> Option<tokio::time::Instant> {
        self.next
    }

    /// The retry starts now (its outcome calls [`Self::failed`] or [`Self::succeeded`]).
    pub fn start(&mut self) {
        self.next = None;
    }
}

/// What [`keep_watching`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchState {
    /// A watch is delivering events.
    Running,
    /// No watch runs (it failed to start or ended); the next try is in `retry_in`.
    Down { reason: String, retry_in: Duration },
}

/// Forward `backend`'s health events to `out` until `cancel` fires or `out` is closed,
/// restarting the watch with `backoff` whenever it fails to start or ends.
/// `on_state` hears every change between running and down.
pub async fn keep_watching(
    backend: Arc<dyn GpuBackend>,
    out: HealthSender,
    backoff: Backoff,
    mut on_state: impl FnMut(WatchState) + Send,
    cancel: CancellationToken,
) {
    let mut delays = backoff.delays();
    loop {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let started = tokio::time::Instant::now();
        let reason = match backend.watch_health(tx) {
            Err(e) => format!("cannot start: {e}"),
            Ok(()) => {
                on_state(WatchState::Running);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = out.closed() => return,
                        event = rx.recv() => match event {
                            Some(e) => {
                                if out.send(e).is_err() {
                                    return;
                                }
                            }
                            None => break,
                        },
                    }
                }
                "the driver's event stream ended".to_string()
            }
        };
        if started.elapsed() >= backoff.max {
            delays.reset();
        }
        let wait = delays.next_delay();
        warn!(%reason, retry_in = ?wait, "GPU health watch lost; devices keep their last known health until it is back");
        on_state(WatchState::Down {
            reason,
            retry_in: wait,
        });
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = out.closed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        info!("restarting the GPU health watch");
    }
}

/// [`GpuBackend::apply_mig_layout`], all or nothing: when it fails (a driver can fail
/// half-way, some instances created, then an error), the GPU's MIG devices are put back
/// to `before` (what they were when the caller read them) so no instance is left that
/// nothing advertises or owns. The error says what failed and whether the rollback
/// worked.
pub fn apply_mig_layout_or_restore(
    backend: &dyn GpuBackend,
    gpu_uuid: &str,
    before: &[(String, u8)],
    layout: &[(String, u8)],
) -> Result<Vec<MigDeviceInfo>> {
    let failed = match backend.apply_mig_layout(gpu_uuid, layout) {
        Ok(devices) => return Ok(devices),
        Err(e) => e,
    };
    let mut before = before.to_vec();
    before.sort_by_key(|(_, start)| *start);
    let now = backend
        .inventory()
        .map_err(|e| e.to_string())
        .and_then(|inv| {
            inv.gpu(gpu_uuid)
                .map(|g| {
                    g.mig_devices
                        .iter()
                        .map(|m| (m.profile.clone(), m.start))
                        .collect::<Vec<_>>()
                })
                .ok_or_else(|| "the GPU is gone".to_string())
        });
    let undo = match now {
        Ok(now) if now == before => Ok("nothing was left to undo"),
        _ => backend
            .apply_mig_layout(gpu_uuid, &before)
            .map(|_| "the instances it created were destroyed")
            .map_err(|e| e.to_string()),
    };
    let reason = match undo {
        Ok(done) => {
            warn!(gpu = %gpu_uuid, error = %failed, "MIG reconfiguration failed; rolled back");
            format!("{failed}; {done}")
        }
        Err(e) => {
            error!(gpu = %gpu_uuid, error = %failed, rollback = %e,
                   "MIG reconfiguration failed and could not be rolled back");
            format!("{failed}; rolling back failed too: {e}")
        }
    };
    Err(Error::Mig {
        gpu: gpu_uuid.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::{FakeBackend, Faults};

    #[tokio::test(start_paused = true)]
    async fn a_retry_timer_doubles_to_the_cap_and_a_success_resets_it() {
        let mut t = RetryTimer::new(Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(2),
        });
        assert_eq!(t.due(), None);
        let waits: Vec<u128> = (0..4).map(|_| t.failed().as_millis()).collect();
        assert_eq!(waits, [500, 1_000, 2_000, 2_000]);
        let now = tokio::time::Instant::now();
        assert_eq!(t.due(), Some(now + Duration::from_secs(2)));
        t.start();
        assert_eq!(t.due(), None, "the retry runs");
        t.succeeded();
        assert_eq!(t.due(), None);
        assert_eq!(
            t.failed(),
            Duration::from_millis(500),
            "a success starts over"
        );
    }

    #[tokio::test]
    async fn a_dead_watch_is_restarted_with_backoff() {
        let fake = Arc::new(FakeBackend::from_spec("1xL4").unwrap());
        fake.set_faults(Faults {
            health_watch_start_failures: 2,
            ..Faults::default()
        });
        let uuid = fake.inventory().unwrap().gpus[0].uuid.clone();
        let (out, mut events) = mpsc::unbounded_channel();
        let (state_tx, mut states) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
        };
        let task = tokio::spawn(keep_watching(
            fake.clone(),
            out,
            backoff,
            move |s| drop(state_tx.send(s)),
            cancel.clone(),
        ));
        async fn next(states: &mut mpsc::UnboundedReceiver<WatchState>) -> WatchState {
            tokio::time::timeout(Duration::from_secs(5), states.recv())
                .await
                .unwrap()
                .unwrap()
        }
        // Two failed starts, 10 then 20 ms apart, then a watch.
        for want in [10, 20] {
            match next(&mut states).await {
                WatchState::Down { reason, retry_in } => {
                    assert!(reason.contains("cannot start"), "{reason}");
                    assert_eq!(retry_in, Duration::from_millis(want));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(next(&mut states).await, WatchState::Running);
        // The stream ends: restarted, and events flow again.
        fake.end_health_watches();
        assert!(matches!(next(&mut states).await, WatchState::Down { .. }));
        assert_eq!(next(&mut states).await, WatchState::Running);
        fake.inject(crate::gpu::HealthEvent::Recovered {
            gpu_uuid: uuid.clone(),
        });
        let got = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
        assert_eq!(
            got.unwrap(),
            Some(crate::gpu::HealthEvent::Recovered { gpu_uuid: uuid })
        );
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_half_failed_mig_create_is_rolled_back() {
        let fake =
            FakeBackend::from_yaml("gpus: [ { model: A100-80GB, migEnabled: true } ]").unwrap();
        let gpu = fake.inventory().unwrap().gpus[0].clone();
        let before: Vec<(String, u8)> = Vec::new();
        fake.set_faults(Faults {
            mig_create_failures: 1,
            mig_create_fails_after: 2,
            ..Faults::default()
        });
        let layout = vec![
            ("3g.40gb".to_string(), 0),
            ("2g.20gb".to_string(), 4),
            ("1g.10gb".to_string(), 6),
        ];
        let err = apply_mig_layout_or_restore(&fake, &gpu.uuid, &before, &layout)
            .unwrap_err()
            .to_string();
        assert!(err.contains("injected driver fault"), "{err}");
        assert!(err.contains("were destroyed"), "{err}");
        let after = fake.inventory().unwrap().gpus[0].mig_devices.clone();
        assert_eq!(after, Vec::new(), "no orphan instance");
        // A retry works.
        let devices = apply_mig_layout_or_restore(&fake, &gpu.uuid, &before, &layout).unwrap();
        assert_eq!(devices.len(), 3);
    }
}
