//! `tessera node`: the DaemonSet agent.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

use tessera::agent::cluster::{watch_config_label, KubeEventRecorder};
use tessera::agent::dra::DraSettings;
use tessera::agent::ownership::{DraMode, Ownership};
use tessera::agent::slot_binding::{self, BindingSettings};
use tessera::agent::vgpu_guard::GuardMode;
use tessera::agent::vgpu_record::{self, RecordSettings};
use tessera::agent::{self, AgentOptions, EventRecorder, LogRecorder};
use tessera::cdi::devroot::DevRoot;
use tessera::cdi::migcaps::MigCapsPaths;
use tessera::deviceplugin::allocate::{AllocateSettings, PreloadMode};
use tessera::dra::registration::RetryPolicy;
use tessera::dra::slices::CounterLayout;
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
    /// The kubelet's root directory; sockets go to `<dir>/device-plugins/` (device plugin)
    /// and `<dir>/plugins_registry/` + `<dir>/plugins/gpu.tessera.io/` (DRA).
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// The kubelet's PodResources socket, read to learn which container holds a
    /// split-mode vGPU allocation (default: `<kubelet-dir>/pod-resources/kubelet.sock`).
    #[arg(long, env = "TESSERA_POD_RESOURCES_SOCKET")]
    pub pod_resources_socket: Option<PathBuf>,
    /// Where CDI specs are written.
    #[arg(long, env = "CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Seconds between checks of the node's CDI spec on disk (rewritten when missing,
    /// damaged or edited; also checked on SIGHUP); 0: on SIGHUP only.
    #[arg(long, env = "TESSERA_CDI_VERIFY_INTERVAL", default_value_t = 60)]
    pub cdi_verify_interval: u64,
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
    /// How the shim is injected into vGPU containers: `file` mounts the agent-written
    /// `<state-dir>/lib/ld.so.preload` at `/etc/ld.so.preload` (the container cannot
    /// unset it); `env` sets `LD_PRELOAD` (opt-in, not enforcing).
    #[arg(long, value_enum, default_value = "file")]
    pub shim_preload: PreloadMode,
    /// The CUDA shim in the agent's image, installed at start into
    /// `<state-dir>/lib/libtessera_cuda.so` (SHA-256 checked); vGPU allocations are refused
    /// while it is missing.
    #[arg(
        long,
        env = "TESSERA_SHIM_SOURCE",
        default_value = "/usr/lib/tessera/libtessera_cuda.so"
    )]
    pub shim_source: PathBuf,
    /// Where the host's /dev is mounted in the agent's container.
    #[arg(long, default_value = "/dev")]
    pub dev_root: String,
    /// Where the NVIDIA driver is installed on the host: `/`, or the driver container's
    /// root (`/run/nvidia/driver` with NVIDIA's GPU Operator; mount it at the same path).
    /// When `<root>/dev` exists, CDI specs name the device nodes' host paths under it.
    #[arg(long, env = "TESSERA_DRIVER_ROOT", default_value = "/")]
    pub driver_root: PathBuf,
    /// Where the host's /proc is visible to the agent (the NVIDIA driver's MIG capability
    /// table `driver/nvidia-caps/mig-minors` and `devices` are read there; the vGPU guard
    /// and the usage sampler read processes' `<pid>/cgroup` there).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Do not put CDI device names in Allocate responses (runtimes without CDI).
    #[arg(long)]
    pub no_cdi: bool,
    /// Run without the API server even in a cluster (no node label, no Events).
    #[arg(long)]
    pub standalone: bool,
    /// Serve Prometheus metrics on this address (e.g. `0.0.0.0:9465`); off when unset.
    #[arg(long, env = "TESSERA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Run the device-plugin path (`nvidia.com/gpu`, MIG and vGPU extended resources).
    #[arg(long, env = "TESSERA_DEVICE_PLUGIN", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub device_plugin: bool,
    /// The DRA driver `gpu.tessera.io` (ResourceSlices and the kubelet's DRA socket):
    /// `auto` registers and publishes only while the split (the node config's
    /// `tessera.dra.gpus`, or `--dra-gpus`) gives it a GPU, `on` always, `off` never
    /// (`true`/`false` are `on`/`off`; `--dra` alone is `on`). Needs the API server
    /// (Kubernetes 1.34+) and `--node-name`; without them `auto` stays off.
    #[arg(long, value_enum, env = "TESSERA_DRA", default_value = "auto",
          num_args = 0..=1, default_missing_value = "on")]
    pub dra: DraMode,
    /// With both paths on: the GPUs the DRA driver owns (`all`, `none`, `0,1,4-7`, GPU
    /// UUIDs, `model:H100`); the device plugin gets the rest. Overrides the node config's
    /// `tessera.dra.gpus`, which decides when this flag is not given.
    #[arg(long, env = "TESSERA_DRA_GPUS")]
    pub dra_gpus: Option<String>,
    /// Where MIG counter sets go: `separate` slices (Kubernetes 1.35+) or `inline` (1.34).
    #[arg(
        long,
        value_enum,
        env = "TESSERA_DRA_COUNTERS",
        default_value = "separate"
    )]
    pub dra_counters: Counters,
    /// This boot's ID; a change means the node rebooted (claims are prepared again).
    #[arg(long, default_value = "/proc/sys/kernel/random/boot_id")]
    pub boot_id_file: PathBuf,
    /// The NVML library to load (default: `libnvidia-ml.so.1` on the library path).
    #[arg(long, env = "TESSERA_NVML_LIB", hide = true)]
    pub nvml_lib: Option<PathBuf>,
    /// Seconds between usage samples (allocated-vs-used gauges, chargeback counters);
    /// 0 turns both off.
    #[arg(long, env = "TESSERA_USAGE_INTERVAL", default_value_t = 15)]
    pub usage_interval: u64,
    /// The pod label read as the team of chargeback series.
    #[arg(long, env = "TESSERA_TEAM_LABEL", default_value = tessera::metrics::usage::DEFAULT_TEAM_LABEL)]
    pub team_label: String,
    /// Seconds a container's chargeback series stay exported after it is gone (keep it
    /// above two scrape intervals so its last increments are scraped).
    #[arg(long, env = "TESSERA_CHARGEBACK_FORGET_AFTER", default_value_t = 120)]
    pub chargeback_forget_after: u64,
    /// Also export HAMi's vGPU monitor metric names (HostGPUMemoryUsage,
    /// vGPU_device_memory_usage_in_bytes, ...) so HAMi dashboards keep working.
    #[arg(long, env = "TESSERA_HAMI_METRICS")]
    pub hami_metrics: bool,
    /// What the vGPU guard does about a pod whose processes use more of a GPU than its
    /// vGPU slices allow, by the driver's own per-process accounting: `report` (an Event
    /// on the Node), `kill` (also SIGKILL its processes on that GPU) or `off`. Needs the
    /// host's PID namespace (`hostPID: true`) to see the driver's PIDs (docs/security.md).
    #[arg(long, env = "TESSERA_VGPU_GUARD", value_enum, default_value = "report")]
    pub vgpu_guard: GuardMode,
    /// Seconds between two samples of the vGPU guard.
    #[arg(long, default_value_t = 10)]
    pub vgpu_guard_interval: u64,
    /// MiB a pod may use above its slices on a GPU, per process of it there: the CUDA
    /// context the driver counts and the shim cannot see.
    #[arg(long, default_value_t = 1024)]
    pub vgpu_guard_tolerance_mib: u64,
    /// Seconds a pod must stay over, in every sample, before the guard acts.
    #[arg(long, default_value_t = 30)]
    pub vgpu_guard_grace: u64,
}

