//! Table tests of the pure controller decision over hand-built snapshots.

use super::decide::{decide, Action, ObjKind, Snapshot};
use crate::quota::api::WorkloadPriorityClass;
use crate::quota::events::split_place;
use crate::quota::fixtures::{cluster_queue, flavor, local_queue};
use serde_json::{json, Value};

const NOW: u64 = 1_795_003_260_000;

fn snapshot(pods: Vec<Value>) -> Snapshot {
    let mut cq = cluster_queue("cq")
        .quota("h100", "nvidia.com/gpu", 4)
        .build();
    cq.spec.namespace_selector = Some(Default::default());
    let mut wpc = WorkloadPriorityClass::default();
    wpc.metadata.name = "high".into();
    wpc.value = 100;
    Snapshot {
        now: NOW,
        flavors: vec![flavor("h100")],
        cluster_queues: vec![cq],
        local_queues: vec![local_queue("team", "lq", "cq")],
        priority_classes: vec![wpc],
        namespaces: vec![("team".into(), Default::default())],
        pods,
        ..Default::default()
    }
}

/// A gated pod asking for `gpus`, created at 12:00.
fn pod(name: &str, gpus: i64) -> Value {
    json!({"metadata": {"name": name, "namespace": "team", "creationTimestamp": "2026-11-18T12:00:00Z",
                        "labels": {"tessera.io/queue-name": "lq"}},
           "spec": {"schedulingGates": [{"name": "tessera.io/admission"}],
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
}

/// Sets the value at a JSON pointer (`~1` escapes `/`), creating objects on the way.
fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let mut target = &mut v;
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/");
        target = match target {
            Value::Array(a) => &mut a[seg.parse::<usize>().unwrap()],
            other => {
                if !other.is_object() {
                    *other = json!({});
                }
                other
                    .as_object_mut()
                    .unwrap()
                    .entry(seg)
                    .or_insert(Value::Null)
            }
        };
    }
    *target = value;
    v
}

fn pending_reason(actions: &[Action], workload: &str) -> Option<String> {
    actions.iter().find_map(|a| match a {
        Action::Pending {
            workload: w,
            reason,
            ..
        } if w == workload => Some(reason.clone()),
        _ => None,
    })
}

fn admitted(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Admit { workload, .. } => Some(workload.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn table() {
    let group = |name: &str, total: &str| {
        let p = with(
            pod(name, 1),
            "/metadata/labels/kueue.x-k8s.io~1pod-group-name",
            json!("g"),
        );
        with(
            p,
            "/metadata/annotations/kueue.x-k8s.io~1pod-group-total-count",
            json!(total),
        )
    };
    // (case, pods, admitted workloads, (workload, pending reason))
    type Case = (
        &'static str,
        Vec<Value>,
        Vec<&'static str>,
        Option<(&'static str, &'static str)>,
    );
    let cases: Vec<Case> = vec![
        ("fits", vec![pod("a", 4)], vec!["team/pod-a"], None),
        (
            "too big",
            vec![pod("a", 5)],
            vec![],
            Some(("team/pod-a", "ExceedsMaxQuota")),
        ),
        (
            "second waits",
            vec![pod("a", 3), pod("b", 3)],
            vec!["team/pod-a"],
            Some(("team/pod-b", "WaitingForQuota")),
        ),
        (
            "running holds quota",
            vec![
                with(pod("a", 3), "/spec/schedulingGates", json!([])),
                pod("b", 3),
            ],
            vec![],
            Some(("team/pod-b", "WaitingForQuota")),
        ),
        (
            "finished frees quota",
            vec![
                with(
                    with(pod("a", 3), "/spec/schedulingGates", json!([])),
                    "/status/phase",
                    json!("Succeeded"),
                ),
                pod("b", 3),
            ],
            vec!["team/pod-b"],
            None,
        ),
        (
            "unknown local queue",
            vec![with(
                pod("a", 1),
                "/metadata/labels/tessera.io~1queue-name",
                json!("nope"),
            )],
            vec![],
            Some(("team/pod-a", "LocalQueueNotFound")),
        ),
        (
            "unknown class",
            vec![with(
                pod("a", 1),
                "/metadata/labels/tessera.io~1priority-class",
                json!("nope"),
            )],
            vec![],
            Some(("team/pod-a", "UnknownPriorityClass")),
        ),
        (
            "bad quantity",
            vec![with(
                pod("a", 1),
                "/spec/containers/0/resources/limits/nvidia.com~1gpu",
                json!("lots"),
            )],
            vec![],
            Some(("team/pod-a", "Invalid")),
        ),
        (
            "incomplete group",
            vec![(group("g-0", "2"))],
            vec![],
            Some(("team/group-g", "PodGroupIncomplete")),
        ),
        (
            "complete group",
            vec![(group("g-0", "2")), (group("g-1", "2"))],
            vec!["team/group-g"],
            None,
        ),
        (
            "bad group count",
            vec![(group("g-0", "x"))],
            vec![],
            Some(("team/group-g", "Invalid")),
        ),
        (
            "group min count above its total",
            vec![
                with(
                    group("g-0", "2"),
                    "/metadata/annotations/tessera.io~1pod-group-min-count",
                    json!("3"),
                ),
                group("g-1", "2"),
            ],
            vec![],
            Some(("team/group-g", "Invalid")),
        ),
        (
            "partial admission of a group of two shapes",
            vec![
                with(
                    group("g-0", "2"),
                    "/metadata/annotations/tessera.io~1pod-group-min-count",
                    json!("1"),
                ),
                with(
                    group("g-1", "2"),
                    "/spec/containers/0/resources/limits/nvidia.com~1gpu",
                    json!(2),
                ),
            ],
            vec![],
            Some(("team/group-g", "Invalid")),
        ),
        (
            "pod of a Job",
            vec![with(
                pod("a", 1),
                "/metadata/ownerReferences",
                json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u"}]),
            )],
            vec![],
            None,
        ),
    ];
    for (name, pods, want_admitted, want_pending) in cases {
        let plan = decide(&snapshot(pods));
        assert_eq!(
            admitted(&plan.actions),
            want_admitted,
            "{name}: {:?}",
            plan.actions
        );
        match want_pending {
            Some((w, reason)) => assert_eq!(
                pending_reason(&plan.actions, w).as_deref(),
                Some(reason),
                "{name}: {:?}",
                plan.actions
            ),
            None => assert!(
                !plan
                    .actions
                    .iter()
                    .any(|a| matches!(a, Action::Pending { .. })),
                "{name}: {:?}",
                plan.actions
            ),
        }
    }
}

#[test]
fn a_recorded_reason_is_not_written_again() {
    let first = decide(&snapshot(vec![pod("a", 3), pod("b", 3)]));
    let Some(Action::Pending {
        reason, message, ..
    }) = first
        .actions
        .iter()
        .find(|a| matches!(a, Action::Pending { .. }))
    else {
        panic!("{:?}", first.actions)
    };
    // The pod carries the reason and the sentence, the record the place.
    let (sentence, place) = split_place(message);
    let place = place.unwrap_or_else(|| panic!("no place in {message}"));
    let mut b = pod("b", 3);
    b["status"] = json!({"conditions": [{"type": "tessera.io/Admitted", "status": "False",
                                         "reason": reason, "message": sentence}]});
    let a = with(pod("a", 3), "/spec/schedulingGates", json!([]));
    let mut s = snapshot(vec![a, b]);
    s.record_places
        .insert("team/pod-b".to_string(), place.to_string());
    let again = decide(&s);
    assert!(again.actions.is_empty(), "{:?}", again.actions);
    // A place that moved (the record shows another) is written again, and so is a
    // sentence that changed (the pod shows the full message, as before).
    s.record_places
        .insert("team/pod-b".to_string(), "2".to_string());
    let moved = decide(&s);
    assert!(
        matches!(&moved.actions[..], [Action::Pending { message: m, .. }] if m == message),
        "{:?}",
        moved.actions
    );
    s.record_places
        .insert("team/pod-b".to_string(), place.to_string());
    s.pods[1]["status"]["conditions"][0]["message"] = json!(message);
    let old_style = decide(&s);
    assert_eq!(old_style.actions.len(), 1, "{:?}", old_style.actions);
}

#[test]
fn preemption_evicts_every_pod_of_the_victim_with_its_grace() {
    let mut low = with(pod("low", 4), "/spec/schedulingGates", json!([]));
    low["spec"]["terminationGracePeriodSeconds"] = json!(120);
    let high = with(
        pod("high", 4),
        "/metadata/annotations",
        json!({"tessera.io/priority": "100"}),
    );
    let mut s = snapshot(vec![low, high]);
    s.cluster_queues[0].spec.preemption.within_cluster_queue =
        crate::quota::api::WithinClusterQueuePolicy::LowerPriority;
    let plan = decide(&s);
    let evict = plan.actions.iter().find_map(|a| match a {
        Action::Evict {
            workload,
            objects,
            by,
            ..
        } => Some((workload, objects, by)),
        _ => None,
    });
    let (workload, objects, by) = evict.expect("an eviction");
    assert_eq!(workload, "team/pod-low");
    assert_eq!(by, "team/pod-high");
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].0.kind, ObjKind::Pod);
    assert_eq!(objects[0].1, 120);
    assert!(
        admitted(&plan.actions).is_empty(),
        "the preemptor waits for the victim"
    );
}

#[test]
fn a_terminating_victim_holds_preemptions_only_in_its_own_cohort() {
    let preempting = |name: &str| {
        let mut cq = cluster_queue(name)
            .quota("h100", "nvidia.com/gpu", 4)
            .build();
        cq.spec.namespace_selector = Some(Default::default());
        cq.spec.preemption.within_cluster_queue =
            crate::quota::api::WithinClusterQueuePolicy::LowerPriority;
        cq
    };
    let in_queue =
        |p: Value, lq: &str| with(p, "/metadata/labels/tessera.io~1queue-name", json!(lq));
    let running = |p: Value| with(p, "/spec/schedulingGates", json!([]));
    let high = |p: Value| {
        with(
            p,
            "/metadata/annotations",
            json!({"tessera.io/priority": "100"}),
        )
    };
    let pods = vec![
        // Queue a: a victim still terminating, a running low pod, a high one waiting.
        with(
            running(in_queue(pod("a-victim", 2), "lq-a")),
            "/metadata/deletionTimestamp",
            json!("2026-11-18T12:00:30Z"),
        ),
        running(in_queue(pod("a-low", 2), "lq-a")),
        high(in_queue(pod("a-high", 2), "lq-a")),
        // Queue b (no cohort shared with a): a running low pod and a high one.
        running(in_queue(pod("b-low", 4), "lq-b")),
        high(in_queue(pod("b-high", 4), "lq-b")),
    ];
    let mut s = snapshot(pods);
    s.cluster_queues = vec![preempting("cq-a"), preempting("cq-b")];
    s.local_queues = vec![
        local_queue("team", "lq-a", "cq-a"),
        local_queue("team", "lq-b", "cq-b"),
    ];
    let plan = decide(&s);
    let evicted: Vec<&str> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { workload, .. } => Some(workload.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(evicted, ["team/pod-b-low"], "{:?}", plan.actions);
    let message = plan.actions.iter().find_map(|a| match a {
        Action::Pending {
            workload, message, ..
        } if workload == "team/pod-a-high" => Some(message.clone()),
        _ => None,
    });
    assert_eq!(
        message.as_deref(),
        Some("waiting for evicted workloads to terminate: team/pod-a-victim")
    );

    // In one cohort, the victim in a holds b's preemption too.
    for cq in &mut s.cluster_queues {
        cq.spec.cohort_name = Some("pool".into());
    }
    let plan = decide(&s);
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::Evict { .. })),
        "{:?}",
        plan.actions
    );
}

