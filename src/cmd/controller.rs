//! `tessera controller`: the quota controller (leader-elected reconcile loop) and its
//! mutating admission webhook in one process. `tessera controller crds` prints the CRDs.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tessera::controller::config::ControllerConfig;
use tessera::controller::crd;
use tessera::controller::reconciler::{self, Config, SystemClock};
use tessera::controller::tls::ReloadingCert;
use tessera::controller::webhook_server::{self, ApiClasses};
use tessera::quota::quantity::parse_duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Flags of `tessera controller`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Sub>,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "tessera-system")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "tessera-controller")]
    pub lease_name: String,
    /// This instance's identity in the Lease (default: the pod name, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Lease duration: a standby takes over this long after the leader's last renewal.
    #[arg(long, default_value = "15s")]
    pub lease_duration: String,
    /// Longest time between two passes when nothing changes (an unchanged cluster is
    /// decided again this often, as a safety net).
    #[arg(long, default_value = "30s")]
    pub resync: String,
    /// Address of the HTTPS admission webhook.
    #[arg(long, default_value = "0.0.0.0:9443")]
    pub webhook_addr: String,
    /// PEM certificate chain of the webhook.
    #[arg(long, default_value = "/etc/tessera/webhook/tls.crt")]
    pub webhook_cert: PathBuf,
    /// PEM private key of the webhook.
    #[arg(long, default_value = "/etc/tessera/webhook/tls.key")]
    pub webhook_key: PathBuf,
    /// How often the certificate files are re-read (a rotated pair is served to new
    /// connections without a restart).
    #[arg(long, default_value = "10s")]
    pub webhook_cert_reload: String,
    /// Do not serve the webhook (e.g. it runs in another Deployment).
    #[arg(long)]
    pub no_webhook: bool,
    /// Do not run the reconcile loop (webhook only).
    #[arg(long)]
    pub webhook_only: bool,
    /// Configuration file: Kueue's `Configuration` subset (`waitForPodsReady`,
    /// `resources.deviceClassMappings`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// First retry delay of an eviction refused by a PodDisruptionBudget; doubles per
    /// refusal up to --eviction-backoff-max.
    #[arg(long, default_value = "5s")]
    pub eviction_backoff: String,
    #[arg(long, default_value = "5m")]
    pub eviction_backoff_max: String,
}

/// Subcommands of `tessera controller`.
#[derive(clap::Subcommand, Debug)]
pub enum Sub {
    /// Print the tessera.io/v1alpha1 CRDs (YAML) and exit.
    Crds,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(Sub::Crds) = args.command {
        print!("{}", crd::crds_yaml().context("encoding the CRDs")?);
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_async(args))
}

fn millis(flag: &str, value: &str) -> Result<u64> {
    parse_duration(value).with_context(|| format!("--{flag}"))
}

async fn run_async(args: Args) -> Result<()> {
    let identity = match args.identity.clone() {
        Some(i) if !i.is_empty() => i,
        _ => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "tessera-controller".into()),
    };
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--config {}", path.display()))?;
            ControllerConfig::parse(&text)
                .with_context(|| format!("--config {}", path.display()))?
        }
        None => ControllerConfig::default(),
    };
    let cfg = Config {
        lease_namespace: args.lease_namespace.clone(),
        lease_name: args.lease_name.clone(),
        identity,
        lease_duration: millis("lease-duration", &args.lease_duration)?,
        resync: Duration::from_millis(millis("resync", &args.resync)?.max(100)),
        reporting_controller: "tessera.io/controller".into(),
        eviction_backoff_base: millis("eviction-backoff", &args.eviction_backoff)?,
        eviction_backoff_max: millis("eviction-backoff-max", &args.eviction_backoff_max)?,
        device_classes: file.device_classes,
        pods_ready: file.wait_for_pods_ready,
    };
    let mut kube_config = kube::Config::infer()
        .await
        .context("connecting to the API server (in-cluster config or KUBECONFIG)")?;
    // kube's default layer retries 429 up to 15 times with backoff up to 1000 s: an
    // eviction refused by a PodDisruptionBudget would stall the whole pass. Every write
    // is retried by the next pass instead, and refused evictions with their own backoff.
    kube_config.default_retry = false;
    let client = kube::Client::try_from(kube_config).context("building the API client")?;
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let reload_shutdown = shutdown.clone();
    if !args.no_webhook {
        let cert = ReloadingCert::load(&args.webhook_cert, &args.webhook_key)
            .context("--webhook-cert/--webhook-key")?;
        let tls = cert.server_config().context("webhook TLS")?;
        let every = Duration::from_millis(
            millis("webhook-cert-reload", &args.webhook_cert_reload)?.max(100),
        );
        tasks.push(tokio::spawn(async move {
            cert.watch(every, reload_shutdown).await;
            Ok(())
        }));
        let listener = tokio::net::TcpListener::bind(&args.webhook_addr)
            .await
            .with_context(|| format!("--webhook-addr {}", args.webhook_addr))?;
        info!(addr = %args.webhook_addr, "serving the admission webhook");
        let classes = Arc::new(ApiClasses(client.clone()));
        tasks.push(tokio::spawn(webhook_server::serve(
            listener,
            tls,
            classes,
            shutdown.clone(),
        )));
    }
    if !args.webhook_only {
        info!(identity = %cfg.identity, lease = %cfg.lease_name, "starting the quota controller");
        tasks.push(tokio::spawn(reconciler::run(
            client,
            cfg,
            Arc::new(SystemClock),
            shutdown.clone(),
        )));
    }
    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = sigterm.recv() => info!("SIGTERM: shutting down"),
        _ = sigint.recv() => info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
    for t in tasks {
        t.await
            .context("controller task panicked")?
            .context("controller task")?;
    }
    Ok(())
}
