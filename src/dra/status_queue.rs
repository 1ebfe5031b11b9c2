//! Writing claims' `status.devices` after the kubelet got its answer, per claim in order.
//!
//! ```text
//! prepare answered ──▶ enqueue(claim, Report{Ready=True | Ready=False})   (no wait)
//! unprepare        ──▶ enqueue(claim, Clear) ─▶ waits for it, bounded
//!
//! per claim UID: at most one write in flight, and one waiting (the newest); a newer
//! request replaces the waiting one (its waiters move to it), never the one in flight
//!   worker: take the waiting op ─▶ read-modify-write (PUT …/status; 409: re-read)
//!           failed ─▶ retry with backoff (100 ms doubling to 5 s, 8 tries), unless a
//!           newer op is waiting: that one goes next instead
//! shutdown ─▶ flush(budget): wait until no claim has a write in flight or waiting
//! ```
//!
//! So a Ready written for a prepare can never land after the clearing of a later
//! unprepare of the same claim: the clear is either the waiting op that replaced the
//! Ready (which is then never written), or it runs after the Ready's PUT returned.
//! Writes of different claims run concurrently. The read-modify-write itself is
//! [`super::status`]'s pure merge on the claim as read, so other drivers' entries stay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backon::BackoffBuilder;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

use super::plugin::ClaimRef;
use super::status;

/// Tries of one read-modify-write when the claim keeps changing (409 Conflict).
const CONFLICT_ATTEMPTS: usize = 5;

/// What to write.
#[derive(Debug, Clone)]
pub enum StatusOp {
    /// The outcome of a prepare, reported on the claim as the prepare read it (re-read on
    /// a conflict or after a failed try); `at` is the condition's transition time.
    Report {
        claim: Box<ResourceClaim>,
        outcome: status::Outcome,
        at: Time,
    },
    /// Remove this driver's entries (unprepare); reads the claim first.
    Clear,
}

/// How failed writes are retried.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    /// Tries in all (the first included) before the write is given up (logged).
    pub tries: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(100),
            max: Duration::from_secs(5),
            tries: 8,
        }
    }
}

impl Backoff {
    /// The waits between the tries of one write: `first`, doubling up to `max`, one
    /// fewer than the tries (at least one try).
    fn delays(&self) -> impl Iterator<Item = Duration> {
        let retries = usize::try_from(self.tries.saturating_sub(1)).unwrap_or(usize::MAX);
        crate::retry::doubling(self.first, self.max)
            .with_max_times(retries)
            .build()
    }
}

/// The result of one try.
enum Tried {
    /// Written, or nothing to write (claim gone, recreated, no device of ours).
    Done,
    /// Worth another try (the API server failed or did not answer).
    Failed(String),
}

struct Waiting {
    claim: ClaimRef,
    op: StatusOp,
    done: Vec<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Slot {
    waiting: Option<Waiting>,
}

struct Inner {
    client: Client,
    node: String,
    backoff: Backoff,
    /// Claims (UID) with a write in flight or waiting; present while a worker runs.
    slots: Mutex<HashMap<String, Slot>>,
    /// How many claims have a worker (for [`StatusWriter::flush`]).
    busy: watch::Sender<usize>,
}

/// Writes `status.devices` in the background, per claim in order. Cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    inner: Arc<Inner>,
}

impl StatusWriter {
    pub fn new(client: Client, node: &str) -> Self {
        Self::with_backoff(client, node, Backoff::default())
    }

    pub fn with_backoff(client: Client, node: &str, backoff: Backoff) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                node: node.to_string(),
                backoff,
                slots: Mutex::new(HashMap::new()),
                busy: watch::Sender::new(0),
            }),
        }
    }

    /// Queue `op` for claim `c` behind the write in flight for it (if any), replacing an
    /// older op still waiting. The receiver fires once `op` (or an op that replaced it)
    /// was written or given up. Must be called on a Tokio runtime.
    pub fn enqueue(&self, c: &ClaimRef, op: StatusOp) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let start = !slots.contains_key(&c.uid);
        let slot = slots.entry(c.uid.clone()).or_default();
        let mut done = vec![tx];
        if let Some(older) = slot.waiting.take() {
            debug!(claim = %format!("{}/{}", c.namespace, c.name), "status write replaced by a newer one before it started");
            done.extend(older.done);
        }
        slot.waiting = Some(Waiting {
            claim: c.clone(),
            op,
            done,
        });
        if start {
            self.inner.busy.send_modify(|n| *n += 1);
            let inner = self.inner.clone();
            let uid = c.uid.clone();
            tokio::spawn(async move { inner.work(uid).await });
        }
        rx
    }

    /// Wait until no claim has a status write in flight or waiting, at most `budget`.
    /// Returns how many claims still had one when the budget ran out (0: all written).
    pub async fn flush(&self, budget: Duration) -> usize {
        let mut rx = self.inner.busy.subscribe();
        let drained = tokio::time::timeout(budget, rx.wait_for(|n| *n == 0))
            .await
            .is_ok();
        if drained {
            0
        } else {
            self.pending()
        }
    }

    /// Claims with a status write in flight or waiting.
    pub fn pending(&self) -> usize {
        *self.inner.busy.borrow()
    }
}

