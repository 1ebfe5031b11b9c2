//! `tessera simulate fleet`: the three-fleet comparison (dedicated pools, shared with
//! Kueue + KEDA, Tessera) on the bundled DLRM inference and Alibaba GPU traces.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use tessera::autoscale::Coupling;
use tessera::sim::fleet::{self, demand, FleetKind, Inputs, Knobs, ModelNodes};

const BUNDLED_DLRM: &str =
    include_str!("../../data/alibaba-dlrm-inference-v2025/dlrm_hn_instances.csv");
const BUNDLED_PODS: &str = include_str!("../../data/alibaba-gpu-v2023/openb_pod_list_default.csv");
const BUNDLED_LLM_CONV: &str =
    include_str!("../../data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv");
const BUNDLED_LLM_CODE: &str =
    include_str!("../../data/azure-llm-inference-2023/AzureLLMInferenceTrace_code.csv");

/// Flags of `tessera simulate fleet` (defaults: docs/fleet-simulation.md).
#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// GPUs in each fleet [default: 4096, or what --gpu-models adds up to].
    #[arg(long)]
    gpus: Option<u32>,
    /// GPUs per node.
    #[arg(long, default_value_t = Knobs::default().gpus_per_node)]
    gpus_per_node: u8,
    /// GPU model of every node.
    #[arg(long, default_value = "H100-80GB", conflicts_with = "gpu_models")]
    gpu_model: String,
    /// Nodes per GPU model, `MODEL:NODES,...` in order (e.g. `H100-80GB:384,A100-40GB:128`):
    /// the dedicated inference pool takes the first nodes, the MIG nodes are the last.
    #[arg(long)]
    gpu_models: Option<String>,
    /// Tessera's fleet: this many of the last nodes are laid out in MIG; training tasks
    /// whose share fits a profile ask for one (0: no MIG).
    #[arg(long, default_value_t = Knobs::default().mig_nodes)]
    mig_nodes: u32,
    /// The named MIG layout of each GPU of a MIG node (`balanced`, `all-1g.10gb`, ...).
    #[arg(long, default_value_t = Knobs::default().mig_layout)]
    mig_layout: String,
    /// Days of simulated time (from the start of the inference trace).
    #[arg(long, default_value_t = Knobs::default().days)]
    days: f64,
    /// Hours at the start left out of the averages.
    #[arg(long, default_value_t = Knobs::default().warmup_hours)]
    warmup_hours: f64,
    /// Inference's nominal quota in the shared fleets, as a share of the GPUs (default:
    /// the dedicated inference pool's size).
    #[arg(long)]
    inference_share: Option<f64>,
    /// Training work offered, as a multiple of the GPUs inference leaves on average.
    #[arg(long, default_value_t = Knobs::default().training_load)]
    training_load: f64,
    /// Scalers' polling interval, seconds.
    #[arg(long, default_value_t = Knobs::default().polling_s)]
    polling: u32,
    /// Demand instances one replica serves at its threshold (0.9: 10 % headroom).
    #[arg(long, default_value_t = Knobs::default().replica_target)]
    replica_target: f64,
    /// Tessera's fleet's scaling: `quota` (coupled, Tessera's) or `off` (KEDA + HPA's).
    #[arg(long, default_value = "quota")]
    coupling: String,
    /// Coupled scalers: seconds a scale-up's demand must persist before it may preempt.
    #[arg(long, default_value_t = Knobs::default().persist_s)]
    persist: u32,
    /// Coupled scalers: seconds the capacity a scale-down frees is lent only to
    /// cheap-to-reclaim training (0: not held).
    #[arg(long, default_value_t = Knobs::default().hold_s)]
    hold: u32,
    /// Checkpoint interval in minutes, `MIN-MAX` (log-uniform) or one value.
    #[arg(long, default_value = "5-30")]
    checkpoint: String,
    /// Training queue's minimum runtime before preemption, minutes (0: none).
    #[arg(long, default_value_t = Knobs::default().min_runtime_min)]
    min_runtime: f64,
    /// Add two LLM services (the Azure LLM inference trace 2023, conversation and code,
    /// tiled under a diurnal envelope) peaking at this many GPUs together (0: none).
    #[arg(long, default_value_t = Knobs::default().llm_peak_gpus)]
    llm_peak_gpus: u32,
    /// The LLM load's low point at 02:00, as a share of its 14:00 peak.
    #[arg(long, default_value_t = Knobs::default().llm_trough)]
    llm_trough: f64,
    /// Seed of the training arrivals and placement ties.
    #[arg(long, default_value_t = Knobs::default().seed)]
    seed: u64,
    /// Fleets to run: `dedicated`, `shared`, `tessera`, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    fleets: String,
    /// DLRM instance list (`app_name,gpu_request,creation_time,deletion_time`; default:
    /// the bundled one).
    #[arg(long)]
    inference_trace: Option<PathBuf>,
    /// Alibaba GPU trace 2023 pod list (default: the bundled default trace).
    #[arg(long)]
    training_trace: Option<PathBuf>,
    /// Print JSON (with the over-time series) instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG of allocation, use and inference headroom over time per fleet.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Worker threads (default: all cores, at most one per fleet).
    #[arg(long)]
    threads: Option<usize>,
}

fn checkpoint(s: &str) -> Result<(f64, f64)> {
    let parse = |v: &str| -> Result<f64> {
        v.trim()
            .parse::<f64>()
            .with_context(|| format!("--checkpoint: `{v}` is not a number of minutes"))
    };
    match s.split_once('-') {
        Some((a, b)) => Ok((parse(a)?, parse(b)?)),
        None => {
            let v = parse(s)?;
            Ok((v, v))
        }
    }
}