/// `--dra-counters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Counters {
    Separate,
    Inline,
}

type Hooks = (
    Arc<dyn EventRecorder>,
    Option<tokio::sync::watch::Receiver<Option<String>>>,
    Option<kube::Client>,
);

/// In a cluster (a kubeconfig or in-cluster service account and `--node-name`): watch the
/// node's `tessera.io/config` label and record Events on the node. `--config-name` wins
/// over the label. Without a cluster: logs only.
async fn cluster_hooks(args: &Args, cancel: &CancellationToken) -> Hooks {
    let standalone: Hooks = (Arc::new(LogRecorder), None, None);
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
        return (recorder, None, Some(client));
    }
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(watch_config_label(client.clone(), node, tx, cancel.clone()));
    (recorder, Some(rx), Some(client))
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
            match tessera::gpu::nvml::NvmlBackend::new(
                args.nvml_lib.as_deref().map(|p| p.as_os_str()),
            ) {
                Ok(nvml) => Arc::new(nvml),
                // A node without the NVIDIA driver (the DaemonSet does not need NVIDIA's
                // feature discovery to pick GPU nodes): idle rather than crash-loop.
                Err(e @ tessera::gpu::Error::NvmlUnavailable(_)) => {
                    tracing::warn!(error = %e, "no NVIDIA driver on this node: idling, nothing advertised (/readyz: no GPU on this node)");
                    Arc::new(NoGpu)
                }
                Err(e) => return Err(e).context("--gpu-backend nvml"),
            }
        }
    })
}

