//! What the engine reports: events (admitted, preempted, evicted, pending, finished) and the
//! final state, in the stable JSON shape of `tessera plan` (documented in `docs/plan.md`).

use super::quantity::Time;
use serde::Serialize;
use std::collections::BTreeMap;

/// Flavors per pod set, then per resource: `{"main": {"nvidia.com/gpu": "h100"}}`.
pub type FlavorMap = BTreeMap<String, BTreeMap<String, String>>;

/// Why a workload is not admitted. Each carries enough to act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingReason {
    /// Queued, not evaluated yet (or blocked behind a StrictFIFO head).
    Queued,
    /// No flavor of the queue covers a requested resource, or every flavor's node
    /// labels/taints rule the pod set out.
    NoMatchingFlavor(String),
    /// The request exceeds the most the queue could ever get (nominal + borrowing).
    ExceedsMaxQuota(String),
    /// Fits the queue's limits but not the quota free now: `message` says how much is
    /// free, `brief` only what is requested (see [`Positions::Ranged`]).
    WaitingForQuota {
        message: String,
        brief: String,
    },
    /// Preemptions were issued for this workload; victims are still terminating.
    WaitingForPreemptedWorkloads(String),
    /// Only victims younger than their queue's minimum runtime could make room.
    MinimumRuntime {
        until: Time,
        message: String,
    },
    /// Admission needs preemption and the workload may not preempt before `until`
    /// (an autoscaler's replica waiting for its demand to persist).
    DemandNotPersisted {
        until: Time,
        message: String,
    },
    /// The ClusterQueue has a stopPolicy.
    ClusterQueueStopped,
    /// `waitForPodsReady.blockAdmission`: an admitted workload's pods are not all ready.
    WaitingForPodsReady,
    /// Evicted after a waitForPodsReady timeout; requeued at `until`.
    Backoff {
        until: Time,
        count: u32,
    },
    /// Requeued more than backoffLimitCount times.
    Deactivated(u32),
    LocalQueueNotFound,
    ClusterQueueNotFound(String),
    /// The ClusterQueue's namespaceSelector does not admit the namespace.
    NamespaceNotAllowed(String),
}

