//! The reconciler's write rules over a recording [`Writes`], without HTTP: what is
//! written in which order, what a failed write defers, what a refused eviction does.

use super::config::Config;
use super::error::{Error, Result};
use super::evictions::EvictionBackoff;
use super::model::{Action, ObjKind, ObjRef, Plan};
use super::readiness::{Hold, Requeue};
use super::reconciler::{apply_with, write_status};
use super::requeue_state::{self, Entry, Forget};
use super::time::Millis;
use super::workload_record::Update;
use super::writes::{Writes, Written};
use crate::quota::WaitForPodsReady;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

const NOW: Millis = 1_795_003_260_000;

/// Records each call as `"<write> <object>"`; the calls in `fail` answer with their
/// status code, and `fresh_hold` answers `hold`.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    /// The assumed writes answered, by workload, with how many calls were made before each.
    answered: Mutex<Vec<(String, usize)>>,
    fail: BTreeMap<String, u16>,
    hold: Option<Hold>,
}

impl Recorder {
    fn failing(calls: &[(&str, u16)]) -> Recorder {
        Recorder {
            fail: calls
                .iter()
                .map(|(c, code)| (c.to_string(), *code))
                .collect(),
            ..Recorder::default()
        }
    }

    fn answer(&self, call: String) -> Result<Written> {
        let code = self.fail.get(&call).copied();
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call.clone());
        match code {
            None => Ok(None),
            Some(code) => Err(Error::api(call)(kube::Error::Api(Box::new(
                kube::core::Status::failure("refused by the test", "Test").with_code(code),
            )))),
        }
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Writes for Recorder {
    async fn admit(
        &self,
        r: &ObjRef,
        _selector: &BTreeMap<String, String>,
        _partial: Option<u32>,
        _now: Millis,
    ) -> Result<Written> {
        self.answer(format!("admit {}", r.name))
    }
    async fn delete_excess(&self, r: &ObjRef) -> Result<bool> {
        self.answer(format!("delete {}", r.name)).map(|_| true)
    }
    async fn evict(&self, r: &ObjRef, _grace: i64) -> Result<Written> {
        self.answer(format!("evict {}", r.name))
    }
    async fn suspend(&self, r: &ObjRef, _requeue: Option<u32>, _now: Millis) -> Result<Written> {
        self.answer(format!("suspend {}", r.name))
    }
    async fn record_requeue(&self, r: &ObjRef, _count: u32, _now: Millis) -> Result<Written> {
        self.answer(format!("requeue {}", r.name))
    }
    async fn record_ready(&self, r: &ObjRef, _now: Millis) -> Result<Written> {
        self.answer(format!("ready {}", r.name))
    }
    async fn record_pending(&self, r: &ObjRef, _: &str, _: &str, _: Millis) -> Result<Written> {
        self.answer(format!("pending {}", r.name))
    }
    async fn annotate_replicas(&self, r: &ObjRef, _value: &str) -> Result<Written> {
        self.answer(format!("replicas {}", r.name))
    }
    async fn write_requeue_state(
        &self,
        namespace: &str,
        _set: &[Entry],
        _forget: &BTreeMap<String, Forget>,
        _records: &[Update],
        _now: Millis,
    ) -> Result<requeue_state::Written> {
        self.answer(format!("requeue-state {namespace}"))
            .map(|_| requeue_state::Written::default())
    }
    async fn fresh_hold(
        &self,
        _cfg: &WaitForPodsReady,
        workload: &str,
        _now: Millis,
    ) -> Result<Option<Hold>> {
        self.answer(format!("read-hold {workload}"))
            .map(|_| self.hold.clone())
    }
    async fn write_records(&self, updates: &[Update], _now: Millis) -> Vec<Update> {
        updates
            .iter()
            .filter(|u| self.answer(format!("record {}", u.name)).is_err())
            .cloned()
            .collect()
    }
    async fn write_queue_status(&self, name: &str, admitted: usize, pending: usize) -> Result<()> {
        self.answer(format!("queue {name} {admitted}/{pending}"))
            .map(|_| ())
    }
    async fn event(&self, r: &ObjRef, reason: &str, _: &str, _: bool, _: Millis) {
        let _ = self.answer(format!("event {reason} {}", r.name));
    }
    fn writes_answered(&self, workload: &str) {
        let calls = self.calls().len();
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((workload.to_string(), calls));
    }
}

fn pod(name: &str) -> ObjRef {
    ObjRef {
        kind: ObjKind::Pod,
        namespace: "team".into(),
        name: name.into(),
    }
}

fn admit(workload: &str, pods: &[&str], excess: &[&str]) -> Action {
    Action::Admit {
        workload: workload.into(),
        objects: pods.iter().map(|p| pod(p)).collect(),
        node_selector: BTreeMap::new(),
        pod_selectors: BTreeMap::new(),
        partial: (!excess.is_empty()).then_some(pods.len() as u32),
        excess: excess.iter().map(|p| pod(p)).collect(),
    }
}

fn timeout(workload: &str, objects: Vec<ObjRef>) -> Action {
    Action::Evict {
        workload: workload.into(),
        objects: objects.into_iter().map(|o| (o, 30)).collect(),
        reason: "PodsReadyTimeout".into(),
        by: String::new(),
        requeue: Some(1),
    }
}

fn pods_ready_cfg() -> Config {
    Config {
        pods_ready: Some(WaitForPodsReady {
            timeout: 60_000,
            backoff_base: 10_000,
            backoff_max: 100_000,
            ..WaitForPodsReady::default()
        }),
        ..Config::default()
    }
}

fn run(
    w: &Recorder,
    cfg: &Config,
    actions: Vec<Action>,
) -> (super::reconciler::Applied, EvictionBackoff) {
    let plan = Plan {
        actions,
        ..Plan::default()
    };
    let mut evictions = EvictionBackoff::new(1_000, 60_000);
    let runtime = tokio::runtime::Builder::new_current_thread().build();
    let applied = match runtime {
        Ok(rt) => rt.block_on(apply_with(w, cfg, &plan, &mut evictions, None, NOW)),
        Err(e) => panic!("runtime: {e}"),
    };
    (applied, evictions)
}

#[test]
fn an_admission_writes_then_tells_and_deletes_extra_pods_only_after_every_ungate() {
    let w = Recorder::default();
    let (applied, _) = run(
        &w,
        &Config::default(),
        vec![admit("team/group-g", &["g-0", "g-1"], &["g-2"])],
    );
    assert_eq!(
        w.calls(),
        [
            "admit g-0",
            "event Admitted g-0",
            "admit g-1",
            "event Admitted g-1",
            "delete g-2",
            "event NotAdmitted g-2"
        ]
    );
    assert_eq!((applied.failed, applied.done), (0, vec![0]));

    // One ungate fails: the group runs short, so no pod of it is deleted yet.
    let w = Recorder::failing(&[("admit g-1", 409)]);
    let (applied, _) = run(
        &w,
        &Config::default(),
        vec![admit("team/group-g", &["g-0", "g-1"], &["g-2"])],
    );
    assert!(
        !w.calls().contains(&"delete g-2".to_string()),
        "{:?}",
        w.calls()
    );
    assert!(
        !w.calls().contains(&"event Admitted g-1".to_string()),
        "no Event for a failed write"
    );
    assert_eq!(applied.failed, 1);
    assert_eq!(applied.done, vec![0], "it runs: one pod was ungated");
}

/// Passes that assume admissions (and readiness records) stop assuming each one only
/// once all of its writes were answered, whichever way they went
/// (`deferred_records::Writing`).
#[test]
fn every_assumed_write_is_answered_once_after_its_last_write() {
    let answered = |w: &Recorder| w.answered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let w = Recorder::failing(&[("admit b-0", 409)]);
    run(
        &w,
        &Config::default(),
        vec![
            admit("team/group-a", &["a-0", "a-1"], &["a-2"]),
            admit("team/group-b", &["b-0"], &[]),
            admit("team/pod-c", &["c"], &[]),
        ],
    );
    let calls = w.calls();
    let after = |call: &str| calls.iter().position(|c| c == call).map(|i| i + 1);
    assert_eq!(
        answered(&w),
        [
            (
                "team/group-a".to_string(),
                after("event NotAdmitted a-2").unwrap_or(0)
            ),
            ("team/group-b".to_string(), after("admit b-0").unwrap_or(0)),
            ("team/pod-c".to_string(), calls.len()),
        ],
        "{calls:?}"
    );
    // Held back by newer requeue state: answered without a write.
    let w = Recorder {
        hold: Some(Hold::Deactivated),
        ..Recorder::default()
    };
    run(
        &w,
        &pods_ready_cfg(),
        vec![admit("team/pod-d", &["d"], &[])],
    );
    assert_eq!(answered(&w), [("team/pod-d".to_string(), 1)]);
    // A readiness record: answered after its write, landed or refused.
    for code in [None, Some(409)] {
        let fail: Vec<(&str, u16)> = code.map(|c| ("ready e", c)).into_iter().collect();
        let w = Recorder::failing(&fail);
        let ready = Action::PodsReady {
            workload: "team/pod-e".into(),
            object: pod("e"),
            queued_at: NOW - 5_000,
            admitted_at: NOW - 2_000,
        };
        let (applied, _) = run(&w, &pods_ready_cfg(), vec![ready]);
        assert_eq!(w.calls(), ["ready e"]);
        assert_eq!(answered(&w), [("team/pod-e".to_string(), 1)]);
        assert_eq!(applied.failed, usize::from(code.is_some()));
    }
    // A pods-ready eviction: answered after its last write, when it went, when its pods
    // failed, and without one when its requeue state could not be written first.
    let state = |wk: &str| Action::RequeueState {
        namespace: "team".into(),
        set: vec![Entry {
            workload: wk.into(),
            requeue: Requeue {
                count: 1,
                evicted_at: NOW,
            },
        }],
        forget: BTreeMap::new(),
    };
    for (fail, calls) in [
        (None, 4),
        (Some(("evict f", 500)), 3),
        (Some(("requeue-state team", 500)), 1),
    ] {
        let w = Recorder::failing(&fail.into_iter().collect::<Vec<_>>());
        let evict = timeout("team/pod-f", vec![pod("f")]);
        run(&w, &pods_ready_cfg(), vec![state("team/pod-f"), evict]);
        assert_eq!(w.calls().len(), calls, "{:?}", w.calls());
        assert_eq!(answered(&w), [("team/pod-f".to_string(), calls)]);
    }
}

#[test]
fn an_admission_waits_while_the_api_server_holds_newer_requeue_state() {
    let w = Recorder {
        hold: Some(Hold::Backoff(NOW + 5_000)),
        ..Recorder::default()
    };
    let (applied, _) = run(
        &w,
        &pods_ready_cfg(),
        vec![admit("team/pod-p", &["p"], &[])],
    );
    assert_eq!(w.calls(), ["read-hold team/pod-p"], "not ungated");
    assert_eq!((applied.failed, applied.done.len()), (1, 0));
    // Without waitForPodsReady there is nothing to read.
    let w = Recorder::default();
    run(
        &w,
        &Config::default(),
        vec![admit("team/pod-p", &["p"], &[])],
    );
    assert_eq!(w.calls()[0], "admit p");
}

#[test]
fn a_timeout_is_not_evicted_when_its_requeue_state_could_not_be_written() {
    let state = Action::RequeueState {
        namespace: "team".into(),
        set: vec![Entry {
            workload: "team/pod-p".into(),
            requeue: Requeue {
                count: 1,
                evicted_at: NOW,
            },
        }],
        forget: BTreeMap::new(),
    };
    let w = Recorder::failing(&[("requeue-state team", 500)]);
    let (applied, _) = run(
        &w,
        &pods_ready_cfg(),
        vec![state.clone(), timeout("team/pod-p", vec![pod("p")])],
    );
    assert_eq!(w.calls(), ["requeue-state team"]);
    assert_eq!((applied.failed, applied.done.len()), (2, 0));
    // Written: the pod records its requeue, then goes, with a Warning Event.
    let w = Recorder::default();
    let (applied, _) = run(
        &w,
        &pods_ready_cfg(),
        vec![state, timeout("team/pod-p", vec![pod("p")])],
    );
    assert_eq!(
        w.calls(),
        [
            "requeue-state team",
            "requeue p",
            "evict p",
            "event Evicted p"
        ]
    );
    assert_eq!(applied.done, vec![1]);
}

#[test]
fn a_replicas_timeout_is_recorded_on_its_owner_first_and_waits_when_that_fails() {
    let owner = ObjRef {
        kind: ObjKind::Deployment,
        namespace: "team".into(),
        name: "web".into(),
    };
    let objects = vec![pod("web-1"), owner.clone()];
    let w = Recorder::default();
    run(
        &w,
        &pods_ready_cfg(),
        vec![timeout("team/deployment-web.web-1", objects.clone())],
    );
    assert_eq!(
        w.calls()[0],
        "requeue web",
        "the owner first: {:?}",
        w.calls()
    );
    let w = Recorder::failing(&[("requeue web", 409)]);
    let (applied, _) = run(
        &w,
        &pods_ready_cfg(),
        vec![timeout("team/deployment-web.web-1", objects)],
    );
    assert_eq!(
        w.calls(),
        ["requeue web"],
        "no pod goes without the owner's record"
    );
    assert_eq!((applied.failed, applied.done.len()), (1, 0));
}

#[test]
fn a_refused_eviction_backs_off_without_counting_as_a_failure_and_a_gone_pod_counts_as_evicted() {
    let preempt = Action::Evict {
        workload: "team/group-v".into(),
        objects: vec![(pod("v-0"), 30), (pod("v-1"), 30), (pod("v-2"), 30)],
        reason: "InClusterQueue".into(),
        by: "team/pod-high".into(),
        requeue: None,
    };
    let w = Recorder::failing(&[("evict v-0", 429), ("evict v-1", 404)]);
    let (applied, evictions) = run(&w, &Config::default(), vec![preempt]);
    assert_eq!(applied.failed, 0);
    assert!(applied.done.is_empty(), "v-0 still runs");
    let blocked: BTreeSet<&str> = evictions
        .blocked()
        .keys()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(blocked, ["v-0"].into());
    let events: Vec<String> = w
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("event"))
        .collect();
    assert_eq!(
        events,
        ["event Preempted v-2"],
        "only a pod that went gets an Event"
    );
}

