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
//! Scalers are listed every tick (`--autoscaler-tick`, 1 s); a scaler whose generation
//! changes starts a fresh engine. Only the holder of its own Lease
//! (`<lease-name>-autoscaler`) polls, so two replicas never scale the same target.
//!
//! Not done here yet: a scale-up's `preempt_after` (the engine's anti-flapping window
//! for preemptions) is not handed to the quota pass, so live scale-ups may preempt at
//! once; `tessera plan` and `tessera simulate fleet` apply it.

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

use super::lease::Elector;
use super::resources::crd_resource;
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
}

/// The scalers this replica polls.
pub struct Autoscaler {
    client: kube::Client,
    prom: PromClient,
    coupling: Coupling,
    entries: BTreeMap<(String, String), Entry>,
}

impl Autoscaler {
    pub fn new(client: kube::Client, cfg: &AutoscalerConfig) -> std::io::Result<Autoscaler> {
        Ok(Autoscaler {
            client,
            prom: PromClient::new(cfg.query_timeout)?,
            coupling: cfg.coupling,
            entries: BTreeMap::new(),
        })
    }

    /// Lists the scalers and polls those due at `now`. Returns how many were polled.
    pub async fn tick(&mut self, now: Millis) -> Result<usize, kube::Error> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &scaler_resource());
        let list = api.list(&ListParams::default()).await?;
        let mut seen = std::collections::BTreeSet::new();
        let mut polled = 0;
        for obj in list.items {
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
                let entry = self.start(&key, &obj, uid, generation).await;
                self.entries.insert(key.clone(), entry);
            }
            let due = self
                .entries
                .get(&key)
                .is_some_and(|e| e.scaler.is_some() && e.next_poll <= now);
            if due {
                self.poll(&key, &obj, now).await;
                polled += 1;
            }
        }
        self.entries.retain(|k, _| seen.contains(k));
        Ok(polled)
    }

    /// A new or changed scaler: validated; an invalid one is reported once.
    async fn start(
        &self,
        key: &(String, String),
        obj: &DynamicObject,
        uid: String,
        generation: i64,
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
        };
        match settings {
            Ok(settings) => entry.scaler = Some(Scaler::new(settings, self.coupling)),
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

    async fn poll(&mut self, key: &(String, String), obj: &DynamicObject, now: Millis) {
        let Some(mut entry) = self.entries.remove(key) else {
            return;
        };
        let Some(settings) = entry.scaler.as_ref().map(|s| s.settings().clone()) else {
            self.entries.insert(key.clone(), entry);
            return;
        };
        entry.next_poll = now.saturating_add(settings.polling_ms);
        let target = match self.read_target(&key.0, obj).await {
            Ok(t) => t,
            Err(message) => {
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
                self.entries.insert(key.clone(), entry);
                return;
            }
        };
        let readings = self.read_triggers(&settings).await;
        let obs = Observation {
            target: target.replicas,
            serving: target.serving,
            readings,
        };
        let decision = match entry.scaler.as_mut() {
            Some(scaler) => scaler.step(&obs, now),
            None => return,
        };
        if decision.active {
            entry.last_active = Some(rfc3339(now));
        }
        if decision.replicas != target.replicas {
            self.scale(key, &entry.uid, &target, &decision).await;
        }
        let status = status_json(
            &decision_conditions(&decision),
            Some(target.replicas),
            Some(decision.replicas),
            entry.last_active.as_deref(),
        );
        self.write_status(key, &mut entry, status).await;
        self.entries.insert(key.clone(), entry);
    }

    async fn read_target(&self, ns: &str, obj: &DynamicObject) -> Result<Target, String> {
        let r = target_resource(obj)?;
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

    async fn read_triggers(&self, settings: &Settings) -> Vec<Reading> {
        let mut out = Vec::with_capacity(settings.triggers.len());
        for t in &settings.triggers {
            let reading = match self.prom.query_one(&t.server_address, &t.query).await {
                Ok(Sample::Value(v)) => Reading::Value(v),
                Ok(Sample::Empty) => Reading::Empty,
                Err(e) => Reading::Failed(e.to_string()),
            };
            out.push(reading);
        }
        out
    }

    async fn scale(&self, key: &(String, String), uid: &str, target: &Target, decision: &Decision) {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.0, &target.resource);
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
fn target_resource(obj: &DynamicObject) -> Result<(ApiResource, String), String> {
    let r = &obj.data["spec"]["scaleTargetRef"];
    let name = r["name"].as_str().unwrap_or_default().to_string();
    let api_version = r["apiVersion"].as_str().unwrap_or("apps/v1");
    let kind = r["kind"].as_str().unwrap_or("Deployment");
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if name.is_empty() || version.is_empty() || kind.is_empty() {
        return Err("spec.scaleTargetRef: name, apiVersion and kind are needed".into());
    }
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = format!("{}s", kind.to_ascii_lowercase());
    Ok((ApiResource::from_gvk_with_plural(&gvk, &plural), name))
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

/// Runs the loop until `shutdown`, polling only while this replica holds the Lease.
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
    let mut elector = Elector::new(
        client,
        &cfg.lease_namespace,
        &cfg.lease_name,
        &cfg.identity,
        cfg.lease_duration,
    );
    let mut failing = false;
    loop {
        let now = clock.now();
        if elector.tick(now).await {
            match autoscaler.tick(now).await {
                Ok(n) => {
                    failing = false;
                    if n > 0 {
                        debug!(polled = n, "autoscaler tick");
                    }
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "listing InferenceScalers failed; retrying");
                    }
                    failing = true;
                }
            }
        } else {
            // A new leader starts every engine afresh from what the objects say.
            autoscaler.entries.clear();
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
