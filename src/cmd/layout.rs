//! `tessera layout`: what a node would advertise for a GPU spec and a config, or the exact
//! reason the layout is invalid. Nothing is changed on the GPUs: MIG layouts are applied
//! to an in-memory copy of the inventory.

use std::path::PathBuf;

use anyhow::{Context, Result};

use tessera::agent;
use tessera::gpu::fake::FakeBackend;
use tessera::gpu::GpuBackend;
use tessera::partition::config::{self, NodeConfig};
use tessera::partition::layout::{Advertisement, GpuPlan, Share, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Flags of `tessera layout`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GPUs to lay out: `8xH100-80GB`, `2xA100-80GB,1xL4`, an inventory YAML, or `nvml`
    /// for this machine's GPUs.
    #[arg(long, default_value = "8xH100-80GB")]
    pub fake_gpus: String,
    /// Layout config file or directory of named configs; the built-in default if absent.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Which named config (the node's `tessera.io/config` label).
    #[arg(long)]
    pub config_name: Option<String>,
    /// List every device, not just the per-resource summary.
    #[arg(long)]
    pub devices: bool,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

pub fn run(args: Args) -> Result<()> {
    let backend = if args.fake_gpus == "nvml" {
        let nvml = tessera::gpu::nvml::NvmlBackend::new(None).context("reading local GPUs")?;
        FakeBackend::from_inventory(nvml.inventory().context("reading local GPUs")?)
    } else {
        FakeBackend::from_arg(&args.fake_gpus).context("--fake-gpus")?
    };
    let config = match &args.config {
        Some(path) => {
            let set = config::load(path)?;
            let chosen = args
                .config_name
                .as_deref()
                .unwrap_or(config::DEFAULT_CONFIG_NAME);
            // The other configs' errors do not stop this one; they are still worth seeing.
            for (name, e) in set.rejected.iter().filter(|(name, _)| *name != chosen) {
                eprintln!("warning: config {name:?} is rejected (nodes using it keep their last good config): {e}");
            }
            set.select(args.config_name.as_deref())?.clone()
        }
        None => NodeConfig::builtin_default(),
    };
    let (inventory, plan, ad) = agent::build(&backend, &config)
        .map_err(|e| anyhow::anyhow!("layout is invalid for these GPUs: {e}"))?;
    match args.output {
        Output::Json => {
            let doc = serde_json::json!({
                "config": config.name,
                "gpus": inventory.gpus,
                "plan": plan,
                "resources": ad.resources,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Output::Table => print_table(&config, &inventory, &plan, &ad, args.devices),
    }
    Ok(())
}

fn print_table(
    config: &NodeConfig,
    inventory: &tessera::gpu::Inventory,
    plan: &tessera::partition::layout::NodePlan,
    ad: &Advertisement,
    devices: bool,
) {
    println!("config: {}", config.name);
    println!();
    println!(
        "{:<4} {:<26} {:>10}  {:<5} MODE",
        "GPU", "MODEL", "MEMORY", "NUMA"
    );
    for g in &inventory.gpus {
        let mode = match plan.gpus.get(&g.uuid) {
            Some(GpuPlan::Whole { replicas: None }) => "whole".to_string(),
            Some(GpuPlan::Whole { replicas: Some(r) }) => {
                format!("timeslice ×{} as {}", r.replicas, r.resource)
            }
            Some(GpuPlan::Mig { .. }) => {
                let parts: Vec<String> = g
                    .mig_devices
                    .iter()
                    .map(|m| format!("{}@{}", m.profile, m.start))
                    .collect();
                format!("mig [{}]", parts.join(", "))
            }
            Some(GpuPlan::Vgpu { slices, .. }) => {
                let parts: Vec<String> = slices
                    .iter()
                    .map(|s| format!("{}MiB/{}%", s.memory_mib, s.cores))
                    .collect();
                format!("vgpu [{}]", parts.join(", "))
            }
            Some(GpuPlan::VgpuSplit { resource, split }) => {
                format!("vgpu split ×{split} as {resource}")
            }
            None => "-".to_string(),
        };
        let numa = g
            .numa_node
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<4} {:<26} {:>6} MiB  {:<5} {}",
            g.index, g.product_name, g.memory_mib, numa, mode
        );
    }
    println!();
    println!("{:<34} {:>7}  GPUS", "RESOURCE", "DEVICES");
    for r in &ad.resources {
        let mut gpus: Vec<u32> = r.devices.iter().map(|d| d.gpu_index).collect();
        gpus.dedup();
        let gpus: Vec<String> = gpus.iter().map(u32::to_string).collect();
        println!("{:<34} {:>7}  {}", r.name, r.devices.len(), gpus.join(","));
        if devices {
            for d in &r.devices {
                let what = match (&d.target, &d.share) {
                    (Target::Gpu, Share::Exclusive) => "whole GPU".to_string(),
                    (Target::Mig { profile, .. }, Share::Exclusive) => format!("MIG {profile}"),
                    (_, Share::Replica { index, of }) => format!("replica {}/{of}", index + 1),
                    (
                        _,
                        Share::Vgpu {
                            memory_mib, cores, ..
                        },
                    ) => {
                        format!("vGPU {memory_mib} MiB, {cores}% SMs")
                    }
                    (_, Share::Slot { index, of }) => format!("vGPU slot {}/{of}", index + 1),
                };
                println!("    {:<52} GPU {}  {}", d.id, d.gpu_index, what);
            }
        }
    }
}
