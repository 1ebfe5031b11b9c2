//! The live InferenceScaler loop (`tessera controller`, `--autoscaler`): each scaler is
//! polled every `pollingInterval`, like KEDA's operator, and the pure engine
//! ([`crate::autoscale`]) decides; this module only reads and writes.
//!
//! One poll of one scaler:
//! 1. its spec is validated ([`ScalerSpec::validate`]; unknown fields, `min > max`, ...):
//!    an invalid spec gets `Ready=False` with the field named, one Event per generation,
//!    and the target is left as it is;
//! 2. the target's `/scale` subresource is read (a kind without one: `Ready=False`,
//!    target untouched) and its pods counted by the scale's selector: a replica *serves*
//!    once its pod is scheduled, not gated (quota) and not terminating;
//! 3. each trigger's query goes to its `serverAddress` (`/api/v1/query`, as KEDA does);
//!    a server that is down, slow, answers several series or refuses the PromQL is a
//!    failed reading (the engine holds or falls back, never scales to zero on it);
//! 4. the decision's replicas are patched onto `/scale` when they differ, with an Event
//!    saying why; the status (KEDA's `Ready`/`Active`/`Fallback` conditions,
//!    `lastActiveTime`, current and desired replicas) is patched when it changed.
//!
//! Scalers come from a watch-fed store; every tick (`--autoscaler-tick`, 250 ms) the due
//! ones are polled, up to [`CONCURRENT_POLLS`] at once; a scaler whose generation
//! changes starts a fresh engine. Only the holder of its own Lease
//! (`<lease-name>-autoscaler`) polls, so two replicas never scale the same target.
//!
//! Coupled with quota: before a scale-up, the target is annotated with its time and the
//! engine's anti-flap window (`tessera.io/scaled-up-at`, `tessera.io/preempt-not-before`,
//! absent for an urgent one); the quota pass gives the replicas that scale-up creates
//! that `preempt_not_before`, as `tessera plan` and `tessera simulate fleet` do. Before
//! a scale-down that holds the capacity it frees (`preemption.holdFreedSeconds`), the
//! target is annotated with the hold (`tessera.io/hold-freed`: the replicas before it,
//! its end, `cheapReworkSeconds`; merged with a hold still standing there at its peak);
//! the quota pass rebuilds the serving ClusterQueue's hold from it on every engine it
//! builds (`controller/holds.rs`), so a restart keeps it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use futures::StreamExt;
use tokio::sync::Notify;

use super::cache::{feed, Store};
use super::lease::Elector;
use super::resources::crd_resource;
use super::scaler_metrics::{PollRecord, ScalerMetrics};
use super::serving::{
    HoldRecord, HOLD_FREED_ANNOTATION, PREEMPT_NOT_BEFORE_ANNOTATION, SCALED_UP_AT_ANNOTATION,
};
use super::time::{rfc3339, Millis};
use crate::autoscale::{Coupling, Decision, Observation, Reading, Scaler, ScalerSpec, Settings};
use crate::prometheus::{PromClient, Sample};

/// The InferenceScaler kind and plural.
pub const KIND: &str = "InferenceScaler";
pub const PLURAL: &str = "inferencescalers";

/// Settings of the loop (from flags).
#[derive(Debug, Clone)]
pub struct AutoscalerConfig {
    pub tick: Duration,
    /// Per query, as KEDA's `KEDA_HTTP_DEFAULT_TIMEOUT` (3 s).
    pub query_timeout: Duration,
    pub coupling: Coupling,
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Millis,
    /// Where polls are recorded (the controller's registry; a default one for tests).
    pub metrics: ScalerMetrics,
}

/// One scaler's state between polls.
struct Entry {
    uid: String,
    generation: i64,
    /// `None`: the spec is invalid (reported once per generation).
    scaler: Option<Scaler>,
    next_poll: Millis,
    /// The status last written (not written again while unchanged).
    status: Value,
    last_active: Option<String>,
    /// Triggers whose series the metrics hold.
    triggers: usize,
}

