//! GPU health for the DRA driver: the backend's [`HealthEvent`]s become
//! (a) the kubelet's `DRAResourceHealth` stream (v1alpha1 and v1beta1), and
//! (b) device taints for the published ResourceSlices.
//!
//! ```text
//! GpuBackend::watch_health ─▶ HealthService::apply ─▶ HealthState (pure, per GPU)
//!                                   │                    │
//!                                   │ change / heartbeat │ taints() ─▶ slices::apply_taints
//!                                   ▼                    ▼            (or Withhold when the
//!            NodeWatchResources: full device list    subscribe()      API server drops them)
//! ```
//!
//! The state is per GPU; every published device of a GPU (whole, MIG placements, vGPU)
//! shares its health. A GPU is `Unhealthy` from the first hardware XID (the ignored
//! application XIDs of [`HealthPolicy`] aside) or uncorrectable ECC error until the backend
//! reports it `Recovered`; every GPU is `Unknown` while the backend's event watch is not
//! running (never started, or its channel closed).
//!
//! The kubelet treats a device whose `last_updated_time` is older than the timeout as
//! Unknown, so the stream re-sends the full list on every change *and* every
//! [`HealthOptions::heartbeat`] with `last_updated_time` = now (the health is
//! re-confirmed continuously while the watch runs); v1beta1 also carries
//! `health_check_timeout_seconds` and a message saying why a device is unhealthy.
//!
//! Taints (key, value, effect): `gpu.tessera.io/xid=<code>` — `NoExecute` for XIDs that
//! mean the GPU or its memory is gone or corrupt ([`NO_EXECUTE_XIDS`]), `NoSchedule` for
//! the rest; `gpu.tessera.io/ecc=uncorrectable:NoExecute`. `timeAdded` is when the fault
//! was first seen, so republishing does not change the slices. Unknown health taints
//! nothing (the driver's own blindness is no reason to evict workloads).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::names::device_gpu;
use super::publish;
use crate::gpu::health::HealthPolicy;
use crate::gpu::{GpuBackend, HealthEvent, Inventory};
use crate::proto::dra_health::{v1alpha1, v1beta1};

/// XIDs after which running work cannot trust the GPU: double-bit ECC (48), ECC page
/// retirement failure (64), fallen off the bus (79), uncontained ECC (95), GSP RPC
/// timeout / error (119, 120), unrecovered ECC (140).
pub const NO_EXECUTE_XIDS: [u64; 7] = [48, 64, 79, 95, 119, 120, 140];
/// Taint keys.
pub const TAINT_XID: &str = "gpu.tessera.io/xid";
pub const TAINT_ECC: &str = "gpu.tessera.io/ecc";
pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// What made a GPU unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Xid(u64),
    EccUncorrectable(u64),
}

impl Cause {
    fn no_execute(self) -> bool {
        match self {
            Cause::Xid(x) => NO_EXECUTE_XIDS.contains(&x),
            Cause::EccUncorrectable(_) => true,
        }
    }

    fn describe(self) -> String {
        match self {
            Cause::Xid(x) => format!("XID {x}"),
            Cause::EccUncorrectable(n) => format!("{n} uncorrectable ECC errors"),
        }
    }
}

/// A GPU's current fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub cause: Cause,
    /// When the fault (or the worse one that replaced it) was first seen.
    pub since: SystemTime,
}

/// Health of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuHealth {
    Healthy,
    Unhealthy(Fault),
    Unknown,
}

/// Per-GPU health, event by event. Pure.
#[derive(Debug, Clone, Default)]
pub struct HealthState {
    policy: HealthPolicy,
    faults: BTreeMap<String, Fault>,
    watching: bool,
}

impl HealthState {
    pub fn new(policy: HealthPolicy) -> Self {
        Self {
            policy,
            ..Default::default()
        }
    }

    /// Use `policy` for the events to come (faults already seen stay).
    pub fn set_policy(&mut self, policy: HealthPolicy) {
        self.policy = policy;
    }

