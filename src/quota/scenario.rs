//! `tessera plan` scenarios: a multi-document YAML file of queue objects and workloads,
//! applied in file order to an [`Engine`], with scheduling run to a fixed point after
//! every object and timers (runtimes, timeouts, backoff) fired in between.
//!
//! Workloads come as Kueue `Workload`s, batch `Job`s, `Pod`s (pod groups via
//! `kueue.x-k8s.io/pod-group-name` + `pod-group-total-count`), or `Deployment`s /
//! `StatefulSet`s (one workload per replica; re-applying with fewer replicas releases
//! their quota). `metadata.creationTimestamp` is an offset from the scenario start
//! (`90s`, `5m`) at which the object is applied. The format is described in `docs/plan.md`.

use super::api::{
    ClusterQueue, LocalQueue, ObjectMeta, PodSpec, PodTemplateSpec, ResourceFlavor, Workload,
    WorkloadPriorityClass,
};
use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::events::{Event, FinalState};
use super::kueue_config::KueueConfig;
use super::model::{PodSetInfo, WorkloadInfo};
use super::quantity::{parse_duration, Quantity, Time};
use super::scale_replay::{Replay, Replicas, ScalerDoc, Series, SeriesDoc, POLL_TAIL};
use crate::autoscale::Coupling;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Labels naming the LocalQueue, ours first.
pub const QUEUE_LABELS: [&str; 2] = ["tessera.io/queue-name", "kueue.x-k8s.io/queue-name"];
/// Labels naming the WorkloadPriorityClass, ours first.
pub const PRIORITY_LABELS: [&str; 2] =
    ["tessera.io/priority-class", "kueue.x-k8s.io/priority-class"];
pub const RUNTIME_ANNOTATION: &str = "tessera.io/runtime";
pub const CHECKPOINT_INTERVAL_ANNOTATION: &str = "tessera.io/checkpoint-interval";
pub const LAST_CHECKPOINT_ANNOTATION: &str = "tessera.io/last-checkpoint";
pub const PODS_READY_ANNOTATION: &str = "tessera.io/pods-ready-after";
const POD_GROUP_LABELS: [&str; 2] = ["tessera.io/pod-group-name", "kueue.x-k8s.io/pod-group-name"];
/// Labels naming a pod group, ours first.
pub const POD_GROUP_LABEL_KEYS: [&str; 2] = POD_GROUP_LABELS;
const POD_GROUP_COUNT: [&str; 2] = [
    "tessera.io/pod-group-total-count",
    "kueue.x-k8s.io/pod-group-total-count",
];
const JOB_MIN_PARALLELISM: &str = "kueue.x-k8s.io/job-min-parallelism";
/// Partial admission of a pod group: the fewest pods it may run with (Kueue has no
/// such annotation for plain pod groups; Jobs use `job-min-parallelism`).
pub const POD_GROUP_MIN_COUNT: &str = "tessera.io/pod-group-min-count";

/// How far past the last object a plan runs when no `until` is given.
pub const DEFAULT_HORIZON: Time = 7 * 24 * 3_600_000;

/// Options of a plan run.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions {
    /// Stop at this time (offset from the start); default: when nothing is left to
    /// happen, at most [`DEFAULT_HORIZON`] after the last object.
    pub until: Option<Time>,
    /// How InferenceScalers couple with quota (`Off`: KEDA + Kueue as they are).
    pub coupling: Coupling,
}

/// The output of `tessera plan`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanOutput {
    pub events: Vec<Event>,
    #[serde(rename = "final")]
    pub final_state: FinalState,
}

/// `batch/v1` Job (the subset that matters).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Job {
    metadata: ObjectMeta,
    spec: JobSpec,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JobSpec {
    #[serde(default)]
    parallelism: Option<u32>,
    #[serde(default)]
    completions: Option<u32>,
    template: PodTemplateSpec,
}

/// `v1` Pod.
#[derive(Clone, Debug, Deserialize)]
struct Pod {
    metadata: ObjectMeta,
    spec: PodSpec,
}