/// The backend of a node without the NVIDIA driver: no GPU, no health events.
struct NoGpu;

impl GpuBackend for NoGpu {
    fn name(&self) -> &'static str {
        "none"
    }

    fn inventory(&self) -> tessera::gpu::Result<tessera::gpu::Inventory> {
        Ok(tessera::gpu::Inventory::default())
    }

    fn watch_health(&self, _tx: tessera::gpu::HealthSender) -> tessera::gpu::Result<()> {
        Ok(())
    }

    fn apply_mig_layout(
        &self,
        gpu_uuid: &str,
        _layout: &[(String, u8)],
    ) -> tessera::gpu::Result<Vec<tessera::gpu::MigDeviceInfo>> {
        Err(tessera::gpu::Error::UnknownGpu(gpu_uuid.to_string()))
    }
}

/// The kubelet paths to run (`--device-plugin`, `--dra`, `--dra-gpus`).
fn paths(args: &Args, opts: &AgentOptions, client: Option<kube::Client>) -> Result<agent::Paths> {
    let ownership = Ownership::with_mode(args.device_plugin, args.dra, args.dra_gpus.as_deref())?;
    if !ownership.dra {
        return Ok(agent::Paths {
            ownership,
            dra: None,
        });
    }
    // `--dra=auto` beside the device plugin, outside a cluster: the DRA path stays off.
    let missing = match (&args.node_name, &client) {
        (None, _) => Some("--node-name"),
        (_, None) => Some("the API server"),
        _ => None,
    };
    if let (Some(what), DraMode::Auto, true) = (missing, args.dra, args.device_plugin) {
        info!("--dra=auto without {what}: the DRA path stays off");
        return Ok(agent::Paths {
            ownership: Ownership::with_mode(true, DraMode::Off, None)?,
            dra: None,
        });
    }
    let node_name = args
        .node_name
        .clone()
        .context("--dra needs --node-name (NODE_NAME)")?;
    let client = client.context(
        "--dra needs the API server (in-cluster service account or kubeconfig, not --standalone)",
    )?;
    let boot_id = tessera::dra::checkpoint::boot_id(&args.boot_id_file)
        .with_context(|| format!("--boot-id-file {}", args.boot_id_file.display()))?;
    let dra = DraSettings {
        client,
        node_name,
        kubelet_dir: args.kubelet_dir.clone(),
        cdi_root: args.cdi_root.clone(),
        checkpoint_dir: args.state_dir.join("dra"),
        boot_id,
        counters: match args.dra_counters {
            Counters::Separate => CounterLayout::Separate,
            Counters::Inline => CounterLayout::Inline,
        },
        allocate: opts.allocate.clone(),
        retry: RetryPolicy::default(),
        move_settle: std::time::Duration::from_secs(1),
        move_stall_warn: std::time::Duration::from_secs(10),
    };
    Ok(agent::Paths {
        ownership,
        dra: Some(dra),
    })
}

