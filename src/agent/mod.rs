//! The node agent: inventory → layout → advertisement, kept current.
//!
//! ```text
//! GpuBackend ─inventory─▶ plan ─MIG layouts─▶ backend.apply_mig_layout ─▶ advertise
//!      │                   ▲                                                  │
//!      │ health events     │ config file changed / SIGHUP / node label        ▼
//!      └──▶ HealthTracker ─┴──────────────▶ publish Snapshot ──▶ device-plugin supervisor
//!                                                 └─ DRA GPUs ─▶ DraView ──▶ [`dra`] (slices,
//!                                                                 kubelet DRA socket)
//! ```
//!
//! Each GPU's ownership is one pure state machine ([`handover`]: unowned, owned by a path,
//! blocked by what holds it, withdrawing from the DRA driver); `moves` reads the node,
//! feeds the machine events and carries out its effects.
//!
//! [`ownership`] splits the GPUs between the two paths: the device plugin advertises only
//! its GPUs, the DRA driver publishes only its own, and MIG layouts are applied only to
//! device-plugin GPUs (the DRA driver creates MIG instances per claim). The split comes
//! from the flags or, per node, from the config's `tessera.dra.gpus`; it is decided again
//! at every reload. A GPU in use on its current path ([`usage`]: a prepared claim, a pod
//! holding it) does not move: the agent reports the blocked move (log, Node Event) and
//! retries it whenever either checkpoint changes (and every 10 s), moving the GPU once it
//! is free. GPUs whose owner does not change keep their devices as they are. A GPU moving
//! to the DRA driver loses the MIG instances the device plugin's layout made.
//!
//! A GPU leaving the DRA driver moves in two phases ([`withdraw`]): the driver stops
//! publishing it, and only once the API server's slices no longer name it and no claim
//! slipped onto it does the device plugin list it; a claim that did rolls the move back.
//! The split put in force is recorded on disk ([`split_record`]) before it is
//! advertised; at start the record says which GPUs the driver had (without a readable
//! record the split is inferred from what survives: slices, allocated claims, the
//! checkpoints), so a config changed while the agent was down moves GPUs the same way; a phase 2 that waits long is reported (`GpuMoveStalled`).
//! With `--dra=auto` the DRA path serves the kubelet only while it owns a GPU
//! ([`dra::DraView::active`]).
//!
//! The split is put in force for the DRA driver ([`crate::dra::owned::OwnedDevices`])
//! before anything is built for it: from then on the driver refuses claims on GPUs it
//! gave up, and a GPU a claim is being prepared on (admitted, not recorded yet) is not
//! taken from it (the split is decided again with that claim as a holder).
//!
//! A config that fails to parse, names an unknown config, or does not fit the GPUs is
//! rejected as a whole: the error (naming the field) is logged and recorded, and the last
//! good config stays in force. If the very first config is bad, nothing is advertised
//! until a good one arrives (advertising a default instead could hand out whole GPUs the
//! operator meant to partition), and `/readyz` answers 503 saying why
//! ([`crate::metrics::probes`]). Only this node's named config is read into force: other
//! configs' errors do not touch it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub mod cluster;
pub mod dra;
pub mod handover;
mod moves;
pub mod ownership;
pub mod slot_binding;
pub mod split_record;
pub(crate) mod usage;
pub mod vgpu_guard;
pub mod vgpu_record;
pub(crate) mod withdraw;

