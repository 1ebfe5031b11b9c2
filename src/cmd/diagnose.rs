//! `tessera diagnose`: why a pod waits next to idle GPUs (or why its GPUs sit idle),
//! against a live cluster or a snapshot (`tessera diagnose dump`). The decisions are in
//! `tessera::diagnose`; this file lists objects, reads usage and prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde_json::Value;

use tessera::controller::crd::WorkloadResource;
use tessera::diagnose::snapshot::SNAPSHOT_FILE;
use tessera::diagnose::{self, Diagnosis, Settings, Snapshot, Usage};
use tessera::prometheus::{PromClient, Sample};

/// The DCGM exporter's utilization gauge, averaged over the pod's GPUs and the window.
const DEFAULT_UTILIZATION_QUERY: &str =
    "avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL{namespace=\"$namespace\",pod=\"$pod\"}[$window]))";

/// Flags of `tessera diagnose`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Write a snapshot of the cluster's Nodes and Pods for an offline diagnosis.
    Dump(DumpArgs),
}

#[derive(clap::Args, Debug)]
struct DumpArgs {
    /// Directory to write `snapshot.json` into (created if missing).
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The pod to diagnose (in --namespace). Without it: every pod that waits for a node
    /// in --namespace and/or --queue.
    pod: Option<String>,
    /// The pod's namespace (default `default` for a named pod; all namespaces otherwise).
    #[arg(short, long)]
    namespace: Option<String>,
    /// Only pods of this local queue (`tessera.io/queue-name` or `kueue.x-k8s.io/queue-name`).
    #[arg(long)]
    queue: Option<String>,
    /// Read a snapshot directory (from `tessera diagnose dump`) instead of the cluster.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Prometheus to read a running pod's GPU utilization from.
    #[arg(long)]
    prometheus: Option<String>,
    /// PromQL for a pod's mean GPU utilization in %; `$namespace`, `$pod` and `$window`
    /// are replaced.
    #[arg(long, default_value = DEFAULT_UTILIZATION_QUERY)]
    utilization_query: String,
    /// The window utilization is averaged over, in seconds.
    #[arg(long, default_value_t = 3600)]
    window_seconds: u64,
    /// Below this mean utilization (%) a running pod's GPUs count as idle.
    #[arg(long, default_value_t = 10.0)]
    idle_below: f64,
    /// Output: `text` or `json`.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

/// Runs the subcommand; `Ok(true)` when a cause was found for every pod diagnosed.
pub fn run(args: Args) -> Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        match args.command {
            Some(Command::Dump(dump)) => {
                let snapshot = live_snapshot().await?;
                write_snapshot(&dump.out, &snapshot)?;
                println!(
                    "wrote {} nodes and {} pods to {}",
                    snapshot.nodes.len(),
                    snapshot.pods.len(),
                    dump.out.join(SNAPSHOT_FILE).display()
                );
                Ok(true)
            }
            None => diagnose(args.run).await,
        }
    })
}

async fn diagnose(args: RunArgs) -> Result<bool> {
    if !(0.0..=100.0).contains(&args.idle_below) {
        bail!("--idle-below {}: a percentage, 0 to 100", args.idle_below);
    }
    if args.pod.is_none() && args.namespace.is_none() && args.queue.is_none() {
        bail!("name a pod, or give --namespace and/or --queue to diagnose the pods that wait");
    }
    let (snapshot, now) = match &args.snapshot {
        Some(dir) => {
            let s = read_snapshot(dir)?;
            let at = s.taken_at()?;
            (s, at)
        }
        None => (live_snapshot().await?, Timestamp::now()),
    };
    let settings = Settings {
        idle_below_percent: args.idle_below,
        ..Settings::default()
    };
    let targets = match &args.pod {
        Some(pod) => vec![(
            args.namespace.clone().unwrap_or_else(|| "default".into()),
            pod.clone(),
        )],
        None => diagnose::waiting_pods(&snapshot, args.namespace.as_deref(), args.queue.as_deref()),
    };
    let prometheus = match &args.prometheus {
        Some(url) => Some((
            PromClient::new(Duration::from_secs(10)).context("Prometheus client")?,
            url.clone(),
        )),
        None => None,
    };
    let mut diagnoses = Vec::new();
    for (namespace, pod) in &targets {
        let usage = match &prometheus {
            Some((client, url)) if holds_node(&snapshot, namespace, pod) => {
                Some(usage(client, url, &args, namespace, pod).await?)
            }
            _ => None,
        };
        diagnoses.push(diagnose::diagnose_pod(
            &snapshot,
            namespace,
            pod,
            usage.as_ref().and_then(Option::as_ref),
            &settings,
            now,
        )?);
    }
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&diagnoses)?),
        Output::Text => print_text(&diagnoses, args.pod.is_none()),
    }
    Ok(!diagnoses.is_empty() && diagnoses.iter().all(|d| d.verdict().is_some()))
}

