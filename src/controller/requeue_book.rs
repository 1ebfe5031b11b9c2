//! The requeue state book of the workloads whose objects do not outlive their pods (pod
//! groups and lone pods): read from their `Workload` records' `status.requeueState`
//! ([`super::workload_record`]), without a request (pure). The writes that keep it are
//! [`super::requeue_state`]'s.
//!
//! Such a record has no owner while it holds a requeue state, so the garbage collector
//! does not delete it with the pods a timeout evicts; it gets its owners back when the
//! state is forgotten, and it is deleted when none of its pods existed for the state's
//! [`ttl`].

use super::readiness::Requeue;
use super::time::Millis;
use super::workload_record::{record_name, OwnerRef, RequeueState, KEY_ANNOTATION};
use crate::quota::WaitForPodsReady;
use serde_json::Value;
use std::collections::BTreeMap;

/// Shortest time a state is kept after its eviction once no pod of its workload exists.
pub const MIN_TTL: Millis = 3_600_000;

/// How long a state outlives the last pod of its workload: twice the longest backoff,
/// at least [`MIN_TTL`], so pods recreated within it still wait out their backoff.
pub fn ttl(cfg: &WaitForPodsReady) -> Millis {
    cfg.backoff_max.saturating_mul(2).max(MIN_TTL)
}

/// One workload's requeue state, to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Workload key (`team/group-g`, `team/pod-p`).
    pub workload: String,
    pub requeue: Requeue,
}

/// One state as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub namespace: String,
    /// The record's name.
    pub name: String,
    /// The `requeueState` as read ([`seen`]): what a forget compares against.
    pub seen: String,
    /// `None`: the state is unreadable (reported, ignored).
    pub requeue: Option<Requeue>,
    /// Why the state is unreadable, in one clear line (the pass logs it).
    pub problem: Option<String>,
}

/// The states of the records read, by workload key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Book {
    pub entries: BTreeMap<String, Stored>,
}

impl Book {
    /// The unreadable states, one line each, by workload key.
    pub fn problems(&self) -> impl Iterator<Item = &String> {
        self.entries.values().filter_map(|s| s.problem.as_ref())
    }

    /// The requeue state recorded for workload `key` (an unreadable one counts as none).
    pub fn requeue(&self, key: &str) -> Option<Requeue> {
        self.entries.get(key).and_then(|s| s.requeue)
    }
}

/// How a state no longer needed goes, if its record still holds it as read (`seen`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forget {
    pub seen: String,
    /// `Some`: the workload's pods (running Ready, or finished): the state is cleared and
    /// the record belongs to them again. `None`: no pod is left; the record is deleted.
    pub owners: Option<Vec<OwnerRef>>,
}

/// A record's `status.requeueState` as a comparable string (`""` without one).
pub fn seen(record: &Value) -> String {
    match &record["status"]["requeueState"] {
        Value::Null => String::new(),
        v => v.to_string(),
    }
}

/// Reads the state of one record, with its workload key: `None` for a record of another
/// kind of workload, without a state, or written before `evictedAt` existed. An
/// unreadable state is kept as such, with a problem naming it.
pub fn read_one(record: &Value) -> Option<(String, Stored)> {
    let meta = &record["metadata"];
    let key = meta["annotations"][KEY_ANNOTATION].as_str()?;
    let (ns, name) = (meta["namespace"].as_str()?, meta["name"].as_str()?);
    let raw = &record["status"]["requeueState"];
    if !kept_here(key) || raw.is_null() || raw.get("evictedAt").is_none() {
        return None;
    }
    let parsed = serde_json::from_value::<RequeueState>(raw.clone()).ok();
    let requeue = parsed.as_ref().and_then(RequeueState::requeue);
    let problem = match (parsed, requeue) {
        (_, Some(_)) => None,
        (None, _) => Some("not a requeue state"),
        (Some(_), None) => Some("needs a count and an RFC 3339 evictedAt"),
    }
    .map(|why| format!("Workload {ns}/{name}: status.requeueState {why}; ignored"));
    // A record whose name does not derive from its key is not this workload's.
    if record_name(key) != name || !key.starts_with(&format!("{ns}/")) {
        return None;
    }
    let stored = Stored {
        namespace: ns.to_string(),
        name: name.to_string(),
        seen: seen(record),
        requeue,
        problem,
    };
    Some((key.to_string(), stored))
}

/// Reads the states of `records` (records of other workloads skipped).
pub fn read(records: &[Value]) -> Book {
    let mut book = Book::default();
    for v in records {
        if let Some((key, stored)) = read_one(v) {
            book.entries.insert(key, stored);
        }
    }
    book
}

/// Whether workload `key`'s state is kept on its record alone (a pod group or a single
/// pod; a Job or a serving replica keeps it on its own object too).
pub fn kept_here(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(_, rest)| rest.starts_with("group-") || rest.starts_with("pod-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(key: &str, state: Value) -> Value {
        let (ns, _) = key.split_once('/').unwrap();
        json!({"metadata": {"namespace": ns, "name": record_name(key),
                            "annotations": {KEY_ANNOTATION: key}},
               "status": {"requeueState": state}})
    }

    #[test]
    fn reads_states_and_reports_unreadable_ones() {
        let good = json!({"count": 2, "evictedAt": "2026-11-18T12:00:00Z"});
        let records = [
            record("team/group-g", good.clone()),
            record("team/pod-p", json!({"count": "two", "evictedAt": "x"})),
            record("team/pod-q", json!({"count": 1, "evictedAt": "yesterday"})),
            // Not kept on the record alone, and a state from before `evictedAt`.
            record("team/job-j", good.clone()),
            record("team/pod-old", json!({"count": 1})),
            record("team/pod-none", Value::Null),
        ];
        let mut foreign = record("team/group-f", good.clone());
        foreign["metadata"]["name"] = json!("something-else");
        let mut all = records.to_vec();
        all.push(foreign);
        let book = read(&all);
        assert_eq!(
            book.requeue("team/group-g"),
            Some(Requeue {
                count: 2,
                evicted_at: 1_795_003_200_000
            })
        );
        let keys: Vec<&str> = book.entries.keys().map(String::as_str).collect();
        assert_eq!(keys, ["team/group-g", "team/pod-p", "team/pod-q"]);
        // (record, words its problem must name)
        let bad = [
            ("pod-p", "not a requeue state"),
            ("pod-q", "RFC 3339 evictedAt"),
        ];
        let problems: Vec<&String> = book.problems().collect();
        assert_eq!(problems.len(), bad.len(), "{problems:?}");
        for (name, words) in bad {
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains(&format!("team/{name}:")) && p.contains(words)),
                "{name}: {problems:?}"
            );
            assert_eq!(book.entries[&format!("team/{name}")].requeue, None);
        }
        assert_eq!(
            book.entries["team/group-g"].seen,
            seen(&records[0]),
            "what a forget compares"
        );
    }

    #[test]
    fn ttl_outlasts_the_longest_backoff() {
        let cfg = |max| WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: max,
            backoff_limit_count: None,
            requeue_by_eviction_time: true,
            block_admission: false,
        };
        assert_eq!(ttl(&cfg(100_000)), MIN_TTL);
        assert_eq!(ttl(&cfg(3_600_000)), 7_200_000);
    }
}
