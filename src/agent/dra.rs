//! The DRA path of the node agent: the GPUs [`super::ownership`] gives the DRA driver are
//! published as ResourceSlices and prepared through the kubelet's DRA socket.
//!
//! ```text
//! start ─▶ NodePreparer::recover (roll back half-prepared claims, reboot → re-prepare)
//!       ─▶ serve dra.sock (DRAPlugin v1 + v1beta1) ─▶ offer plugins_registry/…-reg.sock
//! agent reload (config file, SIGHUP, node label) ─▶ DraView ─▶ build_slices ─▶ Publisher
//!       Publisher: write the pool, watch it, write again on deletion / drift
//! backend health events ─▶ HealthService ─▶ NodeWatchResources (dra.sock)
//!                                        └▶ device taints ─▶ rebuild the slices
//! ```
//!
//! Health: every device of an unhealthy DRA GPU carries its taint
//! ([`crate::dra::slices::apply_taints`]); when the API server drops taints (DRADeviceTaints
//! off) the publisher reports it and the devices of unhealthy GPUs are withheld from the
//! slices instead ([`TaintMode::Withhold`]). The health stream reports every device the
//! driver publishes, withheld ones included.
//!
//! Slices are published only once a config has been applied: an agent whose first config
//! is bad publishes nothing (like the device-plugin path), instead of an empty pool that
//! would withdraw the devices of claims still running.
//!
//! Requests run concurrently: `NodePreparer` does each claim's GET without the checkpoint
//! lock and its locked, blocking part on the blocking pool, so requests overlap their API
//! round trips while the checkpoint stays consistent.
//!
//! What the driver owns is shared with the agent ([`OwnedDevices`]): the agent sets the
//! split before anything is built for it, the publisher sets the device names whenever it
//! builds the slices (before health withholds any), and a claim allocated outside them is
//! refused at NodePrepareResources.
//!
//! At start, after the checkpoint is recovered, MIG instances on the DRA GPUs that no
//! checkpointed claim owns are destroyed (`NodePreparer::destroy_unowned_migs`).
//!
//! Serving follows the view ([`DraView::active`]): the agent marks a view inactive when
//! the DRA path owns no GPU (with `--dra=auto`) and no move off it is still being
//! confirmed. Active: `dra.sock` and the registration socket are served and the pool is
//! published. Inactive: no slices at all (stale ones are deleted) and no sockets, so the
//! kubelet unregisters the plugin; a later active view registers and publishes again.
//! The checkpoint, health watch and publisher live on in between.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::deviceplugin::allocate::AllocateSettings;
use crate::dra::checkpoint::Store;
use crate::dra::health::{devices_from_slices, HealthOptions, HealthService, TaintMode};
use crate::dra::kubelet;
use crate::dra::names::DRIVER;
use crate::dra::node::NodePreparer;
use crate::dra::owned::OwnedDevices;
use crate::dra::publish::Publisher;
use crate::dra::registration::RetryPolicy;
use crate::dra::slices::{apply_taints, build_slices, CounterLayout, SliceOptions};
use crate::dra::socket::{self, DraPaths};
use crate::dra::status_queue::StatusWriter;
use crate::gpu::health::HealthPolicy;
use crate::gpu::{GpuBackend, Inventory};
use crate::partition::layout::NodePlan;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kubelet(#[from] socket::Error),
    #[error("DRA driver task failed: {0}")]
    Task(String),
}

/// How long a stopping driver waits for its queued `status.devices` writes.
pub const STATUS_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// Settings of the DRA path (from flags).
#[derive(Clone)]
pub struct DraSettings {
    pub client: kube::Client,
    pub node_name: String,
    pub kubelet_dir: PathBuf,
    pub cdi_root: PathBuf,
    /// Holds `checkpoint.json` and its lock.
    pub checkpoint_dir: PathBuf,
    /// This boot's ID (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    pub counters: CounterLayout,
    pub allocate: AllocateSettings,
    pub retry: RetryPolicy,
    /// How long the API server must show slices without a GPU leaving the driver before
    /// the agent looks for claims that slipped onto it and hands it to the device plugin
    /// (covers the scheduler's watch lag).
    pub move_settle: std::time::Duration,
    /// How long a GPU may wait in phase 2 of its move off the driver (on neither path)
    /// before the agent warns (log, `GpuMoveStalled` Event, metric); the log repeats at
    /// most once per this interval while it waits.
    pub move_stall_warn: std::time::Duration,
}

