//! `tessera controller`: the quota controller (leader-elected reconcile loop) and its
//! mutating admission webhook in one process. `tessera controller crds` prints the CRDs.

use anyhow::{Context, Result};
use futures::FutureExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tessera::autoscale::Coupling;
use tessera::controller::autoscaler::{self, AutoscalerConfig};
use tessera::controller::certs::{self, CertConfig};
use tessera::controller::claim_templates::ApiTemplates;
use tessera::controller::config::ControllerConfig;
use tessera::controller::crd;
use tessera::controller::extender::{self, Books, BooksConfig, Extender};
use tessera::controller::metrics::ControllerMetrics;
use tessera::controller::reconciler::{self, Config, SystemClock};
use tessera::controller::tls::{CertResolver, ReloadingCert};
use tessera::controller::vgpu_webhook::{VgpuMode, VgpuOptions};
use tessera::controller::webhook::Options;
use tessera::controller::webhook_server::{self, ApiClasses, Health, Limits, Server};
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
    /// Plain-HTTP address of the probes: `GET /livez` (fails when the webhook listener
    /// has died) and `GET /readyz` (200 only while it accepts and has a certificate);
    /// also `GET /metrics`, the controller's Prometheus metrics (Kueue's names).
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub probe_addr: String,
    /// Where the webhook's serving certificate comes from: `self` (the controller
    /// makes a CA and the pair, keeps them in --cert-secret, rotates them and sets the
    /// webhook's caBundle) or `files` (--webhook-cert/--webhook-key, e.g. a
    /// cert-manager Secret mounted, the caBundle injected by cert-manager).
    #[arg(long, value_enum, default_value_t = CertMode::SelfSigned)]
    pub cert_mode: CertMode,
    /// `--cert-mode=self`: the Secret (in the controller's namespace) holding the CA and
    /// the serving pair; both replicas share it.
    #[arg(long, default_value = "tessera-webhook-cert")]
    pub cert_secret: String,
    /// `--cert-mode=self`: the webhook Service (its DNS names are in the certificate).
    #[arg(long, default_value = "tessera-webhook")]
    pub webhook_service: String,
    /// `--cert-mode=self`: the MutatingWebhookConfiguration whose caBundle is kept at
    /// the CA ("" to leave it alone).
    #[arg(long, default_value = "tessera-admission")]
    pub webhook_config: String,
    /// `--cert-mode=self`: how often the Secret and the caBundle are checked (a
    /// certificate within 30 days of its end is rotated).
    #[arg(long, default_value = "1m")]
    pub cert_check_interval: String,
    /// `--cert-mode=files`: PEM certificate chain of the webhook.
    #[arg(long, default_value = "/etc/tessera/webhook/tls.crt")]
    pub webhook_cert: PathBuf,
    /// `--cert-mode=files`: PEM private key of the webhook.
    #[arg(long, default_value = "/etc/tessera/webhook/tls.key")]
    pub webhook_key: PathBuf,
    /// `--cert-mode=files`: how often the certificate files are re-read (a rotated
    /// pair is served to new connections without a restart).
    #[arg(long, default_value = "10s")]
    pub webhook_cert_reload: String,
    /// Also treat Kueue's `kueue.x-k8s.io/queue-name` label as naming a Tessera queue
    /// (webhook and controller). Off by default: beside a real Kueue both would gate
    /// the same pod. The webhook's objectSelector must match (see webhook.yaml).
    #[arg(long)]
    pub accept_kueue_labels: bool,
    /// The kube-scheduler profile the webhook's `POST /vgpu` sets as `schedulerName` on
    /// pods asking for `nvidia.com/gpumem`, `gpumem-percentage` or `gpucores` (a pod
    /// naming another scheduler keeps it); "" checks those pods without setting it.
    #[arg(long, default_value = "tessera-scheduler")]
    pub vgpu_scheduler_name: String,
    /// Also send pods asking for `nvidia.com/gpu` alone to --vgpu-scheduler-name, as
    /// HAMi does. Off by default: such a pod may be a whole-GPU pod, and the extender
    /// only places pods on nodes that publish vGPU records (docs/install.md). The
    /// webhook's matchConditions must then select those pods too.
    #[arg(long)]
    pub vgpu_scheduler_plain_gpu: bool,
    /// How the webhook's `POST /vgpu` sends vGPU pods to a GPU: `extender` (the
    /// scheduler profile above) or `dra` (the pod's request rewritten into
    /// ResourceClaims of `vgpu.gpu.tessera.io`, placed by the stock scheduler; needs
    /// Kubernetes 1.34+ with DRAConsumableCapacity, docs/hami.md "DRA mode").
    #[arg(long, env = "TESSERA_VGPU_MODE", default_value = "extender")]
    pub vgpu_mode: VgpuMode,
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
    /// Address of the kube-scheduler extender for HAMi-style vGPU pods (plain HTTP:
    /// `POST /filter`, `/prioritize`, `/bind`); off when unset.
    #[arg(long)]
    pub extender_addr: Option<String>,
    /// A node whose `tessera.io/vgpu-heartbeat` is older than this has its GPUs taken
    /// out of the extender's scheduling.
    #[arg(long, default_value = "60s")]
    pub extender_heartbeat_window: String,
    /// Run the InferenceScaler loop (KEDA-style autoscaling, coupled with quota); it
    /// holds its own Lease, `<lease-name>-autoscaler`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub autoscaler: bool,
    /// How often the InferenceScalers are listed and the due ones polled (each is
    /// polled every `pollingInterval`).
    #[arg(long, default_value = "250ms")]
    pub autoscaler_tick: String,
    /// Longest wait for one Prometheus query (KEDA's default HTTP timeout).
    #[arg(long, default_value = "3s")]
    pub prometheus_timeout: String,
    /// `quota` (Tessera: waiting replicas are not capacity) or `off` (KEDA + HPA as
    /// they are, for comparison).
    #[arg(long, default_value = "quota")]
    pub autoscaler_coupling: String,
}