/// The scalers this replica polls.
pub struct Autoscaler {
    client: kube::Client,
    prom: PromClient,
    coupling: Coupling,
    metrics: ScalerMetrics,
    entries: BTreeMap<(String, String), Entry>,
    lags: Vec<Millis>,
    /// Scale targets' resources found through discovery: `(apiVersion, kind)` →
    /// resource (only kinds with a `/scale` subresource; a miss is asked again next poll).
    resources: std::sync::Mutex<BTreeMap<(String, String), ApiResource>>,
}

/// Polls in flight at once (each is a `/scale` GET, a pod LIST and the queries).
pub const CONCURRENT_POLLS: usize = 64;
/// Lags kept between two [`Autoscaler::take_lags`].
const MAX_LAGS: usize = 100_000;

impl Autoscaler {
    pub fn new(client: kube::Client, cfg: &AutoscalerConfig) -> std::io::Result<Autoscaler> {
        Ok(Autoscaler {
            client,
            prom: PromClient::new(cfg.query_timeout)?,
            coupling: cfg.coupling,
            metrics: cfg.metrics.clone(),
            entries: BTreeMap::new(),
            lags: Vec::new(),
            resources: std::sync::Mutex::default(),
        })
    }

    /// Polls the scalers due at `now` among `scalers` (the InferenceScalers as stored),
    /// up to [`CONCURRENT_POLLS`] at once. Returns how many were polled.
    pub async fn tick(&mut self, scalers: &[Value], now: Millis) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        let mut due = Vec::new();
        for value in scalers {
            let Ok(obj) = serde_json::from_value::<DynamicObject>(value.clone()) else {
                continue;
            };
            let key = (
                obj.metadata.namespace.clone().unwrap_or_default(),
                obj.metadata.name.clone().unwrap_or_default(),
            );
            seen.insert(key.clone());
            let uid = obj.metadata.uid.clone().unwrap_or_default();
            let generation = obj.metadata.generation.unwrap_or_default();
            let fresh = self
                .entries
                .get(&key)
                .is_none_or(|e| e.uid != uid || e.generation != generation);
            if fresh {
                if let Some(old) = self.entries.get(&key) {
                    self.metrics.forget(&key.0, &key.1, old.triggers);
                }
                let entry = self.start(&key, &obj, uid, generation, now).await;
                self.entries.insert(key.clone(), entry);
            }
            let is_due = self
                .entries
                .get(&key)
                .is_some_and(|e| e.scaler.is_some() && e.next_poll <= now);
            if is_due {
                if let Some(entry) = self.entries.remove(&key) {
                    due.push((key, obj, entry));
                }
            }
        }
        let metrics = &self.metrics;
        self.entries.retain(|k, e| {
            let keep = seen.contains(k);
            if !keep {
                metrics.forget(&k.0, &k.1, e.triggers);
            }
            keep
        });
        let polled = due.len();
        let started = std::time::Instant::now();
        let this = &*self;
        let done: Vec<_> = futures::stream::iter(due)
            .map(|(key, obj, entry)| async move {
                let lag = now.saturating_sub(entry.next_poll);
                let (entry, mut record) = this.poll(&key, &obj, entry, now).await;
                record.lag = Duration::from_millis(lag);
                this.metrics.record(&key.0, &key.1, &record);
                (key, entry, lag)
            })
            .buffer_unordered(CONCURRENT_POLLS)
            .collect()
            .await;
        let elapsed = started.elapsed().as_millis() as Millis;
        for (key, entry, lag) in done {
            // Lag: how late the poll's decision came after it was due (the tick's own
            // lateness plus the time the tick took, an upper bound per poll).
            if self.lags.len() < MAX_LAGS {
                self.lags.push(lag.saturating_add(elapsed));
            }
            self.entries.insert(key, entry);
        }
        polled
    }

    /// The poll lags recorded since the last call (ms; at most [`MAX_LAGS`]).
    pub fn take_lags(&mut self) -> Vec<Millis> {
        std::mem::take(&mut self.lags)
    }

    /// A new or changed scaler: validated; an invalid one is reported once.
    async fn start(
        &self,
        key: &(String, String),
        obj: &DynamicObject,
        uid: String,
        generation: i64,
        now: Millis,
    ) -> Entry {
        let spec = obj.data.get("spec").cloned().unwrap_or(Value::Null);
        let settings = serde_json::from_value::<ScalerSpec>(spec)
            .map_err(|e| format!("spec: {e}"))
            .and_then(|s| s.validate().map_err(|e| e.to_string()));
        let mut entry = Entry {
            uid,
            generation,
            scaler: None,
            next_poll: 0,
            status: Value::Null,
            last_active: status_str(obj, "lastActiveTime"),
            triggers: 0,
        };
        match settings {
            Ok(settings) => {
                entry.next_poll =
                    now.saturating_add(first_poll_offset(&entry.uid, settings.polling_ms));
                entry.triggers = settings.triggers.len();
                entry.scaler = Some(Scaler::new(settings, self.coupling));
            }
            Err(message) => {
                warn!(scaler = %format!("{}/{}", key.0, key.1), %message, "InferenceScaler invalid; target left as it is");
                self.event(key, &entry.uid, "InvalidSpec", &message).await;
                let status = status_json(
                    &[condition("Ready", false, "InvalidSpec", &message)],
                    None,
                    None,
                    entry.last_active.as_deref(),
                );
                self.write_status(key, &mut entry, status).await;
            }
        }
        entry
    }

    /// One poll of a valid scaler: the entry after it, and what the metrics record.
    async fn poll(
        &self,
        key: &(String, String),
        obj: &DynamicObject,
        mut entry: Entry,
        now: Millis,
    ) -> (Entry, PollRecord) {
        let mut record = PollRecord::default();
        let Some(settings) = entry.scaler.as_ref().map(|s| s.settings().clone()) else {
            return (entry, record);
        };
        entry.next_poll = now.saturating_add(settings.polling_ms);
        let target = match self.read_target(&key.0, obj).await {
            Ok(t) => t,
            Err(message) => {
                record.failed = true;
                let status = status_json(
                    &[condition("Ready", false, "ScaleTargetError", &message)],
                    None,
                    None,
                    entry.last_active.as_deref(),
                );
                if entry.status != status {
                    self.event(key, &entry.uid, "ScaleTargetError", &message)
                        .await;
                }
                self.write_status(key, &mut entry, status).await;
                return (entry, record);
            }
        };
        let (readings, took) = self.read_triggers(&settings).await;
        record.triggers = readings
            .iter()
            .zip(&settings.triggers)
            .zip(took)
            .map(|((r, t), took)| match r {
                Reading::Value(v) => (Some(*v), *v > t.activation_threshold, took),
                Reading::Empty if t.ignore_null_values => (Some(0.0), false, took),
                Reading::Empty | Reading::Failed(_) => (None, false, took),
            })
            .collect();
        record.failed = record.triggers.iter().any(|(v, _, _)| v.is_none());
        let obs = Observation {
            target: target.replicas,
            serving: target.serving,
            readings,
        };
        let Some(decision) = entry.scaler.as_mut().map(|s| s.step(&obs, now)) else {
            return (entry, record);
        };
        record.replicas = Some((target.replicas, decision.replicas, target.serving));
        if decision.active {
            entry.last_active = Some(rfc3339(now));
        }
        if decision.replicas != target.replicas {
            let hold = decision.hold_freed_until.map(|until| HoldRecord {
                replicas: target.replicas,
                until,
                max_rework: settings.cheap_rework_ms,
            });
            self.scale(key, &entry.uid, &target, &decision, hold, now)
                .await;
        }
        let status = status_json(
            &decision_conditions(&decision),
            Some(target.replicas),
            Some(decision.replicas),
            entry.last_active.as_deref(),
        );
        self.write_status(key, &mut entry, status).await;
        (entry, record)
    }

    async fn read_target(&self, ns: &str, obj: &DynamicObject) -> Result<Target, String> {
        let (api_version, kind, name) = target_ref(obj)?;
        let r = (self.scalable_resource(&api_version, &kind).await?, name);
        let name = r.1;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &r.0);
        let scale = api.get_scale(&name).await.map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => format!(
                "{} {name} has no /scale subresource or does not exist",
                r.0.kind
            ),
            e => format!("reading {} {name}/scale: {e}", r.0.kind),
        })?;
        let replicas = scale
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or_default()
            .max(0) as u32;
        let selector = scale.status.as_ref().and_then(|s| s.selector.clone());
        let serving = match selector.filter(|s| !s.is_empty()) {
            Some(sel) => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let list = pods
                    .list(&ListParams::default().labels(&sel))
                    .await
                    .map_err(|e| format!("listing the pods of {} {name}: {e}", r.0.kind))?;
                list.items.iter().filter(|p| serves(p)).count() as u32
            }
            // No selector: every replica counts (nothing to tell waiting ones apart).
            None => replicas,
        };
        Ok(Target {
            resource: r.0,
            name,
            replicas,
            serving,
        })
    }

    /// The resource of `kind` in `api_version`, with its plural as the API server's
    /// discovery document names it (irregular plurals and CRDs included), if it has a
    /// `/scale` subresource; cached once found.
    async fn scalable_resource(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<ApiResource, String> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(r) = self
            .resources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(r.clone());
        }
        let list = if api_version.contains('/') {
            self.client.list_api_group_resources(api_version).await
        } else {
            self.client.list_core_api_resources(api_version).await
        }
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => {
                format!("the API server does not serve {api_version}")
            }
            e => format!("discovering {api_version}: {e}"),
        })?;
        let plural = scalable_plural(&list.resources, kind)
            .map_err(|why| format!("{kind} ({api_version}) {why}"))?;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, &plural);
        self.resources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, resource.clone());
        Ok(resource)
    }

    /// Each trigger's reading and how long its query took.
    async fn read_triggers(&self, settings: &Settings) -> (Vec<Reading>, Vec<Duration>) {
        let mut out = Vec::with_capacity(settings.triggers.len());
        let mut took = Vec::with_capacity(settings.triggers.len());
        for t in &settings.triggers {
            let started = std::time::Instant::now();
            let reading = match self.prom.query_one(&t.server_address, &t.query).await {
                Ok(Sample::Value(v)) => Reading::Value(v),
                Ok(Sample::Empty) => Reading::Empty,
                Err(e) => Reading::Failed(e.to_string()),
            };
            took.push(started.elapsed());
            out.push(reading);
        }
        (out, took)
    }

    /// Sets the target's replicas to the decision's; before a scale-up or a scale-down
    /// coupled with quota, records on the target what the quota pass needs (a failed
    /// write leaves the replicas as they are: the next poll retries).
    async fn scale(
        &self,
        key: &(String, String),
        uid: &str,
        target: &Target,
        decision: &Decision,
        hold: Option<HoldRecord>,
        now: Millis,
    ) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.0, &target.resource);
        if let Some(hold) = hold.filter(|_| decision.replicas < target.replicas) {
            if let Err(e) = record_hold(&api, &target.name, hold, now).await {
                warn!(scaler = %format!("{}/{}", key.0, key.1), error = %e, "recording the scale-down's hold failed; the next poll retries");
                return;
            }
        }
        if decision.replicas > target.replicas && self.coupling == Coupling::Quota {
            // Before the replicas exist: the quota pass reads the window from the owner
            // for the pods this scale-up creates (`serving::preempt_not_before`).
            let window = json!({"metadata": {"annotations": {
                SCALED_UP_AT_ANNOTATION: rfc3339(now),
                PREEMPT_NOT_BEFORE_ANNOTATION: decision.preempt_after.map(rfc3339),
            }}});
            if let Err(e) = api
                .patch(
                    &target.name,
                    &PatchParams::default(),
                    &Patch::Merge(&window),
                )
                .await
            {
                warn!(scaler = %format!("{}/{}", key.0, key.1), error = %e, "recording the scale-up's preemption window failed; the next poll retries");
                return;
            }
        }
        let patch = json!({"spec": {"replicas": decision.replicas}});
        let pp = PatchParams::default();
        match api
            .patch_scale(&target.name, &pp, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let message = format!(
                    "{} {} scaled from {} to {}: {}",
                    target.resource.kind,
                    target.name,
                    target.replicas,
                    decision.replicas,
                    decision.why
                );
                info!(scaler = %format!("{}/{}", key.0, key.1), %message, "scaled");
                let reason = match decision.replicas {
                    0 => "ScaledToZero",
                    _ if target.replicas == 0 => "Activated",
                    _ => "Scaled",
                };
                self.event(key, uid, reason, &message).await;
            }
            Err(e) => {
                warn!(scaler = %format!("{}/{}", key.0, key.1), error = %e, "scaling failed; the next poll retries")
            }
        }
    }

    async fn write_status(&self, key: &(String, String), entry: &mut Entry, status: Value) {
        if entry.status == status {
            return;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.0, &scaler_resource());
        let patch = json!({ "status": status });
        match api
            .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => entry.status = status,
            Err(e) => debug!(error = %e, "InferenceScaler status not written; retried next poll"),
        }
    }

    async fn event(&self, key: &(String, String), uid: &str, reason: &str, message: &str) {
        use k8s_openapi::api::events::v1::Event;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", key.1)),
                namespace: Some(key.0.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some("Scale".into()),
            reason: Some(reason.into()),
            note: Some(message.chars().take(1024).collect()),
            type_: Some(if reason.ends_with("Error") || reason == "InvalidSpec" {
                "Warning".into()
            } else {
                "Normal".into()
            }),
            reporting_controller: Some("tessera.io/autoscaler".into()),
            reporting_instance: Some("tessera-controller".into()),
            regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("tessera.io/v1alpha1".into()),
                kind: Some(KIND.into()),
                name: Some(key.1.clone()),
                namespace: Some(key.0.clone()),
                uid: Some(uid.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.0);
        if let Err(e) = api.create(&Default::default(), &event).await {
            debug!(error = %e, "Event not recorded");
        }
    }
}

