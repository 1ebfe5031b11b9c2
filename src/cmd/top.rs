//! `tessera top`: nodes and their GPUs, allocated vs used, like `kubectl top` (issue 21).
//! Rows from `tessera::diagnose::top`; utilization from Prometheus when given. With
//! `--gpus` or `--containers`, one line per GPU or per container from the node agents'
//! gauges in Prometheus (`tessera_gpu_*`, `tessera_container_gpu_*`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use tessera::diagnose::top::{
    container_usage_rows, gpu_usage_rows, node_rows, ContainerUsageRow, GpuUsageRow, NodeRow,
    Series, CONTAINER_GAUGES, GPU_GAUGES,
};
use tessera::prometheus::{PromClient, Sample};

/// The DCGM exporter's utilization gauge of a node's GPUs (`Hostname` is the node).
const DEFAULT_NODE_QUERY: &str = "avg(DCGM_FI_DEV_GPU_UTIL{Hostname=\"$node\"})";

/// Flags of `tessera top`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Read a snapshot directory (`tessera diagnose dump`) instead of the cluster.
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Prometheus to read each node's GPU utilization from.
    #[arg(long)]
    prometheus: Option<String>,
    /// PromQL for a node's mean GPU utilization in %; `$node` is replaced.
    #[arg(long, default_value = DEFAULT_NODE_QUERY)]
    utilization_query: String,
    /// One line per GPU, from the node agents' gauges (needs --prometheus).
    #[arg(long, requires = "prometheus", conflicts_with = "containers")]
    gpus: bool,
    /// One line per container and GPU, from the node agents' gauges (needs --prometheus).
    #[arg(long, requires = "prometheus")]
    containers: bool,
    /// With --gpus or --containers: only this node.
    #[arg(long)]
    node: Option<String>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        if let (true, Some(url)) = (args.gpus || args.containers, &args.prometheus) {
            return usage_view(&args, url).await;
        }
        let snapshot = match &args.snapshot {
            Some(dir) => super::diagnose::read_snapshot(dir)?,
            None => super::diagnose::live_snapshot().await?,
        };
        let mut rows = node_rows(&snapshot);
        if let Some(url) = &args.prometheus {
            let client = PromClient::new(Duration::from_secs(10)).context("Prometheus client")?;
            for row in &mut rows {
                let query = args.utilization_query.replace("$node", &row.node);
                row.utilization_percent = match client
                    .query_one(url, &query)
                    .await
                    .with_context(|| format!("Prometheus {url}: utilization of {}", row.node))?
                {
                    Sample::Value(v) if v.is_finite() => Some(v),
                    // No series: shown as "–", never as 0 %.
                    _ => None,
                };
            }
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", table(&rows, args.prometheus.is_some()));
        }
        Ok(())
    })
}

/// `--gpus` / `--containers`: the agents' gauges now, as lines.
async fn usage_view(args: &Args, url: &str) -> Result<()> {
    let client = PromClient::new(Duration::from_secs(10)).context("Prometheus client")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let selector = match &args.node {
        Some(n) => format!("{{node={}}}", serde_json::to_string(n)?),
        None => String::new(),
    };
    let read = async |metric: &str| -> Result<Vec<Series>> {
        let query = format!("{metric}{selector}");
        let samples = client
            .query_vector(url, &query, now)
            .await
            .with_context(|| format!("Prometheus {url}: {query}"))?;
        Ok(samples.into_iter().map(|s| (s.labels, s.value)).collect())
    };
    if args.gpus {
        let [u, t, z] = GPU_GAUGES;
        let (used, total, util) = (read(u).await?, read(t).await?, read(z).await?);
        let shares = read(CONTAINER_GAUGES[0]).await?;
        let rows = gpu_usage_rows([&used, &total, &util], &shares);
        if rows.is_empty() {
            anyhow::bail!(
                "Prometheus {url} has no {u} series{selector}: is it scraping the node agents?"
            );
        }
        print_rows(&rows, args.json, gpu_table)
    } else {
        let mut series = Vec::new();
        for g in CONTAINER_GAUGES {
            series.push(read(g).await?);
        }
        let rows = container_usage_rows([&series[0], &series[1], &series[2], &series[3]]);
        // No container holds a GPU, or nothing reports at all: only the first is a view.
        if rows.is_empty() && read(GPU_GAUGES[0]).await?.is_empty() {
            anyhow::bail!(
                "Prometheus {url} has no {} series{selector}: is it scraping the node agents?",
                GPU_GAUGES[0]
            );
        }
        print_rows(&rows, args.json, container_table)
    }
}

