//! Keeps one server per advertised resource, registered with the kubelet.
//!
//! ```text
//! snapshot changed ──▶ diff resource names ──▶ stop removed servers
//!                                          └─▶ bind + serve + Register new ones
//! kubelet.sock created (inotify) ──▶ the kubelet restarted and deleted our sockets:
//!                                    re-bind + Register every resource
//! Register failed ──▶ retry with backoff (10 ms … 30 s) until it succeeds (the first
//!                    attempts race the kubelet's listen() right after kubelet.sock appears)
//! cancel ──▶ stop all servers (each removes its socket) and return
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::allocate::AllocateSettings;
use super::registration::{register, socket_name};
use super::server::{bind, options, serve, ResourceService};
use super::snapshot::SharedSnapshot;
use super::{Error, Result};
use crate::retry::Backoff;

/// Where the device-plugin sockets live.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// `<kubelet-dir>/device-plugins`.
    pub plugin_dir: PathBuf,
    pub settings: Arc<AllocateSettings>,
    pub metrics: Arc<crate::metrics::NodeMetrics>,
}

impl SupervisorConfig {
    pub fn kubelet_socket(&self) -> PathBuf {
        self.plugin_dir.join("kubelet.sock")
    }
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<Result<()>>,
    registered: bool,
}

/// Run until `cancel` fires.
pub async fn run(
    cfg: SupervisorConfig,
    mut snapshots: watch::Receiver<SharedSnapshot>,
    cancel: CancellationToken,
) -> Result<()> {
    std::fs::create_dir_all(&cfg.plugin_dir).map_err(|source| Error::Io {
        path: cfg.plugin_dir.display().to_string(),
        source,
    })?;
    let (kubelet_tx, mut kubelet_rx) = mpsc::unbounded_channel();
    let _watcher = watch_kubelet_socket(&cfg.plugin_dir, kubelet_tx)?;

    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut backoff = Backoff::doubling(Duration::from_millis(10), Duration::from_secs(30));
    // The wait before the next registration retry, while one is pending.
    let mut wait = backoff.next_delay();
    let initial = snapshots.borrow_and_update().resource_names();
    reconcile(&cfg, &snapshots, &mut running, &initial, false).await;
    loop {
        // For `/readyz`: how many servers the kubelet has accepted.
        let registered = running.values().filter(|r| r.registered).count();
        cfg.metrics.probes.plugins(registered, running.len());
        let needs_retry = running.values().any(|r| !r.registered);
        let retry = tokio::time::sleep(if needs_retry {
            wait
        } else {
            Duration::from_secs(3600)
        });
        tokio::select! {
            _ = cancel.cancelled() => break,
            changed = snapshots.changed() => {
                if changed.is_err() { break; }
                let names = snapshots.borrow_and_update().resource_names();
                reconcile(&cfg, &snapshots, &mut running, &names, false).await;
            }
            Some(()) = kubelet_rx.recv() => {
                // Coalesce a burst of events (create + modify) into one restart.
                while kubelet_rx.try_recv().is_ok() {}
                info!("kubelet.sock re-created: the kubelet restarted; re-registering");
                let names = snapshots.borrow().resource_names();
                reconcile(&cfg, &snapshots, &mut running, &names, true).await;
                backoff.reset();
                wait = backoff.next_delay();
            }
            _ = retry, if needs_retry => {
                register_pending(&cfg, &mut running).await;
                if running.values().all(|r| r.registered) {
                    backoff.reset();
                }
                wait = backoff.next_delay();
            }
        }
    }
    cfg.metrics.probes.plugins_stopped();
    for (_, r) in std::mem::take(&mut running) {
        stop(r).await;
    }
    Ok(())
}

/// Make the running servers match `names`; with `restart_all`, every server is re-bound.
async fn reconcile(
    cfg: &SupervisorConfig,
    snapshots: &watch::Receiver<SharedSnapshot>,
    running: &mut BTreeMap<String, Running>,
    names: &[String],
    restart_all: bool,
) {
    let gone: Vec<String> = running
        .keys()
        .filter(|n| restart_all || !names.contains(n))
        .cloned()
        .collect();
    for name in gone {
        if let Some(r) = running.remove(&name) {
            if !names.contains(&name) {
                info!(resource = %name, "resource no longer advertised; stopping its server");
            }
            stop(r).await;
        }
    }
    for name in names {
        if running.contains_key(name) {
            continue;
        }
        match start(cfg, snapshots, name) {
            Ok(r) => {
                running.insert(name.clone(), r);
            }
            Err(e) => warn!(resource = %name, error = %e, "cannot start device-plugin server"),
        }
    }
    register_pending(cfg, running).await;
}

fn start(
    cfg: &SupervisorConfig,
    snapshots: &watch::Receiver<SharedSnapshot>,
    resource: &str,
) -> Result<Running> {
    let socket = cfg.plugin_dir.join(socket_name(resource));
    let listener = bind(&socket)?;
    let stop = CancellationToken::new();
    let service = ResourceService::new(
        resource,
        snapshots.clone(),
        cfg.settings.clone(),
        stop.clone(),
        cfg.metrics.clone(),
    );
    let task = tokio::spawn(serve(service, listener, socket, stop.clone()));
    Ok(Running {
        stop,
        task,
        registered: false,
    })
}

async fn stop(r: Running) {
    r.stop.cancel();
    match r.task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "device-plugin server ended with an error"),
        Err(e) => warn!(error = %e, "device-plugin server task failed"),
    }
}

/// Register every server not yet registered, concurrently.
async fn register_pending(cfg: &SupervisorConfig, running: &mut BTreeMap<String, Running>) {
    let kubelet = cfg.kubelet_socket();
    if !kubelet.exists() {
        return;
    }
    let pending: Vec<String> = running
        .iter()
        .filter(|(_, r)| !r.registered)
        .map(|(n, _)| n.clone())
        .collect();
    let results = futures::future::join_all(pending.iter().map(|name| {
        let kubelet = kubelet.clone();
        async move {
            let endpoint = socket_name(name);
            register(&kubelet, &endpoint, name, options()).await
        }
    }))
    .await;
    for (name, result) in pending.iter().zip(results) {
        match result {
            Ok(()) => {
                if let Some(r) = running.get_mut(name) {
                    r.registered = true;
                }
            }
            Err(e) => warn!(resource = %name, error = %e, "registration failed; will retry"),
        }
    }
}

/// inotify on the device-plugin directory: a message each time `kubelet.sock` is created.
fn watch_kubelet_socket(
    dir: &Path,
    tx: mpsc::UnboundedSender<()>,
) -> Result<notify::RecommendedWatcher> {
    let target = dir.join("kubelet.sock");
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if matches!(event.kind, notify::EventKind::Create(_))
                && event.paths.iter().any(|p| p == &target)
            {
                let _ = tx.send(());
            }
        }
    })
    .map_err(|e| Error::Io {
        path: dir.display().to_string(),
        source: std::io::Error::other(e.to_string()),
    })?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| Error::Io {
            path: dir.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
    Ok(watcher)
}