#[test]
fn stateful_set_replicas_are_admitted_one_by_one_and_counted_on_their_owner() {
    let replica = |name: &str, gpus: i64| {
        with(
            pod(name, gpus),
            "/metadata/ownerReferences",
            json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                    "uid": "u", "controller": true}]),
        )
    };
    let mut s = snapshot(vec![replica("db-0", 2), replica("db-1", 3)]);
    s.stateful_sets =
        vec![json!({"metadata": {"name": "db", "namespace": "team"}, "spec": {"replicas": 2}})];
    let plan = decide(&s);
    assert_eq!(admitted(&plan.actions), ["team/statefulset-db.db-0"]);
    let replicas: Vec<(ObjKind, &str, &str)> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Replicas { owner, value } => {
                Some((owner.kind, owner.name.as_str(), value.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(replicas, [(ObjKind::StatefulSet, "db", "1/2")]);
    let message = plan.actions.iter().find_map(|a| match a {
        Action::Pending {
            workload, message, ..
        } if workload == "team/statefulset-db.db-1" => Some(message.clone()),
        _ => None,
    });
    let message = message.expect("db-1 waits");
    assert!(
        message.starts_with("replica of StatefulSet team/db (1 of 2 admitted): "),
        "{message}"
    );

    // Annotated already and unchanged: no write. Scaled to zero: "0/0".
    s.stateful_sets[0]["metadata"]["annotations"] = json!({"tessera.io/admitted-replicas": "1/2"});
    let plan = decide(&s);
    assert!(!plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::Replicas { .. })));
    s.pods.clear();
    s.stateful_sets[0]["spec"]["replicas"] = json!(0);
    let plan = decide(&s);
    assert!(plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::Replicas { value, .. } if value == "0/0")));
}

