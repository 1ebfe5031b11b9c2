//! Steps 2 and 3 for a pod without a node: is there room for it anywhere (memory), and
//! is that room usable by it (placement)?

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use super::placement::ruled_out;
use super::{Cause, Finding, Settings, Snapshot};
use crate::controller::extender::records::{node_state, pod_assignment, pod_host};
use crate::controller::extender::state::Filtered;
use crate::controller::extender::{Books, BooksConfig};
use crate::quota::quantity::Quantity;
use crate::vgpu::request::{pod_request, MemoryRequest, RequestConfig, ResourceNames};

/// At most this many per-node lines of evidence.
const EVIDENCE_LINES: usize = 8;

/// The scheduler profile of vGPU pods (`daemonset/components/vgpu-scheduler`).
const VGPU_SCHEDULER: &str = "tessera-scheduler";

/// The findings of steps 2 and 3.
pub(super) fn capacity_and_placement(
    snapshot: &Snapshot,
    pod: &Pod,
    settings: &Settings,
    now: Timestamp,
) -> Vec<Finding> {
    if is_vgpu_pod(pod) {
        vgpu(snapshot, pod, settings, now)
    } else {
        devices(snapshot, pod)
    }
}

/// The pod's extended resources (`<domain>/<name>`, not `kubernetes.io`), each with its
/// effective count (the larger of the app containers' sum and any init container's).
pub(super) fn gpu_requests(pod: &Pod) -> Vec<(String, i64)> {
    requests(pod)
        .into_iter()
        .filter(|(r, _)| is_extended(r))
        .map(|(r, q)| (r, q / 1000))
        .collect()
}

fn is_extended(resource: &str) -> bool {
    resource
        .split_once('/')
        .is_some_and(|(domain, _)| !domain.ends_with("kubernetes.io"))
}

fn is_vgpu_pod(pod: &Pod) -> bool {
    let names = ResourceNames::new("nvidia.com");
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.scheduler_name.as_deref()) == Some(VGPU_SCHEDULER)
        || requests(pod)
            .keys()
            .any(|r| names.share_names().contains(&r.as_str()))
}

/// One container's requests in milli-units (its limits where a request is absent, as the
/// API server defaults them).
fn container_requests(c: &Container) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let Some(res) = c.resources.as_ref() else {
        return out;
    };
    for map in [res.limits.as_ref(), res.requests.as_ref()]
        .into_iter()
        .flatten()
    {
        for (k, v) in map {
            if let Ok(q) = Quantity::parse(&v.0) {
                out.insert(k.clone(), q.0);
            }
        }
    }
    out
}

/// The pod's effective requests, milli-units.
pub(super) fn requests(pod: &Pod) -> BTreeMap<String, i64> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in container_requests(c) {
            *out.entry(k).or_insert(0) += v;
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in container_requests(c) {
            let e = out.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    out
}

/// What is free on each node for the resources the pod asks, milli-units.
fn free_by_node<'a>(
    snapshot: &'a Snapshot,
    asks: &BTreeMap<String, i64>,
) -> Vec<(&'a Value, BTreeMap<String, i64>)> {
    let mut used: BTreeMap<&str, BTreeMap<String, i64>> = BTreeMap::new();
    for p in &snapshot.pods {
        let (Some(node), false) = (
            p["spec"]["nodeName"].as_str(),
            matches!(
                p["status"]["phase"].as_str(),
                Some("Succeeded") | Some("Failed")
            ),
        ) else {
            continue;
        };
        let Ok(pod) = serde_json::from_value::<Pod>(p.clone()) else {
            continue;
        };
        let held = used.entry(node).or_default();
        for (k, v) in requests(&pod) {
            if asks.contains_key(&k) {
                *held.entry(k).or_insert(0) += v;
            }
        }
    }
    snapshot
        .nodes
        .iter()
        // A split-mode node's nvidia.com/gpu are vGPU slots: only vGPU pods (placed by
        // the tessera-scheduler) get GPUs there.
        .filter(|n| node_state(n).is_none())
        .map(|n| {
            let name = n["metadata"]["name"].as_str().unwrap_or("");
            let free = asks
                .keys()
                .map(|r| {
                    let have = n["status"]["allocatable"][r]
                        .as_str()
                        .and_then(|q| Quantity::parse(q).ok())
                        .map_or(0, |q| q.0);
                    let taken = used.get(name).and_then(|u| u.get(r)).copied().unwrap_or(0);
                    (r.clone(), have - taken)
                })
                .collect();
            (n, free)
        })
        .collect()
}

fn show(resource: &str, milli: i64) -> String {
    match resource {
        "cpu" => format!("{}m cpu", milli),
        "memory" => format!("{} MiB memory", milli / 1000 / (1 << 20)),
        r => format!("{} {r}", milli / 1000),
    }
}

