//! `tessera simulate`: the FGD paper's benchmark on the Alibaba GPU trace v2023.
//!
//! With no arguments it runs every policy × 10 seeds on the copy of the default trace
//! bundled in the binary (`data/alibaba-gpu-v2023/`) and prints the comparison with the
//! paper's numbers. `tessera simulate fgd --node-list … --pod-list …` runs any trace.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use tessera::placement::{PolicyKind, TieBreak};
use tessera::sim::protocol::{Prepared, DEFAULT_COVERAGE, DEFAULT_INFLATION};
use tessera::sim::reference::PaperResults;
use tessera::sim::report::{self, TraceInfo};
use tessera::sim::runner::{self, FIRST_SEED};
use tessera::sim::{bound, plot, trace};

const BUNDLED_NODES: &str =
    include_str!("../../data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");
const BUNDLED_PODS: &str = include_str!("../../data/alibaba-gpu-v2023/openb_pod_list_default.csv");
const BUNDLED_PAPER: &str = include_str!("../../data/alibaba-gpu-v2023/headline_default_trace.csv");
const BUNDLED_TRACE: &str = "openb_pod_list_default";

/// Flags of `tessera simulate`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Box<Command>>,
    #[command(flatten)]
    run: Box<RunFlags>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// The FGD paper's protocol on a node list and pod list of the Alibaba GPU trace.
    Fgd(FgdArgs),
    /// Training and inference over days on one fleet: dedicated pools vs shared with
    /// Kueue + KEDA vs Tessera, on the DLRM inference and Alibaba GPU traces
    /// (docs/fleet-simulation.md).
    Fleet(super::simulate_fleet::FleetArgs),
}

#[derive(clap::Args, Debug)]
struct FgdArgs {
    /// Node list CSV (`sn,cpu_milli,memory_mib,gpu,model`).
    #[arg(long)]
    node_list: PathBuf,
    /// Pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`).
    #[arg(long)]
    pod_list: PathBuf,
    /// Folder with the FGD authors' results (default: `fgd_expected_results/` next to the
    /// pod list, when it exists).
    #[arg(long)]
    expected: Option<PathBuf>,
    #[command(flatten)]
    run: RunFlags,
}

#[derive(clap::Args, Debug, Clone)]
struct RunFlags {
    /// Policy to run: random, dotproduct, gpuclustering, gpupacking, bestfit, fgd,
    /// tessera, or `all` (those seven); HAMi's binpack and spread on request.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Number of seeds (42, 43, ...), as in the paper.
    #[arg(long, default_value_t = 10)]
    seeds: u32,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write a chart of allocation vs arrived request to this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Tie-breaking between equally scored nodes: `first` (node-list order; reproduces
    /// the paper's numbers) or `random`.
    #[arg(long, default_value = "first")]
    ties: String,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    match args.command.map(|c| *c) {
        Some(Command::Fleet(a)) => super::simulate_fleet::run(a),
        Some(Command::Fgd(a)) => {
            let nodes = trace::read_node_list(&a.node_list)?;
            let pods = trace::read_pod_list(&a.pod_list)?;
            let name = a
                .pod_list
                .file_stem()
                .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
            let dir = a.expected.clone().or_else(|| {
                let d = a
                    .pod_list
                    .parent()
                    .unwrap_or(Path::new("."))
                    .join("fgd_expected_results");
                d.is_dir().then_some(d)
            });
            let paper = match dir {
                Some(d) => PaperResults::load(&d, &name)
                    .with_context(|| format!("reading {}", d.display()))?,
                None => None,
            };
            simulate(nodes, &pods, &name, paper, &a.run)
        }
        None => {
            let nodes =
                trace::parse_node_list(BUNDLED_NODES, "bundled openb_node_list_gpu_node.csv")?;
            let pods = trace::parse_pod_list(BUNDLED_PODS, "bundled openb_pod_list_default.csv")?;
            let paper = PaperResults::from_headline(
                BUNDLED_PAPER,
                "bundled headline_default_trace.csv",
                BUNDLED_TRACE,
            )?;
            simulate(nodes, &pods, BUNDLED_TRACE, Some(paper), &args.run)
        }
    }
}

fn simulate(
    nodes: Vec<tessera::placement::NodeSpec>,
    pods: &[trace::TracePod],
    name: &str,
    paper: Option<PaperResults>,
    flags: &RunFlags,
) -> Result<()> {
    let policies: Vec<PolicyKind> = if flags.policy.eq_ignore_ascii_case("all") {
        PolicyKind::ALL.to_vec()
    } else {
        flags
            .policy
            .split(',')
            .map(PolicyKind::parse)
            .collect::<Result<_, _>>()?
    };
    if flags.seeds == 0 {
        bail!("--seeds must be at least 1");
    }
    let seeds: Vec<u64> = (0..u64::from(flags.seeds))
        .map(|i| FIRST_SEED + i)
        .collect();
    let info = TraceInfo {
        trace: name.to_string(),
        nodes: nodes.len(),
        gpus: 0,
        pods: pods.len(),
        packing_reference_pct: None,
        packing_lp_bound_pct: None,
    };
    let prepared = Prepared::new(
        nodes,
        pods,
        DEFAULT_INFLATION,
        DEFAULT_COVERAGE,
        TieBreak::parse(&flags.ties)?,
    )?;
    let reference = seeds
        .iter()
        .map(|&s| bound::packing_reference_pct(&prepared, s))
        .sum::<f64>()
        / seeds.len() as f64;
    let lp_bound = seeds
        .iter()
        .map(|&s| bound::packing_lp_bound_pct(&prepared, s))
        .sum::<Option<f64>>()
        .map(|sum| sum / seeds.len() as f64);
    let info = TraceInfo {
        gpus: prepared.cluster.total_gpu_milli() / 1000,
        packing_reference_pct: Some(reference),
        packing_lp_bound_pct: lp_bound,
        ..info
    };
    let threads = flags
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

    let show = std::io::stderr().is_terminal();
    let started = Instant::now();
    let progress = |done: usize, total: usize| {
        if show {
            let width = 30;
            let filled = done * width / total.max(1);
            eprint!(
                "\r[{}{}] {done}/{total} runs, {:.1}s",
                "#".repeat(filled),
                " ".repeat(width - filled),
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    };
    let results = runner::run_all(&prepared, &policies, &seeds, threads, &progress);
    if show {
        eprintln!();
    }
    let elapsed = started.elapsed();
    let summaries = runner::summarize(&results);
    tracing::info!(
        runs = results.len(),
        threads,
        secs = elapsed.as_secs_f64(),
        "simulation finished"
    );

    if let Some(path) = &flags.plot {
        let title = format!(
            "{name}: GPU allocation vs arrived request ({} seed(s))",
            seeds.len()
        );
        std::fs::write(path, plot::svg(&title, &summaries, paper.as_ref()))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if flags.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::json(&info, &summaries, paper.as_ref()))?
        );
    } else {
        print!("{}", report::table(&info, &summaries, paper.as_ref()));
        println!(
            "{} runs ({} policies × {} seeds) in {:.1}s on {threads} thread(s).",
            results.len(),
            policies.len(),
            seeds.len(),
            elapsed.as_secs_f64()
        );
    }
    Ok(())
}