/// What the DRA driver publishes: its GPUs (post-MIG inventory) and their plan, and the
/// config's health policy.
#[derive(Debug, Clone, PartialEq)]
pub struct DraView {
    pub inventory: Inventory,
    pub plan: NodePlan,
    pub health: HealthPolicy,
    /// Serve the kubelet and publish (false: withdraw, see the module doc).
    pub active: bool,
}

/// The slices for a view (the pool generation is the publisher's business).
pub fn slices_for(
    view: &DraView,
    node: &str,
    counters: CounterLayout,
) -> Result<Vec<ResourceSlice>, crate::dra::slices::SliceError> {
    let mut opts = SliceOptions::new(node);
    opts.counters = counters;
    build_slices(&view.inventory, &view.plan, &opts)
}

/// Run the DRA path until `cancel`: recover, destroy MIG instances on `dra_gpus` that no
/// claim owns, serve the kubelet while the view is active (from the start when
/// `serve_at_start`, before any view: `--dra=on`), publish every view. `owned` is the
/// split the agent put in force; the published device names are added to it here.
#[allow(clippy::too_many_arguments)] // each is one thing the agent hands its DRA path
pub async fn run(
    settings: DraSettings,
    backend: Arc<dyn GpuBackend>,
    dra_gpus: BTreeSet<String>,
    mut views: watch::Receiver<Option<DraView>>,
    owned: OwnedDevices,
    serve_at_start: bool,
    spec_checks: SpecChecks,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let preparer = Arc::new(NodePreparer {
        client: settings.client.clone(),
        node: settings.node_name.clone(),
        backend: backend.clone(),
        checkpoint: Store::new(&settings.checkpoint_dir),
        cdi_root: settings.cdi_root.clone(),
        settings: settings.allocate.clone(),
        boot_id: settings.boot_id.clone(),
        owned: owned.clone(),
        status: StatusWriter::new(settings.client.clone(), &settings.node_name),
    });
    let status_writes = preparer.status.clone();
    tokio::spawn(check_claim_specs(
        preparer.clone(),
        spec_checks,
        cancel.child_token(),
    ));
    let recovering = preparer.clone();
    let recovered = tokio::task::spawn_blocking(move || {
        let loaded = recovering.recover()?;
        let destroyed = recovering.destroy_unowned_migs(&dra_gpus)?;
        Ok::<_, String>((loaded, destroyed))
    });
    match recovered.await {
        Ok(Ok((loaded, destroyed))) => info!(
            claims = loaded.data.claims.len(),
            rolled_back = loaded.rollback.len(),
            rebooted = loaded.rebooted,
            unowned_mig_destroyed = destroyed,
            "DRA checkpoint recovered"
        ),
        // Serve anyway: the kubelet retries claims, and a crash loop helps nobody.
        Ok(Err(e)) => error!(error = %e, "DRA checkpoint recovery failed"),
        Err(e) => return Err(Error::Task(e.to_string())),
    }

    let health = HealthService::new(HealthOptions::default(), HealthPolicy::default());
    let watcher = {
        let (health, backend, cancel) = (health.clone(), backend.clone(), cancel.clone());
        tokio::spawn(async move {
            if let Err(e) = health.run(backend, cancel.clone()).await {
                error!(error = %e, "cannot watch GPU health for DRA devices; they are Unknown");
            }
            // Open health streams hold the gRPC server's graceful shutdown.
            cancel.cancelled().await;
            health.close();
        })
    };

    let active = views.borrow().as_ref().map_or(serve_at_start, |v| v.active);
    let (serve_tx, serve_rx) = watch::channel(active);
    let server = tokio::spawn(serve_while_active(
        DraPaths::under(&settings.kubelet_dir),
        preparer,
        health.clone(),
        settings.retry,
        serve_rx,
        cancel.child_token(),
    ));
    let publishing = publish_views(
        &settings,
        &mut views,
        &health,
        &owned,
        &serve_tx,
        cancel.clone(),
    );
    tokio::pin!(publishing);
    let mut server = server;
    let served = tokio::select! {
        r = &mut server => r,
        () = &mut publishing => {
            // Only returns on cancel (or when the agent dropped its sender).
            cancel.cancel();
            server.await
        }
    };
    // The publisher and the health watch too, whichever side ended first.
    cancel.cancel();
    let _ = watcher.await;
    // The kubelet is no longer served: write the status.devices still queued.
    let queued = status_writes.pending();
    if queued > 0 {
        match status_writes.flush(STATUS_FLUSH).await {
            0 => info!(claims = queued, "queued status.devices writes flushed"),
            left => {
                warn!(claims = left, budget = ?STATUS_FLUSH, "status.devices writes not flushed in the shutdown budget; those claims' status is out of date")
            }
        }
    }
    match served {
        Ok(r) => r.map_err(Error::from),
        Err(e) => Err(Error::Task(e.to_string())),
    }
}

