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
//! The review is kube-core's `AdmissionReview<DynamicObject>` ([`Review`], [`request`]
//! checks and decodes it); a verdict's patch is `json-patch` operations whose paths are
//! `jsonptr` pointers (label and annotation keys escaped by RFC 6901, not by hand);
//! [`respond`] and [`to_json`] write the answer.
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
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::Pod;
use kube_core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, Operation, META_API_VERSION_V1, META_KIND,
};
use kube_core::{DynamicObject, Status};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// An AdmissionReview (`admission.k8s.io/v1`) as the API server sends it and as the
/// webhooks answer it.
pub type Review = AdmissionReview<DynamicObject>;

/// The `request` of a [`Review`]: what is created, by whom, and the object.
pub type Request = AdmissionRequest<DynamicObject>;

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
    Allow(Vec<PatchOperation>),
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
) -> Result<Review, BadReview> {
    let request = request(body)?;
    let verdict = decide_with(&request, classes, options);
    Ok(respond(&request, verdict))
}

/// The request of `body`, once it is checked to be an `admission.k8s.io/v1`
/// AdmissionReview with a request that has a uid.
pub fn request(body: &Value) -> Result<Request, BadReview> {
    if body["apiVersion"] != META_API_VERSION_V1 || body["kind"] != META_KIND {
        return Err(BadReview(format!(
            "expected apiVersion {META_API_VERSION_V1}, kind {META_KIND}"
        )));
    }
    let review: Review = serde_path_to_error::deserialize(body)
        .map_err(|e| BadReview(format!("{}: {}", e.path(), e.inner())))?;
    let request: Request = review
        .try_into()
        .map_err(|_| BadReview("request is missing".into()))?;
    if request.uid.is_empty() {
        return Err(BadReview("request.uid is missing".into()));
    }
    Ok(request)
}

/// The answer to `request` with `verdict`: the response envelope every webhook path of
/// Tessera shares (a denial is a 400 `BadRequest` with the verdict's message).
pub fn respond(request: &Request, verdict: Verdict) -> Review {
    let allowed = AdmissionResponse::from(request);
    let response = match verdict {
        Verdict::Allow(ops) if ops.is_empty() => allowed,
        Verdict::Allow(ops) => match allowed.clone().with_patch(Patch(ops)) {
            Ok(patched) => patched,
            Err(e) => refuse(allowed, 500, "InternalError", &e.to_string()),
        },
        Verdict::Deny(message) => refuse(allowed, 400, "BadRequest", &message),
    };
    response.into_review()
}

/// `response` turned into a refusal with an HTTP-like `code`, `reason` and `message`.
fn refuse(
    response: AdmissionResponse,
    code: u16,
    reason: &str,
    message: &str,
) -> AdmissionResponse {
    let mut response = response.deny(message);
    response.result = Status::failure(message, reason).with_code(code);
    response
}

/// `review` as the JSON the API server reads. The patch is written as base64 text, the
/// JSON form of the API's `[]byte` that the API documents (kube-core's own serializer
/// writes it as an array of numbers, kube-rs/kube#1781).
pub fn to_json(review: &Review) -> serde_json::Result<Value> {
    let mut out = serde_json::to_value(review)?;
    if let Some(patch) = review.response.as_ref().and_then(|r| r.patch.as_ref()) {
        out["response"]["patch"] = serde_json::to_value(k8s_openapi::ByteString(patch.clone()))?;
    }
    Ok(out)
}

/// The decision for one `request` of an AdmissionReview, with the default
/// [`Options`] (only Tessera's queue label).
pub fn decide(request: &Request, classes: Option<&BTreeMap<String, i32>>) -> Verdict {
    decide_with(request, classes, Options::default())
}