impl PendingReason {
    /// The stable reason code used in JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            PendingReason::Queued => "Queued",
            PendingReason::NoMatchingFlavor(_) => "NoMatchingFlavor",
            PendingReason::ExceedsMaxQuota(_) => "ExceedsMaxQuota",
            PendingReason::WaitingForQuota { .. } => "WaitingForQuota",
            PendingReason::WaitingForPreemptedWorkloads(_) => "WaitingForPreemptedWorkloads",
            PendingReason::MinimumRuntime { .. } => "MinimumRuntime",
            PendingReason::DemandNotPersisted { .. } => "DemandNotPersisted",
            PendingReason::ClusterQueueStopped => "ClusterQueueStopped",
            PendingReason::WaitingForPodsReady => "WaitingForPodsReady",
            PendingReason::Backoff { .. } => "Backoff",
            PendingReason::Deactivated(_) => "Deactivated",
            PendingReason::LocalQueueNotFound => "LocalQueueNotFound",
            PendingReason::ClusterQueueNotFound(_) => "ClusterQueueNotFound",
            PendingReason::NamespaceNotAllowed(_) => "NamespaceNotAllowed",
        }
    }

    /// A human sentence; `position` is the 1-based place in the ClusterQueue.
    pub fn message(&self, position: Option<usize>) -> String {
        let pos = position
            .map(|p| format!(" (position {p} in its ClusterQueue)"))
            .unwrap_or_default();
        match self {
            PendingReason::Queued => format!("queued{pos}"),
            PendingReason::NoMatchingFlavor(m)
            | PendingReason::ExceedsMaxQuota(m)
            | PendingReason::WaitingForPreemptedWorkloads(m) => m.clone(),
            PendingReason::WaitingForQuota { message, .. } => format!("{message}{pos}"),
            PendingReason::MinimumRuntime { until, message } => format!(
                "{message}; earliest at {}",
                super::quantity::format_duration(*until)
            ),
            PendingReason::DemandNotPersisted { until, message } => format!(
                "{message}; a scale-up may preempt only once its demand has persisted, at {}",
                super::quantity::format_duration(*until)
            ),
            PendingReason::ClusterQueueStopped => "the ClusterQueue is stopped (stopPolicy)".into(),
            PendingReason::WaitingForPodsReady => {
                "waiting for all admitted workloads to be in PodsReady condition (blockAdmission)"
                    .into()
            }
            PendingReason::Backoff { until, count } => format!(
                "evicted after pods were not ready in time ({count} time(s)); requeued at {}",
                super::quantity::format_duration(*until)
            ),
            PendingReason::Deactivated(n) => {
                format!("deactivated after {n} requeues (backoffLimitCount reached)")
            }
            PendingReason::LocalQueueNotFound => "the LocalQueue does not exist".into(),
            PendingReason::ClusterQueueNotFound(cq) => {
                format!("the LocalQueue points at ClusterQueue {cq:?}, which does not exist")
            }
            PendingReason::NamespaceNotAllowed(cq) => {
                format!("ClusterQueue {cq:?} does not admit this namespace (namespaceSelector)")
            }
        }
    }

    /// Whether the position in the queue is part of the reason.
    pub fn has_position(&self) -> bool {
        matches!(
            self,
            PendingReason::Queued | PendingReason::WaitingForQuota { .. }
        )
    }

    /// The sentence with positions written as `positions` says: [`Self::message`] for
    /// [`Positions::Exact`] and for the first [`EXACT_PLACES`] of a queue; further back
    /// the place as a range ([`place_range`]) and, waiting for quota, without the quota
    /// free now.
    pub fn message_as(&self, position: Option<usize>, positions: Positions) -> String {
        let Some((lo, hi)) = position
            .filter(|_| positions == Positions::Ranged)
            .and_then(place_range)
        else {
            return self.message(position);
        };
        let pos = format!(" (position {lo}-{hi} in its ClusterQueue)");
        match self {
            PendingReason::Queued => format!("queued{pos}"),
            PendingReason::WaitingForQuota { brief, .. } => format!("{brief}{pos}"),
            _ => self.message(position),
        }
    }
}

/// The place a pending message names (`"4"`, or a range `"11-20"`), as [`PendingReason::message_as`]
/// writes it; `None` when the message names none.
pub fn place_in_message(message: &str) -> Option<&str> {
    split_place(message).1
}

/// A pending message split into the sentence and the place it names (see
/// [`place_in_message`]): `"queued (position 4 in its ClusterQueue)"` gives `("queued",
/// Some("4"))`; a message naming no place is all sentence.
pub fn split_place(message: &str) -> (&str, Option<&str>) {
    let Some((sentence, rest)) = message.rsplit_once(" (position ") else {
        return (message, None);
    };
    match rest.strip_suffix(" in its ClusterQueue)") {
        Some(place)
            if !place.is_empty() && place.chars().all(|c| c.is_ascii_digit() || c == '-') =>
        {
            (sentence, Some(place))
        }
        _ => (message, None),
    }
}

/// How waiting workloads' places in their queue are written into their messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Positions {
    /// Every place exact, with the quota free now (`tessera plan`).
    #[default]
    Exact,
    /// Exact for a queue's first [`EXACT_PLACES`] workloads; further back a range of a
    /// 1-2-5 series and no free quota. The controller writes every change of a message
    /// to the API server: with exact places, an admission from the head of a queue of N
    /// would rewrite N messages (and every change of free quota, all of them); ranged,
    /// it rewrites at most the first [`EXACT_PLACES`] and one workload per range bound,
    /// and a workload's message changes a few times while it waits (about three per
    /// tenfold of its starting place).
    Ranged,
}