/// Pod `g-<i>` of group `g` of `total` 1-GPU pods that may run with `min`.
fn partial_member(i: usize, total: usize, min: usize) -> Value {
    let p = with(
        pod(&format!("g-{i}"), 1),
        "/metadata/labels/tessera.io~1pod-group-name",
        json!("g"),
    );
    with(
        p,
        "/metadata/annotations",
        json!({"tessera.io/pod-group-total-count": total.to_string(),
               "tessera.io/pod-group-min-count": min.to_string()}),
    )
}

fn admit_of(actions: &[Action]) -> Vec<(Vec<String>, Vec<String>, Option<u32>)> {
    let names = |r: &[super::decide::ObjRef]| r.iter().map(|o| o.name.clone()).collect();
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Admit {
                objects,
                excess,
                partial,
                ..
            } => Some((names(objects), names(excess), *partial)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_group_is_admitted_partially_and_finished_after_a_restart() {
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Six pods, at least two, four GPUs: four ungated (by name), two deleted.
    let group: Vec<Value> = (0..6).map(|i| partial_member(i, 6, 2)).collect();
    let plan = decide(&snapshot(group.clone()));
    assert_eq!(
        admit_of(&plan.actions),
        [(
            strs(&["g-0", "g-1", "g-2", "g-3"]),
            strs(&["g-4", "g-5"]),
            Some(4)
        )]
    );
    // A restart after the first ungate: the rest of the admission is finished, the
    // group holds four GPUs (a 1-GPU pod waits), nothing is decided again.
    let mut pods = group;
    pods[0]["spec"]["schedulingGates"] = json!([]);
    pods[0]["spec"]["nodeSelector"] = json!({"gpu": "h100"});
    pods[0]["metadata"]["annotations"]["tessera.io/admitted-count"] = json!("4");
    pods.push(pod("late", 1));
    let plan = decide(&snapshot(pods.clone()));
    assert_eq!(
        admit_of(&plan.actions),
        [(strs(&["g-1", "g-2", "g-3"]), strs(&["g-4", "g-5"]), Some(4))]
    );
    assert_eq!(
        pending_reason(&plan.actions, "team/pod-late").as_deref(),
        Some("WaitingForQuota")
    );
    // Done: four running, the two left out gone.
    pods.truncate(4);
    for p in &mut pods[1..4] {
        p["spec"]["schedulingGates"] = json!([]);
        p["metadata"]["annotations"]["tessera.io/admitted-count"] = json!("4");
    }
    let plan = decide(&snapshot(pods));
    assert!(admit_of(&plan.actions).is_empty(), "{:?}", plan.actions);
    // Its minimum above what the queue can ever hold: none of it runs.
    let group: Vec<Value> = (0..6).map(|i| partial_member(i, 6, 5)).collect();
    let plan = decide(&snapshot(group));
    assert!(admit_of(&plan.actions).is_empty(), "{:?}", plan.actions);
    assert_eq!(
        pending_reason(&plan.actions, "team/group-g").as_deref(),
        Some("ExceedsMaxQuota")
    );
}

#[test]
fn a_scaled_up_replica_preempts_only_after_its_scalers_window() {
    // A running low-priority training pod holds the whole quota; an InferenceScaler
    // scaled the StatefulSet up at 12:00 with a window until NOW + 60 s.
    let training = with(pod("train", 4), "/spec/schedulingGates", json!([]));
    let replica = with(
        with(
            pod("web-0", 4),
            "/metadata/ownerReferences",
            json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                    "uid": "u", "controller": true}]),
        ),
        "/metadata/annotations",
        json!({"tessera.io/priority": "100"}),
    );
    let mut s = snapshot(vec![training, replica]);
    s.cluster_queues[0].spec.preemption.within_cluster_queue =
        crate::quota::api::WithinClusterQueuePolicy::LowerPriority;
    let window = |until: u64| {
        json!({"tessera.io/scaled-up-at": "2026-11-18T12:00:00Z",
               "tessera.io/preempt-not-before": super::time::rfc3339(until)})
    };
    s.stateful_sets = vec![json!({"metadata": {"name": "web", "namespace": "team",
        "annotations": window(NOW + 60_000)}, "spec": {"replicas": 1}})];
    let evicts = |s: &Snapshot| {
        decide(s)
            .actions
            .iter()
            .any(|a| matches!(a, Action::Evict { .. }))
    };
    assert!(!evicts(&s), "within the window the replica waits");
    s.stateful_sets[0]["metadata"]["annotations"] = window(NOW - 1);
    assert!(evicts(&s), "after it, it preempts the training pod");
    // Without a window (an urgent scale-up, or none recorded) it preempts at once.
    s.stateful_sets[0]["metadata"]["annotations"] = json!({});
    assert!(evicts(&s));
}