use crate::cdi;
use crate::deviceplugin::allocate::AllocateSettings;
use crate::deviceplugin::snapshot::{SharedSnapshot, Snapshot};
use crate::deviceplugin::supervisor::{self, SupervisorConfig};
use crate::dra::owned::OwnedDevices;
use crate::gpu::health::HealthTracker;
use crate::gpu::{GpuBackend, Inventory};
use crate::metrics::{DeviceLabels, HealthLabels, NodeMetrics};
use crate::partition::config::{self, NodeConfig};
use crate::partition::layout::{self, Advertisement, NodePlan};
use ownership::{Assignment, DraMode, Owner, Ownership};
use usage::{LocalUsage, UsageProbe};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gpu(#[from] crate::gpu::Error),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Layout(#[from] layout::LayoutError),
    #[error(transparent)]
    Cdi(#[from] cdi::Error),
    #[error(transparent)]
    DevicePlugin(#[from] crate::deviceplugin::Error),
    #[error(transparent)]
    Dra(#[from] dra::Error),
    #[error("cannot split the GPUs between the paths: {0}")]
    Split(String),
    #[error("cannot watch {path}: {reason}")]
    Watch { path: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where rejected configs are reported besides the log (an Event on the Node in a
/// cluster; tests record them).
pub trait EventRecorder: Send + Sync {
    fn config_rejected(&self, message: &str);

    /// A GPU the config moves to the other kubelet path is in use where it is (the
    /// message names the GPU and what holds it).
    fn gpu_move_blocked(&self, message: &str) {
        warn!(%message, "GPU not moved between kubelet paths");
    }

    /// A GPU leaving the DRA driver has waited long in phase 2 ([`withdraw`]): on neither
    /// path, because the slices still name it or the API server does not answer (the
    /// message names the GPU and the reason). Once per GPU and wait.
    fn gpu_move_stalled(&self, message: &str) {
        warn!(%message, "GPU move off the DRA driver stalled");
    }

    /// Another device plugin registers a resource Tessera registers or advertises this
    /// node's GPUs ([`crate::deviceplugin::coexist`]). Once per conflict while it lasts.
    fn device_plugin_conflict(&self, message: &str) {
        error!(%message, "device plugin conflict");
    }

    /// A pod's processes use more of a GPU than its vGPU slices allow, by the driver's
    /// own accounting ([`vgpu_guard`]). Once per sample while it lasts.
    fn vgpu_over_limit(&self, message: &str) {
        error!(%message, "vGPU limit exceeded");
    }
}

/// Logs only (no cluster).
pub struct LogRecorder;

impl EventRecorder for LogRecorder {
    fn config_rejected(&self, message: &str) {
        // The agent logs what follows (last good config kept, or not ready).
        debug!(%message, "config rejected");
    }
}

/// The agent's settings (from flags).
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub kubelet_dir: PathBuf,
    pub cdi_root: PathBuf,
    /// Config file, or directory of named configs (a mounted ConfigMap).
    pub config_path: Option<PathBuf>,
    /// The node's `tessera.io/config` label value.
    pub config_name: Option<String>,
    /// Where `/dev` of the host is visible (for CDI host paths).
    pub dev_root: String,
    pub allocate: AllocateSettings,
    pub metrics: Arc<NodeMetrics>,
    /// How often the node's CDI spec on disk is checked against what the agent wrote and
    /// rewritten when wrong (also on SIGHUP); zero: only on SIGHUP.
    pub cdi_verify_interval: Duration,
    /// In a cluster: publish the node's split-mode GPUs on its Node for the scheduler
    /// extender ([`vgpu_record`]). `None`: no cluster, nothing published.
    pub vgpu_record: Option<vgpu_record::RecordSettings>,
    /// In a cluster: bind split-mode slots to their pod's assignment
    /// ([`slot_binding`]). `None`: Allocate refuses split-mode slots.
    pub slot_binding: Option<slot_binding::BindingSettings>,
    /// Receives every snapshot the device plugin advertises (the usage sampler,
    /// `crate::metrics::sampler`). `None`: nobody listens.
    pub advertised: Option<watch::Sender<SharedSnapshot>>,
}

/// The CDI spec file name (without `.json`) for this node's devices.
pub const CDI_SPEC_STEM: &str = "tessera.io-gpu";

/// Build what the node advertises for `config`: plan, apply MIG layouts, advertise.
/// Returns the post-MIG inventory, the plan and the advertisement.
pub fn build(
    backend: &dyn GpuBackend,
    config: &NodeConfig,
) -> Result<(Inventory, NodePlan, Advertisement)> {
    let built = build_owned(backend, config, &Assignment::default())?;
    Ok((built.inventory, built.plan, built.advertisement))
}

/// What one reload produces, split between the two paths.
#[derive(Debug, Clone)]
pub struct Built {
    /// Post-MIG inventory of every GPU.
    pub inventory: Inventory,
    pub plan: NodePlan,
    /// The device plugin's part.
    pub advertisement: Advertisement,
    /// The DRA driver's part (`None` when DRA is off).
    pub dra: Option<dra::DraView>,
}

/// [`build`] with the GPUs split between the paths: MIG layouts are applied to
/// device-plugin GPUs only; DRA GPUs are left for claims to partition.
pub fn build_owned(
    backend: &dyn GpuBackend,
    config: &NodeConfig,
    owners: &Assignment,
) -> Result<Built> {
    let inventory = backend.inventory()?;
    let plan = layout::plan(&inventory, config)?;
    let dra_uuids = owners.dra_uuids(&inventory);
    for (uuid, placements) in plan.mig_layouts() {
        if dra_uuids.contains(uuid) {
            continue;
        }
        let wanted: Vec<(String, u8)> = placements.to_vec();
        let current: Vec<(String, u8)> = inventory
            .gpu(uuid)
            .map(|g| {
                g.mig_devices
                    .iter()
                    .map(|m| (m.profile.clone(), m.start))
                    .collect()
            })
            .unwrap_or_default();
        let mut sorted_wanted = wanted.clone();
        sorted_wanted.sort_by_key(|(_, s)| *s);
        if current != sorted_wanted {
            info!(gpu = %uuid, layout = ?wanted, "applying MIG layout");
            crate::gpu::watch::apply_mig_layout_or_restore(backend, uuid, &current, &wanted)?;
        }
    }
    let inventory = backend.inventory()?;
    let (_, dp_plan) = owners.part(&inventory, &plan, Owner::DevicePlugin);
    let advertisement = if owners.device_plugin {
        ownership::device_plugin_part(
            &layout::advertise(&inventory, config, &dp_plan)?,
            &dra_uuids,
        )
    } else {
        Advertisement::default()
    };
    let dra = owners.dra.then(|| {
        let (inventory, plan) = owners.part(&inventory, &plan, Owner::Dra);
        dra::DraView {
            inventory,
            plan,
            health: config.health.clone(),
            active: true,
        }
    });
    Ok(Built {
        inventory,
        plan,
        advertisement,
        dra,
    })
}

/// The running agent's state.
struct Agent {
    backend: Arc<dyn GpuBackend>,
    opts: AgentOptions,
    recorder: Arc<dyn EventRecorder>,
    health: HealthTracker,
    current: Option<NodeConfig>,
    snapshot: Snapshot,
    tx: watch::Sender<SharedSnapshot>,
    ownership: Ownership,
    /// Each GPU's ownership ([`handover`]): the split in force, blocked moves, moves off
    /// the DRA driver not confirmed yet.
    gpus: handover::Machine,
    usage: Arc<dyn UsageProbe>,
    /// The API server and this node's name (DRA on): claims allocated on a GPU about to
    /// leave the DRA driver are looked up there.
    claims_api: Option<(kube::Client, String)>,
    dra_tx: watch::Sender<Option<dra::DraView>>,
    /// What the DRA driver owns (DRA on): the split is put in force here, before anything
    /// is built for it, and never takes a GPU a claim is being prepared on.
    owned: Option<OwnedDevices>,
    /// Since when the API server's slices name none of the withdrawing GPUs.
    clear_since: Option<tokio::time::Instant>,
    /// See [`dra::DraSettings::move_settle`].
    move_settle: Duration,
    /// See [`dra::DraSettings::move_stall_warn`].
    move_stall_warn: Duration,
    /// Whether phase 2 of the current withdrawal waits long enough to warn.
    stall: withdraw::Stall,
    /// When phase 2 looks at the API server next without being told to (the watch's
    /// events make it look at once): the settle time's end, a retry, or the slow poll.
    next_confirm: tokio::time::Instant,
    /// The watch of this node's slices ([`withdraw::follow_slices`]) while a move is
    /// pending: stopped with this token.
    following: Option<CancellationToken>,
    /// Where that watch says the slices may have changed.
    slices_changed: mpsc::UnboundedSender<()>,
    /// Whether the last DRA view sent serves the kubelet.
    dra_serving: bool,
    /// Where the split in force is recorded ([`split_record`]; DRA on).
    split_record: Option<PathBuf>,
    /// What that file holds (as this process last wrote it).
    recorded: Option<split_record::Recorded>,
    /// The node's CDI spec as last written ([`Agent::verify_cdi`] checks the file).
    cdi_written: Option<cdi::Spec>,
    /// Asks the DRA driver to check its per-claim CDI specs (DRA on).
    claim_spec_checks: Option<mpsc::UnboundedSender<()>>,
    /// A reload that failed on a GPU driver error is retried with backoff.
    driver_retry: crate::gpu::watch::RetryTimer,
    /// The device plugin's GPUs as last applied (their facts go into the vGPU record).
    dp_inventory: Inventory,
    /// The node's split-mode GPUs for the scheduler extender ([`vgpu_record`]); `None`
    /// until a config is in force.
    records_tx: watch::Sender<Option<Vec<crate::vgpu::record::DeviceRecord>>>,
    /// The same GPUs for the slot binder ([`slot_binding`]).
    slot_gpus_tx: watch::Sender<Vec<crate::vgpu::slots::SlotGpu>>,
}

impl Agent {
    /// Load, validate and apply the config; on any error keep the last good one.
    async fn reload(&mut self) {
        let probes = self.opts.metrics.probes.clone();
        let outcome = match self.try_reload().await {
            Ok(true) => "applied",
            Ok(false) => {
                info!("config unchanged");
                "unchanged"
            }
            Err(e) => {
                self.retry_if_driver_error(&e);
                let message = e.to_string();
                match &self.current {
                    Some(good) => error!(%message, config = %good.name,
                        "config rejected; the last good config stays in force"),
                    None => {
                        error!(%message, "config rejected and no good config in force: \
                               not ready, nothing advertised until a good config arrives");
                        probes.config_missing(&message);
                    }
                }
                self.recorder.config_rejected(&message);
                "rejected"
            }
        };
        if let Some(good) = &self.current {
            probes.config_applied(&good.name);
        }
        probes.beat();
        if outcome != "rejected" {
            self.driver_retry.succeeded();
        }
        self.opts.metrics.reload(outcome);
    }

    /// A reload that failed because the GPU driver did (inventory, MIG) is retried with
    /// backoff instead of waiting for the next config change.
    fn retry_if_driver_error(&mut self, e: &Error) {
        if matches!(e, Error::Gpu(_)) {
            let wait = self.driver_retry.failed();
            warn!(error = %e, retry_in = ?wait, "the GPU driver failed; retrying");
        }
    }

    /// Check the node's CDI spec on disk against the one last written and rewrite it when
    /// it is missing, damaged or edited (on SIGHUP and every `cdi_verify_interval`).
    fn verify_cdi(&mut self) {
        if let Some(tx) = &self.claim_spec_checks {
            // The DRA task may be gone (its end is handled by the main loop).
            let _ = tx.send(());
        }
        let Some(spec) = &self.cdi_written else {
            return;
        };
        let root = &self.opts.cdi_root;
        match cdi::verify_spec(root, CDI_SPEC_STEM, spec) {
            Ok(cdi::Verified::Intact) => debug!("CDI spec intact"),
            Ok(cdi::Verified::Repaired { reason }) => {
                warn!(path = %cdi::spec_path(root, CDI_SPEC_STEM).display(), %reason,
                      "the CDI spec on disk was wrong; rewritten");
                self.opts.metrics.cdi_spec_repairs.inc();
            }
            Err(e) => error!(error = %e, "cannot check or rewrite the CDI spec"),
        }
        if let Err(e) = crate::fsio::remove_stale_temps(&cdi::spec_path(root, CDI_SPEC_STEM)) {
            warn!(error = %e, "cannot remove stale temporary CDI files");
        }
    }

    async fn try_reload(&mut self) -> Result<bool> {
        let config = match &self.opts.config_path {
            Some(path) => {
                // Reading and parsing (bounded, see `partition::config::load`) happen off
                // the runtime; only this node's config matters, the others' errors do not.
                let path = path.clone();
                let name = self.opts.config_name.clone();
                tokio::task::spawn_blocking(move || {
                    config::load(&path)?.select(name.as_deref()).cloned()
                })
                .await
                .map_err(|e| Error::Watch {
                    path: "config loader".into(),
                    reason: e.to_string(),
                })??
            }
            None => NodeConfig::builtin_default(),
        };
        self.apply(config).await
    }

    fn on_health(&mut self, event: crate::gpu::HealthEvent) {
        let uuid = event.gpu_uuid().to_string();
        if let Some(h) = self.health.apply(&event) {
            let to = if h.is_healthy() {
                "healthy"
            } else {
                "unhealthy"
            };
            self.opts
                .metrics
                .health_transitions
                .get_or_create(&HealthLabels { to: to.into() })
                .inc();
            match &h {
                crate::gpu::health::Health::Healthy => {
                    info!(gpu = %uuid, "GPU healthy again");
                    self.snapshot.unhealthy.remove(&uuid);
                }
                crate::gpu::health::Health::Unhealthy { reason } => {
                    warn!(gpu = %uuid, %reason, "GPU unhealthy");
                    self.snapshot.unhealthy.insert(uuid, reason.clone());
                }
            }
            self.publish();
        }
    }

    fn publish(&mut self) {
        let devices = &self.opts.metrics.devices;
        devices.clear();
        for r in &self.snapshot.advertisement.resources {
            for d in &r.devices {
                let health = if self.snapshot.unhealthy_reason(d).is_some() {
                    "unhealthy"
                } else {
                    "healthy"
                };
                devices
                    .get_or_create(&DeviceLabels {
                        resource: r.name.clone(),
                        health: health.into(),
                    })
                    .inc();
            }
        }
        self.snapshot.generation += 1;
        self.tx.send_replace(Arc::new(self.snapshot.clone()));
        if self.current.is_none() {
            // Nothing is in force: an earlier run's record is left to go stale.
            return;
        }
        let records = vgpu_record::device_records(
            &self.dp_inventory,
            &self.snapshot.advertisement,
            &self.snapshot.unhealthy,
        );
        let slot_gpus = slot_gpus(&self.dp_inventory, &records);
        self.slot_gpus_tx.send_if_modified(|current| {
            let changed = *current != slot_gpus;
            if changed {
                *current = slot_gpus;
            }
            changed
        });
        self.records_tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&records);
            if changed {
                *current = Some(records);
            }
            changed
        });
    }
}

/// The split-mode GPUs the slot binder may hand out: the published records with their
/// device minors.
fn slot_gpus(
    inventory: &Inventory,
    records: &[crate::vgpu::record::DeviceRecord],
) -> Vec<crate::vgpu::slots::SlotGpu> {
    records
        .iter()
        .filter_map(|r| {
            let gpu = inventory.gpus.iter().find(|g| g.uuid == r.uuid)?;
            Some(crate::vgpu::slots::SlotGpu {
                uuid: r.uuid.clone(),
                minor: gpu.minor,
                memory_mib: r.memory_mib,
                healthy: r.healthy,
            })
        })
        .collect()
}

/// What besides files can make the agent reload.
pub struct Triggers {
    /// SIGHUP.
    pub reload: mpsc::UnboundedReceiver<()>,
    /// The node's `tessera.io/config` label, when running in a cluster.
    pub config_label: Option<watch::Receiver<Option<String>>>,
}

/// Which kubelet paths run, and who owns which GPU.
#[derive(Clone, Default)]
pub struct Paths {
    pub ownership: Ownership,
    /// Required when `ownership.dra` is on.
    pub dra: Option<dra::DraSettings>,
}

/// Run the agent (device-plugin path only) until `cancel` fires. Reloads on config file
/// changes, SIGHUP, and changes of the node's config label.
pub async fn run(
    backend: Arc<dyn GpuBackend>,
    opts: AgentOptions,
    recorder: Arc<dyn EventRecorder>,
    triggers: Triggers,
    cancel: CancellationToken,
) -> Result<()> {
    run_with(backend, opts, recorder, triggers, Paths::default(), cancel).await
}

/// Copies every snapshot from `rx` to `tap` until `cancel` or `rx` closes.
async fn forward(
    mut rx: watch::Receiver<SharedSnapshot>,
    tap: watch::Sender<SharedSnapshot>,
    cancel: CancellationToken,
) {
    loop {
        tap.send_replace(rx.borrow_and_update().clone());
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}

/// [`run`] with the paths chosen by `paths`: the device plugin, the DRA driver, or both
/// side by side on disjoint GPUs.
pub async fn run_with(
    backend: Arc<dyn GpuBackend>,
    opts: AgentOptions,
    recorder: Arc<dyn EventRecorder>,
    triggers: Triggers,
    paths: Paths,
    cancel: CancellationToken,
) -> Result<()> {
    let Paths {
        ownership: owners,
        dra: dra_settings,
    } = paths;
    let owners = match (&dra_settings, owners.dra) {
        (None, true) => {
            warn!("DRA is on but has no API client; running the device-plugin path only");
            Ownership::default()
        }
        _ => owners,
    };
    info!(dra = %owners.dra_mode(), "DRA path mode");
    let (dra_tx, dra_rx) = watch::channel(None);
    let Triggers {
        reload: mut reload_rx,
        config_label,
    } = triggers;
    let mut opts = opts;
    let mut label_rx = config_label;
    if let Some(rx) = label_rx.as_mut() {
        if let Some(name) = rx.borrow_and_update().clone() {
            opts.config_name = Some(name);
        }
    }
    let dra_checkpoint_dir = dra_settings
        .as_ref()
        .filter(|_| owners.dra)
        .map(|s| s.checkpoint_dir.clone());
    let probe = LocalUsage::under(&opts.kubelet_dir, dra_checkpoint_dir.clone());
    let owned = dra_settings
        .as_ref()
        .filter(|_| owners.dra)
        .map(|_| OwnedDevices::new());
    let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
    if let Some(tap) = opts.advertised.clone() {
        tokio::spawn(forward(rx.clone(), tap, cancel.child_token()));
    }
    let (slices_tx, mut slices_rx) = mpsc::unbounded_channel();
    let (records_tx, records_rx) = watch::channel(None);
    let (slot_gpus_tx, slot_gpus_rx) = watch::channel(Vec::new());
    if let Some(binding) = opts.slot_binding.clone() {
        opts.allocate.split_binding = true;
        tokio::spawn(slot_binding::keep_bound(
            binding,
            Arc::new(opts.allocate.clone()),
            opts.cdi_root.clone(),
            slot_gpus_rx,
            cancel.child_token(),
        ));
    }
    if let Some(settings) = opts.vgpu_record.clone() {
        tokio::spawn(vgpu_record::keep_published(
            settings,
            records_rx,
            cancel.child_token(),
        ));
    }
    let mut agent = Agent {
        backend: backend.clone(),
        opts: opts.clone(),
        recorder,
        health: HealthTracker::default(),
        current: None,
        snapshot: Snapshot::default(),
        tx,
        ownership: owners.clone(),
        gpus: handover::Machine::new(handover::Paths {
            device_plugin: owners.device_plugin,
            dra: owners.dra,
        }),
        usage: Arc::new(probe),
        claims_api: dra_settings
            .as_ref()
            .filter(|_| owners.dra)
            .map(|s| (s.client.clone(), s.node_name.clone())),
        dra_tx,
        owned: owned.clone(),
        clear_since: None,
        move_settle: dra_settings
            .as_ref()
            .map_or(Duration::from_secs(1), |s| s.move_settle),
        move_stall_warn: dra_settings
            .as_ref()
            .map_or(Duration::from_secs(10), |s| s.move_stall_warn),
        stall: withdraw::Stall::default(),
        next_confirm: tokio::time::Instant::now(),
        following: None,
        slices_changed: slices_tx,
        dra_serving: false,
        split_record: dra_checkpoint_dir.as_deref().map(split_record::path_in),
        recorded: None,
        cdi_written: None,
        claim_spec_checks: None,
        driver_retry: Default::default(),
        dp_inventory: Inventory::default(),
        records_tx,
        slot_gpus_tx,
    };
    // Watch the config before the first load: a change written after that load began
    // (a ConfigMap update during the start) is seen, not missed until the next one.
    let (file_tx, mut file_rx) = mpsc::unbounded_channel();
    let _watcher = match &opts.config_path {
        Some(path) => Some(watch_config(path, file_tx)?),
        None => None,
    };
    // The first config decides which GPUs the DRA driver owns (the split reads the DRA
    // checkpoint, not the driver, so this comes first; it takes milliseconds).
    agent.reload().await;
    let dra_cancel = cancel.child_token();
    let mut dra_task = dra_settings.filter(|_| owners.dra).map(|settings| {
        let (checks_tx, checks_rx) = mpsc::unbounded_channel();
        agent.claim_spec_checks = Some(checks_tx);
        let dra_gpus = match (backend.inventory(), agent.gpus.decided()) {
            (Ok(inventory), true) => agent.assignment_of(&agent.gpus).dra_uuids(&inventory),
            (Err(e), _) => {
                warn!(error = %e, "no GPU inventory: unowned MIG instances are not cleaned up");
                BTreeSet::new()
            }
            (_, false) => {
                warn!("no config in force: unowned MIG instances are not cleaned up");
                BTreeSet::new()
            }
        };
        tokio::spawn(dra::run(
            settings,
            backend.clone(),
            dra_gpus,
            dra_rx,
            owned.clone().unwrap_or_default(),
            owners.dra_mode() == DraMode::On,
            dra::SpecChecks {
                now: checks_rx,
                repairs: opts.metrics.cdi_spec_repairs.clone(),
            },
            dra_cancel.clone(),
        ))
    });

    // Blocked moves are retried when either checkpoint changes, and every 10 s.
    let (usage_tx, mut usage_rx) = mpsc::unbounded_channel();
    let mut usage_dirs = vec![opts.kubelet_dir.join("device-plugins")];
    usage_dirs.extend(dra_checkpoint_dir);
    let _usage_watchers: Vec<_> = usage_dirs
        .iter()
        .filter_map(|dir| {
            let _ = std::fs::create_dir_all(dir);
            watch_dir(dir, usage_tx.clone())
                .map_err(|e| warn!(error = %e, "blocked GPU moves are retried every 10 s only"))
                .ok()
        })
        .collect();
    let mut retry = tokio::time::interval(Duration::from_secs(10));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // `/livez`: the loop beats while it runs.
    let mut beat = tokio::time::interval(crate::metrics::probes::BEAT_EVERY);

    let (health_tx, mut health_rx) = mpsc::unbounded_channel();
    // Restarted with backoff when it ends or cannot start; devices stay advertised.
    let health_metrics = opts.metrics.clone();
    tokio::spawn(crate::gpu::watch::keep_watching(
        backend.clone(),
        health_tx,
        Default::default(),
        move |state| {
            if matches!(state, crate::gpu::watch::WatchState::Down { .. }) {
                health_metrics.health_watch_restarts.inc();
            }
        },
        cancel.child_token(),
    ));
    let cdi_every = opts.cdi_verify_interval;
    // The start has just written the spec: the first check is one period from now.
    let cdi_period = cdi_every.max(Duration::from_millis(1));
    let mut cdi_check =
        tokio::time::interval_at(tokio::time::Instant::now() + cdi_period, cdi_period);
    cdi_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let sup_cfg = SupervisorConfig {
        plugin_dir: opts.kubelet_dir.join("device-plugins"),
        settings: Arc::new(opts.allocate.clone()),
        metrics: opts.metrics.clone(),
    };
    let sup_cancel = cancel.child_token();
    let mut supervisor = owners
        .device_plugin
        .then(|| tokio::spawn(supervisor::run(sup_cfg, rx, sup_cancel.clone())));

    // Set when the device-plugin or DRA task ends on its own (an error, or the end of it).
    let mut ended: Option<Result<(), Error>> = None;
    loop {
        // Moves off the DRA driver follow the API server's slices with a watch while one
        // is pending.
        agent.follow_slices_while_withdrawing();
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = beat.tick() => agent.opts.metrics.probes.beat(),
            Some(event) = health_rx.recv() => agent.on_health(event),
            Some(()) = file_rx.recv() => {
                // Editors and the kubelet's ConfigMap updates write in several steps.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while file_rx.try_recv().is_ok() {}
                info!("config changed on disk; reloading");
                agent.reload().await;
            }
            Some(()) = reload_rx.recv() => {
                info!("SIGHUP; reloading config");
                agent.reload().await;
                agent.verify_cdi();
            }
            _ = cdi_check.tick(), if !cdi_every.is_zero() => agent.verify_cdi(),
            _ = tokio::time::sleep_until(agent.driver_retry.due().unwrap_or_else(tokio::time::Instant::now)),
                if agent.driver_retry.due().is_some() => {
                agent.driver_retry.start();
                info!("retrying after a GPU driver error");
                agent.reload().await;
            }
            Some(()) = usage_rx.recv() => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                while usage_rx.try_recv().is_ok() {}
                debug!(blocked = agent.gpus.blocked().count(), "a checkpoint changed; rechecking blocked GPU moves");
                agent.recheck().await;
            }
            _ = retry.tick(), if agent.gpus.blocked().next().is_some() => {
                debug!(blocked = agent.gpus.blocked().count(), "rechecking blocked GPU moves (periodic)");
                agent.recheck().await
            }
            Some(()) = slices_rx.recv() => {
                while slices_rx.try_recv().is_ok() {}
                agent.confirm_withdrawal().await;
            }
            _ = tokio::time::sleep_until(agent.next_confirm), if !agent.gpus.withdrawing().is_empty() => {
                agent.confirm_withdrawal().await;
            }
            Ok(()) = async { match label_rx.as_mut() {
                Some(rx) => rx.changed().await,
                None => std::future::pending().await,
            } } => {
                let name = label_rx.as_mut().and_then(|rx| rx.borrow_and_update().clone());
                info!(config = ?name, "node label {} changed; reloading", config::CONFIG_LABEL);
                agent.opts.config_name = name;
                agent.reload().await;
            }
            result = async { match supervisor.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            } } => {
                supervisor = None;
                ended = Some(match result {
                    Ok(r) => r.map_err(Error::from),
                    Err(e) => Err(Error::Watch { path: "supervisor".into(), reason: e.to_string() }),
                });
                break;
            }
            result = async { match dra_task.as_mut() {
                Some(task) => task.await,
                None => std::future::pending().await,
            } } => {
                dra_task = None;
                ended = Some(match result {
                    Ok(r) => r.map_err(Error::from),
                    Err(e) => Err(Error::Watch { path: "DRA driver".into(), reason: e.to_string() }),
                });
                break;
            }
        }
    }
    if let Some(stop) = agent.following.take() {
        stop.cancel();
    }
    // Whichever way the loop ended, stop both paths and wait for them, so their sockets
    // are withdrawn before the agent returns.
    sup_cancel.cancel();
    dra_cancel.cancel();
    if let Some(task) = supervisor {
        match task.await {
            Ok(r) => r?,
            Err(e) => warn!(error = %e, "supervisor task failed"),
        }
    }
    if let Some(task) = dra_task {
        match task.await {
            Ok(r) => r?,
            Err(e) => warn!(error = %e, "DRA driver task failed"),
        }
    }
    ended.unwrap_or(Ok(()))
}