/// Whole devices (and cpu/memory): free per node from allocatable minus the requests of
/// the pods bound there.
fn devices(snapshot: &Snapshot, pod: &Pod) -> Vec<Finding> {
    let asks = requests(pod);
    if asks.is_empty() {
        return vec![Finding::ruled_out(
            Cause::Memory,
            "the pod asks for no resources; nothing of Tessera's holds it",
        )];
    }
    let free = free_by_node(snapshot, &asks);
    let split = snapshot.nodes.len() - free.len();
    let note = (split > 0).then(|| {
        format!(
            "{split} node(s) in vGPU split mode left out: their nvidia.com/gpu are vGPU \
             slots, for pods placed by the tessera-scheduler"
        )
    });
    let fitting: Vec<&Value> = free
        .iter()
        .filter(|(_, f)| {
            asks.iter()
                .all(|(r, q)| f.get(r).copied().unwrap_or(0) >= *q)
        })
        .map(|(n, _)| *n)
        .collect();
    if let Some(f) = never_fits(snapshot, &asks) {
        return vec![f];
    }
    if fitting.is_empty() {
        let mut findings = no_room(&asks, &free);
        if let Some(f) = findings.iter_mut().find(|f| f.explains) {
            f.evidence.extend(note);
        }
        return findings;
    }
    let mut memory = Finding::ruled_out(
        Cause::Memory,
        format!(
            "{} node(s) have room for {}: {}",
            fitting.len(),
            asks.iter()
                .map(|(r, q)| show(r, *q))
                .collect::<Vec<_>>()
                .join(", "),
            names(&fitting)
        ),
    );
    memory.evidence.extend(note);
    vec![memory, placement(&fitting, pod)]
}

/// A request larger than any (non-split) node's allocatable: never placeable.
fn never_fits(snapshot: &Snapshot, asks: &BTreeMap<String, i64>) -> Option<Finding> {
    for (r, q) in asks {
        let biggest = snapshot
            .nodes
            .iter()
            .filter(|n| node_state(n).is_none())
            .filter_map(|n| n["status"]["allocatable"][r].as_str())
            .filter_map(|q| Quantity::parse(q).ok())
            .map(|q| q.0)
            .max()
            .unwrap_or(0);
        if biggest < *q {
            let mut f = Finding::explains(
                Cause::Memory,
                format!(
                    "memory: no node has {} at all (the largest has {}): the pod cannot \
                     be placed as written",
                    show(r, *q),
                    show(r, biggest)
                ),
            );
            f.fix = Some("split the work over more pods, or add larger nodes".into());
            return Some(f);
        }
    }
    None
}

/// No node has room: short in the cluster (memory), or fragmented (placement).
fn no_room(asks: &BTreeMap<String, i64>, free: &[(&Value, BTreeMap<String, i64>)]) -> Vec<Finding> {
    let mut short = Vec::new();
    let mut scattered = Vec::new();
    for (r, q) in asks {
        let total: i64 = free.iter().map(|(_, f)| f[r].max(0)).sum();
        // The first node (in list order) with the most free.
        let largest = free
            .iter()
            .rev()
            .max_by_key(|(_, f)| f[r])
            .map(|(n, f)| (n["metadata"]["name"].as_str().unwrap_or("?"), f[r].max(0)));
        let largest = largest.map_or("no node has any".into(), |(n, l)| {
            format!("largest free {} on {n}", show(r, l))
        });
        if total < *q {
            short.push(format!(
                "the pod asks {}, the cluster has {} free ({largest})",
                show(r, *q),
                show(r, total)
            ));
        } else {
            scattered.push(format!(
                "{} free in total, but no node has {} ({largest})",
                show(r, total),
                show(r, *q)
            ));
        }
    }
    if !short.is_empty() {
        let mut f = Finding::explains(Cause::Memory, format!("memory: {}", short.join("; ")));
        f.evidence = scattered;
        f.fix = Some(
            "free capacity (finished or lower-priority work), add nodes, or ask for less".into(),
        );
        return vec![f];
    }
    let mut f = Finding::explains(
        Cause::Placement,
        format!("placement: {}", scattered.join("; ")),
    );
    f.fix = Some(
        "the capacity is fragmented: a smaller request per pod, or a layout that packs \
         (`tessera layout`), or Tessera's placement policy for new pods"
            .into(),
    );
    vec![
        Finding::ruled_out(Cause::Memory, "the cluster has the capacity in total"),
        f,
    ]
}

/// Step 3 over the nodes that have room.
fn placement(fitting: &[&Value], pod: &Pod) -> Finding {
    let excluded: Vec<String> = fitting.iter().filter_map(|n| ruled_out(n, pod)).collect();
    if excluded.len() == fitting.len() {
        let mut f = Finding::explains(
            Cause::Placement,
            format!(
                "placement: every node with room is ruled out for this pod ({})",
                excluded.len()
            ),
        );
        f.evidence = excluded.into_iter().take(EVIDENCE_LINES).collect();
        f.fix =
            Some("add the toleration, or relax the node selector / affinity, or uncordon".into());
        return f;
    }
    let open: Vec<&Value> = fitting
        .iter()
        .copied()
        .filter(|n| ruled_out(n, pod).is_none())
        .collect();
    let mut f = Finding::ruled_out(
        Cause::Placement,
        format!(
            "no cause found: {} may take it now ({}); it should be placed at the \
             scheduler's next attempt",
            names(&open),
            if open.len() == 1 { "fits" } else { "they fit" }
        ),
    );
    f.evidence = excluded.into_iter().take(EVIDENCE_LINES).collect();
    f
}

