//! `tessera diagnose`: why a pod waits next to idle GPUs, or why its GPUs sit idle.
//!
//! Pure: a [`Snapshot`] of the cluster's Nodes and Pods (raw API objects, as a LIST
//! returns them) and optional usage readings in, a [`Diagnosis`] out. The four causes
//! are walked in order and the first that explains the pod is the verdict:
//!
//! 1. **quota** — the Tessera controller holds the pod back (its admission gate), with
//!    the pending reason and message the controller recorded on the pod;
//! 2. **memory** — no GPU has room: for vGPU pods the scheduler extender's own books and
//!    fitting (`crate::vgpu`) over the nodes' records and the pods' assignments, so the
//!    reason is the one the extender gives; for whole devices, no node has enough free;
//! 3. **placement** — the capacity exists but not in one place (fragmented), or the
//!    nodes that have it are ruled out (cordoned, a taint not tolerated, the node
//!    selector or required node affinity);
//! 4. **app** — the pod runs and holds GPUs, but its measured utilization is low.
//!
//! Each step records what it checked, so "no cause found" still shows the evidence.

pub mod snapshot;
pub mod top;

mod devices;
mod placement;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

pub use snapshot::{Snapshot, SnapshotError, SNAPSHOT_FORMAT};

/// A cause of waiting (or idling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    Quota,
    Memory,
    Placement,
    App,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Quota => "quota",
            Cause::Memory => "memory",
            Cause::Placement => "placement",
            Cause::App => "app",
        }
    }
}

/// What one step found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub cause: Cause,
    /// Whether this step explains the pod.
    pub explains: bool,
    /// One line: the verdict or what was ruled out.
    pub summary: String,
    /// Supporting facts (per node, per GPU, readings).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// What would fix it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ruled_out(cause: Cause, summary: impl Into<String>) -> Finding {
        Finding {
            cause,
            explains: false,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: None,
        }
    }

    fn explains(cause: Cause, summary: impl Into<String>) -> Finding {
        Finding {
            cause,
            explains: true,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: None,
        }
    }
}

/// The diagnosis of one pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    pub namespace: String,
    pub pod: String,
    pub phase: String,
    /// The steps taken, in order; the last one that explains the pod is the verdict.
    pub findings: Vec<Finding>,
}

impl Diagnosis {
    /// The cause found, if any.
    pub fn verdict(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.explains)
    }
}

/// A pod's GPU usage, read from a metrics source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Usage {
    /// Mean utilization of the pod's GPUs over the window, 0..=100.
    pub utilization_percent: f64,
    /// The window the mean is over, seconds.
    pub window_seconds: u64,
}

/// Settings of a diagnosis.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Below this mean utilization a running pod's GPUs count as idle.
    pub idle_below_percent: f64,
    /// The extender's heartbeat window (a node with an older vGPU heartbeat is out).
    pub heartbeat_window: std::time::Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            idle_below_percent: 10.0,
            heartbeat_window: crate::controller::extender::BooksConfig::default().heartbeat_window,
        }
    }
}

/// Why a pod cannot be diagnosed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiagnoseError {
    #[error("pod {namespace}/{name} does not exist")]
    NotFound { namespace: String, name: String },
    #[error("pod {namespace}/{name} cannot be read: {reason}")]
    Unreadable {
        namespace: String,
        name: String,
        reason: String,
    },
}

/// Diagnose the pod `namespace/name` in `snapshot` at `now`; `usage` is its GPU usage if
/// a metrics source gave one.
pub fn diagnose_pod(
    snapshot: &Snapshot,
    namespace: &str,
    name: &str,
    usage: Option<&Usage>,
    settings: &Settings,
    now: Timestamp,
) -> Result<Diagnosis, DiagnoseError> {
    let raw = snapshot
        .pods
        .iter()
        .find(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)
        .ok_or_else(|| DiagnoseError::NotFound {
            namespace: namespace.into(),
            name: name.into(),
        })?;
    let pod: Pod = serde_json::from_value(raw.clone()).map_err(|e| DiagnoseError::Unreadable {
        namespace: namespace.into(),
        name: name.into(),
        reason: e.to_string(),
    })?;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let mut findings = Vec::new();
    let running = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some();
    if running {
        findings.push(app(&pod, &phase, usage, settings));
    } else {
        findings.push(quota(&pod, &snapshot.workloads));
        if !findings[0].explains {
            findings.extend(devices::capacity_and_placement(
                snapshot, &pod, settings, now,
            ));
        }
    }
    Ok(Diagnosis {
        namespace: namespace.into(),
        pod: name.into(),
        phase,
        findings,
    })
}