/// `MODEL:NODES,...` → the models' nodes.
fn gpu_models(s: &str) -> Result<Vec<ModelNodes>> {
    s.split(',')
        .map(|entry| {
            let (model, nodes) = entry.trim().rsplit_once(':').with_context(|| {
                format!("--gpu-models: `{entry}` is not MODEL:NODES (e.g. H100-80GB:384)")
            })?;
            let nodes = nodes.trim().parse::<u32>().with_context(|| {
                format!("--gpu-models: `{nodes}` in `{entry}` is not a number of nodes")
            })?;
            Ok(ModelNodes {
                model: model.trim().to_string(),
                nodes,
            })
        })
        .collect()
}

fn coupling(s: &str) -> Result<Coupling> {
    match s.trim().to_ascii_lowercase().as_str() {
        "quota" => Ok(Coupling::Quota),
        "off" => Ok(Coupling::Off),
        other => bail!("--coupling: `{other}` is not quota or off"),
    }
}

fn fleets(s: &str) -> Result<Vec<FleetKind>> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(FleetKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for name in s.split(',') {
        let k = match name.trim().to_ascii_lowercase().as_str() {
            "dedicated" => FleetKind::Dedicated,
            "shared" => FleetKind::Shared,
            "tessera" => FleetKind::Tessera,
            other => bail!("--fleets: `{other}` is not dedicated, shared, tessera or all"),
        };
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out)
}

fn text(path: &Option<PathBuf>, bundled: &'static str) -> Result<(String, String)> {
    match path {
        Some(p) => Ok((
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            p.display().to_string(),
        )),
        None => Ok((bundled.to_string(), "bundled".to_string())),
    }
}

pub fn run(a: FleetArgs) -> Result<()> {
    let per_node = u32::from(a.gpus_per_node.max(1));
    let models = match &a.gpu_models {
        Some(list) => gpu_models(list)?,
        None => vec![ModelNodes {
            model: a.gpu_model.clone(),
            nodes: a.gpus.unwrap_or(Knobs::default().gpus) / per_node,
        }],
    };
    let model_gpus = models
        .iter()
        .map(|m| u64::from(m.nodes) * u64::from(per_node))
        .sum::<u64>();
    let gpus = match a.gpus {
        Some(g) => g,
        None => u32::try_from(model_gpus).context("--gpu-models: more than 2^32 GPUs")?,
    };
    let knobs = Knobs {
        gpus,
        gpus_per_node: a.gpus_per_node,
        gpu_models: models,
        mig_nodes: a.mig_nodes,
        mig_layout: a.mig_layout.clone(),
        days: a.days,
        warmup_hours: a.warmup_hours,
        inference_share: a.inference_share,
        training_load: a.training_load,
        polling_s: a.polling,
        replica_target: a.replica_target,
        tessera_coupling: coupling(&a.coupling)?,
        persist_s: a.persist,
        hold_s: a.hold,
        checkpoint_min: checkpoint(&a.checkpoint)?,
        min_runtime_min: a.min_runtime,
        llm_peak_gpus: a.llm_peak_gpus,
        llm_trough: a.llm_trough,
        seed: a.seed,
    };
    knobs.validate()?;
    let kinds = fleets(&a.fleets)?;
    let (dlrm, dlrm_name) = text(&a.inference_trace, BUNDLED_DLRM)?;
    let (pods, pods_name) = text(&a.training_trace, BUNDLED_PODS)?;
    let mut services = demand::parse_services(&dlrm, &format!("{dlrm_name} DLRM instance list"))?;
    services.extend(demand::azure_llm_services(
        (BUNDLED_LLM_CONV, "bundled Azure LLM conv trace"),
        (BUNDLED_LLM_CODE, "bundled Azure LLM code trace"),
        knobs.llm_peak_gpus,
        knobs.llm_trough,
        knobs.horizon(),
    )?);
    let tasks = demand::parse_tasks_on(
        &pods,
        &format!("{pods_name} pod list"),
        &knobs.model_names(),
    )?;
    let mut inputs = Inputs::new(&knobs, services, &tasks.shapes)?;
    inputs.tasks_left_out = tasks.left_out;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

    let show = std::io::stderr().is_terminal();
    let started = Instant::now();
    let progress = |f: f64| {
        if show {
            let width = 30;
            let filled = ((f * width as f64) as usize).min(width);
            eprint!(
                "\r[{}{}] {:>3.0}% of simulated time, {:.1}s",
                "#".repeat(filled),
                " ".repeat(width - filled),
                f * 100.0,
                started.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
        }
    };
    let comparison = fleet::run_all(&knobs, &inputs, &kinds, threads, &progress)?;
    if show {
        eprintln!();
    }
    let elapsed = started.elapsed().as_secs_f64();
    tracing::info!(
        fleets = kinds.len(),
        threads,
        secs = elapsed,
        "fleet simulation finished"
    );
    if let Some(path) = &a.plot {
        let title = format!(
            "{} GPUs, {} day(s): allocation, use and inference headroom per fleet",
            knobs.gpus, knobs.days
        );
        std::fs::write(path, fleet::plot::svg(&title, &comparison.fleets))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&fleet::report::json(&comparison))?
        );
    } else {
        print!("{}", fleet::report::table(&comparison));
        println!(
            "{} fleet(s) in {elapsed:.1}s on {} thread(s).",
            kinds.len(),
            threads.clamp(1, kinds.len().max(1))
        );
    }
    Ok(())
}