/// The directory to watch for a config path (a mounted ConfigMap swaps a `..data`
/// symlink, so the file itself is never written in place).
fn config_dir(path: &std::path::Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    std::path::Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf()
    }
}

/// Send `()` when the config at `path` may have changed: a write, rename or removal of
/// the file itself, or of a config file in the directory of named configs (dotfiles
/// aside), or the `..data` symlink swap by which the kubelet updates a mounted ConfigMap.
/// Writes to anything else in the folder (a log file beside `--config`, an editor's swap
/// file, the ConfigMap's timestamped directories) are ignored.
fn watch_config(
    path: &std::path::Path,
    tx: mpsc::UnboundedSender<()>,
) -> Result<notify::RecommendedWatcher> {
    let is_dir = path.is_dir();
    let file_name = path.file_name().map(|n| n.to_os_string());
    let relevant = move |p: &std::path::Path| {
        let Some(name) = p.file_name() else {
            return false;
        };
        if name == "..data" {
            return true;
        }
        if is_dir {
            // The watch is not recursive: every path is in the directory.
            !name.to_string_lossy().starts_with('.')
        } else {
            Some(name) == file_name.as_deref()
        }
    };
    let werr = |e: notify::Error| Error::Watch {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event {
            if !matches!(e.kind, notify::EventKind::Access(_))
                && e.paths.iter().any(|p| relevant(p))
            {
                let _ = tx.send(());
            }
        }
    })
    .map_err(werr)?;
    watcher
        .watch(&config_dir(path), RecursiveMode::NonRecursive)
        .map_err(werr)?;
    Ok(watcher)
}

/// Send `()` on every change in `dir` (not recursive; reads are ignored).
fn watch_dir(
    dir: &std::path::Path,
    tx: mpsc::UnboundedSender<()>,
) -> Result<notify::RecommendedWatcher> {
    let werr = |e: notify::Error| Error::Watch {
        path: dir.display().to_string(),
        reason: e.to_string(),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(e) = event {
            if !matches!(e.kind, notify::EventKind::Access(_)) {
                let _ = tx.send(());
            }
        }
    })
    .map_err(werr)?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(werr)?;
    Ok(watcher)
}