/// Places written exactly with [`Positions::Ranged`] (Kueue's visibility default lists a
/// ClusterQueue's first 10 pending workloads).
pub const EXACT_PLACES: usize = 10;

#[cfg(test)]
thread_local! {
    static EXACT_FOR_TESTS: std::cell::Cell<usize> = const { std::cell::Cell::new(EXACT_PLACES) };
}

/// The places written exactly with [`Positions::Ranged`]: [`EXACT_PLACES`]. A unit test
/// may lower it on its own thread ([`set_exact_places_for_tests`]), so that the short
/// queues of a property test have workloads behind the exact places.
pub fn exact_places() -> usize {
    #[cfg(test)]
    {
        EXACT_FOR_TESTS.with(|c| c.get())
    }
    #[cfg(not(test))]
    {
        EXACT_PLACES
    }
}

/// Sets [`exact_places`] for the calling thread (tests only).
#[cfg(test)]
pub fn set_exact_places_for_tests(n: usize) {
    EXACT_FOR_TESTS.with(|c| c.set(n));
}

/// The range of the 1-2-5 series (11-20, 21-50, 51-100, 101-200, ...) holding 1-based
/// place `p`; `None` within the first [`EXACT_PLACES`].
pub fn place_range(p: usize) -> Option<(usize, usize)> {
    let exact = exact_places();
    if p <= exact {
        return None;
    }
    let mut decade = exact;
    loop {
        let bounds = [decade, decade.checked_mul(2)?, decade.checked_mul(5)?];
        let next = decade.checked_mul(10)?;
        for (lo, hi) in bounds.into_iter().zip([bounds[1], bounds[2], next]) {
            if p <= hi {
                return Some((lo + 1, hi));
            }
        }
        decade = next;
    }
}

/// Kind of an [`Event`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EventType {
    Admitted,
    Preempted,
    /// Evicted for a reason other than preemption (pods-ready timeout, stopPolicy drain).
    Evicted,
    Pending,
    Finished,
    /// `tessera plan` only: an InferenceScaler changed its target's replicas (or began
    /// holding them: metric failed, waiting for capacity); `workload` names the scaler.
    Scaled,
}

/// One thing that happened to a workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Seconds since the start of the scenario.
    pub time: f64,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// `namespace/name`.
    pub workload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flavors: Option<FlavorMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub borrowing: Option<bool>,
    /// Admitted pods per pod set (differs from the request under partial admission).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_counts: Option<BTreeMap<String, u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For `Preempted`: the preemptor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// For `Preempted`: seconds of work lost since the victim's last checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_rework: Option<f64>,
    /// For `Pending` while waiting for quota: 1-based place in the ClusterQueue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

impl Event {
    pub(crate) fn new(now: Time, kind: EventType, workload: String) -> Self {
        Event {
            time: now as f64 / 1000.0,
            kind,
            workload,
            cluster_queue: None,
            flavors: None,
            borrowing: None,
            pod_counts: None,
            reason: None,
            message: None,
            by: None,
            expected_rework: None,
            position: None,
        }
    }
}

/// An admitted workload in the final state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmittedEntry {
    pub workload: String,
    pub cluster_queue: String,
    pub flavors: FlavorMap,
    pub borrowing: bool,
    pub pod_counts: BTreeMap<String, u32>,
    /// Seconds since the start of the scenario.
    pub admitted_at: f64,
}

/// A pending workload in the final state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingEntry {
    pub workload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_queue: Option<String>,
    pub reason: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
}

/// Usage of one `(flavor, resource)` in one ClusterQueue.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageEntry {
    pub flavor: String,
    pub resource: String,
    /// Quantities as Kubernetes strings (`8`, `500m`).
    pub usage: String,
    pub nominal_quota: String,
    /// Usage above nominal quota (borrowed from the cohort).
    pub borrowed: String,
}