    /// Apply one event seen at `at`; true if any GPU's health changed.
    pub fn apply(&mut self, event: &HealthEvent, at: SystemTime) -> bool {
        let uuid = event.gpu_uuid().to_string();
        let cause = match *event {
            HealthEvent::Xid { xid, .. } if self.policy.ignored_xids.contains(&xid) => {
                return false
            }
            HealthEvent::Xid { xid, .. } => Cause::Xid(xid),
            HealthEvent::EccUncorrectable { count, .. } => Cause::EccUncorrectable(count),
            HealthEvent::Recovered { .. } => return self.faults.remove(&uuid).is_some(),
        };
        match self.faults.get(&uuid) {
            // A second fault changes nothing unless it is worse (NoSchedule → NoExecute).
            Some(f) if f.cause.no_execute() || !cause.no_execute() => false,
            _ => {
                self.faults.insert(uuid, Fault { cause, since: at });
                true
            }
        }
    }

    /// Whether the backend's event watch runs; true if that changed.
    pub fn set_watching(&mut self, watching: bool) -> bool {
        std::mem::replace(&mut self.watching, watching) != watching
    }

    pub fn gpu(&self, uuid: &str) -> GpuHealth {
        if !self.watching {
            return GpuHealth::Unknown;
        }
        match self.faults.get(uuid) {
            Some(f) => GpuHealth::Unhealthy(*f),
            None => GpuHealth::Healthy,
        }
    }

    /// The device taints per GPU UUID (unhealthy GPUs only).
    pub fn taints(&self) -> BTreeMap<String, Vec<DeviceTaint>> {
        self.faults
            .iter()
            .map(|(uuid, f)| (uuid.clone(), vec![taint(f)]))
            .collect()
    }
}

fn taint(f: &Fault) -> DeviceTaint {
    let (key, value) = match f.cause {
        Cause::Xid(x) => (TAINT_XID, x.to_string()),
        Cause::EccUncorrectable(_) => (TAINT_ECC, "uncorrectable".to_string()),
    };
    DeviceTaint {
        key: key.to_string(),
        value: Some(value),
        effect: if f.cause.no_execute() {
            NO_EXECUTE
        } else {
            NO_SCHEDULE
        }
        .to_string(),
        time_added: Some(time(f.since)),
    }
}

/// A `metav1.Time` (whole seconds, as the API stores it).
fn time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
}

/// How unhealthy GPUs show in the ResourceSlices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaintMode {
    /// Devices carry taints (the API server has DRADeviceTaints on).
    #[default]
    Taint,
    /// The API server drops taints (gate off): unhealthy GPUs' devices are left out of the
    /// slices instead, so they cannot be allocated.
    Withhold,
}

impl TaintMode {
    /// The mode to fall back to after a publish error: [`TaintMode::Withhold`] when the API
    /// server dropped the taints (DRADeviceTaints off), logged with the gate's name.
    pub fn after_publish_error(self, e: &publish::Error) -> TaintMode {
        match e {
            publish::Error::FieldDropped { gate, field, .. } if *gate == "DRADeviceTaints" => {
                if self == TaintMode::Taint {
                    warn!(%field, "the API server dropped device taints: the feature gate DRADeviceTaints is off; unhealthy GPUs are withheld from the ResourceSlices instead");
                }
                TaintMode::Withhold
            }
            _ => self,
        }
    }
}

/// A published device and the GPU it lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRef {
    pub pool: String,
    pub device: String,
    pub gpu_uuid: String,
}

/// Every device of `slices` with its GPU (devices of unknown GPUs are skipped).
pub fn devices_from_slices(slices: &[ResourceSlice], inventory: &Inventory) -> Vec<DeviceRef> {
    slices
        .iter()
        .flat_map(|s| {
            s.spec
                .devices
                .iter()
                .flatten()
                .map(move |d| (s.spec.pool.name.clone(), d))
        })
        .filter_map(|(pool, d)| {
            device_gpu(&d.name, inventory).map(|g| DeviceRef {
                pool,
                device: d.name.clone(),
                gpu_uuid: g.uuid.clone(),
            })
        })
        .collect()
}