/// `stopPolicy: HoldAndDrain`: the ClusterQueue's running workloads are evicted (reason
/// `ClusterQueueStopped`, as Kueue's), and nothing waiting is admitted; a pass while
/// they terminate evicts nothing again. With `Hold` they keep running.
#[test]
fn a_draining_cluster_queue_evicts_what_runs_in_it() {
    use crate::quota::api::StopPolicy;
    let running = |p: Value| with(p, "/spec/schedulingGates", json!([]));
    let stopped = |pods: Vec<Value>, stop: StopPolicy| {
        let mut s = snapshot(pods);
        s.cluster_queues[0].spec.stop_policy = stop;
        decide(&s)
    };
    let evicts = |actions: &[Action]| -> Vec<(String, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Evict {
                    workload, reason, ..
                } => Some((workload.clone(), reason.clone())),
                _ => None,
            })
            .collect()
    };
    let pods = vec![running(pod("a", 2)), pod("b", 1)];
    let plan = stopped(pods.clone(), StopPolicy::HoldAndDrain);
    assert_eq!(
        evicts(&plan.actions),
        [("team/pod-a".to_string(), "ClusterQueueStopped".to_string())],
        "{:?}",
        plan.actions
    );
    assert!(admitted(&plan.actions).is_empty(), "{:?}", plan.actions);
    assert_eq!(
        pending_reason(&plan.actions, "team/pod-b").as_deref(),
        Some("ClusterQueueStopped")
    );
    // Terminating: not evicted again.
    let terminating = with(
        running(pod("a", 2)),
        "/metadata/deletionTimestamp",
        json!("2026-11-18T12:00:30Z"),
    );
    let plan = stopped(vec![terminating, pod("b", 1)], StopPolicy::HoldAndDrain);
    assert!(evicts(&plan.actions).is_empty(), "{:?}", plan.actions);
    // Held only: it keeps running.
    let plan = stopped(pods, StopPolicy::Hold);
    assert!(evicts(&plan.actions).is_empty(), "{:?}", plan.actions);
}
