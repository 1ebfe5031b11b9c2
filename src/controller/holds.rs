//! Holds on the capacity a coupled scale-down freed, as a quota pass rebuilds them.
//!
//! The autoscaler records a hold on the serving owner it scales down
//! ([`HOLD_FREED_ANNOTATION`](super::serving::HOLD_FREED_ANNOTATION): the replicas
//! before, the end, the cheap rework), so the hold outlives the controller. Every engine
//! a pass builds gets the holds standing at the pass's time: the owner's ClusterQueue
//! (its pod template's LocalQueue) holds what that many replicas of the template use,
//! per flavor and resource ([`Engine::replica_usage`]). The owners holding in one queue
//! add up; their queue's hold ends with the first of them to end (the next pass holds
//! what the others still do), and lends only to work under the lowest of their reworks.
//!
//! ```text
//! Deployment ─tessera.io/hold-freed─► {replicas, until, maxReworkSeconds}
//!     └─spec.template─► a replica's shape ─Engine::replica_usage─► (ClusterQueue, usage)
//! per ClusterQueue: Σ usage, min until, min rework ─Engine::set_hold─► the pass's engine
//! ```
//! An annotation that cannot be read, or a template whose replicas no queue admits, holds
//! nothing and is reported as a problem of the pass (a warning each pass).
//!
//! Limitations: the usage held is in each resource group's first flavor the replicas
//! may use (where they go while there is room); a hold counts against its queue's whole
//! usage, so other work admitted in the serving queue uses its headroom; bare
//! ReplicaSets are read only while some pod is owned by a ReplicaSet (as a pass lists
//! them), and DRA claims of the replicas are not held.

use super::serving::{HoldRecord, ServingIndex};
use super::time::Millis;
use crate::quota::objects::{workload_from_live_pod, LivePod};
use crate::quota::{Engine, HoldFreed, WorkloadInfo};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// What one ClusterQueue holds: milli-units per `(flavor, resource)`.
pub(super) type Levels = crate::quota::HeldLevels;

/// The holds standing at one pass's time, per ClusterQueue, and the owners that could
/// not be read.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Holds {
    pub(super) queues: BTreeMap<String, (Levels, HoldFreed)>,
    pub(super) problems: Vec<String>,
}

impl Holds {
    /// The holds the owners of `serving` record that still stand at `now`, in the
    /// queues of `engine`.
    pub(super) fn read(engine: &Engine, serving: &ServingIndex, now: Millis) -> Holds {
        let mut holds = Holds::default();
        for (owner, object) in serving.owners() {
            let held = HoldRecord::read(object).and_then(|record| match record {
                Some(r) if r.until > now => held_usage(engine, object, r).map(Some),
                _ => Ok(None),
            });
            match held {
                Ok(Some((cq, levels, hold))) => holds.add(cq, levels, hold),
                Ok(None) => {}
                Err(why) => holds
                    .problems
                    .push(format!("{}: {why}; no hold kept", owner.describe())),
            }
        }
        holds
    }

    /// Adds one owner's hold to its queue's.
    fn add(&mut self, cq: String, levels: Levels, hold: HoldFreed) {
        let (sum, merged) = self.queues.entry(cq).or_insert((Levels::new(), hold));
        for (fr, level) in levels {
            *sum.entry(fr).or_insert(0) += level;
        }
        merged.until = merged.until.min(hold.until);
        merged.max_rework = merged.max_rework.min(hold.max_rework);
    }

    /// Sets the holds on `engine` (the one they were read with); what it refuses is
    /// added to `problems`.
    pub(super) fn set(&self, engine: &mut Engine, now: Millis, problems: &mut Vec<String>) {
        for (cq, (levels, hold)) in &self.queues {
            if let Err(e) = engine.set_hold(now, cq, levels, *hold) {
                problems.push(format!("the hold of ClusterQueue {cq}: {e}"));
            }
        }
    }

    /// When the first hold ends.
    pub(super) fn next_end(&self) -> Option<Millis> {
        self.queues.values().map(|(_, h)| h.until).min()
    }
}

/// The queue, usage and hold of `record` on serving owner `object`.
fn held_usage(
    engine: &Engine,
    object: &Value,
    record: HoldRecord,
) -> Result<(String, Levels, HoldFreed), String> {
    let shape = replica_shape(object)?;
    if shape.queue_name.is_empty() {
        return Err("its pod template names no queue".into());
    }
    let (cq, levels) = engine
        .replica_usage(&shape, record.replicas)
        .map_err(|e| e.to_string())?;
    let hold = HoldFreed {
        until: record.until,
        max_rework: record.max_rework,
    };
    Ok((cq, levels, hold))
}