async fn run_async(args: Args) -> Result<()> {
    // Bad path flags fail before anything starts.
    Ownership::with_mode(args.device_plugin, args.dra, args.dra_gpus.as_deref())?;
    let backend = backend(&args)?;
    let metrics = Arc::new(tessera::metrics::NodeMetrics::with_hami(args.hami_metrics));
    let mut allocate = AllocateSettings::with_state_dir(&args.state_dir);
    allocate.preload = args.shim_preload;
    install_shim(&allocate, &args.shim_source);
    allocate.cdi = !args.no_cdi;
    // The capability table is read under --proc-root; its nodes live under --dev-root.
    allocate.mig_caps = MigCapsPaths::under(&args.proc_root, &args.dev_root);
    let host_dev = DevRoot::from_driver_root(&args.driver_root);
    if !host_dev.is_host() {
        allocate.mig_caps.host_dev_dir = host_dev.caps_dir();
    }
    info!(driver_root = %args.driver_root.display(), host_dev_root = host_dev.as_str(),
          "CDI specs name the NVIDIA device nodes under <host_dev_root>/dev");
    allocate.host_dev = host_dev;
    let mut opts = AgentOptions {
        kubelet_dir: args.kubelet_dir.clone(),
        cdi_root: args.cdi_root.clone(),
        config_path: args.config.clone(),
        config_name: args.config_name.clone(),
        dev_root: args.dev_root.clone(),
        allocate,
        metrics: metrics.clone(),
        cdi_verify_interval: std::time::Duration::from_secs(args.cdi_verify_interval),
        vgpu_record: None,
        slot_binding: None,
        advertised: None,
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
    let (recorder, config_label, client) = cluster_hooks(&args, &cancel).await;
    // In a cluster, the split-mode GPUs are described on the Node for the extender.
    opts.vgpu_record = client
        .clone()
        .zip(args.node_name.clone())
        .map(|(client, node_name)| RecordSettings {
            client,
            node_name,
            heartbeat: vgpu_record::HEARTBEAT_PERIOD,
        });
    // ... and split-mode slots are bound to their pod's assignment.
    opts.slot_binding = client
        .clone()
        .zip(args.node_name.clone())
        .map(|(client, node_name)| BindingSettings {
            client,
            node_name,
            pod_resources_socket: pod_resources_socket(&args),
            kubelet_checkpoint: kubelet_checkpoint(&args),
            poll: slot_binding::DEFAULT_POLL,
        });
    spawn_vgpu_dir_reconcile(&args, &opts.allocate, &cancel);
    opts.advertised = spawn_sampler(&args, &opts, &backend, client.clone(), &cancel);
    spawn_coexistence_watch(&args, backend.as_ref(), &recorder, &metrics, &cancel);
    spawn_vgpu_guard(&args, &opts, &backend, &recorder, &cancel);
    let triggers = agent::Triggers {
        reload: reload_rx,
        config_label,
    };
    let paths = paths(&args, &opts, client)?;
    let result = agent::run_with(backend, opts, recorder, triggers, paths, cancel.clone()).await;
    cancel.cancel();
    signals.abort();
    let dra_dir = args.state_dir.join("dra");
    // `auto` may never have run the driver: fold only a log that exists.
    if args.dra != DraMode::Off
        && dra_dir
            .join(tessera::dra::checkpoint::log::FILE_NAME)
            .exists()
    {
        settle_dra_checkpoint(dra_dir).await;
    }
    result.context("node agent")
}

/// The kubelet's PodResources socket (`--pod-resources-socket`, else under the kubelet dir).
fn pod_resources_socket(args: &Args) -> PathBuf {
    args.pod_resources_socket
        .clone()
        .unwrap_or_else(|| args.kubelet_dir.join("pod-resources/kubelet.sock"))
}

/// The kubelet's device-manager checkpoint.
fn kubelet_checkpoint(args: &Args) -> PathBuf {
    args.kubelet_dir
        .join("device-plugins/kubelet_internal_checkpoint")
}

/// The usage sampler, fed the device plugin's snapshots; `None` with `--usage-interval 0`.
fn spawn_sampler(
    args: &Args,
    opts: &AgentOptions,
    backend: &Arc<dyn GpuBackend>,
    client: Option<kube::Client>,
    cancel: &CancellationToken,
) -> Option<tokio::sync::watch::Sender<tessera::deviceplugin::snapshot::SharedSnapshot>> {
    use tessera::metrics::sampler::{self, SamplerSettings};
    if args.usage_interval == 0 {
        info!("--usage-interval 0: usage metrics and chargeback off");
        return None;
    }
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    let settings = SamplerSettings {
        node_name: args.node_name.clone().unwrap_or_default(),
        interval: std::time::Duration::from_secs(args.usage_interval),
        forget_after: std::time::Duration::from_secs(args.chargeback_forget_after),
        team_label: args.team_label.clone(),
        pod_resources_socket: pod_resources_socket(args),
        kubelet_checkpoint: kubelet_checkpoint(args),
        alloc_dirs: opts.allocate.alloc_dirs(),
        client,
        proc_root: args.proc_root.clone(),
    };
    tokio::spawn(sampler::run(
        settings,
        backend.clone(),
        rx,
        opts.metrics.clone(),
        cancel.child_token(),
    ));
    Some(tx)
}

/// The vGPU guard ([`tessera::agent::vgpu_guard`]), unless `--vgpu-guard off`.
fn spawn_vgpu_guard(
    args: &Args,
    opts: &AgentOptions,
    backend: &Arc<dyn GpuBackend>,
    recorder: &Arc<dyn EventRecorder>,
    cancel: &CancellationToken,
) {
    use tessera::agent::vgpu_guard::{self, BackendProcesses, GuardConfig};
    if args.vgpu_guard == GuardMode::Off || args.vgpu_guard_interval == 0 {
        info!("--vgpu-guard off: vGPU limits are the shim's alone");
        return;
    }
    let cfg = GuardConfig {
        mode: args.vgpu_guard,
        interval: std::time::Duration::from_secs(args.vgpu_guard_interval),
        settings: tessera::vgpu::guard::Settings {
            tolerance_per_process_bytes: args.vgpu_guard_tolerance_mib.saturating_mul(1 << 20),
            grace_ms: args.vgpu_guard_grace.saturating_mul(1000),
        },
        alloc_dirs: opts.allocate.alloc_dirs(),
        kubelet_checkpoint: kubelet_checkpoint(args),
        proc_root: args.proc_root.clone(),
    };
    let source = Arc::new(BackendProcesses(backend.clone()));
    tokio::spawn(vgpu_guard::run(
        cfg,
        source,
        recorder.clone(),
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default()
        },
        cancel.child_token(),
    ));
}

