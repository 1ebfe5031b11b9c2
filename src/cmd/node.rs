//! `tessera node`: the DaemonSet agent.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

use tessera::agent::cluster::{watch_config_label, KubeEventRecorder};
use tessera::agent::{self, AgentOptions, EventRecorder, LogRecorder};
use tessera::deviceplugin::allocate::{AllocateSettings, PreloadMode};
use tessera::gpu::GpuBackend;

/// Which GPU backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Nvml,
    Fake,
}

/// Flags of `tessera node` (environment variables in brackets).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The kubelet's root directory; sockets go to `<dir>/device-plugins/`.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Layout config: a file, or a directory of named configs (mounted ConfigMap).
    /// Hot-reloaded on change and on SIGHUP.
    #[arg(long, env = "TESSERA_CONFIG")]
    pub config: Option<PathBuf>,
    /// The node's `tessera.io/config` label value: which named config to use.
    #[arg(long, env = "TESSERA_CONFIG_NAME")]
    pub config_name: Option<String>,
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[arg(long, value_enum, env = "TESSERA_GPU_BACKEND", default_value = "nvml")]
    pub gpu_backend: Backend,
    /// Fake GPUs: `8xH100-80GB`, `2xA100-80GB,1xL4`, or an inventory YAML file.
    #[arg(long, env = "TESSERA_FAKE_GPUS", default_value = "8xH100-80GB")]
    pub fake_gpus: String,
    /// Agent state (vGPU accounting directories, the shim library).
    #[arg(long, env = "TESSERA_STATE_DIR", default_value = "/var/lib/tessera")]
    pub state_dir: PathBuf,
    /// How the shim is injected into vGPU containers.
    #[arg(long, value_enum, default_value = "env")]
    pub shim_preload: PreloadMode,
    /// Where the host's /dev is mounted in the agent's container.
    #[arg(long, default_value = "/dev")]
    pub dev_root: String,
    /// Do not put CDI device names in Allocate responses (runtimes without CDI).
    #[arg(long)]
    pub no_cdi: bool,
    /// Run without the API server even in a cluster (no node label, no Events).
    #[arg(long)]
    pub standalone: bool,
    /// Serve Prometheus metrics on this address (e.g. `0.0.0.0:9465`); off when unset.
    #[arg(long, env = "TESSERA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

type Hooks = (
    Arc<dyn EventRecorder>,
    Option<tokio::sync::watch::Receiver<Option<String>>>,
);

/// In a cluster (a kubeconfig or in-cluster service account and `--node-name`): watch the
/// node's `tessera.io/config` label and record Events on the node. `--config-name` wins
/// over the label. Without a cluster: logs only.
async fn cluster_hooks(args: &Args, cancel: &CancellationToken) -> Hooks {
    let standalone: Hooks = (Arc::new(LogRecorder), None);
    if args.standalone {
        return standalone;
    }
    let Some(node) = args.node_name.clone() else {
        return standalone;
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no Kubernetes API access; running standalone");
            return standalone;
        }
    };
    let recorder: Arc<dyn EventRecorder> =
        Arc::new(KubeEventRecorder::new(client.clone(), node.clone()));
    if args.config_name.is_some() {
        return (recorder, None);
    }
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(watch_config_label(client, node, tx, cancel.clone()));
    (recorder, Some(rx))
}

pub fn run(args: Args) -> Result<()> {
    // One thread: every task is short and I/O-bound, and a single thread avoids cross-core
    // wake-ups on the Allocate path (measured in benches/node_agent.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_async(args))
}

fn backend(args: &Args) -> Result<Arc<dyn GpuBackend>> {
    Ok(match args.gpu_backend {
        Backend::Fake => Arc::new(
            tessera::gpu::fake::FakeBackend::from_arg(&args.fake_gpus).context("--fake-gpus")?,
        ),
        Backend::Nvml => {
            Arc::new(tessera::gpu::nvml::NvmlBackend::new(None).context("--gpu-backend nvml")?)
        }
    })
}

async fn run_async(args: Args) -> Result<()> {
    let backend = backend(&args)?;
    let metrics = Arc::new(tessera::metrics::NodeMetrics::new());
    let mut allocate = AllocateSettings::with_state_dir(&args.state_dir);
    allocate.preload = args.shim_preload;
    allocate.cdi = !args.no_cdi;
    let opts = AgentOptions {
        kubelet_dir: args.kubelet_dir.clone(),
        cdi_root: args.cdi_root.clone(),
        config_path: args.config.clone(),
        config_name: args.config_name.clone(),
        dev_root: args.dev_root.clone(),
        allocate,
        metrics: metrics.clone(),
    };
    info!(
        backend = backend.name(),
        node = args.node_name.as_deref().unwrap_or(""),
        kubelet_dir = %args.kubelet_dir.display(),
        "starting node agent"
    );

    let cancel = CancellationToken::new();
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let signals = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
                    _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
                    _ = sighup.recv() => { let _ = reload_tx.send(()); }
                }
            }
            cancel.cancel();
        })
    };
    if let Some(addr) = args.metrics_addr {
        let (metrics, cancel) = (metrics.clone(), cancel.clone());
        // Bind now so a bad address fails the start, not a background task.
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-addr {addr}"))?;
        tokio::spawn(async move {
            if let Err(e) = tessera::metrics::serve(listener, metrics, cancel).await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
    }
    let (recorder, config_label) = cluster_hooks(&args, &cancel).await;
    let triggers = agent::Triggers {
        reload: reload_rx,
        config_label,
    };
    let result = agent::run(backend, opts, recorder, triggers, cancel.clone()).await;
    cancel.cancel();
    signals.abort();
    result.context("node agent")
}