/// One replica of serving owner `object` as a workload: a pod of its template, in its
/// namespace.
fn replica_shape(object: &Value) -> Result<WorkloadInfo, String> {
    let template = &object["spec"]["template"];
    let mut meta = Map::new();
    for (field, value) in [
        ("name", &object["metadata"]["name"]),
        ("namespace", &object["metadata"]["namespace"]),
        ("labels", &template["metadata"]["labels"]),
        ("annotations", &template["metadata"]["annotations"]),
    ] {
        if !value.is_null() {
            meta.insert(field.into(), value.clone());
        }
    }
    let mut pod = Map::new();
    pod.insert("metadata".into(), Value::Object(meta));
    pod.insert("spec".into(), template["spec"].clone());
    match workload_from_live_pod(&Value::Object(pod)) {
        Ok(LivePod::Single(info)) => Ok(info),
        Ok(LivePod::GroupMember { .. }) => Err("its replicas are members of a pod group".into()),
        Err(e) => Err(format!("its pod template: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::serving::HOLD_FREED_ANNOTATION;
    use super::*;
    use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
    use crate::quota::EngineConfig;
    use serde_json::json;

    const GPU: &str = "nvidia.com/gpu";

    fn engine() -> Engine {
        let mut e = Engine::new(EngineConfig::default());
        e.apply_flavor(&flavor("h100"), 0).unwrap();
        for q in ["serve", "train"] {
            let cq = cluster_queue(q)
                .cohort("fleet")
                .quota("h100", GPU, 4)
                .build();
            e.apply_cluster_queue(&cq, 0).unwrap();
            e.apply_local_queue(&local_queue("ml", q, q), 0).unwrap();
        }
        e
    }

    fn deployment(name: &str, gpus: u32, hold: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "ml",
                         "annotations": {HOLD_FREED_ANNOTATION: hold}},
            "spec": {"replicas": 1, "template": {
                "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "serve"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm",
                    "resources": {"limits": {GPU: gpus}}}]}}}
        })
    }

    fn hold(replicas: u32, until_s: u64, rework_s: u64) -> String {
        format!(
            r#"{{"replicas":{replicas},"until":"{}","maxReworkSeconds":{rework_s}}}"#,
            super::super::time::rfc3339(until_s * 1000)
        )
    }

    /// Two owners holding in one queue add up, end with the first, lend under the
    /// lowest rework; an ended hold and an unreadable one hold nothing (the latter is
    /// reported).
    #[test]
    fn owners_holding_in_one_queue_add_up_until_the_first_ends() {
        let e = engine();
        let deployments = [
            deployment("chat", 1, &hold(4, 600, 300)),
            deployment("embed", 2, &hold(1, 900, 60)),
            deployment("old", 1, &hold(8, 100, 300)),
            deployment("bad", 1, "four replicas"),
        ];
        let serving = ServingIndex::new(&[], &deployments, &[]);
        let holds = Holds::read(&e, &serving, 200_000);
        let levels: Levels = [(("h100".into(), GPU.into()), 6_000)].into_iter().collect();
        let want = HoldFreed {
            until: 600_000,
            max_rework: 60_000,
        };
        assert_eq!(
            holds.queues,
            [("serve".to_string(), (levels, want))]
                .into_iter()
                .collect()
        );
        assert_eq!(holds.next_end(), Some(600_000));
        assert_eq!(holds.problems.len(), 1, "{:?}", holds.problems);
        assert!(
            holds.problems[0].starts_with("Deployment ml/bad: annotation"),
            "{:?}",
            holds.problems
        );
        // After the first ends, the other alone.
        let later = Holds::read(&e, &serving, 600_000);
        let (levels, hold) = &later.queues["serve"];
        assert_eq!(levels.values().sum::<i64>(), 2_000);
        assert_eq!(hold.until, 900_000);
    }

    /// A template without a queue, or whose queue does not exist, holds nothing.
    #[test]
    fn a_hold_no_queue_admits_is_reported() {
        let e = engine();
        let mut unqueued = deployment("chat", 1, &hold(4, 600, 300));
        unqueued["spec"]["template"]["metadata"] = json!({});
        let mut elsewhere = deployment("embed", 1, &hold(4, 600, 300));
        elsewhere["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] =
            json!("nowhere");
        let deployments = [unqueued, elsewhere];
        let serving = ServingIndex::new(&[], &deployments, &[]);
        let holds = Holds::read(&e, &serving, 0);
        assert!(holds.queues.is_empty());
        assert_eq!(holds.problems.len(), 2, "{:?}", holds.problems);
        assert!(
            holds.problems[0].contains("names no queue"),
            "{:?}",
            holds.problems
        );
        assert!(
            holds.problems[1].contains("nowhere"),
            "{:?}",
            holds.problems
        );
    }
}