/// Annotates target `name` with `hold` ([`HOLD_FREED_ANNOTATION`]), merged with the hold
/// it records if that still stands at `now` (one the quota pass cannot read is
/// replaced, with a warning).
async fn record_hold(
    api: &Api<DynamicObject>,
    name: &str,
    hold: HoldRecord,
    now: Millis,
) -> Result<(), kube::Error> {
    let object = api.get(name).await?;
    let value = serde_json::to_value(&object).unwrap_or_default();
    let earlier = HoldRecord::read(&value).unwrap_or_else(|why| {
        warn!(target = name, %why, "replacing an unreadable hold");
        None
    });
    let hold = hold.merged(earlier, now);
    let patch = json!({"metadata": {"annotations": {HOLD_FREED_ANNOTATION: hold.annotation()}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// When a new scaler is first polled, after `now`: spread over its polling interval by
/// its UID, so a thousand scalers seen at once (a controller start, a failover) are not
/// all polled in the same tick and then again together every interval.
pub fn first_poll_offset(uid: &str, polling_ms: Millis) -> Millis {
    // FNV-1a: stable across runs and replicas, unlike std's RandomState.
    let hash = uid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash % polling_ms.max(1)
}

/// The target as one poll saw it.
struct Target {
    resource: ApiResource,
    name: String,
    replicas: u32,
    serving: u32,
}

/// The InferenceScaler resource.
pub fn scaler_resource() -> ApiResource {
    crd_resource(KIND, PLURAL)
}

/// `spec.scaleTargetRef` as an API resource and a name. Kinds are pluralised the way
/// the API server's discovery does for the built-in ones (`Deployment` → `deployments`);
/// a custom kind with an irregular plural is not found (reported as no `/scale`).
/// `spec.scaleTargetRef`: apiVersion (default `apps/v1`), kind (default `Deployment`)
/// and name.
fn target_ref(obj: &DynamicObject) -> Result<(String, String, String), String> {
    let r = &obj.data["spec"]["scaleTargetRef"];
    let name = r["name"].as_str().unwrap_or_default();
    let api_version = r["apiVersion"].as_str().unwrap_or("apps/v1");
    let kind = r["kind"].as_str().unwrap_or("Deployment");
    let version = api_version.split_once('/').map_or(api_version, |(_, v)| v);
    if name.is_empty() || version.is_empty() || kind.is_empty() {
        return Err("spec.scaleTargetRef: name, apiVersion and kind are needed".into());
    }
    Ok((api_version.to_string(), kind.to_string(), name.to_string()))
}

/// The plural of `kind` in a discovery document's resources, if it has `/scale`.
fn scalable_plural(
    resources: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource],
    kind: &str,
) -> Result<String, String> {
    let plural = resources
        .iter()
        .find(|r| r.kind == kind && !r.name.contains('/'))
        .map(|r| r.name.clone())
        .ok_or_else(|| "is not a kind the API server serves".to_string())?;
    let scale = format!("{plural}/scale");
    if resources.iter().any(|r| r.name == scale) {
        Ok(plural)
    } else {
        Err("has no /scale subresource".into())
    }
}

/// A replica serves once its pod is scheduled, ungated and not terminating.
fn serves(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let scheduled = spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let gated = spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    scheduled && !gated && pod.metadata.deletion_timestamp.is_none()
}

fn status_str(obj: &DynamicObject, field: &str) -> Option<String> {
    obj.data["status"][field].as_str().map(str::to_string)
}

/// A KEDA-style condition.
fn condition(kind: &str, ok: bool, reason: &str, message: &str) -> Value {
    json!({
        "type": kind,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
    })
}

/// KEDA's three conditions for a decision.
fn decision_conditions(d: &Decision) -> Vec<Value> {
    let why = d.why.to_string();
    vec![
        condition(
            "Ready",
            true,
            "ScalerReady",
            "the scaler polls its triggers",
        ),
        condition(
            "Active",
            d.active,
            if d.active {
                "ScalerActive"
            } else {
                "ScalerNotActive"
            },
            &why,
        ),
        condition(
            "Fallback",
            d.fallback,
            if d.fallback {
                "FallbackExists"
            } else {
                "NoFallbackFound"
            },
            &why,
        ),
    ]
}

fn status_json(
    conditions: &[Value],
    current: Option<u32>,
    desired: Option<u32>,
    last_active: Option<&str>,
) -> Value {
    let mut s = json!({ "conditions": conditions });
    if let Some(c) = current {
        s["currentReplicas"] = json!(c);
    }
    if let Some(d) = desired {
        s["desiredReplicas"] = json!(d);
    }
    if let Some(t) = last_active {
        s["lastActiveTime"] = json!(t);
    }
    s
}

/// Runs the loop until `shutdown`, polling only while this replica holds the Lease. The
/// InferenceScalers come from a watch-fed store (one LIST, then WATCH).
pub async fn run(
    client: kube::Client,
    cfg: AutoscalerConfig,
    clock: std::sync::Arc<dyn super::reconciler::Clock>,
    shutdown: CancellationToken,
) -> super::Result<()> {
    let mut autoscaler =
        Autoscaler::new(client.clone(), &cfg).map_err(|source| super::Error::Io {
            what: "the autoscaler's Prometheus client".into(),
            source,
        })?;
    let store = std::sync::Arc::new(Store::new(scaler_resource(), None, true));
    {
        let (client, store, shutdown) = (client.clone(), store.clone(), shutdown.child_token());
        tokio::spawn(async move {
            feed(client, &store, std::sync::Arc::new(Notify::new()), shutdown).await;
        });
    }
    let mut elector = Elector::new(
        client,
        &cfg.lease_namespace,
        &cfg.lease_name,
        &cfg.identity,
        cfg.lease_duration,
    );
    loop {
        let now = clock.now();
        if !elector.tick(now).await {
            // A new leader starts every engine afresh from what the objects say.
            autoscaler.entries.clear();
        } else if store.synced() {
            let polled = autoscaler.tick(&store.values(), now).await;
            if polled > 0 {
                debug!(polled, "autoscaler tick");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(cfg.tick) => {}
        }
    }
    if let Err(e) = elector.release(clock.now()).await {
        warn!(error = %e, "releasing the autoscaler lease");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    #[test]
    fn the_plural_comes_from_discovery_and_needs_a_scale_subresource() {
        let r = |name: &str, kind: &str| APIResource {
            name: name.into(),
            kind: kind.into(),
            ..Default::default()
        };
        let list = [
            r("inferencepolicies", "InferencePolicy"),
            r("inferencepolicies/status", "InferencePolicy"),
            r("inferencepolicies/scale", "Scale"),
            r("daemonsets", "DaemonSet"),
            r("daemonsets/status", "DaemonSet"),
        ];
        assert_eq!(
            scalable_plural(&list, "InferencePolicy").unwrap(),
            "inferencepolicies"
        );
        assert_eq!(
            scalable_plural(&list, "DaemonSet").unwrap_err(),
            "has no /scale subresource"
        );
        assert!(scalable_plural(&list, "Policy").is_err());
    }
}