/// The decision for one `request` of an AdmissionReview.
pub fn decide_with(
    request: &Request,
    classes: Option<&BTreeMap<String, i32>>,
    options: Options,
) -> Verdict {
    let queue_labels = options.queue_labels();
    if request.operation != Operation::Create {
        return Verdict::Allow(Vec::new());
    }
    let object = request.object.as_ref();
    let what = match (request.kind.group.as_str(), request.kind.kind.as_str()) {
        ("", "Pod") => "Pod",
        ("batch", "Job") => "Job",
        ("apps", owner @ ("Deployment" | "StatefulSet")) => {
            let Some(object) = object else {
                return Verdict::Allow(Vec::new());
            };
            if let Some(e) = template_pod(object).and_then(|p| vgpu_error(&p)) {
                return Verdict::Deny(format!("{owner}: pod template: {e}"));
            }
            return Verdict::Allow(propagate_labels(object, queue_labels));
        }
        _ => return Verdict::Allow(Vec::new()),
    };
    let Some(object) = object else {
        return Verdict::Deny(format!("{what}: request.object is missing"));
    };
    let denial = match what {
        "Pod" => object
            .clone()
            .try_parse::<Pod>()
            .ok()
            .and_then(|p| vgpu_error(&p)),
        _ => template_pod(object)
            .and_then(|p| vgpu_error(&p))
            .map(|e| format!("pod template: {e}")),
    };
    if let Some(e) = denial {
        return Verdict::Deny(format!("{what}: {e}"));
    }
    let no_map = BTreeMap::new();
    let labels = object.metadata.labels.as_ref().unwrap_or(&no_map);
    let annotations = object.metadata.annotations.as_ref();
    let label = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).map(String::as_str));
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
                Some(value) => ops.push(set_annotation(
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
        ops.push(add(&["spec", "suspend"], json!(true)));
        return Verdict::Allow(ops);
    }
    if label(&POD_GROUP_LABELS).is_some() {
        if let Err((field, why)) = pod_group_counts(annotations.unwrap_or(&no_map)) {
            return Verdict::Deny(format!("Pod: annotation {field}: {why}"));
        }
    } else if annotations.is_some_and(|a| a.contains_key(POD_GROUP_MIN_COUNT)) {
        return Verdict::Deny(format!(
            "Pod: annotation {POD_GROUP_MIN_COUNT} needs a pod group (label {})",
            POD_GROUP_LABELS[0]
        ));
    }
    let gates = &object.data["spec"]["schedulingGates"];
    let gated = gates
        .as_array()
        .is_some_and(|g| g.iter().any(|x| x["name"] == ADMISSION_GATE));
    if !gated {
        let gate = json!({"name": ADMISSION_GATE});
        ops.push(if gates.is_array() {
            add(&["spec", "schedulingGates", "-"], gate)
        } else {
            add(&["spec", "schedulingGates"], json!([gate]))
        });
    }
    Verdict::Allow(ops)
}

/// A JSONPatch `add` of `value` at the path of `tokens` (each escaped as RFC 6901 says;
/// `-` is the end of an array).
fn add(tokens: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(tokens.iter().copied()),
        value,
    })
}

/// JSONPatch copying the queue and priority labels of a Deployment / StatefulSet into
/// its pod template (labels the template already has are kept). Nothing without one
/// of `queue_labels`.
fn propagate_labels(object: &DynamicObject, queue_labels: &[&str]) -> Vec<PatchOperation> {
    let Some(labels) = object.metadata.labels.as_ref() else {
        return Vec::new();
    };
    if !queue_labels.iter().any(|k| labels.contains_key(*k)) {
        return Vec::new();
    }
    let template = &object.data["spec"]["template"];
    if !template.is_object() {
        return Vec::new();
    }
    let have = &template["metadata"]["labels"];
    let missing: BTreeMap<&str, &str> = queue_labels
        .iter()
        .chain(PRIORITY_LABELS.iter())
        .filter_map(|k| labels.get(*k).map(|v| (*k, v.as_str())))
        .filter(|(k, _)| have[*k].is_null())
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    if have.is_object() {
        missing
            .into_iter()
            .map(|(k, v)| add(&["spec", "template", "metadata", "labels", k], json!(v)))
            .collect()
    } else if template["metadata"].is_object() {
        vec![add(
            &["spec", "template", "metadata", "labels"],
            json!(missing),
        )]
    } else {
        vec![add(
            &["spec", "template", "metadata"],
            json!({"labels": missing}),
        )]
    }
}

/// Why a pod's HAMi-style vGPU request cannot be placed, for pods that name
/// `gpumem`, `gpumem-percentage` or `gpucores` (resources under the default
/// `nvidia.com` prefix); `None` for every other pod (a pod with only `nvidia.com/gpu`
/// may be a whole-GPU pod and is not checked here).
fn vgpu_error(pod: &Pod) -> Option<String> {
    let config = vgpu::RequestConfig::default();
    let names = vgpu::request::ResourceNames::new(&config.prefix);
    if !vgpu::request::carries_vgpu_resources(pod, &names) {
        return None;
    }
    vgpu::pod_request(pod, &config).err().map(|e| e.to_string())
}