/// `apps/v1` Deployment or StatefulSet.
#[derive(Clone, Debug, Deserialize)]
struct Serving {
    metadata: ObjectMeta,
    spec: ServingSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct ServingSpec {
    #[serde(default = "one")]
    replicas: u32,
    template: PodTemplateSpec,
}

fn one() -> u32 {
    1
}

/// `resource.k8s.io` ResourceClaimTemplate: device requests by class.
#[derive(Clone, Debug, Deserialize)]
struct ClaimTemplate {
    metadata: ObjectMeta,
    spec: ClaimTemplateSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct ClaimTemplateSpec {
    spec: ClaimSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct ClaimSpec {
    devices: DeviceClaim,
}

#[derive(Clone, Debug, Deserialize)]
struct DeviceClaim {
    #[serde(default)]
    requests: Vec<DeviceRequest>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceRequest {
    /// resource.k8s.io/v1beta1 shape.
    #[serde(default)]
    device_class_name: Option<String>,
    #[serde(default)]
    count: Option<u32>,
    /// resource.k8s.io/v1 shape.
    #[serde(default)]
    exactly: Option<ExactRequest>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExactRequest {
    device_class_name: String,
    #[serde(default)]
    count: Option<u32>,
}

#[derive(Clone, Debug)]
struct Namespace {
    name: String,
    labels: BTreeMap<String, String>,
}

/// One object of a scenario.
#[derive(Clone, Debug)]
enum Object {
    Flavor(ResourceFlavor),
    ClusterQueue(ClusterQueue),
    LocalQueue(LocalQueue),
    PriorityClass(WorkloadPriorityClass),
    Namespace(Namespace),
    ClaimTemplate(String, String, BTreeMap<String, u32>),
    Workload(Box<WorkloadInfo>),
    PodOfGroup {
        group: String,
        total: u32,
        min: Option<u32>,
        pod: Box<WorkloadInfo>,
    },
    Serving {
        kind: &'static str,
        base: Box<WorkloadInfo>,
        replicas: u32,
    },
    Scaler(Box<ScalerDoc>),
    Series(String, Series),
}

#[derive(Clone, Debug)]
struct Step {
    at: Option<Time>,
    doc: usize,
    line: usize,
    object: Object,
}

/// A parsed scenario: engine settings and objects in file order.
#[derive(Clone, Debug)]
pub struct Scenario {
    config: EngineConfig,
    device_classes: HashMap<String, String>,
    steps: Vec<Step>,
}

/// Largest plan file read, in bytes (nesting, node and alias budgets: [`crate::yaml`]).
pub const MAX_PLAN_BYTES: u64 = 64 << 20;

/// First line (1-based) of each YAML document in `text`.
fn doc_lines(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if t == "---" || t.starts_with("--- ") {
            starts.push(i + 2);
            open = true;
        } else if !open && !t.trim().is_empty() && !t.trim_start().starts_with('#') {
            starts.push(i + 1);
            open = true;
        }
    }
    starts
}

/// The first field of a plan document that reading it would silently ignore (`spec.bogus`),
/// if any. Tessera's own kinds are checked against the types they are read into; the
/// Kubernetes kinds, of which Tessera reads a subset, against the full API types of
/// `k8s-openapi` (so `spec.template.spec.containers[0].image` is fine, `spec.paralelism`
/// is not).
fn unknown_field<T: for<'de> Deserialize<'de>>(
    v: &serde_json::Value,
    kind: &str,
) -> Option<String> {
    use k8s_openapi::api::{apps, batch, core, resource};
    fn ignored<U: for<'de> Deserialize<'de>>(v: &serde_json::Value) -> Vec<String> {
        let mut paths = Vec::new();
        let parsed: std::result::Result<U, _> =
            serde_ignored::deserialize(v, |p| paths.push(render(&p)));
        // A document the full type cannot read is reported by Tessera's own reading.
        if parsed.is_err() {
            paths.clear();
        }
        paths
    }
    /// `spec.containers[0].x`: map keys joined by dots, indices in brackets, `Option`
    /// and newtype layers left out.
    fn render(path: &serde_ignored::Path) -> String {
        use serde_ignored::Path;
        match path {
            Path::Root => String::new(),
            Path::Seq { parent, index } => format!("{}[{index}]", render(parent)),
            Path::Map { parent, key } => match render(parent) {
                p if p.is_empty() => key.clone(),
                p => format!("{p}.{key}"),
            },
            Path::Some { parent }
            | Path::NewtypeStruct { parent }
            | Path::NewtypeVariant { parent } => render(parent),
        }
    }
    let api_version = v.get("apiVersion").and_then(|a| a.as_str()).unwrap_or("");
    let paths = match (kind, api_version) {
        ("Job", _) => ignored::<batch::v1::Job>(v),
        ("Pod", _) => ignored::<core::v1::Pod>(v),
        ("Deployment", _) => ignored::<apps::v1::Deployment>(v),
        ("StatefulSet", _) => ignored::<apps::v1::StatefulSet>(v),
        ("ResourceClaimTemplate", "resource.k8s.io/v1") => {
            ignored::<resource::v1::ResourceClaimTemplate>(v)
        }
        ("ResourceClaimTemplate", "resource.k8s.io/v1beta2") => {
            ignored::<resource::v1beta2::ResourceClaimTemplate>(v)
        }
        ("ResourceClaimTemplate", "resource.k8s.io/v1beta1") => {
            ignored::<resource::v1beta1::ResourceClaimTemplate>(v)
        }
        ("ResourceClaimTemplate", _) => Vec::new(),
        _ => ignored::<T>(v),
    };
    // Every document has these; the creation time is read on its own.
    const READ_ELSEWHERE: [&str; 3] = ["apiVersion", "kind", "metadata.creationTimestamp"];
    paths
        .into_iter()
        .find(|p| !READ_ELSEWHERE.contains(&p.as_str()))
        .map(|p| crate::yaml::safe_path(&p))
}

impl Scenario {
    /// Parses a scenario file. Errors name the document, its line and the field.
    pub fn parse(text: &str) -> Result<Scenario> {
        let lines = doc_lines(text);
        let mut docs = Vec::new();
        let values = crate::yaml::documents(text, MAX_PLAN_BYTES).map_err(|e| {
            // The document the error is in: the last one starting at or before its line.
            let line = e.line.unwrap_or(1);
            Error::Scenario {
                doc: lines.iter().filter(|&&start| start <= line).count().max(1),
                line,
                why: e.reason,
            }
        })?;
        for (i, value) in values.into_iter().enumerate() {
            let line = lines.get(i).copied().unwrap_or(1);
            if value.is_null() {
                continue;
            }
            docs.push((i + 1, line, value));
        }
        let mut config = EngineConfig::default();
        let mut device_classes = HashMap::new();
        let mut steps = Vec::new();
        for (doc, line, value) in docs {
            let err = |why: String| Error::Scenario { doc, line, why };
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .ok_or_else(|| err("missing `kind`".into()))?
                .to_string();
            fn typed<T: for<'de> Deserialize<'de>>(
                v: serde_json::Value,
                kind: &str,
                err: &dyn Fn(String) -> Error,
            ) -> Result<T> {
                let name = v
                    .get("metadata")
                    .and_then(|m| m.get("name"))
                    .and_then(|n| n.as_str())
                    .unwrap_or("")
                    .to_string();
                if let Some(field) = unknown_field::<T>(&v, kind) {
                    return Err(err(format!(
                        "{kind} {name:?}: unknown field {field} (it would be ignored)"
                    )));
                }
                serde_path_to_error::deserialize(v).map_err(|e| {
                    err(format!(
                        "{kind} {name:?}: {}: {}",
                        crate::yaml::safe_path(&e.path().to_string()),
                        e.inner()
                    ))
                })
            }
            let at = value
                .get("metadata")
                .and_then(|m| m.get("creationTimestamp"))
                .map(|t| match t {
                    serde_json::Value::String(s) => parse_time(s),
                    serde_json::Value::Number(n) => parse_time(&n.to_string()),
                    _ => Err(Error::Duration {
                        value: format!("{t:?}"),
                        why: "expected an offset like 90s".into(),
                    }),
                })
                .transpose()
                .map_err(|e| err(format!("metadata.creationTimestamp: {e}")))?;
            let object = match kind.as_str() {
                "Configuration" => {
                    let c = KueueConfig::from_value(value).map_err(|e| err(e.to_string()))?;
                    if c.wait_for_pods_ready.is_some() {
                        config.wait_for_pods_ready = c.wait_for_pods_ready;
                    }
                    device_classes.extend(c.device_classes);
                    continue;
                }
                "ResourceFlavor" => Object::Flavor(typed(value, &kind, &err)?),
                "ClusterQueue" => Object::ClusterQueue(typed(value, &kind, &err)?),
                "LocalQueue" => Object::LocalQueue(typed(value, &kind, &err)?),
                "WorkloadPriorityClass" => Object::PriorityClass(typed(value, &kind, &err)?),
                "Namespace" => {
                    let meta: ObjectMeta = value
                        .get("metadata")
                        .cloned()
                        .map(serde_json::from_value)
                        .transpose()
                        .map_err(|e| err(format!("Namespace: {e}")))?
                        .ok_or_else(|| err("Namespace: missing metadata".into()))?;
                    Object::Namespace(Namespace {
                        name: meta.name,
                        labels: meta.labels,
                    })
                }
                "ResourceClaimTemplate" => {
                    let t: ClaimTemplate = typed(value, &kind, &err)?;
                    let mut per_class = BTreeMap::new();
                    for (i, r) in t.spec.spec.devices.requests.iter().enumerate() {
                        let (class, count) = match (&r.exactly, &r.device_class_name) {
                            (Some(e), _) => (e.device_class_name.clone(), e.count.unwrap_or(1)),
                            (None, Some(c)) => (c.clone(), r.count.unwrap_or(1)),
                            (None, None) => {
                                return Err(err(format!(
                                    "ResourceClaimTemplate {:?}: spec.spec.devices.requests[{i}] names no deviceClassName",
                                    t.metadata.name
                                )))
                            }
                        };
                        *per_class.entry(class).or_insert(0) += count;
                    }
                    Object::ClaimTemplate(
                        t.metadata.namespace.unwrap_or_else(|| "default".into()),
                        t.metadata.name,
                        per_class,
                    )
                }
                "Workload" => {
                    let w: Workload = typed(value, &kind, &err)?;
                    Object::Workload(Box::new(
                        from_workload(&w, at).map_err(|e| err(e.to_string()))?,
                    ))
                }
                "Job" => {
                    let j: Job = typed(value, &kind, &err)?;
                    let (count, min) = job_pod_counts(&j).map_err(|()| {
                        err(format!(
                            "Job {:?}: annotation {JOB_MIN_PARALLELISM}: not a number",
                            j.metadata.name
                        ))
                    })?;
                    let info =
                        from_pods(&j.metadata, &j.spec.template.spec, "main", count, min, at)
                            .map_err(|e| err(e.to_string()))?;
                    Object::Workload(Box::new(info))
                }
                "Pod" => {
                    let p: Pod = typed(value, &kind, &err)?;
                    let info = from_pods(&p.metadata, &p.spec, "main", 1, None, at)
                        .map_err(|e| err(e.to_string()))?;
                    match first_label(&p.metadata.labels, &POD_GROUP_LABELS) {
                        Some(group) => {
                            let (total, min) = pod_group_counts(&p.metadata.annotations).map_err(
                                |(field, why)| {
                                    err(format!(
                                        "Pod {:?}: annotation {field}: {why}",
                                        p.metadata.name
                                    ))
                                },
                            )?;
                            Object::PodOfGroup {
                                group: group.to_string(),
                                total,
                                min,
                                pod: Box::new(info),
                            }
                        }
                        None => Object::Workload(Box::new(info)),
                    }
                }
                "Deployment" | "StatefulSet" => {
                    let s: Serving = typed(value, &kind, &err)?;
                    let info = from_pods(&s.metadata, &s.spec.template.spec, "main", 1, None, at)
                        .map_err(|e| err(e.to_string()))?;
                    Object::Serving {
                        kind: if kind == "Deployment" {
                            "Deployment"
                        } else {
                            "StatefulSet"
                        },
                        base: Box::new(info),
                        replicas: s.spec.replicas,
                    }
                }
                "InferenceScaler" => Object::Scaler(Box::new(typed(value, &kind, &err)?)),
                "MetricSeries" => {
                    let doc: SeriesDoc = typed(value, &kind, &err)?;
                    let (query, series) = doc.read().map_err(|e| err(e.to_string()))?;
                    Object::Series(query, series)
                }
                other => return Err(err(format!("unsupported kind {other:?}"))),
            };
            steps.push(Step {
                at,
                doc,
                line,
                object,
            });
        }
        Ok(Scenario {
            config,
            device_classes,
            steps,
        })
    }

    /// Engine settings from the scenario's `Configuration`, if any.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs the scenario on a fresh engine.
    pub fn run(&self, opts: &PlanOptions) -> Result<PlanOutput> {
        let mut engine = Engine::new(self.config.clone());
        let mut clock: Time = 0;
        let mut claims: HashMap<(String, String), BTreeMap<String, u32>> = HashMap::new();
        let mut groups: HashMap<String, Vec<WorkloadInfo>> = HashMap::new();
        let mut replicas = Replicas::default();
        let mut replay = Replay::default();
        let mut events = Vec::new();
        for step in &self.steps {
            let at = step.at.unwrap_or(clock).max(clock);
            if opts.until.is_some_and(|u| at > u) {
                break;
            }
            replay.poll_before(at, &mut engine, &mut replicas, &mut events)?;
            engine.advance_to(at)?;
            clock = at;
            let err = |e: Error| Error::Scenario {
                doc: step.doc,
                line: step.line,
                why: e.to_string(),
            };
            match &step.object {
                Object::Flavor(f) => engine.apply_flavor(f, at).map_err(err)?,
                Object::ClusterQueue(q) => engine.apply_cluster_queue(q, at).map_err(err)?,
                Object::LocalQueue(q) => engine.apply_local_queue(q, at).map_err(err)?,
                Object::PriorityClass(p) => engine.apply_priority_class(p).map_err(err)?,
                Object::Namespace(n) => engine.apply_namespace(&n.name, n.labels.clone(), at),
                Object::ClaimTemplate(ns, name, per_class) => {
                    claims.insert((ns.clone(), name.clone()), per_class.clone());
                }
                Object::Workload(w) => {
                    let w = self.with_claims(w, &claims).map_err(err)?;
                    engine.submit(at, w.with_creation(at)).map_err(err)?;
                }
                Object::PodOfGroup {
                    group,
                    total,
                    min,
                    pod,
                } => {
                    let key = format!("{}/{}", pod.namespace, group);
                    let pod = self.with_claims(pod, &claims).map_err(err)?;
                    let members = groups.entry(key.clone()).or_default();
                    members.push(pod.with_creation(at));
                    if members.len() as u32 == *total {
                        let members = groups.remove(&key).unwrap_or_default();
                        let mut w = merge_group(group, members);
                        set_group_min_count(&mut w, *min).map_err(|why| {
                            err(Error::Invalid {
                                kind: "Pod",
                                name: format!("(group {group})"),
                                field: format!("metadata.annotations.{POD_GROUP_MIN_COUNT}"),
                                why,
                            })
                        })?;
                        engine.submit(at, w).map_err(err)?;
                    }
                }
                Object::Serving {
                    kind,
                    base,
                    replicas: want,
                } => {
                    let base = self.with_claims(base, &claims).map_err(err)?;
                    replicas
                        .set(&mut engine, at, kind, &base, *want, None)
                        .map_err(err)?;
                }
                Object::Scaler(doc) => replay
                    .add_scaler(at, doc, &replicas, opts.coupling)
                    .map_err(err)?,
                Object::Series(query, series) => replay.add_series(query.clone(), series.clone()),
            }
            engine.schedule(at)?;
        }
        if !replay.is_empty() {
            let end = opts
                .until
                .unwrap_or(clock.max(replay.last_change()).saturating_add(POLL_TAIL));
            replay.poll_before(end, &mut engine, &mut replicas, &mut events)?;
            clock = clock.max(end);
        }
        let horizon = opts.until.unwrap_or(clock.saturating_add(DEFAULT_HORIZON));
        engine.advance_to(horizon)?;
        events.extend(engine.take_events());
        for (key, members) in groups {
            let mut ev = Event::new(clock, super::events::EventType::Pending, key);
            ev.reason = Some("PodGroupIncomplete".into());
            ev.message = Some(format!(
                "{} pod(s) of the group arrived, waiting for the rest",
                members.len()
            ));
            events.push(ev);
        }
        Ok(PlanOutput {
            events,
            final_state: engine.final_state(),
        })
    }

    fn with_claims(
        &self,
        w: &WorkloadInfo,
        claims: &HashMap<(String, String), BTreeMap<String, u32>>,
    ) -> Result<WorkloadInfo> {
        let mut w = w.clone();
        for ps in &mut w.pod_sets {
            let refs = std::mem::take(&mut ps.claim_templates);
            for t in refs {
                let per_class = claims
                    .get(&(w.namespace.clone(), t.clone()))
                    .ok_or_else(|| Error::Invalid {
                        kind: "Workload",
                        name: format!("{}/{}", w.namespace, w.name),
                        field: format!("podSets.{}.resourceClaims", ps.name),
                        why: format!(
                            "ResourceClaimTemplate {t:?} not found (define it earlier in the file)"
                        ),
                    })?;
                for (class, n) in per_class {
                    let resource = self
                        .device_classes
                        .get(class)
                        .cloned()
                        .unwrap_or_else(|| class.clone());
                    let e = ps.requests.entry(resource).or_default();
                    e.0 += Quantity::units(*n as i64).0;
                }
            }
        }
        Ok(w)
    }
}

impl WorkloadInfo {
    pub(super) fn with_creation(mut self, at: Time) -> Self {
        if !self.explicit_creation {
            self.creation = at;
        }
        self
    }
}

/// Parses a plan time: an offset (`90s`, `5m`, `120`). RFC 3339 stamps are refused with
/// a hint, since a plan has no wall clock.
fn parse_time(s: &str) -> Result<Time> {
    if s.contains('T') && s.contains('-') {
        return Err(Error::Duration {
            value: s.to_string(),
            why: "plans use offsets from the scenario start, like 90s or 5m".into(),
        });
    }
    parse_duration(s)
}

fn first_label<'a>(map: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| map.get(*k).map(String::as_str))
}

fn annotation_time(meta: &ObjectMeta, key: &str) -> Result<Option<Time>> {
    meta.annotations
        .get(key)
        .map(|v| {
            parse_duration(v).map_err(|e| Error::Invalid {
                kind: "Workload",
                name: meta.name.clone(),
                field: format!("metadata.annotations.{key}"),
                why: e.to_string(),
            })
        })
        .transpose()
}

fn common(meta: &ObjectMeta, queue: String, at: Option<Time>) -> Result<WorkloadInfo> {
    let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let mut w = WorkloadInfo::new(&format!("{ns}/{}", meta.name), &queue);
    w.creation = at.unwrap_or(0);
    w.explicit_creation = at.is_some();
    w.runtime = annotation_time(meta, RUNTIME_ANNOTATION)?;
    w.checkpoint_interval = annotation_time(meta, CHECKPOINT_INTERVAL_ANNOTATION)?;
    w.last_checkpoint = annotation_time(meta, LAST_CHECKPOINT_ANNOTATION)?;
    w.pods_ready_after = match meta
        .annotations
        .get(PODS_READY_ANNOTATION)
        .map(String::as_str)
    {
        Some("never") => None,
        Some(_) => annotation_time(meta, PODS_READY_ANNOTATION)?,
        None => Some(0),
    };
    Ok(w)
}

fn pod_set(name: &str, count: u32, min: Option<u32>, spec: &PodSpec) -> PodSetInfo {
    PodSetInfo {
        name: name.to_string(),
        count,
        min_count: min,
        requests: spec.effective_requests(),
        node_selector: spec.node_selector.clone(),
        tolerations: spec.tolerations.clone(),
        claim_templates: spec
            .resource_claims
            .iter()
            .filter_map(|c| c.resource_claim_template_name.clone())
            .collect(),
    }
}

fn grace(spec: &PodSpec) -> Time {
    spec.termination_grace_period_seconds
        .unwrap_or(0)
        .saturating_mul(1000)
}

fn from_workload(w: &Workload, at: Option<Time>) -> Result<WorkloadInfo> {
    let mut info = common(&w.metadata, w.spec.queue_name.clone(), at)?;
    info.priority = w.spec.priority;
    info.priority_class = w.spec.priority_class_name.clone();
    info.pod_sets = w
        .spec
        .pod_sets
        .iter()
        .map(|ps| pod_set(&ps.name, ps.count, ps.min_count, &ps.template.spec))
        .collect();
    info.grace_period = w
        .spec
        .pod_sets
        .iter()
        .map(|ps| grace(&ps.template.spec))
        .max()
        .unwrap_or(0);
    Ok(info)
}

fn from_pods(
    meta: &ObjectMeta,
    spec: &PodSpec,
    name: &str,
    count: u32,
    min: Option<u32>,
    at: Option<Time>,
) -> Result<WorkloadInfo> {
    let queue = first_label(&meta.labels, &QUEUE_LABELS)
        .unwrap_or("")
        .to_string();
    let mut info = common(meta, queue, at)?;
    info.priority_class = first_label(&meta.labels, &PRIORITY_LABELS).map(str::to_string);
    info.pod_sets = vec![pod_set(name, count, min, spec)];
    info.grace_period = grace(spec);
    Ok(info)
}

/// A pod group becomes one workload; identical pods share a pod set.
fn merge_group(group: &str, members: Vec<WorkloadInfo>) -> WorkloadInfo {
    let mut out = members[0].clone();
    out.name = group.to_string();
    out.pod_sets.clear();
    for m in &members {
        out.creation = out.creation.min(m.creation);
        out.runtime = out.runtime.max(m.runtime);
        out.grace_period = out.grace_period.max(m.grace_period);
        for ps in &m.pod_sets {
            match out.pod_sets.iter_mut().find(|p| {
                p.requests == ps.requests
                    && p.node_selector == ps.node_selector
                    && p.tolerations == ps.tolerations
            }) {
                Some(p) => p.count += ps.count,
                None => {
                    let mut p = ps.clone();
                    p.name = format!("role-{}", out.pod_sets.len());
                    out.pod_sets.push(p);
                }
            }
        }
    }
    out
}

/// A pod group's total count (`pod-group-total-count`, ours or Kueue's) and partial
/// admission floor ([`POD_GROUP_MIN_COUNT`]) from a member's annotations; `Err` names
/// the annotation and what is wrong with it.
pub fn pod_group_counts(
    annotations: &BTreeMap<String, String>,
) -> std::result::Result<(u32, Option<u32>), (&'static str, String)> {
    let total_key = POD_GROUP_COUNT[1];
    let total = first_label(annotations, &POD_GROUP_COUNT)
        .ok_or((total_key, "a pod group needs its total count".to_string()))?
        .parse::<u32>()
        .map_err(|_| (total_key, "not a number".to_string()))?;
    if total == 0 {
        return Err((total_key, "must be at least 1".into()));
    }
    let min = annotations
        .get(POD_GROUP_MIN_COUNT)
        .map(|v| {
            let min = v
                .parse::<u32>()
                .map_err(|_| (POD_GROUP_MIN_COUNT, format!("{v:?} is not a number")))?;
            if min == 0 || min > total {
                return Err((
                    POD_GROUP_MIN_COUNT,
                    format!("{min} is not between 1 and the group's total count {total}"),
                ));
            }
            Ok(min)
        })
        .transpose()?;
    Ok((total, min))
}

/// Sets a merged pod group's partial admission floor. Only a group whose pods are all
/// alike (one pod set) can run with fewer: which pods to leave out of a group of
/// several shapes is not the controller's to guess.
pub fn set_group_min_count(
    w: &mut WorkloadInfo,
    min: Option<u32>,
) -> std::result::Result<(), String> {
    let Some(min) = min else { return Ok(()) };
    match w.pod_sets.as_mut_slice() {
        [only] => {
            only.min_count = Some(min.min(only.count));
            Ok(())
        }
        sets => Err(format!(
            "partial admission needs the group's pods alike (same requests, node selector and tolerations); they come in {} shapes",
            sets.len()
        )),
    }
}

/// A live Pod read by the controller: a workload of its own, or one member of a group.
#[derive(Clone, Debug, PartialEq)]
pub enum LivePod {
    Single(WorkloadInfo),
    GroupMember {
        group: String,
        total: u32,
        /// The group's partial admission floor ([`POD_GROUP_MIN_COUNT`]).
        min: Option<u32>,
        pod: WorkloadInfo,
    },
}

/// Annotations that only mean something in a plan (simulated runtime and readiness, an
/// offset checkpoint time); a live object's own clock decides those.
const PLAN_ONLY_ANNOTATIONS: [&str; 3] = [
    RUNTIME_ANNOTATION,
    PODS_READY_ANNOTATION,
    LAST_CHECKPOINT_ANNOTATION,
];

/// Reads a live object (JSON from the API server) into the plan's shape. The pod
/// template's own metadata is not needed for quota and is dropped (it has no name).
fn live<T: for<'de> Deserialize<'de>>(kind: &'static str, object: &serde_json::Value) -> Result<T> {
    let mut object = object.clone();
    if let Some(spec) = object.get_mut("spec").and_then(|s| s.as_object_mut()) {
        if let Some(t) = spec.get_mut("template").and_then(|t| t.as_object_mut()) {
            t.remove("metadata");
        }
    }
    if let Some(a) = object
        .pointer_mut("/metadata/annotations")
        .and_then(|a| a.as_object_mut())
    {
        for k in PLAN_ONLY_ANNOTATIONS {
            a.remove(k);
        }
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .unwrap_or("")
        .to_string();
    serde_path_to_error::deserialize(object).map_err(|e| Error::Invalid {
        kind,
        name,
        field: e.path().to_string(),
        why: e.inner().to_string(),
    })
}

/// A live Pod as a workload, the way a plan reads a `Pod` document (queue and priority
/// labels, requests, pod-group label and total-count annotation). Creation time is 0:
/// the caller sets it from the object's own timestamp.
pub fn workload_from_live_pod(pod: &serde_json::Value) -> Result<LivePod> {
    let p: Pod = live("Pod", pod)?;
    let info = from_pods(&p.metadata, &p.spec, "main", 1, None, None)?;
    let Some(group) = first_label(&p.metadata.labels, &POD_GROUP_LABELS) else {
        return Ok(LivePod::Single(info));
    };
    let (total, min) =
        pod_group_counts(&p.metadata.annotations).map_err(|(field, why)| Error::Invalid {
            kind: "Pod",
            name: p.metadata.name.clone(),
            field: format!("metadata.annotations.{field}"),
            why,
        })?;
    Ok(LivePod::GroupMember {
        group: group.to_string(),
        total,
        min,
        pod: info,
    })
}

/// A live batch Job as a workload: one pod set of `min(parallelism, completions)` pods,
/// partial admission from `kueue.x-k8s.io/job-min-parallelism`.
pub fn workload_from_live_job(job: &serde_json::Value) -> Result<WorkloadInfo> {
    let j: Job = live("Job", job)?;
    let (count, min) = job_pod_counts(&j).map_err(|()| Error::Invalid {
        kind: "Job",
        name: j.metadata.name.clone(),
        field: format!("metadata.annotations.{JOB_MIN_PARALLELISM}"),
        why: "not a number".into(),
    })?;
    from_pods(&j.metadata, &j.spec.template.spec, "main", count, min, None)
}

/// A Job's pod count, `min(parallelism, completions)` (1 when unset), and its partial
/// admission floor from `kueue.x-k8s.io/job-min-parallelism`; `Err` when that annotation
/// is not a number.
fn job_pod_counts(j: &Job) -> std::result::Result<(u32, Option<u32>), ()> {
    let count = match (j.spec.parallelism, j.spec.completions) {
        (Some(p), Some(c)) => p.min(c),
        (Some(p), None) => p,
        (None, _) => 1,
    };
    let min = j
        .metadata
        .annotations
        .get(JOB_MIN_PARALLELISM)
        .map(|v| v.parse::<u32>().map_err(|_| ()))
        .transpose()?;
    Ok((count, min))
}

/// The members of a pod group as one workload (identical pods share a pod set).
pub fn merge_live_pod_group(group: &str, members: Vec<WorkloadInfo>) -> Option<WorkloadInfo> {
    if members.is_empty() {
        return None;
    }
    Some(merge_group(group, members))
}

/// Parses and runs a scenario.
pub fn plan_str(text: &str, opts: &PlanOptions) -> Result<PlanOutput> {
    Scenario::parse(text)?.run(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_group_counts_are_checked() {
        let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let total = "kueue.x-k8s.io/pod-group-total-count";
        // (annotations, (total, min) or part of the error)
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            std::result::Result<(u32, Option<u32>), &'a str>,
        );
        let cases: [Case; 6] = [
            (&[(total, "4")], Ok((4, None))),
            (
                &[(total, "4"), (POD_GROUP_MIN_COUNT, "2")],
                Ok((4, Some(2))),
            ),
            (&[], Err("needs its total count")),
            (&[(total, "0")], Err("at least 1")),
            (
                &[(total, "4"), (POD_GROUP_MIN_COUNT, "5")],
                Err("between 1 and"),
            ),
            (
                &[(total, "4"), (POD_GROUP_MIN_COUNT, "two")],
                Err("not a number"),
            ),
        ];
        for (pairs, want) in cases {
            match (pod_group_counts(&ann(pairs)), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{pairs:?}"),
                (Err((_, why)), Err(w)) => assert!(why.contains(w), "{pairs:?}: {why}"),
                (got, _) => panic!("{pairs:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_min_count_on_a_group_of_two_shapes_is_refused() {
        let pod = |name: &str, gpus: u32| {
            format!(
                "kind: Pod\nmetadata: {{name: {name}, namespace: ml, labels: {{tessera.io/queue-name: q, tessera.io/pod-group-name: g}}, annotations: {{tessera.io/pod-group-total-count: \"2\", {POD_GROUP_MIN_COUNT}: \"1\"}}}}\nspec: {{containers: [{{resources: {{requests: {{nvidia.com/gpu: {gpus}}}}}}}]}}\n"
            )
        };
        let text = format!("{}---\n{}", pod("a", 1), pod("b", 2));
        let err = plan_str(&text, &PlanOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("2 shapes") && err.contains("document 2"),
            "{err}"
        );
    }

    #[test]
    fn document_lines_are_found() {
        let cases = [
            ("a: 1\n---\nb: 2\n", vec![1, 3]),
            ("# c\n---\na: 1\n---\nb: 2\n", vec![3, 5]),
            ("\n# c\nkind: X\n", vec![3]),
        ];
        for (text, want) in cases {
            assert_eq!(doc_lines(text), want, "{text:?}");
        }
    }

    #[test]
    fn annotations_become_plan_timing() {
        let text = r#"
kind: Workload
metadata:
  name: w
  namespace: ml
  creationTimestamp: 1m30s
  annotations:
    tessera.io/runtime: 10m
    tessera.io/checkpoint-interval: 5m
    tessera.io/pods-ready-after: never
spec: {queueName: q, podSets: [{count: 1, template: {spec: {containers: [{resources: {requests: {cpu: 1}}}]}}}]}
"#;
        let s = Scenario::parse(text).unwrap();
        let Object::Workload(w) = &s.steps[0].object else {
            panic!("not a workload")
        };
        assert_eq!(s.steps[0].at, Some(90_000));
        assert_eq!(w.runtime, Some(600_000));
        assert_eq!(w.checkpoint_interval, Some(300_000));
        assert_eq!(w.pods_ready_after, None);
        assert_eq!(w.creation, 90_000);
    }

    #[test]
    fn bad_annotation_names_the_field() {
        let text = "kind: Job\nmetadata: {name: j, annotations: {tessera.io/runtime: soon}}\nspec: {template: {spec: {containers: []}}}\n";
        let err = Scenario::parse(text).unwrap_err().to_string();
        assert!(err.contains("tessera.io/runtime"), "{err}");
    }

    /// A plan's `Configuration` is read by the controller's parser: the same fields, the
    /// same refusals (unknown fields, zero timeouts) naming the field.
    #[test]
    fn configuration_is_validated_as_the_controller_does() {
        for (text, field) in [
            (
                "kind: Configuration\nwaitForPodsReady: {enable: true, timout: 1m}\n",
                "timout",
            ),
            (
                "kind: Configuration\nwaitForPodsReady: {enable: true, timeout: 0s}\n",
                "waitForPodsReady.timeout",
            ),
        ] {
            let err = Scenario::parse(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
        let ok = "kind: Configuration\nwaitForPodsReady: {enable: true, blockAdmission: true, timeout: 2m}\n";
        let s = Scenario::parse(ok).unwrap();
        let w = s.config().wait_for_pods_ready.as_ref().unwrap();
        assert!(w.block_admission);
        assert_eq!(w.timeout, 120_000);
    }
}