/// One device's entry of a health report (API-version neutral).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    pub pool: String,
    pub device: String,
    pub health: GpuHealth,
    /// Unix seconds.
    pub last_updated: i64,
    pub message: String,
}

/// The full report for `devices` at `now`. Pure.
pub fn report(devices: &[DeviceRef], state: &HealthState, now: SystemTime) -> Vec<DeviceReport> {
    let now_secs = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    devices
        .iter()
        .map(|d| {
            let health = state.gpu(&d.gpu_uuid);
            let message = match health {
                GpuHealth::Healthy => String::new(),
                GpuHealth::Unknown => "GPU health events are not being watched".to_string(),
                GpuHealth::Unhealthy(f) => {
                    let t = taint(&f);
                    format!(
                        "GPU {}: {} (taint {}={}:{})",
                        d.gpu_uuid,
                        f.cause.describe(),
                        t.key,
                        t.value.unwrap_or_default(),
                        t.effect
                    )
                }
            };
            DeviceReport {
                pool: d.pool.clone(),
                device: d.device.clone(),
                health,
                last_updated: now_secs,
                message,
            }
        })
        .collect()
}

/// Stream cadence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthOptions {
    /// `health_check_timeout_seconds` sent to v1beta1 kubelets.
    pub timeout: Duration,
    /// Full list re-sent at least this often (keep well below `timeout`).
    pub heartbeat: Duration,
}

impl Default for HealthOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            heartbeat: Duration::from_secs(20),
        }
    }
}

struct Inner {
    state: HealthState,
    devices: Vec<DeviceRef>,
}

/// The real `DRAResourceHealth` service (both versions) and the source of device taints.
/// Cheap to clone; every clone shares the state.
#[derive(Clone)]
pub struct HealthService {
    inner: Arc<Mutex<Inner>>,
    changed: watch::Sender<u64>,
    options: HealthOptions,
    closed: CancellationToken,
}

impl HealthService {
    pub fn new(options: HealthOptions, policy: HealthPolicy) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                state: HealthState::new(policy),
                devices: Vec::new(),
            })),
            changed: watch::channel(0).0,
            options,
            closed: CancellationToken::new(),
        }
    }

    /// End every open `NodeWatchResources` stream (at shutdown: a gRPC server's graceful
    /// shutdown waits for open streams, and these never end on their own).
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// The same service (devices, state, changes) whose streams [`Self::close`] ends
    /// without ending the streams of `self` or of other sessions; closing `self` ends
    /// them too. For a server that stops while the service lives on (the DRA driver
    /// withdrawing from the kubelet).
    pub fn session(&self) -> Self {
        Self {
            closed: self.closed.child_token(),
            ..self.clone()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every critical section is a plain assignment: a poisoned lock is still sound.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The devices to report (e.g. [`devices_from_slices`] of what is published).
    pub fn set_devices(&self, devices: Vec<DeviceRef>) {
        let changed = {
            let mut inner = self.lock();
            std::mem::replace(&mut inner.devices, devices) != inner.devices
        };
        if changed {
            self.bump();
        }
    }

    /// Apply a backend event now.
    pub fn apply(&self, event: &HealthEvent) {
        if self.lock().state.apply(event, SystemTime::now()) {
            info!(?event, "GPU health changed");
            self.bump();
        }
    }

    /// See [`HealthState::set_policy`].
    pub fn set_policy(&self, policy: HealthPolicy) {
        self.lock().state.set_policy(policy);
    }

    pub fn set_watching(&self, watching: bool) {
        if self.lock().state.set_watching(watching) {
            self.bump();
        }
    }

    /// A copy of the current state (for taints).
    pub fn state(&self) -> HealthState {
        self.lock().state.clone()
    }

    /// Changes (health or devices): wakes on every change, e.g. to republish slices.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The report as of now.
    pub fn report(&self) -> Vec<DeviceReport> {
        let inner = self.lock();
        report(&inner.devices, &inner.state, SystemTime::now())
    }

    /// Feed the backend's health events into this service until `cancel`. A watch that
    /// ends or cannot start is restarted with backoff ([`crate::gpu::watch`]); while none
    /// runs every device is Unknown (and stays published).
    pub async fn run(
        &self,
        backend: Arc<dyn GpuBackend>,
        cancel: CancellationToken,
    ) -> crate::gpu::Result<()> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let svc = self.clone();
        let watch = tokio::spawn(crate::gpu::watch::keep_watching(
            backend,
            tx,
            crate::gpu::watch::Backoff::default(),
            move |state| {
                let running = state == crate::gpu::watch::WatchState::Running;
                if !running {
                    warn!("no GPU health watch; devices are Unknown until it is back");
                }
                svc.set_watching(running);
            },
            cancel.clone(),
        ));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                event = rx.recv() => match event {
                    Some(e) => self.apply(&e),
                    None => break,
                },
            }
        }
        watch.abort();
        self.set_watching(false);
        Ok(())
    }

    /// The full report now, then again on every change and every heartbeat.
    fn stream<T: Send + 'static>(
        &self,
        convert: fn(&[DeviceReport], &HealthOptions) -> T,
    ) -> HealthStream<T> {
        let rx = self.changed.subscribe();
        let state = (self.clone(), rx, true);
        Box::pin(futures::stream::unfold(
            state,
            move |(svc, mut rx, first)| async move {
                if svc.closed.is_cancelled() {
                    return None;
                }
                if !first {
                    tokio::select! {
                        _ = svc.closed.cancelled() => return None,
                        changed = rx.changed() => if changed.is_err() { return None },
                        _ = tokio::time::sleep(svc.options.heartbeat) => {}
                    }
                }
                rx.borrow_and_update();
                let item = convert(&svc.report(), &svc.options);
                Some((Ok(item), (svc, rx, false)))
            },
        ))
    }
}

type HealthStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn alpha(reports: &[DeviceReport], _: &HealthOptions) -> v1alpha1::NodeWatchResourcesResponse {
    v1alpha1::NodeWatchResourcesResponse {
        devices: reports
            .iter()
            .map(|r| v1alpha1::DeviceHealth {
                device: Some(v1alpha1::DeviceIdentifier {
                    pool_name: r.pool.clone(),
                    device_name: r.device.clone(),
                }),
                health: match r.health {
                    GpuHealth::Healthy => v1alpha1::HealthStatus::Healthy,
                    GpuHealth::Unhealthy(_) => v1alpha1::HealthStatus::Unhealthy,
                    GpuHealth::Unknown => v1alpha1::HealthStatus::Unknown,
                } as i32,
                last_updated_time: r.last_updated,
            })
            .collect(),
    }
}

/// The proto caps the message at 1024 characters.
fn cap(s: &str) -> String {
    s.chars().take(1024).collect()
}

fn beta(reports: &[DeviceReport], o: &HealthOptions) -> v1beta1::NodeWatchResourcesResponse {
    v1beta1::NodeWatchResourcesResponse {
        devices: reports
            .iter()
            .map(|r| v1beta1::DeviceHealth {
                device: Some(v1beta1::DeviceIdentifier {
                    pool_name: r.pool.clone(),
                    device_name: r.device.clone(),
                }),
                health: match r.health {
                    GpuHealth::Healthy => v1beta1::HealthStatus::Healthy,
                    GpuHealth::Unhealthy(_) => v1beta1::HealthStatus::Unhealthy,
                    GpuHealth::Unknown => v1beta1::HealthStatus::Unknown,
                } as i32,
                last_updated_time: r.last_updated,
                health_check_timeout_seconds: o.timeout.as_secs() as i64,
                message: cap(&r.message),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.stream(alpha)))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream<v1beta1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _request: Request<v1beta1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.stream(beta)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(x: u64) -> HealthEvent {
        HealthEvent::Xid {
            gpu_uuid: "GPU-a".into(),
            xid: x,
        }
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn faults_escalate_and_recover() {
        let mut s = HealthState::default();
        assert_eq!(s.gpu("GPU-a"), GpuHealth::Unknown, "not watching yet");
        assert!(s.set_watching(true));
        assert_eq!(s.gpu("GPU-a"), GpuHealth::Healthy);
        // (event, changed, taint (key, value, effect) afterwards)
        /// (key, value, effect)
        type Want<'a> = Option<(&'a str, &'a str, &'a str)>;
        let table: Vec<(HealthEvent, bool, Want)> = vec![
            (xid(13), false, None),
            (xid(74), true, Some((TAINT_XID, "74", NO_SCHEDULE))),
            (xid(92), false, Some((TAINT_XID, "74", NO_SCHEDULE))),
            (xid(79), true, Some((TAINT_XID, "79", NO_EXECUTE))),
            (
                HealthEvent::EccUncorrectable {
                    gpu_uuid: "GPU-a".into(),
                    count: 2,
                },
                false,
                Some((TAINT_XID, "79", NO_EXECUTE)),
            ),
            (
                HealthEvent::Recovered {
                    gpu_uuid: "GPU-a".into(),
                },
                true,
                None,
            ),
        ];
        for (i, (event, changed, want)) in table.into_iter().enumerate() {
            assert_eq!(s.apply(&event, at(100 + i as u64)), changed, "{event:?}");
            let taints = s.taints();
            let got = taints.get("GPU-a").map(|t| &t[0]);
            match want {
                None => assert!(got.is_none(), "{event:?}: {got:?}"),
                Some((k, v, e)) => {
                    let t = got.unwrap();
                    assert_eq!(
                        (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
                        (k, Some(v), e),
                        "{event:?}"
                    );
                }
            }
        }
        let ecc = HealthEvent::EccUncorrectable {
            gpu_uuid: "GPU-b".into(),
            count: 1,
        };
        assert!(s.apply(&ecc, at(500)));
        let t = &s.taints()["GPU-b"][0];
        assert_eq!((t.key.as_str(), t.effect.as_str()), (TAINT_ECC, NO_EXECUTE));
        assert_eq!(t.time_added, Some(time(at(500))));
        assert!(s.set_watching(false));
        assert_eq!(s.gpu("GPU-b"), GpuHealth::Unknown);
    }

    #[test]
    fn reports_every_device_with_its_gpus_health() {
        let devices = vec![
            DeviceRef {
                pool: "n".into(),
                device: "gpu-0".into(),
                gpu_uuid: "GPU-a".into(),
            },
            DeviceRef {
                pool: "n".into(),
                device: "gpu-1-mig-1g-10gb-0".into(),
                gpu_uuid: "GPU-b".into(),
            },
        ];
        let mut s = HealthState::default();
        s.set_watching(true);
        s.apply(
            &HealthEvent::Xid {
                gpu_uuid: "GPU-b".into(),
                xid: 48,
            },
            at(10),
        );
        let r = report(&devices, &s, at(99));
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].health, GpuHealth::Healthy);
        assert_eq!(r[1].last_updated, 99, "re-confirmed now, not when it broke");
        assert!(r[1].message.contains("XID 48") && r[1].message.contains("NoExecute"));
        let b = beta(&r, &HealthOptions::default());
        assert_eq!(b.devices[0].health_check_timeout_seconds, 60);
        assert_eq!(b.devices[1].health, v1beta1::HealthStatus::Unhealthy as i32);
        let a = alpha(&r, &HealthOptions::default());
        assert_eq!(
            a.devices[1].health,
            v1alpha1::HealthStatus::Unhealthy as i32
        );
        assert_eq!(cap(&"x".repeat(2000)).len(), 1024);
    }

    #[test]
    fn taints_dropped_by_the_api_server_switch_to_withholding() {
        let dropped = publish::Error::FieldDropped {
            slice: "s".into(),
            field: "spec.devices.*.taints".into(),
            gate: "DRADeviceTaints",
        };
        assert_eq!(
            TaintMode::Taint.after_publish_error(&dropped),
            TaintMode::Withhold
        );
        let other = publish::Error::FieldDropped {
            slice: "s".into(),
            field: "spec.sharedCounters".into(),
            gate: "DRAPartitionableDevices",
        };
        assert_eq!(
            TaintMode::Taint.after_publish_error(&other),
            TaintMode::Taint
        );
    }
}