/// Step 1: the Tessera controller's admission gate and the reason it recorded (on the
/// pod; its place in the queue on its `Workload` record, one of `workloads`).
fn quota(pod: &Pod, workloads: &[Value]) -> Finding {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| {
            g.iter()
                .any(|g| g.name == crate::controller::ADMISSION_GATE)
        });
    if !gated {
        return Finding::ruled_out(
            Cause::Quota,
            "admitted by its queue (no tessera.io/admission gate)",
        );
    }
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == crate::controller::CONDITION_TYPE)
        });
    let queue = crate::quota::objects::QUEUE_LABELS
        .iter()
        .find_map(|k| pod.metadata.labels.as_ref().and_then(|l| l.get(*k)))
        .cloned();
    let mut f = match condition {
        Some(c) => Finding::explains(
            Cause::Quota,
            format!(
                "quota: {}: {}{}",
                c.reason.as_deref().unwrap_or("Pending"),
                c.message.as_deref().unwrap_or("(no message)"),
                place_of(pod, workloads)
                    .map(|(record, place)| format!(
                        " (position {place} in its ClusterQueue; Workload {record})"
                    ))
                    .unwrap_or_default()
            ),
        ),
        None => Finding::explains(
            Cause::Quota,
            "quota: held by the Tessera admission gate; the controller has not recorded \
             a reason yet (is `tessera controller` running?)",
        ),
    };
    f.evidence.push(match queue {
        Some(q) => format!("local queue {q}"),
        None => "no queue label: the controller admits it to the namespace's default queue, \
                 if there is one"
            .into(),
    });
    f.fix = Some(
        "see the queue's usage and borrowing with `kubectl get clusterqueues`; \
         `tessera plan` replays what a quota change would do"
            .into(),
    );
    f
}

/// The name of the `Workload` record owned by `pod` and the place in its ClusterQueue it
/// shows, when it shows one.
fn place_of<'a>(pod: &Pod, workloads: &'a [Value]) -> Option<(&'a str, &'a str)> {
    let namespace = pod.metadata.namespace.as_deref()?;
    let name = pod.metadata.name.as_deref()?;
    workloads.iter().find_map(|w| {
        let owned = w["metadata"]["namespace"] == namespace
            && w["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o["kind"] == "Pod" && o["name"] == name));
        let place = w["status"]["positionInClusterQueue"].as_str()?;
        owned.then_some((w["metadata"]["name"].as_str()?, place))
    })
}

/// Step 4, for a pod that holds its node: are its GPUs busy?
fn app(pod: &Pod, phase: &str, usage: Option<&Usage>, settings: &Settings) -> Finding {
    let gpus = devices::gpu_requests(pod);
    if gpus.is_empty() {
        return Finding::ruled_out(
            Cause::App,
            format!("the pod is {phase} on its node and holds no GPUs"),
        );
    }
    let held = gpus
        .iter()
        .map(|(r, n)| format!("{n} {r}"))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(u) = usage else {
        let mut f = Finding::ruled_out(
            Cause::App,
            format!(
                "the pod is {phase} and holds {held}; no utilization reading (give \
                 --prometheus to check whether the GPUs are used)"
            ),
        );
        f.evidence.push("nothing waits: the pod is placed".into());
        return f;
    };
    let window = if u.window_seconds >= 3600 {
        format!("{:.1} h", u.window_seconds as f64 / 3600.0)
    } else {
        format!("{} min", u.window_seconds.div_ceil(60))
    };
    if u.utilization_percent < settings.idle_below_percent {
        let mut f = Finding::explains(
            Cause::App,
            format!(
                "app: allocated {held}, used {:.0} % over the last {window}: the job \
                 looks input-bound or idle",
                u.utilization_percent
            ),
        );
        f.fix = Some(
            "profile the input pipeline (data loading, CPU, network); a smaller share \
             (nvidia.com/gpucores, a MIG profile) frees the rest for others"
                .into(),
        );
        f
    } else {
        Finding::ruled_out(
            Cause::App,
            format!(
                "the pod is {phase}, holds {held} and uses them ({:.0} % over the last \
                 {window})",
                u.utilization_percent
            ),
        )
    }
}

/// The namespace/name of every pod in `snapshot` that waits for a node (pending, not
/// finished), optionally only in `namespace` or in local queue `queue`.
pub fn waiting_pods(
    snapshot: &Snapshot,
    namespace: Option<&str>,
    queue: Option<&str>,
) -> Vec<(String, String)> {
    let label = |p: &Value| {
        crate::quota::objects::QUEUE_LABELS
            .iter()
            .find_map(|k| p["metadata"]["labels"][*k].as_str())
            .map(str::to_string)
    };
    snapshot
        .pods
        .iter()
        .filter(|p| p["spec"]["nodeName"].as_str().is_none())
        .filter(|p| {
            !matches!(
                p["status"]["phase"].as_str(),
                Some("Succeeded") | Some("Failed")
            )
        })
        .filter(|p| namespace.is_none_or(|n| p["metadata"]["namespace"] == n))
        .filter(|p| queue.is_none_or(|q| label(p).as_deref() == Some(q)))
        .filter_map(|p| {
            Some((
                p["metadata"]["namespace"].as_str()?.to_string(),
                p["metadata"]["name"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Count of each cause over many diagnoses (for `--namespace` / `--queue`).
pub fn tally(diagnoses: &[Diagnosis]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for d in diagnoses {
        let key = d.verdict().map_or("none", |f| f.cause.as_str());
        *out.entry(key).or_insert(0) += 1;
    }
    out
}