/// The pod a Job, Deployment or StatefulSet would create, from its template. A
/// template (or a pod) that does not decode is left to the API server's own validation.
fn template_pod(object: &DynamicObject) -> Option<Pod> {
    let template = &object.data["spec"]["template"];
    let metadata = match &template["metadata"] {
        Value::Null => json!({}),
        metadata => metadata.clone(),
    };
    Pod::deserialize(json!({"metadata": metadata, "spec": template["spec"]})).ok()
}

fn owned_by_job(object: &DynamicObject) -> bool {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Job" && r.api_version == "batch/v1")
}

/// JSONPatch setting one annotation, creating the map when absent.
fn set_annotation(object: &DynamicObject, key: &str, value: &str) -> PatchOperation {
    if object.metadata.annotations.is_some() {
        add(&["metadata", "annotations", key], json!(value))
    } else {
        add(&["metadata", "annotations"], json!({key: value}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review_of(kind: (&str, &str), operation: &str, object: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u-1", "operation": operation,
                           "kind": {"group": kind.0, "version": "v1", "kind": kind.1},
                           "resource": {"group": kind.0, "version": "v1", "resource": "things"},
                           "userInfo": {"username": "alice"},
                           "object": object}})
    }

    /// The answer to `body` as the API server reads it.
    fn answer(
        body: &Value,
        classes: Option<&BTreeMap<String, i32>>,
        options: Options,
    ) -> Result<Value, BadReview> {
        review(body, classes, options).map(|r| to_json(&r).unwrap())
    }

    /// The request of a review built by the test.
    fn req(body: &Value) -> Request {
        request(body).unwrap()
    }

    /// The JSONPatch of an answer (none: empty).
    fn patch_of(response: &Value) -> Vec<PatchOperation> {
        match response.get("patch") {
            None => Vec::new(),
            Some(p) => {
                assert_eq!(response["patchType"], "JSONPatch");
                let bytes: k8s_openapi::ByteString = serde_json::from_value(p.clone()).unwrap();
                serde_json::from_slice::<Patch>(&bytes.0).unwrap().0
            }
        }
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

    /// Applies a JSONPatch as the API server does (RFC 6902); the webhook only adds.
    fn apply(mut doc: Value, ops: &[PatchOperation]) -> Value {
        assert!(ops.iter().all(|op| matches!(op, PatchOperation::Add(_))));
        json_patch::patch(&mut doc, ops).unwrap_or_else(|e| panic!("{e}: {ops:?}"));
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
            let out = answer(
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
            assert!(
                resp.get("patch").is_none() || resp["patch"].is_string(),
                "{name}"
            );
            let ops = patch_of(resp);
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
            let request = review_of(kind, "CREATE", object);
            assert_eq!(
                decide(&req(&request), Some(&classes())),
                Verdict::Allow(Vec::new()),
                "{kind:?}: Kueue's, not ours, by default"
            );
            let Verdict::Allow(ops) = decide_with(&req(&request), Some(&classes()), KUEUE) else {
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
        let request = review_of(("", "Pod"), "CREATE", both);
        for options in [Options::default(), KUEUE] {
            let Verdict::Allow(ops) = decide_with(&req(&request), Some(&classes()), options) else {
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
            let out = answer(
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
            let out = answer(&owner(group, kind, &bad), None, Options::default()).unwrap();
            assert_eq!(out["response"]["allowed"], false, "{kind}");
            assert_eq!(
                out["response"]["status"]["message"],
                format!("{kind}: {reason}"),
                "{kind}"
            );
            let out = answer(&owner(group, kind, &good), None, Options::default()).unwrap();
            assert_eq!(out["response"]["allowed"], true, "{kind}");
        }
    }

    #[test]
    fn a_valid_queued_vgpu_pod_is_gated_as_before() {
        let limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "25"});
        let out = answer(
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
        let out = answer(
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
        // Each refusal names what is wrong.
        let p = pod(json!({"tessera.io/queue-name": "lq"}), Value::Null, None);
        let good = review_of(("", "Pod"), "CREATE", p);
        type Edit = fn(&mut Value);
        let broken = |edit: Edit| {
            let mut body = good.clone();
            edit(&mut body);
            review(&body, None, Options::default())
                .unwrap_err()
                .to_string()
        };
        let cases: [(&str, Edit); 6] = [
            (
                "expected apiVersion admission.k8s.io/v1, kind AdmissionReview",
                |b| b["kind"] = json!("Pod"),
            ),
            ("request is missing", |b| {
                b.as_object_mut().unwrap().remove("request");
            }),
            ("request.uid is missing", |b| {
                b["request"]["uid"] = json!("")
            }),
            ("request: missing field `resource`", |b| {
                b["request"].as_object_mut().unwrap().remove("resource");
            }),
            ("request.operation: unknown variant `PATCH`", |b| {
                b["request"]["operation"] = json!("PATCH")
            }),
            ("request.object", |b| {
                b["request"]["object"] = json!("a pod")
            }),
        ];
        for (want, edit) in cases {
            let error = broken(edit);
            assert!(error.starts_with("bad AdmissionReview: "), "{error}");
            assert!(error.contains(want), "{want}: {error}");
        }
        assert!(review(&good, None, Options::default()).is_ok());
        // A request without an object is denied with a reason.
        let r = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "operation": "CREATE",
                                   "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                                   "userInfo": {}}});
        let out = answer(&r, None, Options::default()).unwrap();
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
                let request = review_of(("apps", kind), "CREATE", object.clone());
                let Verdict::Allow(ops) = decide_with(&req(&request), Some(&classes()), KUEUE)
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

    #[test]
    fn keys_with_slash_and_tilde_are_escaped_and_the_patch_applies() {
        // A queue label and a priority class whose keys carry `/` and `~`, which a JSON
        // pointer must write as `~1` and `~0`.
        let odd = "example.com/a~b";
        let object = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns",
                         "labels": {"tessera.io/queue-name": "lq",
                                    "tessera.io/priority-class": "high", odd: "x"}},
            "spec": {"template": {"metadata": {"labels": {"app": "web", odd: "y"}},
                                  "spec": {"containers": [{"name": "c"}]}}}});
        let out = answer(
            &review_of(("apps", "Deployment"), "CREATE", object.clone()),
            Some(&classes()),
            Options::default(),
        )
        .unwrap();
        let ops = patch_of(&out["response"]);
        let paths: Vec<String> = ops.iter().map(|op| op.path().to_string()).collect();
        assert_eq!(
            paths,
            [
                "/spec/template/metadata/labels/tessera.io~1priority-class",
                "/spec/template/metadata/labels/tessera.io~1queue-name",
            ]
        );
        let mut after = object.clone();
        json_patch::patch(&mut after, &ops).unwrap();
        assert_eq!(
            after["spec"]["template"]["metadata"]["labels"],
            json!({"app": "web", odd: "y", "tessera.io/queue-name": "lq",
                   "tessera.io/priority-class": "high"})
        );

        // An annotation key with both, set on a pod that has annotations already.
        let pod = pod(
            json!({"tessera.io/queue-name": "lq", "tessera.io/priority-class": "high"}),
            json!({odd: "kept"}),
            None,
        );
        let Verdict::Allow(ops) = decide(
            &req(&review_of(("", "Pod"), "CREATE", pod.clone())),
            Some(&classes()),
        ) else {
            panic!("denied");
        };
        assert_eq!(
            ops[0].path().to_string(),
            "/metadata/annotations/tessera.io~1priority"
        );
        let set = set_annotation(&DynamicObject::deserialize(&pod).unwrap(), odd, "new");
        assert_eq!(
            set.path().to_string(),
            "/metadata/annotations/example.com~1a~0b"
        );
        let mut after = pod.clone();
        json_patch::patch(&mut after, &[set]).unwrap();
        assert_eq!(after["metadata"]["annotations"][odd], "new");
        assert_eq!(
            after["metadata"]["annotations"].as_object().unwrap().len(),
            1
        );
        json_patch::patch(&mut after, &ops).unwrap();
        assert_eq!(
            after["metadata"]["annotations"][PRIORITY_ANNOTATION],
            "1000"
        );
        assert_eq!(
            after["spec"]["schedulingGates"],
            json!([{"name": ADMISSION_GATE}])
        );
    }

    #[test]
    fn the_patch_is_base64_text_on_the_wire() {
        let p = pod(json!({"tessera.io/queue-name": "lq"}), Value::Null, None);
        let out = answer(
            &review_of(("", "Pod"), "CREATE", p),
            None,
            Options::default(),
        )
        .unwrap();
        let response = &out["response"];
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(response["patchType"], "JSONPatch");
        let text = response["patch"]
            .as_str()
            .expect("base64 text, not a number array");
        let bytes: k8s_openapi::ByteString = serde_json::from_value(json!(text)).unwrap();
        let ops: Value = serde_json::from_slice(&bytes.0).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": ADMISSION_GATE}]}])
        );
    }
}
