//! The `tessera` binary: flag parsing, logging setup, and one short function per subcommand.

use std::process::ExitCode;

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

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once at start: the size difference between subcommands' flags does not matter.
#[allow(clippy::large_enum_variant)]
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
    init_tracing(default_level, log_format);
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
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The whole cause chain on one line, no backtrace: these are user errors.
            match log_format {
                LogFormat::Text => eprintln!("error: {e:#}"),
                LogFormat::Json => tracing::error!(error = %format!("{e:#}"), "exiting"),
            }
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `RUST_LOG` (or `TESSERA_LOG`) sets the filter. Text has ANSI
/// colour only when stderr is a terminal and `NO_COLOR` is unset (`kubectl logs` shows
/// escape codes verbatim); JSON is one object per line.
fn init_tracing(default_level: &str, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let (filter, refused) =
        match std::env::var("RUST_LOG").or_else(|_| std::env::var("TESSERA_LOG")) {
            Ok(v) => match EnvFilter::try_new(v) {
                Ok(f) => (f, None),
                Err(e) => (EnvFilter::new(default_level), Some(e.to_string())),
            },
            Err(_) => (EnvFilter::new(default_level), None),
        };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => {
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colour).init()
        }
    }
    if let Some(reason) = refused {
        tracing::warn!(%reason, level = default_level, "RUST_LOG/TESSERA_LOG not understood; logging at the default level");
    }
}
