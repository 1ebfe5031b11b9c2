//! The shipped webhook configuration sends the webhook only what Tessera manages: its
//! selectors, evaluated as the API server does, against the objects of a Deployment's
//! life (Deployment → the webhook's template patch → its pods) and against what must
//! never reach it (unlabelled Jobs, Kueue's objects, kube-system).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use tessera::controller::webhook::{decide_with, request, Options, Verdict};

fn config() -> Value {
    let text = std::fs::read_to_string("daemonset/controller/webhook.yaml").unwrap();
    serde_saphyr::from_str::<Value>(&text).unwrap()
}

/// A label selector's `matchExpressions` (all the shipped ones use) against `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    assert!(
        selector["matchLabels"].is_null(),
        "only matchExpressions here"
    );
    selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels[e["key"].as_str().unwrap()].as_str();
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                "In" => value.is_some_and(|v| values.contains(&v)),
                "NotIn" => value.is_none_or(|v| !values.contains(&v)),
                op => panic!("operator {op}"),
            }
        })
}

/// The webhooks of the shipped configuration the API server calls for a CREATE of
/// `resource` in `group` in namespace `ns`, for an object labelled `labels`.
fn called(group: &str, resource: &str, ns: &str, labels: &Value) -> Vec<String> {
    let ns_labels = json!({ "kubernetes.io/metadata.name": ns });
    config()["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            w["rules"].as_array().unwrap().iter().any(|r| {
                let has =
                    |k: &str, x: &str| r[k].as_array().unwrap().iter().any(|v| v == x || v == "*");
                has("apiGroups", group) && has("resources", resource) && has("operations", "CREATE")
            }) && selects(&w["objectSelector"], labels)
                && selects(&w["namespaceSelector"], &ns_labels)
        })
        .map(|w| w["name"].as_str().unwrap().to_string())
        .collect()
}

fn classes() -> BTreeMap<String, i32> {
    BTreeMap::new()
}

#[test]
fn a_deployments_pods_carry_the_label_and_reach_the_pod_webhook() {
    let queue = json!({"tessera.io/queue-name": "lq"});
    assert_eq!(
        called("apps", "deployments", "team", &queue),
        ["serving.admission.tessera.io"]
    );
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team", "labels": queue},
        "spec": {"template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c"}]}}}});
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "d-1", "operation": "CREATE",
                    "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "userInfo": {"username": "alice"}, "object": deployment.clone()}});
    let request = request(&review).unwrap();
    let Verdict::Allow(ops) = decide_with(&request, Some(&classes()), Options::default()) else {
        panic!("denied");
    };
    // The ReplicaSet copies the patched template's labels onto each pod.
    let mut patched = deployment;
    json_patch::patch(&mut patched, &ops).unwrap();
    let pod_labels = patched["spec"]["template"]["metadata"]["labels"].clone();
    assert_eq!(pod_labels["tessera.io/queue-name"], "lq", "{ops:?}");
    assert_eq!(
        called("", "pods", "team", &pod_labels),
        ["pods.admission.tessera.io"],
        "the replica pods are gated"
    );
    assert_eq!(
        called("batch", "jobs", "team", &queue),
        ["jobs.admission.tessera.io"]
    );
}

#[test]
fn nothing_else_reaches_the_webhook() {
    let none: Vec<String> = Vec::new();
    let kueue = json!({"kueue.x-k8s.io/queue-name": "lq"});
    for (group, resource) in [
        ("", "pods"),
        ("batch", "jobs"),
        ("apps", "deployments"),
        ("apps", "statefulsets"),
    ] {
        assert_eq!(
            called(group, resource, "team", &json!({})),
            none,
            "{resource}: unlabelled"
        );
        assert_eq!(
            called(group, resource, "team", &kueue),
            none,
            "{resource}: Kueue's"
        );
        for ns in ["kube-system", "tessera-system"] {
            let queue = json!({"tessera.io/queue-name": "lq"});
            assert_eq!(
                called(group, resource, ns, &queue),
                none,
                "{resource} in {ns}"
            );
        }
    }
    assert_eq!(
        called(
            "apps",
            "daemonsets",
            "team",
            &json!({"tessera.io/queue-name": "lq"})
        ),
        none
    );
    for w in config()["webhooks"].as_array().unwrap() {
        assert_eq!(w["failurePolicy"], "Fail", "{}", w["name"]);
        assert_eq!(w["timeoutSeconds"], 5);
        assert!(
            w["clientConfig"]["caBundle"].is_null(),
            "set by the controller"
        );
    }
}