fn names(nodes: &[&Value]) -> String {
    let mut list: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .take(EVIDENCE_LINES)
        .collect();
    if nodes.len() > EVIDENCE_LINES {
        list.push("…");
    }
    list.join(", ")
}

/// vGPU pods: the scheduler extender's own books and fitting over the snapshot.
fn vgpu(snapshot: &Snapshot, pod: &Pod, settings: &Settings, now: Timestamp) -> Vec<Finding> {
    let books = Books::new(BooksConfig {
        heartbeat_window: settings.heartbeat_window,
        ..BooksConfig::default()
    });
    let states: Vec<_> = snapshot.nodes.iter().filter_map(node_state).collect();
    if states.is_empty() {
        let mut f = Finding::explains(
            Cause::Memory,
            "memory: no node publishes vGPU devices (annotation tessera.io/vgpu-devices): \
             no node has GPUs in vGPU split mode",
        );
        f.fix = Some("give some nodes a layout with `vgpu: { split: N }` (docs/install.md)".into());
        return vec![f];
    }
    let assignments = snapshot
        .pods
        .iter()
        .filter_map(pod_assignment)
        .filter_map(Result::ok)
        .collect();
    let present = snapshot.pods.iter().filter_map(pod_host).collect();
    let node_names: Vec<String> = states.iter().map(|s| s.name.clone()).collect();
    books.sync(states, assignments, &present, now);
    let filtered = books.filter(pod, &node_names, now);
    if filtered.fits.is_empty() {
        return vgpu_no_room(&books, &node_names, pod, &filtered);
    }
    let fitting: Vec<&Value> = filtered
        .fits
        .iter()
        .filter_map(|name| {
            snapshot
                .nodes
                .iter()
                .find(|n| n["metadata"]["name"] == name.as_str())
        })
        .collect();
    let memory = Finding::ruled_out(
        Cause::Memory,
        format!(
            "its vGPUs fit on {} node(s): {}",
            fitting.len(),
            names(&fitting)
        ),
    );
    vec![memory, placement(&fitting, pod)]
}

fn vgpu_no_room(
    books: &Books,
    node_names: &[String],
    pod: &Pod,
    filtered: &Filtered,
) -> Vec<Finding> {
    let evidence: Vec<String> = filtered
        .failed
        .values()
        .chain(filtered.unresolvable.values())
        .take(EVIDENCE_LINES)
        .cloned()
        .collect();
    let summary = filtered
        .summary
        .clone()
        .unwrap_or_else(|| "no node fits its vGPUs".into());
    // Fragmented: the memory one vGPU needs is free in total, but not on one GPU.
    let need = pod_request(pod, &RequestConfig::default())
        .ok()
        .flatten()
        .and_then(|r| {
            r.containers
                .iter()
                .filter_map(|c| match c.memory {
                    MemoryRequest::Mib(m) => Some(m),
                    MemoryRequest::Percent(_) => None,
                })
                .max()
        });
    // (memory, free) of every healthy GPU.
    let gpus: Vec<(u64, u64)> = node_names
        .iter()
        .filter_map(|n| books.node_books(n))
        .flat_map(|b| {
            b.gpus()
                .filter(|(g, _)| g.healthy)
                .map(|(g, u)| (g.memory_mib, g.memory_mib.saturating_sub(u.memory_mib)))
                .collect::<Vec<_>>()
        })
        .collect();
    let free: Vec<u64> = gpus.iter().map(|(_, f)| *f).collect();
    let total: u64 = free.iter().sum();
    let largest = free.iter().copied().max().unwrap_or(0);
    let biggest_gpu = gpus.iter().map(|(m, _)| *m).max().unwrap_or(0);
    if let Some(need) = need.filter(|n| total >= *n && largest < *n && biggest_gpu >= *n) {
        let mut f = Finding::explains(
            Cause::Placement,
            format!(
                "placement: {} GPUs have {total} MiB free in total, but no single GPU has \
                 {need} MiB (largest free {largest} MiB)",
                free.iter().filter(|f| **f > 0).count()
            ),
        );
        f.evidence = evidence;
        f.fix = Some(
            "the GPUs' memory is fragmented: hami.io/gpu-scheduler-policy: binpack packs \
             new vGPUs; a smaller gpumem fits now"
                .into(),
        );
        return vec![
            Finding::ruled_out(Cause::Memory, "the vGPU memory exists in total"),
            f,
        ];
    }
    let mut f = Finding::explains(Cause::Memory, format!("memory: {summary}"));
    f.evidence = evidence;
    f.fix = Some("free vGPUs, add split-mode GPUs, or ask for less gpumem/gpucores".into());
    vec![f]
}
