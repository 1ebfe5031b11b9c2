//! The mutating admission decision, pure: an AdmissionReview v1 in, an AdmissionReview
//! response out. Pods that name a queue get the `tessera.io/admission` scheduling gate;
//! batch Jobs that name a queue are created suspended; the priority label must name a
//! WorkloadPriorityClass, whose value is recorded in `tessera.io/priority` at creation
//! (as Kueue fixes a workload's priority when it is created). A Deployment or
//! StatefulSet labelled with a queue (Kueue's way) has its queue and priority labels
//! copied into its pod template, so its replica pods are gated and queued. The HTTPS
//! shell is `webhook_server.rs`. A pod, or the pod template of a Job, Deployment or
//! StatefulSet, whose HAMi-style vGPU request (`nvidia.com/gpumem`, `gpumem-percentage`,
//! `gpucores`) is invalid is denied with the reason [`crate::vgpu::request`] gives
//! (docs/hami.md).
//!
//! Only `tessera.io/queue-name` names a queue unless [`Options::accept_kueue_labels`]
//! (`--accept-kueue-labels`) is set: beside a real Kueue, a pod carrying Kueue's
//! `kueue.x-k8s.io/queue-name` is Kueue's to gate, not ours.

use super::{ADMISSION_GATE, PRIORITY_ANNOTATION};
use crate::quota::objects::{
    pod_group_counts, POD_GROUP_LABEL_KEYS as POD_GROUP_LABELS, POD_GROUP_MIN_COUNT,
    PRIORITY_LABELS, QUEUE_LABELS,
};
use crate::vgpu;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What the webhook honours beyond Tessera's own labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Kueue's `kueue.x-k8s.io/queue-name` names a queue too (off by default: beside a
    /// real Kueue the same pod would be gated by both).
    pub accept_kueue_labels: bool,
}

/// `tessera.io/queue-name` alone.
static TESSERA_QUEUE_LABEL: [&str; 1] = [QUEUE_LABELS[0]];

impl Options {
    /// The labels that name a queue, in order of precedence.
    pub fn queue_labels(&self) -> &'static [&'static str] {
        if self.accept_kueue_labels {
            &QUEUE_LABELS
        } else {
            &TESSERA_QUEUE_LABEL
        }
    }
}

/// A request that is not an AdmissionReview this webhook can answer (HTTP 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad AdmissionReview: {0}")]
pub struct BadReview(pub String);

/// What the webhook decided for one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Allowed, with these JSONPatch operations (possibly none).
    Allow(Vec<Value>),
    /// Refused, with a message for the user.
    Deny(String),
}

/// Answers an AdmissionReview (`admission.k8s.io/v1`). `classes` are the known
/// WorkloadPriorityClasses (name → value); `None` when they could not be listed, in
/// which case the priority label is not checked here (the controller reports it).
pub fn review(
    body: &Value,
    classes: Option<&BTreeMap<String, i32>>,
    options: Options,
) -> Result<Value, BadReview> {
    respond(body, |request| decide_with(request, classes, options))
}

