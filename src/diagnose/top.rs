//! `tessera top`: per node, the GPUs allocated against those it has (and for split-mode
//! nodes the vGPU memory booked), the view an operator opens first. Pure: a snapshot in,
//! rows out; utilization readings are joined by the caller.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::devices::requests;
use super::Snapshot;
use crate::controller::extender::records::{node_state, pod_assignment};
use crate::quota::quantity::Quantity;

/// One node's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeRow {
    pub node: String,
    /// The GPU resource counted (`nvidia.com/gpu` or the first extended resource the node
    /// has), with allocatable and allocated (requests of the pods bound there that have
    /// not finished).
    pub resource: String,
    pub allocatable: i64,
    pub allocated: i64,
    /// Split-mode nodes: vGPU memory booked / total, MiB, from the pods' assignments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vgpu_memory_mib: Option<(u64, u64)>,
    /// Mean GPU utilization %, when a metrics source gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<f64>,
}

/// The rows of every node with GPUs, in the snapshot's order.
pub fn node_rows(snapshot: &Snapshot) -> Vec<NodeRow> {
    let mut allocated: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut booked: BTreeMap<String, u64> = BTreeMap::new();
    for p in &snapshot.pods {
        let finished = matches!(
            p["status"]["phase"].as_str(),
            Some("Succeeded") | Some("Failed")
        );
        let Some(node) = p["spec"]["nodeName"].as_str().filter(|_| !finished) else {
            continue;
        };
        if let Some(Ok(a)) = pod_assignment(p) {
            let mib: u64 = a
                .assignment
                .containers
                .iter()
                .flat_map(|c| &c.grants)
                .map(|g| g.memory_mib)
                .sum();
            *booked.entry(node.to_string()).or_default() += mib;
        }
        let Ok(pod) = serde_json::from_value::<Pod>(p.clone()) else {
            continue;
        };
        for (r, q) in requests(&pod) {
            *allocated.entry((node.to_string(), r)).or_default() += q;
        }
    }
    snapshot
        .nodes
        .iter()
        .filter_map(|n| {
            let name = n["metadata"]["name"].as_str()?.to_string();
            let alloc = n["status"]["allocatable"].as_object()?;
            let resource = if alloc.contains_key("nvidia.com/gpu") {
                "nvidia.com/gpu".to_string()
            } else {
                alloc.keys().find(|k| is_gpu_like(k))?.clone()
            };
            let allocatable = alloc[&resource]
                .as_str()
                .and_then(|q| Quantity::parse(q).ok())
                .map_or(0, |q| q.0 / 1000);
            let vgpu_memory_mib = node_state(n).and_then(|s| s.gpus.ok()).map(|gpus| {
                let total = gpus.iter().map(|g| g.memory_mib).sum();
                (booked.get(&name).copied().unwrap_or(0), total)
            });
            Some(NodeRow {
                allocated: allocated
                    .get(&(name.clone(), resource.clone()))
                    .map_or(0, |q| q / 1000),
                node: name,
                resource,
                allocatable,
                vgpu_memory_mib,
                utilization_percent: None,
            })
        })
        .collect()
}

fn is_gpu_like(resource: &str) -> bool {
    resource.starts_with("nvidia.com/") || resource.starts_with("amd.com/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn allocated_counts_bound_unfinished_pods_and_booked_vgpu_memory() {
        let node = |name: &str, ann: serde_json::Value| {
            json!({"metadata": {"name": name, "annotations": ann},
                   "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64"}}})
        };
        let record = json!([{"uuid": "G0", "model": "A100", "memoryMiB": 81920, "slots": 10,
                             "healthy": true}])
        .to_string();
        let pod = |name: &str, node: &str, gpus: &str, phase: &str| {
            json!({"metadata": {"name": name, "namespace": "t", "uid": name},
                   "spec": {"nodeName": node, "containers": [{"name": "c", "resources":
                       {"limits": {"nvidia.com/gpu": gpus}}}]},
                   "status": {"phase": phase}})
        };
        let mut vgpu = pod("v", "n2", "1", "Running");
        vgpu["metadata"]["annotations"] = json!({"tessera.io/vgpu-assignment": json!({
            "node": "n2", "containers": [{"name": "c", "devices":
                [{"uuid": "G0", "memoryMiB": 10240, "cores": 30}]}]}).to_string()});
        let s = Snapshot::new(
            vec![
                node("n1", json!({})),
                node(
                    "n2",
                    json!({"tessera.io/vgpu-devices": record, "tessera.io/vgpu-heartbeat": "2026-12-03T12:00:00Z"}),
                ),
                json!({"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}}),
            ],
            vec![
                pod("a", "n1", "3", "Running"),
                pod("b", "n1", "2", "Pending"),
                pod("done", "n1", "4", "Succeeded"),
                vgpu,
            ],
            "2026-12-03T12:00:00Z".parse().unwrap(),
        );
        let rows = node_rows(&s);
        assert_eq!(rows.len(), 2, "the CPU node has no GPU line");
        assert_eq!((rows[0].allocatable, rows[0].allocated), (8, 5));
        assert_eq!(rows[0].vgpu_memory_mib, None);
        assert_eq!(
            (rows[1].allocated, rows[1].vgpu_memory_mib),
            (1, Some((10240, 81920)))
        );
    }
}
