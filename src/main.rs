//! The `tessera` binary: flag parsing, logging setup, and one short function per subcommand.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod cmd;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Share one GPU fleet between training and inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Node agent (DaemonSet): advertise GPUs to the kubelet.
    Node(cmd::node::Args),
    /// Print the resources and devices a node would advertise for a GPU spec and config.
    Layout(cmd::layout::Args),
    /// Fleet what-if on cluster traces (default: the bundled Alibaba GPU trace).
    Simulate(cmd::simulate::Args),
    /// Offline quota what-if: queues + workloads YAML in, admissions/preemptions out.
    Plan(cmd::plan::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Node(args) => cmd::node::run(args),
        Command::Layout(args) => cmd::layout::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Plan(args) => cmd::plan::run(args),
    }
}

/// Logs go to stderr; `RUST_LOG` (or `TESSERA_LOG`) sets the filter, `info` by default.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| std::env::var("TESSERA_LOG"))
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