/// When the per-claim CDI specs are checked ([`NodePreparer::verify_claim_specs`]): a
/// message on `now` (the agent's SIGHUP and `--cdi-verify-interval` check of the node
/// spec); each rewritten spec counts on `repairs` (`tessera_cdi_spec_repairs_total`).
pub struct SpecChecks {
    pub now: tokio::sync::mpsc::UnboundedReceiver<()>,
    pub repairs: prometheus_client::metrics::counter::Counter,
}

async fn check_claim_specs(
    preparer: Arc<NodePreparer>,
    mut checks: SpecChecks,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            got = checks.now.recv() => if got.is_none() { return },
        }
        let p = preparer.clone();
        match tokio::task::spawn_blocking(move || p.verify_claim_specs()).await {
            Ok(Ok(check)) => {
                for (uid, reason) in &check.repaired {
                    warn!(claim_uid = %uid, %reason, "a claim's CDI spec on disk was wrong; rewritten");
                    checks.repairs.inc();
                }
                for (uid, why) in &check.unchecked {
                    warn!(claim_uid = %uid, %why, "a claim's CDI spec cannot be checked; left as it is");
                }
            }
            Ok(Err(e)) => error!(error = %e, "cannot check the claims' CDI specs"),
            Err(e) => error!(error = %e, "the claims' CDI spec check failed"),
        }
    }
}

/// Serve the kubelet (`dra.sock`, then the registration socket) while `active` says so,
/// until `cancel`. Going inactive stops both servers (their sockets are removed, so the
/// kubelet's plugin watcher unregisters the driver) and ends the health streams they
/// served; going active again offers the registration anew.
async fn serve_while_active(
    paths: DraPaths,
    preparer: Arc<NodePreparer>,
    health: HealthService,
    retry: RetryPolicy,
    mut active: watch::Receiver<bool>,
    cancel: CancellationToken,
) -> Result<(), socket::Error> {
    let flatten = |r: Result<Result<(), socket::Error>, tokio::task::JoinError>| match r {
        Ok(r) => r,
        Err(e) => Err(socket::Error::Serve {
            socket: paths.plugin_socket.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        }),
    };
    loop {
        while !*active.borrow_and_update() {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                r = active.changed() => if r.is_err() { return Ok(()) },
            }
        }
        info!("the DRA driver serves the kubelet (registration offered)");
        let stop = cancel.child_token();
        let session = health.session();
        let mut server = tokio::spawn(kubelet::serve_with_health(
            paths.clone(),
            preparer.clone(),
            session.clone(),
            retry,
            stop.clone(),
        ));
        let ended = loop {
            tokio::select! {
                r = &mut server => break Some(r),
                _ = cancel.cancelled() => break None,
                r = active.changed() => {
                    if r.is_err() || !*active.borrow_and_update() {
                        break None;
                    }
                }
            }
        };
        if let Some(r) = ended {
            return flatten(r);
        }
        stop.cancel();
        session.close();
        flatten(server.await)?;
        if cancel.is_cancelled() {
            return Ok(());
        }
        info!("the DRA driver owns no GPU: withdrawn from the kubelet (sockets removed)");
    }
}