/// Where the webhook's certificate comes from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertMode {
    /// Made, stored in a Secret and rotated by the controller.
    #[value(name = "self")]
    SelfSigned,
    /// Read from --webhook-cert / --webhook-key (cert-manager).
    Files,
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
        accept_kueue_labels: args.accept_kueue_labels,
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
    let health = if args.no_webhook {
        Health::disabled()
    } else {
        let resolver = match args.cert_mode {
            CertMode::Files => {
                let cert = ReloadingCert::load(&args.webhook_cert, &args.webhook_key)
                    .context("--webhook-cert/--webhook-key")?;
                let every = Duration::from_millis(
                    millis("webhook-cert-reload", &args.webhook_cert_reload)?.max(100),
                );
                let resolver = cert.resolver();
                let reload_shutdown = shutdown.clone();
                tasks.push(tokio::spawn(async move {
                    cert.watch(every, reload_shutdown).await;
                    Ok(())
                }));
                resolver
            }
            CertMode::SelfSigned => {
                let cert_cfg = CertConfig {
                    secret: args.cert_secret.clone(),
                    service: args.webhook_service.clone(),
                    webhook_config: args.webhook_config.clone(),
                    check_every: Duration::from_millis(
                        millis("cert-check-interval", &args.cert_check_interval)?.max(1000),
                    ),
                    ..CertConfig::new(&args.lease_namespace)
                };
                let resolver = CertResolver::empty();
                info!(secret = %cert_cfg.secret, namespace = %cert_cfg.namespace,
                      "webhook certificate: self-managed");
                tasks.push(tokio::spawn({
                    let (client, resolver, shutdown) =
                        (client.clone(), resolver.clone(), shutdown.clone());
                    async move {
                        certs::run(client, cert_cfg, resolver, shutdown).await;
                        Ok(())
                    }
                }));
                resolver
            }
        };
        let limits = Limits::default();
        let health = Health::new(Some(resolver.clone()), limits.accept_failure_grace);
        let listener = tokio::net::TcpListener::bind(&args.webhook_addr)
            .await
            .with_context(|| format!("--webhook-addr {}", args.webhook_addr))?;
        info!(addr = %args.webhook_addr, "serving the admission webhook");
        let server = Server {
            tls: resolver.server_config().context("webhook TLS")?,
            classes: Arc::new(ApiClasses(client.clone())),
            options: Options {
                accept_kueue_labels: args.accept_kueue_labels,
            },
            vgpu: VgpuOptions {
                mode: args.vgpu_mode,
                ..VgpuOptions::new(&args.vgpu_scheduler_name, args.vgpu_scheduler_plain_gpu)
            },
            templates: Arc::new(ApiTemplates(client.clone())),
            limits,
            health: health.clone(),
        };
        tasks.push(tokio::spawn(webhook_server::run(
            server,
            listener,
            shutdown.clone(),
        )));
        health
    };
    let metrics = Arc::new(ControllerMetrics::new());
    if let Some(addr) = &args.extender_addr {
        let books = Arc::new(Books::new(BooksConfig {
            heartbeat_window: Duration::from_millis(millis(
                "extender-heartbeat-window",
                &args.extender_heartbeat_window,
            )?),
            ..BooksConfig::default()
        }));
        let listener = extender::server::bind_listener(addr).await?;
        info!(%addr, "serving the scheduler extender");
        let (client, shutdown) = (client.clone(), shutdown.clone());
        tasks.push(tokio::spawn(
            extender::keep_books(client.clone(), books.clone(), shutdown.clone())
                .then(|()| async { Ok(()) }),
        ));
        let extender = Arc::new(Extender {
            books,
            client,
            limits: Limits::default(),
            metrics: metrics.extender.clone(),
        });
        tasks.push(tokio::spawn(extender::serve(listener, extender, shutdown)));
    }
    let probes = webhook_server::bind_probes(&args.probe_addr).await?;
    info!(addr = %args.probe_addr, "serving /livez, /readyz and /metrics");
    tasks.push(tokio::spawn(webhook_server::serve_probes_with(
        probes,
        health,
        Some(metrics.clone()),
        shutdown.clone(),
    )));
    if !args.webhook_only && args.autoscaler {
        let coupling = match args.autoscaler_coupling.as_str() {
            "quota" => Coupling::Quota,
            "off" => Coupling::Off,
            other => anyhow::bail!("--autoscaler-coupling {other:?}: expected quota or off"),
        };
        let scaler_cfg = AutoscalerConfig {
            tick: Duration::from_millis(millis("autoscaler-tick", &args.autoscaler_tick)?.max(50)),
            query_timeout: Duration::from_millis(
                millis("prometheus-timeout", &args.prometheus_timeout)?.max(1),
            ),
            coupling,
            lease_namespace: cfg.lease_namespace.clone(),
            lease_name: format!("{}-autoscaler", cfg.lease_name),
            identity: cfg.identity.clone(),
            lease_duration: cfg.lease_duration,
            metrics: metrics.scaler.clone(),
        };
        info!(lease = %scaler_cfg.lease_name, "starting the InferenceScaler loop");
        let (client, shutdown) = (client.clone(), shutdown.clone());
        tasks.push(tokio::spawn(autoscaler::run(
            client,
            scaler_cfg,
            Arc::new(SystemClock),
            shutdown,
        )));
    }
    if !args.webhook_only {
        info!(identity = %cfg.identity, lease = %cfg.lease_name, "starting the quota controller");
        tasks.push(tokio::spawn(reconciler::run_measured(
            client,
            cfg,
            Arc::new(SystemClock),
            Some(metrics),
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