fn record(name: &str) -> Update {
    Update::blank(&format!("team/{name}"), "team", name)
}

fn status(w: &Recorder, plan: &Plan, unwritten: Vec<Update>) -> (usize, Vec<Update>) {
    let runtime = tokio::runtime::Builder::new_current_thread().build();
    match runtime {
        Ok(rt) => {
            let mut records = unwritten;
            records.extend(plan.records.iter().cloned());
            rt.block_on(write_status(w, plan, records, NOW))
        }
        Err(e) => panic!("runtime: {e}"),
    }
}

#[test]
fn records_an_earlier_pass_failed_to_write_go_first_and_a_failed_one_is_kept_for_the_next() {
    let plan = Plan {
        queue_counts: [("a".to_string(), (2, 5))].into(),
        records: vec![record("pod-new"), record("pod-flaky")],
        ..Plan::default()
    };
    let w = Recorder::failing(&[("record pod-flaky", 500), ("queue a 2/5", 409)]);
    let (failed, again) = status(&w, &plan, vec![record("pod-old")]);
    assert_eq!(
        w.calls(),
        [
            "queue a 2/5",
            "record pod-old",
            "record pod-new",
            "record pod-flaky"
        ],
        "queue counts, then the carried record, then this pass's"
    );
    assert_eq!(failed, 1, "the queue's status write");
    let names: Vec<&str> = again.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["pod-flaky"], "written again by the next pass");
    // The next pass writes it first.
    let w = Recorder::default();
    let (failed, again) = status(&w, &Plan::default(), again);
    assert_eq!((failed, again.len()), (0, 0));
    assert_eq!(w.calls(), ["record pod-flaky"]);
}

#[test]
fn a_reason_is_written_on_every_pod_but_announced_only_when_it_is_new() {
    let pending = |workload: &str, pods: &[&str], new_reason: bool| Action::Pending {
        workload: workload.into(),
        objects: pods.iter().map(|p| pod(p)).collect(),
        reason: "Queued".into(),
        message: "position 2 in its ClusterQueue".into(),
        new_reason,
    };
    let w = Recorder::failing(&[("pending g-1", 500)]);
    let (applied, _) = run(
        &w,
        &Config::default(),
        vec![
            pending("team/group-g", &["g-0", "g-1"], false),
            pending("team/pod-p", &["p"], true),
        ],
    );
    let mut calls = w.calls();
    calls.sort();
    assert_eq!(
        calls,
        ["event Queued p", "pending g-0", "pending g-1", "pending p"],
        "a moved place is written, not announced"
    );
    assert_eq!(applied.failed, 1, "g-1's write is retried by the next pass");
}
