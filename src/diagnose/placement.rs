//! Whether a node is ruled out for a pod by what kube-scheduler checks besides
//! resources: cordoned, a taint the pod does not tolerate, its node selector, its
//! required node affinity. A rule this module cannot evaluate never rules a node out.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, Toleration};
use serde_json::Value;

/// Why `node` is ruled out for `pod`, if it is.
pub fn ruled_out(node: &Value, pod: &Pod) -> Option<String> {
    let name = node["metadata"]["name"].as_str().unwrap_or("?");
    if node["spec"]["unschedulable"].as_bool() == Some(true) {
        return Some(format!("{name}: cordoned (spec.unschedulable)"));
    }
    let spec = pod.spec.as_ref()?;
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    for taint in node["spec"]["taints"].as_array().into_iter().flatten() {
        let effect = taint["effect"].as_str().unwrap_or("");
        if effect == "PreferNoSchedule" {
            continue;
        }
        if !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Some(format!(
                "{name}: taint {}={}:{effect} not tolerated",
                taint["key"].as_str().unwrap_or(""),
                taint["value"].as_str().unwrap_or("")
            ));
        }
    }
    let labels = &node["metadata"]["labels"];
    for (k, v) in spec.node_selector.iter().flatten() {
        if labels[k].as_str() != Some(v.as_str()) {
            return Some(format!("{name}: node selector {k}={v} does not match"));
        }
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    if !terms.is_empty()
        && !terms.iter().any(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .all(|r| matches(r, labels) != Some(false))
        })
    {
        return Some(format!("{name}: required node affinity does not match"));
    }
    None
}

fn tolerates(t: &Toleration, taint: &Value) -> bool {
    let key = taint["key"].as_str().unwrap_or("");
    let effect = taint["effect"].as_str().unwrap_or("");
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == effect);
    let op = t.operator.as_deref().unwrap_or("Equal");
    let key_ok = match t.key.as_deref() {
        None | Some("") => op == "Exists",
        Some(k) => k == key,
    };
    let value_ok =
        op == "Exists" || t.value.as_deref().unwrap_or("") == taint["value"].as_str().unwrap_or("");
    effect_ok && key_ok && value_ok
}

/// `None` when the operator is not one this module knows.
fn matches(r: &NodeSelectorRequirement, labels: &Value) -> Option<bool> {
    let value = labels[&r.key].as_str();
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    Some(match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => value.and_then(number)? > values.first().and_then(|s| number(s))?,
        "Lt" => value.and_then(number)? < values.first().and_then(|s| number(s))?,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn cordon_taints_selectors_and_affinity_rule_nodes_out() {
        let node = json!({"metadata": {"name": "n1", "labels": {"pool": "infer", "gen": "9"}},
            "spec": {"taints": [{"key": "gpu", "value": "reserved", "effect": "NoSchedule"},
                                {"key": "soft", "effect": "PreferNoSchedule"}]}});
        let base = json!({"containers": [{"name": "c"}]});
        assert_eq!(
            ruled_out(&node, &pod(base.clone())).unwrap(),
            "n1: taint gpu=reserved:NoSchedule not tolerated"
        );
        let mut tolerant = base.clone();
        tolerant["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
        assert_eq!(ruled_out(&node, &pod(tolerant.clone())), None);
        let mut everything = base.clone();
        everything["tolerations"] = json!([{"operator": "Exists"}]);
        assert_eq!(ruled_out(&node, &pod(everything)), None);
        let mut wrong_value = base.clone();
        wrong_value["tolerations"] = json!([{"key": "gpu", "value": "other"}]);
        assert!(ruled_out(&node, &pod(wrong_value)).is_some());

        let mut selector = tolerant.clone();
        selector["nodeSelector"] = json!({"pool": "train"});
        assert_eq!(
            ruled_out(&node, &pod(selector)).unwrap(),
            "n1: node selector pool=train does not match"
        );
        let affinity = |op: &str, values: Value| {
            let mut s = tolerant.clone();
            s["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gen", "operator": op, "values": values}]}]}}});
            ruled_out(&node, &pod(s))
        };
        assert_eq!(affinity("In", json!(["9", "10"])), None);
        assert!(affinity("NotIn", json!(["9"])).is_some());
        assert_eq!(affinity("Gt", json!(["8"])), None);
        assert!(affinity("Lt", json!(["8"])).is_some());
        assert_eq!(
            affinity("Sideways", json!([])),
            None,
            "unknown: not ruled out"
        );

        let cordoned = json!({"metadata": {"name": "n2"}, "spec": {"unschedulable": true}});
        assert_eq!(
            ruled_out(&cordoned, &pod(base)).unwrap(),
            "n2: cordoned (spec.unschedulable)"
        );
    }
}
