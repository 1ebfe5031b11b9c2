//! The usage sampler: every `--usage-interval` it reads who holds what and how busy the
//! GPUs are, sets the allocated-vs-used gauges and charges the chargeback counters.
//!
//! ```text
//! tick ─▶ PodResources List ──────────┐ (fails: keep the last gauges, charge nothing,
//!      ─▶ backend.usage(), inventory ─┤  warn once per failure streak)
//!      ─▶ checkpoint + shim files ────┼─▶ usage::tick (pure) ─▶ publish: gauges set,
//!      ─▶ pod labels (API, cached) ───┘   vanished series removed, chargeback charged;
//!                                         series gone > --chargeback-forget-after forgotten
//! ```
//!
//! A tick charges the seconds since the previous tick (the first charges nothing): a
//! tick whose PodResources call fails loses its interval rather than charging holders it
//! could not see.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::usage::{
    self, ClaimDevice, ClaimHolder, ClaimTarget, ClaimUnit, ContainerLabels, DraClaim, GpuLabels,
    PodLabels, Sample, Seen, Streak, Tick,
};
use super::{hami, NodeMetrics};
use crate::deviceplugin::snapshot::SharedSnapshot;
use crate::dra::checkpoint::{self, Phase, PreparedClaim, Store};
use crate::dra::names::{parse_device_name, DeviceKind};
use crate::dra::prepare::claim_dir_id;
use crate::gpu::{GpuBackend, GpuUsage, Inventory};
use crate::proto::podresources as pr;
use crate::shimfiles::{self, AllocDirs};

/// How long a pod's labels are trusted before they are read again.
const LABELS_TTL: Duration = Duration::from_secs(300);
/// A pod GET slower than this is given up (labels empty until the next try).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the sampler needs.
#[derive(Clone)]
pub struct SamplerSettings {
    pub node_name: String,
    /// `--usage-interval`; zero turns the sampler off.
    pub interval: Duration,
    /// `--chargeback-forget-after`.
    pub forget_after: Duration,
    /// `--team-label`.
    pub team_label: String,
    pub pod_resources_socket: PathBuf,
    /// The kubelet's device checkpoint (which allocation directory is which container's).
    pub kubelet_checkpoint: PathBuf,
    pub alloc_dirs: AllocDirs,
    /// Reads pod labels; `None` (no API access): queue and team are empty.
    pub client: Option<kube::Client>,
    /// `--proc-root`: where each GPU process's `<pid>/cgroup` names its pod.
    pub proc_root: PathBuf,
}

impl SamplerSettings {
    /// The DRA driver's checkpoint directory: `<state-dir>/dra`, beside the vGPU
    /// allocation directories (`<state-dir>/vgpu`), as `tessera node` lays them out.
    pub fn dra_checkpoint_dir(&self) -> Option<PathBuf> {
        self.alloc_dirs.root.parent().map(|state| state.join("dra"))
    }

    /// The kubelet DRA manager's checkpoint (which pods run with each claim):
    /// `dra_manager_state` in the kubelet's directory, the one holding `device-plugins/`
    /// where [`SamplerSettings::kubelet_checkpoint`] is.
    pub fn kubelet_dra_state(&self) -> Option<PathBuf> {
        let kubelet_dir = self.kubelet_checkpoint.parent()?.parent()?;
        Some(kubelet_dir.join(crate::agent::vgpu_guard::KUBELET_DRA_STATE))
    }
}

impl std::fmt::Debug for SamplerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SamplerSettings")
            .field("node_name", &self.node_name)
            .field("interval", &self.interval)
            .field("forget_after", &self.forget_after)
            .field("team_label", &self.team_label)
            .field("pod_resources_socket", &self.pod_resources_socket)
            .finish_non_exhaustive()
    }
}

/// The series the last published tick set, to remove those a new tick lacks.
#[derive(Debug, Default)]
pub struct Published {
    gpus: BTreeSet<GpuLabels>,
    containers: BTreeSet<ContainerLabels>,
    hami_hosts: BTreeSet<hami::HostLabels>,
    hami_vgpus: BTreeSet<hami::VgpuLabels>,
    seen: Seen,
}

