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
    ClusterQueue, LocalQueue, ObjectMeta, PodTemplateSpec, ResourceFlavor, Workload,
    WorkloadPriorityClass,
};
use super::engine::{Engine, EngineConfig};
use super::error::{Error, Result};
use super::events::{Event, FinalState};
use super::kueue_config::KueueConfig;
use super::model::WorkloadInfo;
use super::objects::{
    first_label, from_pods, from_workload, job_pod_counts, merge_group, Job, Pod,
    JOB_MIN_PARALLELISM, POD_GROUP_LABELS,
};
pub use super::objects::{
    merge_live_pod_group, pod_group_counts, set_group_min_count, workload_from_live_job,
    workload_from_live_pod, LivePod, CHECKPOINT_INTERVAL_ANNOTATION, LAST_CHECKPOINT_ANNOTATION,
    PODS_READY_ANNOTATION, POD_GROUP_LABEL_KEYS, POD_GROUP_MIN_COUNT, PRIORITY_LABELS,
    QUEUE_LABELS, RUNTIME_ANNOTATION,
};
use super::quantity::{parse_duration, Quantity, Time};
use super::scale_replay::{Replay, Replicas, ScalerDoc, Series, SeriesDoc, POLL_TAIL};
use crate::autoscale::Coupling;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

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
    /// Its `spec` is counted by [`super::claims::claimed`].
    spec: serde_json::Value,
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
                    let per_class = super::claims::claimed(&t.spec["spec"]).map_err(|why| {
                        err(format!(
                            "ResourceClaimTemplate {:?}: spec.spec.{why}",
                            t.metadata.name
                        ))
                    })?;
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
                        .set(&mut engine, at, kind, &base, *want, Default::default())
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