/// Answers an AdmissionReview (`admission.k8s.io/v1`) with the verdict `decide` gives
/// its `request`: the response envelope every webhook path of Tessera shares.
pub fn respond(body: &Value, decide: impl FnOnce(&Value) -> Verdict) -> Result<Value, BadReview> {
    let uid = review_uid(body)?;
    let verdict = decide(&body["request"]);
    let response = match verdict {
        Verdict::Allow(ops) if ops.is_empty() => json!({"uid": uid, "allowed": true}),
        Verdict::Allow(ops) => {
            let patch = serde_json::to_vec(&ops).unwrap_or_default();
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                   "patch": k8s_openapi::ByteString(patch)})
        }
        Verdict::Deny(message) => json!({"uid": uid, "allowed": false,
            "status": {"code": 400, "reason": "BadRequest", "message": message}}),
    };
    Ok(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

/// The request's uid, once `body` is checked to be an `admission.k8s.io/v1`
/// AdmissionReview.
pub fn review_uid(body: &Value) -> Result<&str, BadReview> {
    if body["apiVersion"] != "admission.k8s.io/v1" || body["kind"] != "AdmissionReview" {
        return Err(BadReview(
            "expected apiVersion admission.k8s.io/v1, kind AdmissionReview".into(),
        ));
    }
    body["request"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| BadReview("request.uid is missing".into()))
}

/// The decision for one `request` of an AdmissionReview, with the default
/// [`Options`] (only Tessera's queue label).
pub fn decide(request: &Value, classes: Option<&BTreeMap<String, i32>>) -> Verdict {
    decide_with(request, classes, Options::default())
}

/// The decision for one `request` of an AdmissionReview.
pub fn decide_with(
    request: &Value,
    classes: Option<&BTreeMap<String, i32>>,
    options: Options,
) -> Verdict {
    let queue_labels = options.queue_labels();
    if request["operation"] != "CREATE" {
        return Verdict::Allow(Vec::new());
    }
    let object = &request["object"];
    let kind = (
        request["kind"]["group"].as_str().unwrap_or(""),
        request["kind"]["kind"].as_str().unwrap_or(""),
    );
    let what = match kind {
        ("", "Pod") => "Pod",
        ("batch", "Job") => "Job",
        ("apps", owner @ ("Deployment" | "StatefulSet")) => {
            if let Some(e) = vgpu_error(&pod_template(object)) {
                return Verdict::Deny(format!("{owner}: pod template: {e}"));
            }
            return Verdict::Allow(propagate_labels(object, queue_labels));
        }
        _ => return Verdict::Allow(Vec::new()),
    };
    if !object.is_object() {
        return Verdict::Deny(format!("{what}: request.object is missing"));
    }
    let denial = match what {
        "Pod" => vgpu_error(object),
        _ => vgpu_error(&pod_template(object)).map(|e| format!("pod template: {e}")),
    };
    if let Some(e) = denial {
        return Verdict::Deny(format!("{what}: {e}"));
    }
    let labels = &object["metadata"]["labels"];
    let label = |keys: &[&str]| keys.iter().find_map(|k| labels[*k].as_str());
    let Some(queue) = label(queue_labels) else {
        return Verdict::Allow(Vec::new());
    };
    if queue.is_empty() {
        return Verdict::Deny(format!("{what}: label {} is empty", QUEUE_LABELS[0]));
    }
    if what == "Pod" && owned_by_job(object) {
        // The Job is the workload; its pods run when the Job is unsuspended.
        return Verdict::Allow(Vec::new());
    }
    let mut ops = Vec::new();
    if let Some(class) = label(&PRIORITY_LABELS) {
        if let Some(classes) = classes {
            match classes.get(class) {
                Some(value) => ops.extend(set_annotation(
                    object,
                    PRIORITY_ANNOTATION,
                    &value.to_string(),
                )),
                None => {
                    return Verdict::Deny(format!(
                        "{what}: label {}: WorkloadPriorityClass {class:?} does not exist",
                        PRIORITY_LABELS[0]
                    ))
                }
            }
        }
    }
    if what == "Job" {
        ops.push(json!({"op": "add", "path": "/spec/suspend", "value": true}));
        return Verdict::Allow(ops);
    }
    if label(&POD_GROUP_LABELS).is_some() {
        let annotations: BTreeMap<String, String> = object["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        if let Err((field, why)) = pod_group_counts(&annotations) {
            return Verdict::Deny(format!("Pod: annotation {field}: {why}"));
        }
    } else if object["metadata"]["annotations"][POD_GROUP_MIN_COUNT].is_string() {
        return Verdict::Deny(format!(
            "Pod: annotation {POD_GROUP_MIN_COUNT} needs a pod group (label {})",
            POD_GROUP_LABELS[0]
        ));
    }
    let gates = &object["spec"]["schedulingGates"];
    let gated = gates
        .as_array()
        .is_some_and(|g| g.iter().any(|x| x["name"] == ADMISSION_GATE));
    if !gated {
        let gate = json!({"name": ADMISSION_GATE});
        ops.push(if gates.is_array() {
            json!({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
        } else {
            json!({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
        });
    }
    Verdict::Allow(ops)
}

/// JSONPatch copying the queue and priority labels of a Deployment / StatefulSet into
/// its pod template (labels the template already has are kept). Nothing without one
/// of `queue_labels`.
fn propagate_labels(object: &Value, queue_labels: &[&str]) -> Vec<Value> {
    let labels = &object["metadata"]["labels"];
    if !queue_labels.iter().any(|k| labels[*k].is_string()) {
        return Vec::new();
    }
    let wanted: Vec<(&str, &str)> = queue_labels
        .iter()
        .chain(PRIORITY_LABELS.iter())
        .filter_map(|k| labels[*k].as_str().map(|v| (*k, v)))
        .collect();
    let template = &object["spec"]["template"];
    if !template.is_object() {
        return Vec::new();
    }
    let have = &template["metadata"]["labels"];
    let missing: serde_json::Map<String, Value> = wanted
        .into_iter()
        .filter(|(k, _)| have[*k].is_null())
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    if have.is_object() {
        missing
            .into_iter()
            .map(|(k, v)| {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                json!({"op": "add", "path": format!("/spec/template/metadata/labels/{escaped}"), "value": v})
            })
            .collect()
    } else if template["metadata"].is_object() {
        vec![json!({"op": "add", "path": "/spec/template/metadata/labels", "value": missing})]
    } else {
        vec![json!({"op": "add", "path": "/spec/template/metadata", "value": {"labels": missing}})]
    }
}

/// Why a pod's HAMi-style vGPU request cannot be placed, for pods that name
/// `gpumem`, `gpumem-percentage` or `gpucores` (resources under the default
/// `nvidia.com` prefix); `None` for every other pod (a pod with only `nvidia.com/gpu`
/// may be a whole-GPU pod and is not checked here). A pod that does not decode is left
/// to the API server's own validation.
fn vgpu_error(pod: &Value) -> Option<String> {
    let pod: Pod = serde_json::from_value(pod.clone()).ok()?;
    let config = vgpu::RequestConfig::default();
    let names = vgpu::request::ResourceNames::new(&config.prefix);
    if !vgpu::request::carries_vgpu_resources(&pod, &names) {
        return None;
    }
    vgpu::pod_request(&pod, &config)
        .err()
        .map(|e| e.to_string())
}

/// The pod a Job, Deployment or StatefulSet would create, from its template.
fn pod_template(object: &Value) -> Value {
    let template = &object["spec"]["template"];
    let metadata = match &template["metadata"] {
        Value::Null => json!({}),
        metadata => metadata.clone(),
    };
    json!({"metadata": metadata, "spec": template["spec"]})
}

fn owned_by_job(object: &Value) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r["kind"] == "Job" && r["apiVersion"] == "batch/v1")
        })
}

/// JSONPatch setting one annotation, creating the map when absent.
fn set_annotation(object: &Value, key: &str, value: &str) -> Vec<Value> {
    if object["metadata"]["annotations"].is_object() {
        let escaped = key.replace('~', "~0").replace('/', "~1");
        vec![
            json!({"op": "add", "path": format!("/metadata/annotations/{escaped}"), "value": value}),
        ]
    } else {
        vec![json!({"op": "add", "path": "/metadata/annotations", "value": {key: value}})]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review_of(kind: (&str, &str), operation: &str, object: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u-1", "operation": operation,
                           "kind": {"group": kind.0, "version": "v1", "kind": kind.1},
                           "object": object}})
    }

    fn pod(labels: Value, annotations: Value, gates: Option<Value>) -> Value {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "p", "namespace": "ns", "labels": labels},
                           "spec": {"containers": [{"name": "c"}]}});
        if !annotations.is_null() {
            p["metadata"]["annotations"] = annotations;
        }
        if let Some(g) = gates {
            p["spec"]["schedulingGates"] = g;
        }
        p
    }

    const KUEUE: Options = Options {
        accept_kueue_labels: true,
    };

    fn classes() -> BTreeMap<String, i32> {
        [("high".to_string(), 1000)].into()
    }

    /// Applies a JSONPatch of `add` operations (all the webhook emits).
    fn apply(mut doc: Value, ops: &[Value]) -> Value {
        for op in ops {
            assert_eq!(op["op"], "add");
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc.pointer_mut(parent).expect("parent exists");
            if last == "-" {
                target.as_array_mut().unwrap().push(op["value"].clone());
            } else {
                target[last.as_str()] = op["value"].clone();
            }
        }
        doc
    }

    #[test]
    fn table() {
        let q = json!({"tessera.io/queue-name": "lq"});
        let kq =
            json!({"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/priority-class": "high"});
        let group = json!({"tessera.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": "g"});
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "labels": {"tessera.io/queue-name": "lq"}},
            "spec": {"suspend": false, "template": {"spec": {"containers": []}}}});
        let mut owned = pod(q.clone(), Value::Null, None);
        owned["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "x"}]);
        // (case, kind, operation, object, gated after, suspended after, denial contains)
        type Case<'a> = (
            &'a str,
            (&'a str, &'a str),
            &'a str,
            Value,
            bool,
            bool,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "no queue label",
                ("", "Pod"),
                "CREATE",
                pod(json!({}), Value::Null, None),
                false,
                false,
                None,
            ),
            (
                "tessera label",
                ("", "Pod"),
                "CREATE",
                pod(q.clone(), Value::Null, None),
                true,
                false,
                None,
            ),
            (
                "kueue labels",
                ("", "Pod"),
                "CREATE",
                pod(kq.clone(), json!({"a": "b"}), None),
                true,
                false,
                None,
            ),
            (
                "other gates kept",
                ("", "Pod"),
                "CREATE",
                pod(q.clone(), Value::Null, Some(json!([{"name": "x"}]))),
                true,
                false,
                None,
            ),
            (
                "already gated",
                ("", "Pod"),
                "CREATE",
                pod(
                    q.clone(),
                    Value::Null,
                    Some(json!([{"name": ADMISSION_GATE}])),
                ),
                true,
                false,
                None,
            ),
            (
                "update ignored",
                ("", "Pod"),
                "UPDATE",
                pod(q.clone(), Value::Null, None),
                false,
                false,
                None,
            ),
            (
                "pod of a Job",
                ("", "Pod"),
                "CREATE",
                owned,
                false,
                false,
                None,
            ),
            (
                "unknown class",
                ("", "Pod"),
                "CREATE",
                pod(
                    json!({"tessera.io/queue-name": "lq", "tessera.io/priority-class": "nope"}),
                    Value::Null,
                    None,
                ),
                false,
                false,
                Some("\"nope\" does not exist"),
            ),
            (
                "empty queue",
                ("", "Pod"),
                "CREATE",
                pod(json!({"tessera.io/queue-name": ""}), Value::Null, None),
                false,
                false,
                Some("is empty"),
            ),
            (
                "group without count",
                ("", "Pod"),
                "CREATE",
                pod(group.clone(), Value::Null, None),
                false,
                false,
                Some("pod-group-total-count"),
            ),
            (
                "group bad count",
                ("", "Pod"),
                "CREATE",
                pod(
                    group.clone(),
                    json!({"kueue.x-k8s.io/pod-group-total-count": "x"}),
                    None,
                ),
                false,
                false,
                Some("pod-group-total-count: not a number"),
            ),
            (
                "min count without a group",
                ("", "Pod"),
                "CREATE",
                pod(
                    json!({"tessera.io/queue-name": "lq"}),
                    json!({"tessera.io/pod-group-min-count": "1"}),
                    None,
                ),
                false,
                false,
                Some("tessera.io/pod-group-min-count needs a pod group"),
            ),
            (
                "group min count above its total",
                ("", "Pod"),
                "CREATE",
                pod(
                    group.clone(),
                    json!({"kueue.x-k8s.io/pod-group-total-count": "2",
                           "tessera.io/pod-group-min-count": "3"}),
                    None,
                ),
                false,
                false,
                Some("tessera.io/pod-group-min-count: 3 is not between 1 and the group's total count 2"),
            ),
            (
                "group",
                ("", "Pod"),
                "CREATE",
                pod(
                    group.clone(),
                    json!({"kueue.x-k8s.io/pod-group-total-count": "2"}),
                    None,
                ),
                true,
                false,
                None,
            ),
            (
                "group with a min count",
                ("", "Pod"),
                "CREATE",
                pod(
                    group.clone(),
                    json!({"kueue.x-k8s.io/pod-group-total-count": "4",
                           "tessera.io/pod-group-min-count": "2"}),
                    None,
                ),
                true,
                false,
                None,
            ),
            (
                "job",
                ("batch", "Job"),
                "CREATE",
                job.clone(),
                false,
                true,
                None,
            ),
            (
                "other kind",
                ("apps", "DaemonSet"),
                "CREATE",
                job,
                false,
                false,
                None,
            ),
        ];
        for (name, kind, op, object, gated, suspended, denial) in cases {
            let out = review(
                &review_of(kind, op, object.clone()),
                Some(&classes()),
                KUEUE,
            )
            .unwrap();
            let resp = &out["response"];
            assert_eq!(resp["uid"], "u-1", "{name}");
            match denial {
                Some(text) => {
                    assert_eq!(resp["allowed"], false, "{name}");
                    let msg = resp["status"]["message"].as_str().unwrap();
                    assert!(msg.contains(text), "{name}: {msg}");
                    continue;
                }
                None => assert_eq!(resp["allowed"], true, "{name}: {resp}"),
            }
            let ops: Vec<Value> = match resp["patch"].as_str() {
                Some(_) => {
                    assert_eq!(resp["patchType"], "JSONPatch", "{name}");
                    let bytes: k8s_openapi::ByteString =
                        serde_json::from_value(resp["patch"].clone()).unwrap();
                    serde_json::from_slice(&bytes.0).unwrap()
                }
                None => Vec::new(),
            };
            let after = apply(object.clone(), &ops);
            let gates = after["spec"]["schedulingGates"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let n = gates.iter().filter(|g| g["name"] == ADMISSION_GATE).count();
            assert_eq!(n, usize::from(gated), "{name}: gates {gates:?}");
            if let Some(before) = object["spec"]["schedulingGates"].as_array() {
                assert!(before.iter().all(|g| gates.contains(g)), "{name}: kept");
            }
            assert_eq!(after["spec"]["suspend"] == true, suspended, "{name}");
            if name == "kueue labels" {
                assert_eq!(
                    after["metadata"]["annotations"][PRIORITY_ANNOTATION],
                    "1000"
                );
                assert_eq!(after["metadata"]["annotations"]["a"], "b");
            }
        }
    }

    #[test]
    fn kueue_labels_are_honoured_only_when_accepted() {
        let kq = json!({"kueue.x-k8s.io/queue-name": "lq"});
        let job = json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "labels": kq.clone()},
            "spec": {"template": {"spec": {"containers": []}}}});
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": kq.clone()},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {}}}});
        let objects = [
            (("", "Pod"), pod(kq.clone(), Value::Null, None)),
            (("batch", "Job"), job),
            (("apps", "Deployment"), deployment),
        ];
        for (kind, object) in objects {
            let req = review_of(kind, "CREATE", object);
            assert_eq!(
                decide(&req["request"], Some(&classes())),
                Verdict::Allow(Vec::new()),
                "{kind:?}: Kueue's, not ours, by default"
            );
            let Verdict::Allow(ops) = decide_with(&req["request"], Some(&classes()), KUEUE) else {
                panic!("{kind:?}: denied");
            };
            assert!(!ops.is_empty(), "{kind:?}: gated / suspended / propagated");
        }
        // Tessera's own label is honoured either way, and wins over Kueue's.
        let both = pod(
            json!({"tessera.io/queue-name": "lq", "kueue.x-k8s.io/queue-name": "other"}),
            Value::Null,
            None,
        );
        let req = review_of(("", "Pod"), "CREATE", both);
        for options in [Options::default(), KUEUE] {
            let Verdict::Allow(ops) = decide_with(&req["request"], Some(&classes()), options)
            else {
                panic!("denied");
            };
            assert_eq!(ops.len(), 1, "{options:?}: the gate");
        }
    }

    /// An AdmissionReview as the API server sends it for a pod CREATE.
    fn pod_review(annotations: Value, labels: Value, spec: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "infer",
                "namespace": "ml",
                "operation": "CREATE",
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "infer", "namespace": "ml",
                                 "labels": labels, "annotations": annotations},
                    "spec": spec,
                },
                "oldObject": null,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            }
        })
    }

    fn one_container(limits: Value) -> Value {
        json!({"containers": [{"name": "main", "image": "cuda",
                               "resources": {"limits": limits}}]})
    }

    #[test]
    fn invalid_vgpu_requests_are_denied_with_the_reason() {
        let issue_pod = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240",
                               "nvidia.com/gpucores": "30"});
        // (case, annotations, labels, spec, None if allowed / the denial message)
        let cases = [
            (
                "the issue's pod",
                json!({"nvidia.com/use-gputype": "A100,H100",
                       "hami.io/gpu-scheduler-policy": "binpack"}),
                json!({}),
                one_container(issue_pod.clone()),
                None,
            ),
            (
                "gpucores above 100",
                json!({}),
                json!({}),
                one_container(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})),
                Some("Pod: container \"main\": nvidia.com/gpucores is 150, above 100 (% of the GPU's SMs)"),
            ),
            (
                "memory and percentage together",
                json!({}),
                json!({}),
                one_container(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024",
                                     "nvidia.com/gpumem-percentage": "50"})),
                Some("Pod: container \"main\": nvidia.com/gpumem and nvidia.com/gpumem-percentage together; ask for one of them"),
            ),
            (
                "gpumem without a count",
                json!({}),
                json!({}),
                one_container(json!({"nvidia.com/gpumem": "1024"})),
                Some("Pod: container \"main\": nvidia.com/gpumem without nvidia.com/gpu; add nvidia.com/gpu: 1 (HAMi adds it silently, Tessera asks you to write it)"),
            ),
            (
                "unknown policy on a vGPU pod",
                json!({"hami.io/node-scheduler-policy": "random"}),
                json!({}),
                one_container(issue_pod.clone()),
                Some("Pod: annotation hami.io/node-scheduler-policy: \"random\" is not a policy (binpack or spread)"),
            ),
            (
                "an invalid init container",
                json!({}),
                json!({}),
                json!({"initContainers": [{"name": "warm", "image": "cuda",
                        "resources": {"limits": {"nvidia.com/gpu": "1",
                                                 "nvidia.com/gpumem-percentage": "120"}}}],
                       "containers": [{"name": "main", "image": "cuda"}]}),
                Some("Pod: container \"warm\": nvidia.com/gpumem-percentage is 120, not between 1 and 100"),
            ),
            (
                "a queued vGPU pod is still checked",
                json!({}),
                json!({"tessera.io/queue-name": "lq"}),
                one_container(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"})),
                Some("Pod: container \"main\": nvidia.com/gpucores is 101, above 100 (% of the GPU's SMs)"),
            ),
            (
                "a whole-GPU pod is not a vGPU pod",
                json!({"hami.io/node-scheduler-policy": "random"}),
                json!({}),
                one_container(json!({"nvidia.com/gpu": "1"})),
                None,
            ),
            (
                "a CPU pod is left alone",
                json!({"nvidia.com/use-gputype": ""}),
                json!({}),
                one_container(json!({"cpu": "1"})),
                None,
            ),
        ];
        for (name, annotations, labels, spec, denial) in cases {
            let out = review(
                &pod_review(annotations, labels, spec),
                None,
                Options::default(),
            )
            .unwrap();
            let response = &out["response"];
            assert_eq!(out["kind"], "AdmissionReview", "{name}");
            assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
            match denial {
                Some(message) => {
                    assert_eq!(response["allowed"], false, "{name}: {response}");
                    assert_eq!(response["status"]["code"], 400, "{name}");
                    assert_eq!(response["status"]["message"], message, "{name}");
                }
                None => assert_eq!(response["allowed"], true, "{name}: {response}"),
            }
        }
    }

    #[test]
    fn invalid_vgpu_pod_templates_are_denied_at_their_owner() {
        let template = |limits: Value| {
            json!({"metadata": {"labels": {"app": "infer"}},
                   "spec": one_container(limits)})
        };
        let bad = template(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "200"}));
        let good = template(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20"}));
        let owner = |group: &str, kind: &str, template: &Value| {
            let api_version = format!("{group}/v1");
            let object = json!({"apiVersion": api_version, "kind": kind,
                                "metadata": {"name": "infer", "namespace": "ml"},
                                "spec": {"template": template}});
            review_of((group, kind), "CREATE", object)
        };
        let reason = "pod template: container \"main\": nvidia.com/gpucores is 200, \
                      above 100 (% of the GPU's SMs)";
        for (group, kind) in [
            ("apps", "Deployment"),
            ("apps", "StatefulSet"),
            ("batch", "Job"),
        ] {
            let out = review(&owner(group, kind, &bad), None, Options::default()).unwrap();
            assert_eq!(out["response"]["allowed"], false, "{kind}");
            assert_eq!(
                out["response"]["status"]["message"],
                format!("{kind}: {reason}"),
                "{kind}"
            );
            let out = review(&owner(group, kind, &good), None, Options::default()).unwrap();
            assert_eq!(out["response"]["allowed"], true, "{kind}");
        }
    }

    #[test]
    fn a_valid_queued_vgpu_pod_is_gated_as_before() {
        let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"});
        let out = review(
            &pod_review(
                json!({}),
                json!({"tessera.io/queue-name": "lq"}),
                one_container(limits),
            ),
            None,
            Options::default(),
        )
        .unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
    }

    #[test]
    fn unknown_classes_are_not_checked_when_they_could_not_be_listed() {
        let p = pod(
            json!({"tessera.io/queue-name": "lq", "tessera.io/priority-class": "nope"}),
            Value::Null,
            None,
        );
        let out = review(
            &review_of(("", "Pod"), "CREATE", p),
            None,
            Options::default(),
        )
        .unwrap();
        assert_eq!(out["response"]["allowed"], true);
    }

    #[test]
    fn malformed_reviews_are_errors_not_panics() {
        for body in [
            json!(null),
            json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 3}}),
        ] {
            assert!(review(&body, None, Options::default()).is_err(), "{body}");
        }
        // A request without an object is denied with a reason.
        let r = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "operation": "CREATE", "kind": {"group": "", "kind": "Pod"}}});
        let out = review(&r, None, Options::default()).unwrap();
        assert_eq!(out["response"]["allowed"], false);
    }

    #[test]
    fn serving_owners_pass_their_queue_labels_to_the_pod_template() {
        let deployment = |labels: Value, template_meta: Value| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "ns", "labels": labels},
                   "spec": {"template": {"metadata": template_meta,
                                         "spec": {"containers": [{"name": "c"}]}}}})
        };
        let kq = json!({"kueue.x-k8s.io/queue-name": "lq", "tessera.io/priority-class": "high"});
        // (case, object, template labels after)
        let cases = [
            (
                "labels added next to the template's own",
                deployment(kq.clone(), json!({"labels": {"app": "web"}})),
                json!({"app": "web", "kueue.x-k8s.io/queue-name": "lq", "tessera.io/priority-class": "high"}),
            ),
            (
                "template without labels",
                deployment(kq.clone(), json!({})),
                json!({"kueue.x-k8s.io/queue-name": "lq", "tessera.io/priority-class": "high"}),
            ),
            (
                "template without metadata",
                deployment(kq.clone(), Value::Null),
                json!({"kueue.x-k8s.io/queue-name": "lq", "tessera.io/priority-class": "high"}),
            ),
            (
                "the template's own queue wins",
                deployment(
                    kq,
                    json!({"labels": {"kueue.x-k8s.io/queue-name": "other"}}),
                ),
                json!({"kueue.x-k8s.io/queue-name": "other", "tessera.io/priority-class": "high"}),
            ),
            (
                "no queue label: untouched",
                deployment(json!({"app": "web"}), json!({"labels": {"app": "web"}})),
                json!({"app": "web"}),
            ),
        ];
        for (name, mut object, want) in cases {
            if object["spec"]["template"]["metadata"].is_null() {
                object["spec"]["template"]
                    .as_object_mut()
                    .unwrap()
                    .remove("metadata");
            }
            for kind in ["Deployment", "StatefulSet"] {
                let req = review_of(("apps", kind), "CREATE", object.clone());
                let Verdict::Allow(ops) = decide_with(&req["request"], Some(&classes()), KUEUE)
                else {
                    panic!("{name}: denied");
                };
                let after = apply(object.clone(), &ops);
                assert_eq!(
                    after["spec"]["template"]["metadata"]["labels"], want,
                    "{name} ({kind})"
                );
            }
        }
    }
}
