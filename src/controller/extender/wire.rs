//! The kube-scheduler extender v1 wire format (`k8s.io/kube-scheduler/extender/v1`),
//! field for field with the Go structs' JSON tags. The extender is configured with
//! `nodeCacheCapable: true`, so the scheduler sends node names (`nodenames`) and reads
//! names back; a full `nodes` list is still understood, and answered in kind.

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The highest score a prioritize answer may give (`MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the body of `POST /filter` and `POST /prioritize`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    pub pod: Pod,
    /// Candidate nodes as a `v1.NodeList` (`nodeCacheCapable: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
}

/// A `v1.NodeList`, kept as JSON: only the items' names are read, and the items that
/// pass are sent back unchanged.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
}

impl ExtenderArgs {
    /// The candidate nodes' names, from `nodenames` or else from `nodes`.
    pub fn node_names(&self) -> Vec<String> {
        if let Some(names) = &self.nodenames {
            return names.clone();
        }
        self.nodes
            .iter()
            .flat_map(|l| &l.items)
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }
}

/// `FailedNodesMap`: node name → why it was filtered out.
pub type FailedNodesMap = BTreeMap<String, String>;

/// `ExtenderFilterResult`: the answer to `POST /filter`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ExtenderFilterResult {
    /// The nodes that pass, as a list (when the scheduler sent `nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<serde_json::Value>,
    /// The nodes that pass, by name (when the scheduler sent `nodenames`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
    /// Nodes filtered out; preemption may make room.
    #[serde(
        default,
        rename = "failedNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes filtered out that preemption cannot help.
    #[serde(
        default,
        rename = "failedAndUnresolvableNodes",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// The extender failed (the scheduler counts the pod unschedulable this cycle).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl ExtenderFilterResult {
    /// The metrics' result of this answer: `error` (the extender failed), `fit` (some
    /// node passes) or `unschedulable` (none does).
    pub fn outcome(&self) -> &'static str {
        let passed = self.nodenames.as_ref().map_or(0, Vec::len)
            + self
                .nodes
                .as_ref()
                .and_then(|n| n["items"].as_array())
                .map_or(0, Vec::len);
        if !self.error.is_empty() {
            "error"
        } else if passed > 0 {
            "fit"
        } else {
            "unschedulable"
        }
    }
}

/// `HostPriority`: one entry of the answer to `POST /prioritize` (`HostPriorityList`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct HostPriority {
    pub host: String,
    /// 0..=[`MAX_EXTENDER_PRIORITY`].
    pub score: i64,
}

/// `ExtenderBindingArgs`: the body of `POST /bind`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "podName")]
    pub pod_name: String,
    #[serde(rename = "podNamespace")]
    pub pod_namespace: String,
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    pub node: String,
}

/// `ExtenderBindingResult`: the answer to `POST /bind`; an empty error means bound.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct ExtenderBindingResult {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_names_are_the_go_json_tags() {
        let result = ExtenderFilterResult {
            nodenames: Some(vec!["a".into()]),
            failed_nodes: [("b".to_string(), "full".to_string())].into(),
            failed_and_unresolvable_nodes: [("c".to_string(), "stale".to_string())].into(),
            error: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&result).expect("encodes"),
            json!({"nodenames": ["a"], "failedNodes": {"b": "full"},
                   "failedAndUnresolvableNodes": {"c": "stale"}, "error": "x"})
        );
        let bind: ExtenderBindingArgs = serde_json::from_value(json!({
            "podName": "p", "podNamespace": "ns", "podUID": "u", "node": "n"}))
        .expect("decodes");
        assert_eq!((bind.pod_name.as_str(), bind.pod_uid.as_str()), ("p", "u"));
        assert_eq!(
            serde_json::to_value(HostPriority {
                host: "n".into(),
                score: 3
            })
            .expect("encodes"),
            json!({"host": "n", "score": 3})
        );
        assert_eq!(
            serde_json::to_value(ExtenderBindingResult::default()).expect("encodes"),
            json!({})
        );
    }

    #[test]
    fn node_names_come_from_nodenames_or_the_node_list() {
        let by_name: ExtenderArgs =
            serde_json::from_value(json!({"pod": {}, "nodenames": ["a", "b"]})).expect("args");
        assert_eq!(by_name.node_names(), ["a", "b"]);
        let by_list: ExtenderArgs = serde_json::from_value(
            json!({"pod": {}, "nodes": {"items": [{"metadata": {"name": "c"}}]}}),
        )
        .expect("args");
        assert_eq!(by_list.node_names(), ["c"]);
    }
}