/// Reports other device plugins that register Tessera's resources or advertise this
/// node's GPUs (NVIDIA's plugin, HAMi), once a minute.
fn spawn_coexistence_watch(
    args: &Args,
    backend: &dyn GpuBackend,
    recorder: &Arc<dyn EventRecorder>,
    metrics: &Arc<tessera::metrics::NodeMetrics>,
    cancel: &CancellationToken,
) {
    use tessera::deviceplugin::coexist;
    let gpu_ids = backend
        .inventory()
        .map(|inv| coexist::node_gpu_ids(&inv))
        .unwrap_or_default();
    let sink = Arc::new(coexist::AgentSink {
        recorder: recorder.clone(),
        metrics: metrics.clone(),
    });
    tokio::spawn(coexist::watch(
        args.kubelet_dir.join("device-plugins"),
        gpu_ids,
        sink,
        std::time::Duration::from_secs(60),
        cancel.clone(),
    ));
}

/// Copy the shim from the image into the state directory (checksum verified). A failure
/// is logged, and every vGPU allocation is refused with its reason until a restart.
fn install_shim(allocate: &AllocateSettings, source: &std::path::Path) {
    match allocate.shim.install(source, &allocate.shim_container_path) {
        Ok(sha256) => info!(source = %source.display(), dest = %allocate.shim.host_path.display(),
                            %sha256, "CUDA shim installed"),
        Err(e) => tracing::error!(error = %e,
            "CUDA shim not installed: vGPU allocations will be refused"),
    }
}

/// Every minute, remove the device-plugin vGPU directories (limits, accounting) of
/// containers the kubelet's device checkpoint no longer holds.
fn spawn_vgpu_dir_reconcile(args: &Args, allocate: &AllocateSettings, cancel: &CancellationToken) {
    let dirs = allocate.alloc_dirs();
    let checkpoint = kubelet_checkpoint(args);
    let cancel = cancel.clone();
    let cdi_root = args.cdi_root.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (d, cp) = (dirs.clone(), checkpoint.clone());
            let grace = std::time::Duration::from_secs(120);
            match tokio::task::spawn_blocking(move || {
                tessera::shimfiles::reconcile_device_plugin(&d, &cp, grace)
            })
            .await
            {
                Ok(Ok(removed)) if !removed.is_empty() => {
                    for id in &removed {
                        // A split-mode allocation's CDI spec goes with its directory.
                        if let Err(e) = slot_binding::remove_spec(&cdi_root, id) {
                            tracing::warn!(%id, error = %e, "cannot remove a vGPU CDI spec");
                        }
                    }
                    info!(
                        ?removed,
                        "removed vGPU directories of containers that are gone"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "vGPU directory cleanup skipped"),
                Err(e) => tracing::warn!(error = %e, "vGPU directory cleanup failed"),
            }
        }
    });
}

/// At shutdown (SIGTERM, the agent stopped): fold the DRA checkpoint's log into its
/// snapshot, so that a rollback to a release that reads only the snapshot (0.2 and
/// earlier) finds every prepared claim there.
async fn settle_dra_checkpoint(dir: PathBuf) {
    let settled = tokio::task::spawn_blocking(move || {
        let store = tessera::dra::checkpoint::Store::new(&dir);
        let session = store.session()?;
        session.settle()
    })
    .await;
    match settled {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot fold the DRA checkpoint log into its snapshot")
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot fold the DRA checkpoint log into its snapshot")
        }
    }
}