/// Sets the gauges of `tick` (removing the series the previous tick had and this one
/// lacks), charges its chargeback increments, and forgets the chargeback series not
/// charged for longer than `forget_after` (`now`: a monotonic offset).
pub fn publish(
    metrics: &NodeMetrics,
    tick: &Tick,
    published: &mut Published,
    now: Duration,
    forget_after: Duration,
) {
    let mut gpus = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for g in &tick.gpus {
        metrics
            .gpu_memory_used
            .get_or_create(&g.labels)
            .set(g.memory_used_bytes);
        metrics
            .gpu_memory_total
            .get_or_create(&g.labels)
            .set(g.memory_total_bytes);
        match g.utilization_ratio {
            Some(r) => {
                metrics.gpu_utilization.get_or_create(&g.labels).set(r);
            }
            None => {
                metrics.gpu_utilization.remove(&g.labels);
            }
        }
        if let Some(h) = &metrics.hami {
            let labels = hami::host_labels(g);
            h.host_memory
                .get_or_create(&labels)
                .set(g.memory_used_bytes);
            h.host_core
                .get_or_create(&labels)
                .set(g.utilization_ratio.unwrap_or(0.0) * 100.0);
            hosts.insert(labels);
        }
        gpus.insert(g.labels.clone());
    }
    for gone in usage::vanished(&published.gpus, &gpus) {
        metrics.gpu_memory_used.remove(&gone);
        metrics.gpu_memory_total.remove(&gone);
        metrics.gpu_utilization.remove(&gone);
    }
    let mut containers = BTreeSet::new();
    let mut vgpus = BTreeSet::new();
    for c in &tick.containers {
        let l = &c.labels;
        metrics
            .container_allocated_share
            .get_or_create(l)
            .set(c.allocated_share);
        set_or_remove(&metrics.container_busy, l, c.busy);
        set_or_remove(&metrics.container_memory_used, l, c.memory_used_bytes);
        set_or_remove(&metrics.container_memory_limit, l, c.memory_limit_bytes);
        if let (Some(h), Some(labels)) = (&metrics.hami, hami::vgpu_labels(c)) {
            h.vgpu_used
                .get_or_create(&labels)
                .set(c.memory_used_bytes.unwrap_or(0.0));
            h.vgpu_limit
                .get_or_create(&labels)
                .set(c.memory_limit_bytes.unwrap_or(0.0));
            vgpus.insert(labels);
        }
        containers.insert(l.clone());
    }
    for gone in usage::vanished(&published.containers, &containers) {
        metrics.container_allocated_share.remove(&gone);
        metrics.container_busy.remove(&gone);
        metrics.container_memory_used.remove(&gone);
        metrics.container_memory_limit.remove(&gone);
    }
    if let Some(h) = &metrics.hami {
        for gone in usage::vanished(&published.hami_hosts, &hosts) {
            h.host_memory.remove(&gone);
            h.host_core.remove(&gone);
        }
        for gone in usage::vanished(&published.hami_vgpus, &vgpus) {
            h.vgpu_used.remove(&gone);
            h.vgpu_limit.remove(&gone);
        }
    }
    for c in &tick.charges {
        metrics
            .chargeback
            .charge(&c.labels, c.share, c.busy, c.seconds);
    }
    published
        .seen
        .observe(tick.charges.iter().map(|c| &c.labels), now);
    for gone in published.seen.expired(now, forget_after) {
        debug!(pod = %gone.pod, container = %gone.container, gpu = %gone.gpu,
               "chargeback series forgotten");
        metrics.chargeback.forget(&gone);
    }
    published.gpus = gpus;
    published.containers = containers;
    published.hami_hosts = hosts;
    published.hami_vgpus = vgpus;
}

fn set_or_remove(
    family: &prometheus_client::metrics::family::Family<ContainerLabels, super::F64Gauge>,
    labels: &ContainerLabels,
    value: Option<f64>,
) {
    match value {
        Some(v) => {
            family.get_or_create(labels).set(v);
        }
        None => {
            family.remove(labels);
        }
    }
}

/// What the blocking reads of one tick return.
struct Local {
    inventory: Inventory,
    usage: Vec<GpuUsage>,
    vgpu: Vec<usage::VgpuAccounting>,
    claims: Vec<DraClaim>,
    /// The kubelet's device checkpoint entries (pod UID, container, device IDs), every
    /// mode's.
    allocations: Vec<shimfiles::CheckpointAllocation>,
    /// The pod UID of each process the driver lists on a GPU.
    process_pods: BTreeMap<u32, String>,
    /// The kubelet's DRA state: claim UID → the UIDs of the pods running with it (read
    /// only while the driver has claims prepared).
    claim_pods: BTreeMap<String, BTreeSet<String>>,
    problems: Vec<String>,
}