fn print_rows<T: serde::Serialize>(
    rows: &[T],
    json: bool,
    table: fn(&[T]) -> String,
) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
    } else {
        print!("{}", table(rows));
    }
    Ok(())
}

/// `a/b GiB`, `–` for what no series gave.
fn gib(used: Option<f64>, of: Option<f64>) -> String {
    let g = |b: Option<f64>| {
        b.map_or("–".to_string(), |b| {
            format!("{:.1}", b / f64::from(1u32 << 30))
        })
    };
    format!("{}/{} GiB", g(used), g(of))
}

fn percent(ratio: Option<f64>) -> String {
    ratio.map_or("–".to_string(), |r| format!("{:.0}", r * 100.0))
}

fn gpu_table(rows: &[GpuUsageRow]) -> String {
    let mut out = format!(
        "{:<20} {:<40} {:<10} {:<9} {:>9} {:>10} {:>19} {:>6}\n",
        "NODE", "GPU", "MODEL", "MODE", "ALLOCATED", "CONTAINERS", "MEMORY", "BUSY %"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<20} {:<40} {:<10} {:<9} {:>9.2} {:>10} {:>19} {:>6}\n",
            r.node,
            r.gpu,
            r.model,
            r.mode,
            r.allocated_share,
            r.containers,
            gib(r.memory_used_bytes, r.memory_total_bytes),
            percent(r.utilization_ratio)
        ));
    }
    out
}

fn container_table(rows: &[ContainerUsageRow]) -> String {
    let mut out = format!(
        "{:<40} {:<16} {:<20} {:<40} {:<9} {:>6} {:>6} {:>19}\n",
        "NAMESPACE/POD", "CONTAINER", "NODE", "GPU", "MODE", "SHARE", "BUSY %", "MEMORY"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<40} {:<16} {:<20} {:<40} {:<9} {:>6.2} {:>6} {:>19}\n",
            format!("{}/{}", r.namespace, r.pod),
            r.container,
            r.node,
            r.gpu,
            r.mode,
            r.allocated_share,
            percent(r.busy_ratio),
            gib(r.memory_used_bytes, r.memory_limit_bytes)
        ));
    }
    out
}

fn table(rows: &[NodeRow], with_usage: bool) -> String {
    let mut out = format!(
        "{:<24} {:>6} {:>9} {:>6} {:>19}{}\n",
        "NODE",
        "GPUS",
        "ALLOCATED",
        "FREE",
        "vGPU MEM BOOKED",
        if with_usage { "   USED %" } else { "" }
    );
    let (mut total, mut taken) = (0, 0);
    for r in rows {
        total += r.allocatable;
        taken += r.allocated;
        let vgpu = r.vgpu_memory_mib.map_or("–".to_string(), |(b, t)| {
            format!("{:.0}/{:.0} GiB", b as f64 / 1024.0, t as f64 / 1024.0)
        });
        let used = match (with_usage, r.utilization_percent) {
            (false, _) => String::new(),
            (true, Some(u)) => format!(" {u:>9.1}"),
            (true, None) => format!(" {:>9}", "–"),
        };
        out.push_str(&format!(
            "{:<24} {:>6} {:>9} {:>6} {:>19}{used}\n",
            r.node,
            r.allocatable,
            r.allocated,
            r.allocatable - r.allocated,
            vgpu
        ));
    }
    let pct = if total > 0 {
        100.0 * taken as f64 / total as f64
    } else {
        0.0
    };
    out.push_str(&format!(
        "{} nodes, {taken} of {total} GPUs allocated ({pct:.1} %)\n",
        rows.len()
    ));
    out
}