fn holds_node(snapshot: &Snapshot, namespace: &str, pod: &str) -> bool {
    snapshot.pods.iter().any(|p| {
        p["metadata"]["namespace"] == namespace
            && p["metadata"]["name"] == pod
            && p["spec"]["nodeName"].as_str().is_some()
    })
}

/// The pod's utilization; `Ok(None)` when Prometheus has no series for it (said in the
/// output, never read as 0 %). A Prometheus that cannot answer is an error naming it.
async fn usage(
    client: &PromClient,
    url: &str,
    args: &RunArgs,
    namespace: &str,
    pod: &str,
) -> Result<Option<Usage>> {
    let query = args
        .utilization_query
        .replace("$namespace", namespace)
        .replace("$pod", pod)
        .replace("$window", &format!("{}s", args.window_seconds));
    match client
        .query_one(url, &query)
        .await
        .with_context(|| format!("Prometheus {url}: utilization of {namespace}/{pod}"))?
    {
        Sample::Value(v) if v.is_finite() => Ok(Some(Usage {
            utilization_percent: v,
            window_seconds: args.window_seconds,
        })),
        _ => {
            eprintln!(
                "note: Prometheus {url} has no GPU utilization for {namespace}/{pod} \
                 (query: {query}); the app step is skipped"
            );
            Ok(None)
        }
    }
}

fn print_text(diagnoses: &[Diagnosis], many: bool) {
    if diagnoses.is_empty() {
        println!("no pod waits for a node here");
        return;
    }
    for d in diagnoses {
        println!("pod {}/{} ({})", d.namespace, d.pod, d.phase);
        for (i, f) in d.findings.iter().enumerate() {
            let mark = if f.explains { "cause" } else { "ok" };
            println!(
                "  {}. {:<9} {mark:<5}  {}",
                i + 1,
                f.cause.as_str(),
                f.summary
            );
            for e in &f.evidence {
                println!("       - {e}");
            }
            if let Some(fix) = &f.fix {
                println!("       fix: {fix}");
            }
        }
        match d.verdict() {
            Some(v) => println!("  verdict: {}", v.cause.as_str()),
            None => println!("  verdict: no cause found"),
        }
    }
    if many {
        let tally = diagnose::tally(diagnoses);
        let line: Vec<String> = tally.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!("{} pods: {}", diagnoses.len(), line.join(", "));
    }
}

pub(crate) async fn live_snapshot() -> Result<Snapshot> {
    let client = kube::Client::try_default()
        .await
        .context("no cluster: give --snapshot DIR, or a kubeconfig / in-cluster account")?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes = nodes
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    let pods = pods
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let nodes: Vec<Value> = nodes
        .items
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    let pods: Vec<Value> = pods
        .items
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    let mut snapshot = Snapshot::new(nodes, pods, Timestamp::now());
    snapshot.workloads = workload_records(&client).await?;
    Ok(snapshot)
}

/// The quota controller's `Workload` records (none where the kind is not installed, or
/// the account may not list them: a diagnosis goes on without the places they hold).
async fn workload_records(client: &kube::Client) -> Result<Vec<Value>> {
    let resource = kube::api::ApiResource::erase::<WorkloadResource>(&());
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => Ok(Vec::new()),
        Err(e) => Err(e).context("listing Workload records"),
    }
}

pub(crate) fn read_snapshot(dir: &std::path::Path) -> Result<Snapshot> {
    let path = dir.join(SNAPSHOT_FILE);
    let bytes = std::fs::read(&path).with_context(|| format!("--snapshot: {}", path.display()))?;
    Snapshot::from_json(&bytes).with_context(|| format!("--snapshot: {}", path.display()))
}

fn write_snapshot(dir: &std::path::Path, snapshot: &Snapshot) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--out {}", dir.display()))?;
    let path = dir.join(SNAPSHOT_FILE);
    std::fs::write(&path, serde_json::to_vec(snapshot)?)
        .with_context(|| format!("--out {}", path.display()))
}
