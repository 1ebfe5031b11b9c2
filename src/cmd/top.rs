//! `tessera top`: nodes and their GPUs, allocated vs used, like `kubectl top` (issue 21).
//! Rows from `tessera::diagnose::top`; utilization from Prometheus when given.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use tessera::diagnose::top::{node_rows, NodeRow};
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