impl Inner {
    /// The worker of claim `uid`: runs its waiting ops one after another until none is
    /// left, then removes the claim's slot.
    async fn work(self: Arc<Self>, uid: String) {
        loop {
            let next = {
                let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
                match slots.get_mut(&uid).and_then(|s| s.waiting.take()) {
                    Some(w) => w,
                    None => {
                        slots.remove(&uid);
                        drop(slots);
                        self.busy.send_modify(|n| *n = n.saturating_sub(1));
                        return;
                    }
                }
            };
            self.run(&uid, next.claim, next.op).await;
            for tx in next.done {
                let _ = tx.send(());
            }
        }
    }

    /// Whether a newer op waits for claim `uid`.
    fn superseded(&self, uid: &str) -> bool {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .is_some_and(|s| s.waiting.is_some())
    }

    /// One op with its retries.
    async fn run(&self, uid: &str, c: ClaimRef, op: StatusOp) {
        let who = format!("{}/{}", c.namespace, c.name);
        let mut delays = self.backoff.delays();
        let mut read: Option<ResourceClaim> = match &op {
            StatusOp::Report { claim, .. } => Some((**claim).clone()),
            StatusOp::Clear => None,
        };
        for attempt in 1u32.. {
            let tried = match &op {
                StatusOp::Report { outcome, at, .. } => {
                    let (node, at) = (self.node.clone(), at.clone());
                    self.try_write(&c, read.take(), move |claim| {
                        status::report(claim, &node, outcome, at.clone())
                    })
                    .await
                }
                StatusOp::Clear => {
                    let node = self.node.clone();
                    self.try_write(&c, None, move |claim| status::clear(claim, &node))
                        .await
                }
            };
            let error = match tried {
                Tried::Done => return,
                Tried::Failed(e) => e,
            };
            if self.superseded(uid) {
                debug!(claim = %who, error = %error, "status write failed; a newer one goes instead");
                return;
            }
            let Some(delay) = delays.next() else {
                warn!(claim = %who, error = %error, tries = attempt, "status.devices not written; given up");
                return;
            };
            warn!(claim = %who, error = %error, retry_in = ?delay, "cannot write the claim's status.devices; retrying");
            tokio::time::sleep(delay).await;
            if self.superseded(uid) {
                return;
            }
        }
    }

    /// One read-modify-write of the claim's `status.devices` (`claim`: as already read;
    /// `None`: GET it), re-read on a conflict.
    async fn try_write(
        &self,
        c: &ClaimRef,
        claim: Option<ResourceClaim>,
        devices: impl Fn(&ResourceClaim) -> Option<Vec<AllocatedDeviceStatus>>,
    ) -> Tried {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
        let who = format!("{}/{}", c.namespace, c.name);
        let mut claim = match claim {
            Some(claim) => claim,
            None => match api.get(&c.name).await {
                Ok(claim) => claim,
                Err(kube::Error::Api(s)) if s.is_not_found() => return Tried::Done,
                Err(e) => return Tried::Failed(format!("cannot read the claim: {e}")),
            },
        };
        for _ in 0..CONFLICT_ATTEMPTS {
            // A recreated claim: its status is not about this request.
            if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) {
                return Tried::Done;
            }
            let Some(list) = devices(&claim) else {
                return Tried::Done;
            };
            let expect_entries = !list.is_empty();
            claim.status.get_or_insert_with(Default::default).devices = Some(list);
            match api
                .replace_status(&c.name, &PostParams::default(), &claim)
                .await
            {
                Ok(stored) => {
                    let kept = stored
                        .status
                        .as_ref()
                        .and_then(|s| s.devices.as_ref())
                        .is_some_and(|d| !d.is_empty());
                    if expect_entries && !kept {
                        warn!(claim = %who, "the API server dropped status.devices: the feature gate DRAResourceClaimDeviceStatus is off");
                    }
                    return Tried::Done;
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => match api.get(&c.name).await {
                    Ok(fresh) => claim = fresh,
                    Err(kube::Error::Api(s)) if s.is_not_found() => return Tried::Done,
                    Err(e) => return Tried::Failed(format!("cannot re-read the claim: {e}")),
                },
                Err(kube::Error::Api(s)) if s.is_not_found() => return Tried::Done,
                Err(e) => return Tried::Failed(e.to_string()),
            }
        }
        Tried::Failed("the claim kept changing (409 Conflict)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_tried_eight_times_with_capped_doubling_waits() {
        let delays: Vec<Duration> = Backoff::default().delays().collect();
        assert_eq!(delays.len(), 7, "8 tries: 7 waits between them");
        assert_eq!(delays[0], Duration::from_millis(100));
        let secs: Vec<f64> = delays.iter().map(|d| d.as_secs_f64()).collect();
        for (got, want) in secs.iter().zip([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]) {
            assert!((got - want).abs() < 1e-6, "{secs:?}");
        }
    }

    #[test]
    fn one_try_or_none_means_no_retry() {
        for tries in [0, 1] {
            let b = Backoff {
                tries,
                ..Backoff::default()
            };
            assert_eq!(b.delays().count(), 0, "tries {tries}");
        }
    }
}