/// The slices of `view` with GPU health applied (`mode`); the health service and `owned`
/// learn the full device list (withheld devices included). `None` when the slices cannot
/// be built. An inactive view has no slices (and publishes no device).
fn desired_slices(
    view: &DraView,
    settings: &DraSettings,
    health: &HealthService,
    owned: &OwnedDevices,
    mode: TaintMode,
) -> Option<Vec<ResourceSlice>> {
    if !view.active {
        owned.publish(std::iter::empty());
        health.set_devices(Vec::new());
        return Some(Vec::new());
    }
    let mut slices = match slices_for(view, &settings.node_name, settings.counters) {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot build ResourceSlices");
            return None;
        }
    };
    let devices = devices_from_slices(&slices, &view.inventory);
    owned.publish(devices.iter().map(|d| d.device.clone()));
    health.set_devices(devices);
    apply_taints(&mut slices, &view.inventory, &health.state().taints(), mode);
    Some(slices)
}

/// Turn views and health into slices and keep them published, until `cancel` or the
/// views end; say on `serve` whether the kubelet is to be served (set before the slices
/// of an active view are sent, after the empty set of an inactive one).
async fn publish_views(
    settings: &DraSettings,
    views: &mut watch::Receiver<Option<DraView>>,
    health: &HealthService,
    owned: &OwnedDevices,
    serve: &watch::Sender<bool>,
    cancel: CancellationToken,
) {
    // Wait for the first applied config.
    let mut view = loop {
        if let Some(v) = views.borrow_and_update().clone() {
            break v;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = views.changed() => if r.is_err() { return },
        }
    };
    health.set_policy(view.health.clone());
    serve.send_if_modified(|s| std::mem::replace(s, view.active) != view.active);
    let mut mode = TaintMode::Taint;
    let mut health_rx = health.subscribe();
    // Nothing published when the first view cannot be built: the last slices stay (none).
    let initial = desired_slices(&view, settings, health, owned, mode).unwrap_or_default();
    health_rx.borrow_and_update();
    let (desired_tx, desired_rx) = watch::channel(initial);
    let (status_tx, mut status_rx) = watch::channel(None);
    let publisher = Publisher::new(settings.client.clone(), &settings.node_name, DRIVER);
    let task = tokio::spawn(publisher.run(desired_rx, status_tx, cancel.child_token()));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = views.changed() => {
                if r.is_err() { break }
                let Some(v) = views.borrow_and_update().clone() else { continue };
                health.set_policy(v.health.clone());
                view = v;
            }
            r = health_rx.changed() => {
                if r.is_err() { break }
                health_rx.borrow_and_update();
            }
            r = status_rx.changed() => {
                if r.is_err() { break }
                let Some(e) = status_rx.borrow_and_update().clone() else { continue };
                warn!(error = %e, "ResourceSlices not published; retrying");
                let next = mode.after_publish_error(&e);
                if next == mode { continue }
                mode = next;
            }
        }
        // The last slices stay when the new ones cannot be built.
        let Some(slices) = desired_slices(&view, settings, health, owned, mode) else {
            continue;
        };
        // set_devices may have signalled a change that this rebuild already covers.
        health_rx.borrow_and_update();
        if view.active {
            serve.send_if_modified(|s| !std::mem::replace(s, true));
        }
        desired_tx.send_if_modified(|cur| {
            let changed = *cur != slices;
            if changed {
                info!(
                    slices = slices.len(),
                    ?mode,
                    "DRA devices or their health changed; republishing"
                );
                *cur = slices;
            }
            changed
        });
        if !view.active {
            serve.send_if_modified(|s| std::mem::replace(s, false));
        }
    }
    cancel.cancel();
    let _ = task.await;
}
