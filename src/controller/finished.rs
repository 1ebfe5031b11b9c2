//! `Finished` on the `Workload` record of a workload that ran to completion, as Kueue's
//! workload controller sets it: a Job whose `Complete` condition is true (reason
//! `Succeeded`) or whose `Failed` one is (reason `Failed`, its message); a pod group or a
//! lone pod once every pod of it is done, `Succeeded` when all succeeded, else `Failed`.
//! Pure: [`super::finish_watch`] finds the candidates among the objects that changed and
//! writes the updates with the other records.
//!
//! The quota a finished workload held was released when it left the engine (its pods
//! done, its Job finished); this only says so on its record, once, and leaves the other
//! conditions as they were.

use super::workload_record::{condition, record_name, Set, Update, KEY_ANNOTATION};
use super::workloads::{job_key, pod_done, pod_key};
use serde_json::Value;

/// How a workload ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    /// With what the Job (or the first failed pod) says.
    Failed(String),
}

/// The workload key of a finished pod, `None` for a pod not done or not a workload's
/// own (a Job's pods are the Job's).
pub fn done_pod_key(pod: &Value) -> Option<String> {
    pod_done(pod).then(|| pod_key(pod)).flatten()
}

/// How the workload made of `pods` (all the pods that carry its key) ended; `None`
/// while any of them is not done, or without pods.
pub fn pods_outcome<'a>(pods: impl IntoIterator<Item = &'a Value>) -> Option<Outcome> {
    let mut failed: Option<String> = None;
    let mut any = false;
    for p in pods {
        if !pod_done(p) {
            return None;
        }
        any = true;
        if p["status"]["phase"] == "Failed" && failed.is_none() {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let why = p["status"]["message"]
                .as_str()
                .or(p["status"]["reason"].as_str())
                .unwrap_or("no reason given");
            failed = Some(format!("pod {name} failed: {why}"));
        }
    }
    match (any, failed) {
        (false, _) => None,
        (true, Some(why)) => Some(Outcome::Failed(why)),
        (true, None) => Some(Outcome::Succeeded),
    }
}

/// The key and outcome of a finished Job that names a queue.
pub fn job_outcome(job: &Value) -> Option<(String, Outcome)> {
    let meta = &job["metadata"];
    let names_queue = crate::quota::objects::QUEUE_LABELS
        .iter()
        .any(|k| meta["labels"][*k].is_string());
    if !names_queue {
        return None;
    }
    let ns = meta["namespace"].as_str().filter(|n| !n.is_empty());
    let key = job_key(ns.unwrap_or("default"), meta["name"].as_str()?);
    let conditions = job["status"]["conditions"].as_array()?;
    let holds = |t: &str| {
        conditions
            .iter()
            .find(|c| c["type"] == t && c["status"] == "True")
    };
    if holds("Complete").is_some() {
        return Some((key, Outcome::Succeeded));
    }
    let failed = holds("Failed")?;
    let why = failed["message"]
        .as_str()
        .or(failed["reason"].as_str())
        .unwrap_or("no reason given");
    Some((key, Outcome::Failed(format!("Job failed: {why}"))))
}

/// Whether `record` (the stored record of workload `key`, if any) has yet to say it
/// finished: it exists, is this workload's, and has no true `Finished` condition. A
/// workload that never got a record gets none now.
pub fn needs_finished(record: Option<&Value>, key: &str) -> bool {
    let Some(r) = record else {
        return false;
    };
    let ours = r["metadata"]["annotations"][KEY_ANNOTATION].as_str() == Some(key);
    let done = r["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Finished" && c["status"] == "True")
    });
    ours && !done
}

/// The record update saying workload `key` finished with `outcome`.
pub fn update(key: &str, outcome: &Outcome) -> Update {
    let (reason, message) = match outcome {
        Outcome::Succeeded => (
            "Succeeded",
            "The workload finished successfully".to_string(),
        ),
        Outcome::Failed(why) => ("Failed", why.clone()),
    };
    Update {
        key: key.to_string(),
        namespace: key.split_once('/').map_or("", |(ns, _)| ns).to_string(),
        name: record_name(key),
        owners: Vec::new(),
        spec: None,
        admission: None,
        conditions: vec![Set::Always(condition("Finished", true, reason, message))],
        requeue_state: None,
        position: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "team",
                            "labels": {"tessera.io/queue-name": "lq", "tessera.io/pod-group-name": "g"}},
               "status": {"phase": phase, "message": "OOMKilled"}})
    }

    #[test]
    fn a_group_finishes_when_every_pod_is_done() {
        // (phases, outcome)
        let cases = [
            (vec!["Succeeded", "Succeeded"], Some(Outcome::Succeeded)),
            (
                vec!["Succeeded", "Failed"],
                Some(Outcome::Failed("pod g-1 failed: OOMKilled".into())),
            ),
            (vec!["Succeeded", "Running"], None),
            (vec!["Pending"], None),
            (vec![], None),
        ];
        for (phases, want) in cases {
            let pods: Vec<Value> = phases
                .iter()
                .enumerate()
                .map(|(i, p)| pod(&format!("g-{i}"), p))
                .collect();
            assert_eq!(pods_outcome(&pods), want, "{phases:?}");
        }
        assert_eq!(
            done_pod_key(&pod("g-0", "Failed")).as_deref(),
            Some("team/group-g")
        );
        assert_eq!(done_pod_key(&pod("g-0", "Running")), None);
    }

    #[test]
    fn a_job_finishes_on_its_complete_or_failed_condition() {
        let job = |t: &str, status: &str| {
            json!({"metadata": {"name": "train", "namespace": "team",
                                "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                   "status": {"conditions": [{"type": t, "status": status,
                                              "message": "BackoffLimitExceeded"}]}})
        };
        let key = "team/job-train".to_string();
        assert_eq!(
            job_outcome(&job("Complete", "True")),
            Some((key.clone(), Outcome::Succeeded))
        );
        assert_eq!(
            job_outcome(&job("Failed", "True")),
            Some((
                key,
                Outcome::Failed("Job failed: BackoffLimitExceeded".into())
            ))
        );
        assert_eq!(job_outcome(&job("Complete", "False")), None);
        let mut unqueued = job("Complete", "True");
        unqueued["metadata"]["labels"] = json!({});
        assert_eq!(job_outcome(&unqueued), None);
    }

    #[test]
    fn only_a_record_of_this_workload_not_yet_finished_is_written() {
        let record = |key: &str, conditions: Value| {
            json!({"metadata": {"annotations": {KEY_ANNOTATION: key}},
                   "status": {"conditions": conditions}})
        };
        let running = record(
            "team/pod-p",
            json!([{"type": "Admitted", "status": "True"}]),
        );
        let finished = record(
            "team/pod-p",
            json!([{"type": "Finished", "status": "True"}]),
        );
        assert!(needs_finished(Some(&running), "team/pod-p"));
        assert!(!needs_finished(Some(&finished), "team/pod-p"));
        assert!(!needs_finished(Some(&running), "team/pod-q"), "another's");
        assert!(!needs_finished(None, "team/pod-p"), "no record: none made");
        let u = update("team/pod-p", &Outcome::Succeeded);
        let after = u.apply(&Default::default(), "t");
        assert_eq!(after.conditions[0].type_, "Finished");
        assert_eq!(after.conditions[0].reason, "Succeeded");
        assert_eq!(u.apply(&after, "t2"), after, "written once");
    }
}