/// Per-queue usage in the final state.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueUsage {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    pub admitted_workloads: usize,
    pub pending_workloads: usize,
    pub resources: Vec<UsageEntry>,
}

/// The state at the end of a plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FinalState {
    pub admitted: Vec<AdmittedEntry>,
    pub pending: Vec<PendingEntry>,
    pub finished: Vec<String>,
    pub cluster_queues: Vec<QueueUsage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_splits_into_its_sentence_and_place() {
        let quota = PendingReason::WaitingForQuota {
            message: "2 requested, 0 available".into(),
            brief: "2 requested".into(),
        };
        for (reason, place) in [
            (PendingReason::Queued, 4),
            (PendingReason::Queued, 37),
            (quota.clone(), 1),
            (quota, 12_345),
        ] {
            let message = reason.message_as(Some(place), Positions::Ranged);
            let (sentence, named) = split_place(&message);
            let named = named.unwrap_or_else(|| panic!("no place in {message}"));
            assert!(!sentence.contains("position"), "{message}");
            assert_eq!(
                format!("{sentence} (position {named} in its ClusterQueue)"),
                message
            );
            assert_eq!(Some(named), place_in_message(&message));
        }
        // Nothing that is not a place is cut off.
        for message in [
            "queued",
            "odd (position x in its ClusterQueue)",
            "cut (position 3 in its",
            "(position  in its ClusterQueue)",
        ] {
            assert_eq!(split_place(message), (message, None));
        }
    }

    #[test]
    fn places_beyond_the_first_ten_are_ranges_of_a_1_2_5_series() {
        let table = [
            (1, None),
            (10, None),
            (11, Some((11, 20))),
            (20, Some((11, 20))),
            (21, Some((21, 50))),
            (50, Some((21, 50))),
            (51, Some((51, 100))),
            (101, Some((101, 200))),
            (1_000, Some((501, 1_000))),
            (1_001, Some((1_001, 2_000))),
            (49_999, Some((20_001, 50_000))),
        ];
        for (p, want) in table {
            assert_eq!(place_range(p), want, "place {p}");
        }
        // Contiguous, each holding its place; past the series' end the place is exact.
        let mut last = (0, EXACT_PLACES);
        for p in EXACT_PLACES + 1..200_000 {
            let (lo, hi) = place_range(p).expect("a range");
            assert!(lo <= p && p <= hi, "{p} in {lo}-{hi}");
            if (lo, hi) != last {
                assert_eq!(lo, last.1 + 1, "{lo}-{hi} follows {last:?}");
                last = (lo, hi);
            }
        }
        assert_eq!(place_range(usize::MAX), None);
    }

    #[test]
    fn ranged_messages_drop_the_free_quota_only_past_the_exact_places() {
        let r = PendingReason::WaitingForQuota {
            message: "gpu: 2 requested, 1 available".into(),
            brief: "gpu: 2 requested".into(),
        };
        let exact = "gpu: 2 requested, 1 available (position 10 in its ClusterQueue)";
        assert_eq!(r.message_as(Some(10), Positions::Ranged), exact);
        assert_eq!(r.message_as(Some(10), Positions::Exact), exact);
        assert_eq!(
            r.message_as(Some(11), Positions::Ranged),
            "gpu: 2 requested (position 11-20 in its ClusterQueue)"
        );
        assert_eq!(
            r.message_as(Some(4_321), Positions::Exact),
            "gpu: 2 requested, 1 available (position 4321 in its ClusterQueue)"
        );
        assert_eq!(
            PendingReason::Queued.message_as(Some(60), Positions::Ranged),
            "queued (position 51-100 in its ClusterQueue)"
        );
        let stopped = PendingReason::ClusterQueueStopped;
        assert_eq!(
            stopped.message_as(Some(60), Positions::Ranged),
            stopped.message(None)
        );
    }
}