/// The containers' claims of Tessera's DRA driver in a PodResources answer (the kubelet
/// lists them with its `KubeletPodResourcesDynamicResources` feature gate on).
pub fn claim_holders_of(answer: &pr::ListPodResourcesResponse) -> Vec<ClaimHolder> {
    let mut out = Vec::new();
    for pod in &answer.pod_resources {
        for c in &pod.containers {
            for claim in &c.dynamic_resources {
                let devices: Vec<String> = claim
                    .claim_resources
                    .iter()
                    .filter(|r| r.driver_name == crate::dra::names::DRIVER)
                    .map(|r| r.device_name.clone())
                    .collect();
                if devices.is_empty() {
                    continue;
                }
                out.push(ClaimHolder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                    claim_namespace: claim.claim_namespace.clone(),
                    claim_name: claim.claim_name.clone(),
                    devices,
                });
            }
        }
    }
    out
}

/// A prepared claim's record as the usage tick sees it: each device's target (its name
/// parsed, a MIG device from the instance the claim created) and the vGPU files of its
/// directory. A device whose name does not parse is left out and reported.
pub fn dra_claim(
    uid: &str,
    record: &PreparedClaim,
    dirs: &AllocDirs,
    problems: &mut Vec<String>,
) -> DraClaim {
    let mut devices = Vec::new();
    for d in &record.devices {
        let target = match (parse_device_name(&d.device), &d.mig) {
            (_, Some(m)) => ClaimTarget::Mig {
                gpu_uuid: m.gpu_uuid.clone(),
                profile: m.profile.clone(),
                start: m.start,
            },
            (Some(DeviceKind::Whole { gpu }), None) => ClaimTarget::Gpu { index: gpu },
            (Some(DeviceKind::Vgpu { gpu }), None) => ClaimTarget::Vgpu { index: gpu },
            (Some(DeviceKind::Mig { .. }) | None, None) => {
                problems.push(format!(
                    "DRA claim {}/{} ({uid}): device {} is not one the driver prepares",
                    record.namespace, record.name, d.device
                ));
                continue;
            }
        };
        devices.push(ClaimDevice {
            name: d.device.clone(),
            target,
            time_sliced: d.time_slice.is_some(),
        });
    }
    let id = claim_dir_id(uid);
    let units = match dirs.read_units(&id) {
        Ok(units) => units.map(|units| {
            units
                .into_iter()
                .map(|u| ClaimUnit {
                    index: u.index,
                    gpu: u.gpu,
                    memory_mib: u.memory_mib,
                    cores: u.cores,
                })
                .collect()
        }),
        // A UID no directory can be named after has no vGPU files.
        Err(shimfiles::Error::BadId(_)) => None,
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    let used_bytes = match units {
        Some(_) => {
            let file = dirs.accounting_dir(&id).join(shimfiles::ACCOUNTING_FILE);
            shimfiles::read_accounting(&file)
                .map(|t| t.map(|t| t.to_vec()))
                .unwrap_or_else(|e| {
                    problems.push(e.to_string());
                    None
                })
        }
        None => None,
    };
    DraClaim {
        uid: uid.to_string(),
        namespace: record.namespace.clone(),
        name: record.name.clone(),
        devices,
        units,
        used_bytes,
    }
}

/// The claims the DRA driver holds as prepared, from its checkpoint in `dir` (read
/// without its lock; a missing checkpoint is no claims).
fn read_claims(
    dir: &std::path::Path,
    dirs: &AllocDirs,
    problems: &mut Vec<String>,
) -> Vec<DraClaim> {
    let data = match Store::new(dir).read() {
        Ok(data) => data,
        Err(e) => {
            problems.push(e.to_string());
            return Vec::new();
        }
    };
    dra_claims(&data, dirs, problems)
}

/// [`dra_claim`] of every `Completed` claim in `data`.
pub fn dra_claims(
    data: &checkpoint::Data,
    dirs: &AllocDirs,
    problems: &mut Vec<String>,
) -> Vec<DraClaim> {
    data.claims
        .iter()
        .filter(|(_, c)| c.phase == Phase::Completed)
        .map(|(uid, c)| dra_claim(uid, c, dirs, problems))
        .collect()
}

/// Inventory, usage, the vGPU containers' files and the DRA claims (blocking: NVML and
/// the file system).
fn read_local(
    backend: &dyn GpuBackend,
    checkpoint: &std::path::Path,
    dirs: &AllocDirs,
    dra_dir: Option<&std::path::Path>,
    kubelet_dra_state: Option<&std::path::Path>,
    proc_root: &std::path::Path,
) -> Local {
    let mut problems = Vec::new();
    let inventory = backend.inventory().unwrap_or_else(|e| {
        problems.push(format!("GPU inventory: {e}"));
        Inventory::default()
    });
    let usage = backend.usage().unwrap_or_else(|e| {
        problems.push(format!("GPU usage: {e}"));
        Vec::new()
    });
    let mut vgpu = Vec::new();
    let bytes = match std::fs::read(checkpoint) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            problems.push(format!("{}: {e}", checkpoint.display()));
            None
        }
    };
    // The vGPU allocations by directory, and every allocation (pod UIDs for all modes;
    // a checkpoint that does not parse is reported once, by the first).
    let (allocations, devices) = match &bytes {
        Some(bytes) => (
            shimfiles::checkpoint_allocations(bytes).unwrap_or_else(|e| {
                problems.push(format!("{}: {e}", checkpoint.display()));
                BTreeMap::new()
            }),
            shimfiles::checkpoint_devices(bytes).unwrap_or_default(),
        ),
        None => (BTreeMap::new(), Vec::new()),
    };
    let ids = dirs.list(shimfiles::DP_PREFIX).unwrap_or_else(|e| {
        problems.push(e.to_string());
        Vec::new()
    });
    for id in ids {
        let Some(alloc) = allocations.get(&id) else {
            continue;
        };
        let limits = match shimfiles::read_limits(dirs, &id) {
            Ok(l) => l.unwrap_or_default(),
            Err(e) => {
                problems.push(e.to_string());
                Vec::new()
            }
        };
        let file = dirs.accounting_dir(&id).join(shimfiles::ACCOUNTING_FILE);
        let used_bytes = match shimfiles::read_accounting(&file) {
            Ok(totals) => totals.map(|t| t.to_vec()),
            Err(e) => {
                problems.push(e.to_string());
                None
            }
        };
        vgpu.push(usage::VgpuAccounting {
            device_ids: alloc.device_ids.clone(),
            used_bytes,
            limits: limits
                .into_iter()
                .map(|l| usage::UnitLimits {
                    index: l.index,
                    memory_mib: l.memory_mib,
                    cores: l.cores,
                })
                .collect(),
        });
    }
    let claims = match dra_dir {
        Some(dir) => read_claims(dir, dirs, &mut problems),
        None => Vec::new(),
    };
    let claim_pods = match kubelet_dra_state {
        Some(path) if !claims.is_empty() => read_claim_pods(path, &mut problems),
        _ => BTreeMap::new(),
    };
    let process_pods = usage
        .iter()
        .flat_map(|u| &u.processes)
        .filter_map(|p| Some((p.pid, crate::agent::vgpu_guard::pod_of(proc_root, p.pid)?)))
        .collect();
    Local {
        inventory,
        usage,
        vgpu,
        claims,
        allocations: devices,
        process_pods,
        claim_pods,
        problems,
    }
}

