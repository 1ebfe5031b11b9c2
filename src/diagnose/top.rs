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

/// One series of an instant query: its labels and value.
pub type Series = (BTreeMap<String, String>, f64);

/// The agents' gauges `tessera top --gpus` and `--containers` read (Prometheus names).
pub const GPU_GAUGES: [&str; 3] = [
    "tessera_gpu_memory_used_bytes",
    "tessera_gpu_memory_total_bytes",
    "tessera_gpu_utilization_ratio",
];
pub const CONTAINER_GAUGES: [&str; 4] = [
    "tessera_container_gpu_allocated_share",
    "tessera_container_gpu_busy_ratio",
    "tessera_container_gpu_memory_used_bytes",
    "tessera_container_gpu_memory_limit_bytes",
];

/// One GPU's line of `tessera top --gpus`: what the driver says it uses, and what its
/// containers were given. A gauge with no series is `None` (shown as "–", never 0).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuUsageRow {
    pub node: String,
    pub gpu: String,
    pub model: String,
    pub mode: String,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub utilization_ratio: Option<f64>,
    /// Sum of the shares the containers on it hold (1 = the whole GPU given out).
    pub allocated_share: f64,
    pub containers: usize,
}

/// One container's line of `tessera top --containers`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ContainerUsageRow {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: String,
    pub gpu: String,
    pub mode: String,
    pub allocated_share: f64,
    pub busy_ratio: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_limit_bytes: Option<f64>,
}

fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map_or("", String::as_str)
}

/// `(node, gpu)` → value, of one gauge's series.
fn by_gpu(series: &[Series]) -> BTreeMap<(String, String), f64> {
    series
        .iter()
        .map(|(l, v)| ((label(l, "node").into(), label(l, "gpu").into()), *v))
        .collect()
}

/// The GPU lines, ordered by node and GPU, from the series of [`GPU_GAUGES`] (in that
/// order) and of `tessera_container_gpu_allocated_share`.
pub fn gpu_usage_rows(gauges: [&[Series]; 3], shares: &[Series]) -> Vec<GpuUsageRow> {
    let [used, total, util] = gauges.map(by_gpu);
    let mut rows: BTreeMap<(String, String), GpuUsageRow> = BTreeMap::new();
    for (l, _) in gauges.iter().flat_map(|g| g.iter()) {
        let key = (label(l, "node").to_string(), label(l, "gpu").to_string());
        rows.entry(key.clone()).or_insert_with(|| GpuUsageRow {
            node: key.0.clone(),
            gpu: key.1.clone(),
            model: label(l, "model").into(),
            mode: label(l, "mode").into(),
            memory_used_bytes: used.get(&key).copied(),
            memory_total_bytes: total.get(&key).copied(),
            utilization_ratio: util.get(&key).copied().filter(|v| v.is_finite()),
            allocated_share: 0.0,
            containers: 0,
        });
    }
    for (l, share) in shares {
        let key = (label(l, "node").to_string(), label(l, "gpu").to_string());
        if let Some(row) = rows.get_mut(&key) {
            row.allocated_share += share;
            row.containers += 1;
        }
    }
    rows.into_values().collect()
}

/// The container lines, ordered by namespace, pod, container and GPU, from the series
/// of [`CONTAINER_GAUGES`] (in that order); a container holding two GPUs has two lines.
pub fn container_usage_rows(gauges: [&[Series]; 4]) -> Vec<ContainerUsageRow> {
    type Key = (String, String, String, String, String);
    let key = |l: &BTreeMap<String, String>| -> Key {
        let k = |name| label(l, name).to_string();
        (
            k("namespace"),
            k("pod"),
            k("container"),
            k("node"),
            k("gpu"),
        )
    };
    let index = |series: &[Series]| -> BTreeMap<Key, f64> {
        series.iter().map(|(l, v)| (key(l), *v)).collect()
    };
    let [share, busy, used, limit] = gauges;
    let (busy, used, limit) = (index(busy), index(used), index(limit));
    let mut rows: BTreeMap<Key, ContainerUsageRow> = BTreeMap::new();
    for (l, v) in share {
        let k = key(l);
        rows.insert(
            k.clone(),
            ContainerUsageRow {
                namespace: k.0.clone(),
                pod: k.1.clone(),
                container: k.2.clone(),
                node: k.3.clone(),
                gpu: k.4.clone(),
                mode: label(l, "mode").into(),
                allocated_share: *v,
                busy_ratio: busy.get(&k).copied().filter(|v| v.is_finite()),
                memory_used_bytes: used.get(&k).copied(),
                memory_limit_bytes: limit.get(&k).copied(),
            },
        );
    }
    rows.into_values().collect()
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

    fn series(pairs: &[(&str, &str)], value: f64) -> Series {
        (
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        )
    }

    #[test]
    fn gpu_lines_join_the_gauges_and_sum_their_containers_shares() {
        let g = |gpu: &str, v: f64| {
            series(
                &[
                    ("node", "n1"),
                    ("gpu", gpu),
                    ("model", "H100"),
                    ("mode", "vgpu"),
                ],
                v,
            )
        };
        let used = [g("GPU-0", 10.0), g("GPU-1", 0.0)];
        let total = [g("GPU-0", 80.0), g("GPU-1", 80.0)];
        let util = [g("GPU-0", 0.5)];
        let c = |pod: &str, gpu: &str, v: f64| {
            series(
                &[
                    ("node", "n1"),
                    ("gpu", gpu),
                    ("namespace", "t"),
                    ("pod", pod),
                    ("container", "c"),
                    ("mode", "vgpu"),
                ],
                v,
            )
        };
        let shares = [
            c("a", "GPU-0", 0.25),
            c("b", "GPU-0", 0.5),
            c("x", "GPU-9", 1.0),
        ];
        let rows = gpu_usage_rows([&used, &total, &util], &shares);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].allocated_share, rows[0].containers), (0.75, 2));
        assert_eq!(rows[0].utilization_ratio, Some(0.5));
        assert_eq!(rows[1].utilization_ratio, None, "no series: unknown, not 0");
        assert_eq!(rows[1].memory_used_bytes, Some(0.0));
        let busy = [c("a", "GPU-0", 0.9)];
        let crow = container_usage_rows([&shares, &busy, &[], &[]]);
        assert_eq!(crow.len(), 3);
        assert_eq!((crow[0].pod.as_str(), crow[0].busy_ratio), ("a", Some(0.9)));
        assert_eq!(crow[1].busy_ratio, None);
        assert_eq!(crow[0].memory_limit_bytes, None);
    }
}
