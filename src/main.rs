//! The `tessera` binary: flag parsing, logging setup, and one short function per subcommand.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tessera::logging::{self, LogFormat};

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
    /// Log lines as plain text (no colour unless stderr is a terminal) or as one JSON
    /// object per line, for log pipelines.
    #[arg(
        long,
        global = true,
        env = "TESSERA_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
}

// Parsed once at start: the size difference between subcommands' flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Node agent (DaemonSet): advertise GPUs to the kubelet (also the `tessera-node`
    /// binary, which the DaemonSet runs: the same agent in a smaller binary).
    Node(cmd::node::Args),
    /// Print the resources and devices a node would advertise for a GPU spec and config.
    Layout(cmd::layout::Args),
    /// Fleet what-if on cluster traces (default: the bundled Alibaba GPU trace).
    Simulate(cmd::simulate::Args),
    /// Offline quota what-if: queues + workloads YAML in, admissions/preemptions out.
    Plan(cmd::plan::Args),
    /// Quota controller and admission webhook (`tessera controller crds` prints the CRDs).
    Controller(cmd::controller::Args),
    /// Why a pod waits (quota, memory, placement) or its GPUs idle; exit 2: no cause found.
    Diagnose(cmd::diagnose::Args),
    /// Nodes and their GPUs, allocated vs used.
    Top(cmd::top::Args),
    /// Reports read back from Prometheus (`report chargeback`: GPU-hours per team).
    Report(cmd::report::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Daemons log at info; the one-shot tools only warn unless asked.
    let default_level = match cli.command {
        Command::Node(_) | Command::Controller(_) => "info",
        _ => "warn",
    };
    let log_format = cli.log_format;
    logging::init(default_level, log_format);
    let result: Result<()> = match cli.command {
        Command::Node(args) => cmd::node::run(args),
        Command::Layout(args) => cmd::layout::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Controller(args) => cmd::controller::run(args),
        Command::Diagnose(args) => match cmd::diagnose::run(args) {
            Ok(true) => Ok(()),
            // Diagnosed, no cause found: said on stdout, told by the exit code.
            Ok(false) => return ExitCode::from(2),
            Err(e) => Err(e),
        },
        Command::Top(args) => cmd::top::run(args),
        Command::Report(args) => cmd::report::run(args),
    };
    logging::exit_code(result, log_format)
}