/// The kubelet DRA manager's checkpoint at `path`
/// ([`crate::agent::vgpu_guard::kubelet_claim_pods`]); unreadable, the DRA-claim pods'
/// UIDs are unknown (their processes are attributed to no one) and it is reported.
fn read_claim_pods(
    path: &std::path::Path,
    problems: &mut Vec<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let read = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| crate::agent::vgpu_guard::kubelet_claim_pods(&bytes));
    read.unwrap_or_else(|e| {
        problems.push(format!(
            "{}: {e} (the DRA-claim pods' processes are attributed to no one)",
            path.display()
        ));
        BTreeMap::new()
    })
}

/// Pod labels per `(namespace, name)`, read from the API server and kept [`LABELS_TTL`].
#[derive(Default)]
struct LabelCache {
    /// Each pod's labels, its UID as the API server has it, and when they were read.
    pods: BTreeMap<(String, String), (PodLabels, Option<String>, Instant)>,
}

impl LabelCache {
    async fn refresh(
        &mut self,
        client: Option<&kube::Client>,
        team_label: &str,
        listed: BTreeSet<(String, String)>,
    ) -> BTreeMap<(String, String), PodLabels> {
        self.pods.retain(|k, _| listed.contains(k));
        let Some(client) = client else {
            return BTreeMap::new();
        };
        let now = Instant::now();
        for key in &listed {
            if self
                .pods
                .get(key)
                .is_some_and(|(_, _, at)| now.duration_since(*at) < LABELS_TTL)
            {
                continue;
            }
            let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &key.0);
            let (labels, uid) = match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(&key.1)).await
            {
                Ok(Ok(Some(pod))) => (
                    PodLabels::from_labels(&pod.metadata.labels.unwrap_or_default(), team_label),
                    pod.metadata.uid,
                ),
                Ok(Ok(None)) => (PodLabels::default(), None),
                Ok(Err(e)) => {
                    debug!(namespace = %key.0, pod = %key.1, error = %e, "pod labels not read");
                    (PodLabels::default(), None)
                }
                Err(_) => (PodLabels::default(), None),
            };
            self.pods.insert(key.clone(), (labels, uid, now));
        }
        self.pods
            .iter()
            .map(|(k, (l, _, _))| (k.clone(), l.clone()))
            .collect()
    }

    /// The UIDs the API server gave for the pods read (none without a client).
    fn uids(&self) -> BTreeMap<(String, String), String> {
        self.pods
            .iter()
            .filter_map(|(k, (_, uid, _))| Some((k.clone(), uid.clone()?)))
            .collect()
    }
}

