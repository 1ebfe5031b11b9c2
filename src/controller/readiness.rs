//! What objects record about `waitForPodsReady`, read without a request: whether pods
//! and Jobs are Ready, the requeue count and eviction time written on them, and when a
//! requeued workload may be admitted again. Pure; [`super::pods_ready`] decides the
//! timeouts from these, [`super::requeue_book`] keeps the same state for workloads
//! whose objects do not outlive their pods.

use super::time::{millis, Millis};
use crate::quota::WaitForPodsReady;
use serde_json::Value;

/// When all pods of the workload were first seen Ready (RFC 3339).
pub const PODS_READY_AT_ANNOTATION: &str = "tessera.io/pods-ready-at";

/// How many times the workload was evicted for a pods-ready timeout.
pub const REQUEUE_COUNT_ANNOTATION: &str = "tessera.io/requeue-count";

/// When it was last evicted for a pods-ready timeout (RFC 3339).
pub const EVICTED_AT_ANNOTATION: &str = "tessera.io/evicted-at";

/// Whether a pod reports the `Ready` condition.
pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|x| x["type"] == "Ready" && x["status"] == "True")
    })
}

/// Whether a Job's pods are ready: `status.ready + status.succeeded` reach its
/// parallelism (Kueue's rule for batch Jobs).
pub fn job_ready(job: &Value) -> bool {
    let want = job["spec"]["parallelism"].as_u64().unwrap_or(1);
    let have = job["status"]["ready"].as_u64().unwrap_or(0)
        + job["status"]["succeeded"].as_u64().unwrap_or(0);
    have >= want
}

/// Whether the object records that its pods were Ready once.
pub fn ready_recorded(object: &Value) -> bool {
    object["metadata"]["annotations"][PODS_READY_AT_ANNOTATION].is_string()
}

/// Requeue state of an object evicted for a pods-ready timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requeue {
    pub count: u32,
    pub evicted_at: Millis,
}

/// Reads the requeue annotations (absent or unreadable: never requeued).
pub fn requeue_state(object: &Value) -> Option<Requeue> {
    let a = &object["metadata"]["annotations"];
    let count = a[REQUEUE_COUNT_ANNOTATION].as_str()?.parse().ok()?;
    let evicted_at = a[EVICTED_AT_ANNOTATION].as_str().and_then(millis)?;
    Some(Requeue { count, evicted_at })
}

/// The later of two requeue states (more requeues, then the later eviction).
pub fn latest(a: Option<Requeue>, b: Option<Requeue>) -> Option<Requeue> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if (y.count, y.evicted_at) > (x.count, x.evicted_at) {
            y
        } else {
            x
        }),
        (x, y) => x.or(y),
    }
}

/// The requeue count to record when `l` times out now: one more than recorded, unless
/// the state was recorded at or after its admission (this timeout is counted already).
pub fn next_count(requeue: Option<Requeue>, admitted_at: Millis) -> u32 {
    match requeue {
        Some(r) if r.evicted_at >= admitted_at => r.count.max(1),
        r => r.map_or(0, |r| r.count).saturating_add(1),
    }
}

/// What a requeued workload waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Back in the queue at this time.
    Backoff(Millis),
    /// `backoffLimitCount` exceeded: never admitted again (delete or recreate it).
    Deactivated,
}

/// Whether a workload requeued `r` must still wait at `now`.
pub fn hold(cfg: &WaitForPodsReady, r: Requeue, now: Millis) -> Option<Hold> {
    if r.count == 0 {
        return None;
    }
    if cfg.backoff_limit_count.is_some_and(|limit| r.count > limit) {
        return Some(Hold::Deactivated);
    }
    let delay = cfg
        .backoff_base
        .saturating_mul(1u64 << (r.count - 1).min(40))
        .min(cfg.backoff_max);
    let until = r.evicted_at.saturating_add(delay);
    (until > now).then_some(Hold::Backoff(until))
}

/// Whether an admitted workload whose pods are not Ready has run out of time.
pub fn timed_out(cfg: &WaitForPodsReady, admitted_at: Millis, now: Millis) -> bool {
    now >= admitted_at.saturating_add(cfg.timeout)
}