/// Sample until `cancel` fires. `advertised` is the device plugin's current snapshot.
pub async fn run(
    settings: SamplerSettings,
    backend: Arc<dyn GpuBackend>,
    advertised: watch::Receiver<SharedSnapshot>,
    metrics: Arc<NodeMetrics>,
    cancel: CancellationToken,
) {
    if settings.interval.is_zero() {
        info!("--usage-interval 0: usage metrics and chargeback off");
        return;
    }
    info!(interval = ?settings.interval, socket = %settings.pod_resources_socket.display(),
          "sampling GPU usage");
    let start = Instant::now();
    let mut ticker = tokio::time::interval(settings.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Instant> = None;
    let mut streak = Streak::default();
    let mut published = Published::default();
    let mut labels = LabelCache::default();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if reported.len() > 1024 {
            reported.clear();
        }
        let now = Instant::now();
        let seconds = last.map_or(0.0, |at| now.duration_since(at).as_secs_f64());
        last = Some(now);
        let answer = match crate::agent::slot_binding::list_pod_resources(
            &settings.pod_resources_socket,
        )
        .await
        {
            Ok(a) => {
                if streak.ok() {
                    info!("the kubelet's PodResources API answers again; charging resumes");
                }
                a
            }
            Err(e) => {
                if streak.fail() {
                    warn!(error = %e, "cannot read the kubelet's PodResources; usage metrics keep their last values and nothing is charged until it answers");
                }
                continue;
            }
        };
        let holders = crate::agent::slot_binding::holders_of(&answer);
        let claim_holders = claim_holders_of(&answer);
        let (b, checkpoint, dirs, dra_dir, dra_state, proc_root) = (
            backend.clone(),
            settings.kubelet_checkpoint.clone(),
            settings.alloc_dirs.clone(),
            settings.dra_checkpoint_dir(),
            settings.kubelet_dra_state(),
            settings.proc_root.clone(),
        );
        let local = match tokio::task::spawn_blocking(move || {
            read_local(
                b.as_ref(),
                &checkpoint,
                &dirs,
                dra_dir.as_deref(),
                dra_state.as_deref(),
                &proc_root,
            )
        })
        .await
        {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "usage read failed");
                continue;
            }
        };
        for p in &local.problems {
            if reported.insert(p.clone()) {
                warn!(problem = %p, "usage partly unread");
            }
        }
        let listed: BTreeSet<(String, String)> = holders
            .iter()
            .map(|h| (h.namespace.clone(), h.pod.clone()))
            .chain(
                claim_holders
                    .iter()
                    .map(|h| (h.namespace.clone(), h.pod.clone())),
            )
            .collect();
        let pods = labels
            .refresh(settings.client.as_ref(), &settings.team_label, listed)
            .await;
        let snapshot = advertised.borrow().clone();
        let mut pod_uids = usage::pod_uids(&holders, &local.allocations);
        usage::add_claim_pod_uids(
            &mut pod_uids,
            &claim_holders,
            &local.claims,
            &local.claim_pods,
        );
        usage::add_api_pod_uids(&mut pod_uids, labels.uids());
        let tick = usage::tick(
            &Sample {
                node: &settings.node_name,
                inventory: &local.inventory,
                advertisement: &snapshot.advertisement,
                holders: &holders,
                usage: &local.usage,
                vgpu: &local.vgpu,
                claim_holders: &claim_holders,
                claims: &local.claims,
                pods: &pods,
                process_pods: &local.process_pods,
                pod_uids: &pod_uids,
            },
            seconds,
        );
        for s in &tick.skipped {
            if reported.insert(s.clone()) {
                warn!(device = %s, "held device not charged");
            }
        }
        publish(
            &metrics,
            &tick,
            &mut published,
            now.duration_since(start),
            settings.forget_after,
        );
    }
}
