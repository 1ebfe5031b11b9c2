//! The `tessera-node` binary: the node agent (`tessera node`) in a binary of its own, which
//! the DaemonSet runs. Same flags, same code; what it leaves out is every other
//! subcommand. The agent's resident memory is mostly its own code mapped from the binary
//! (the heap is about 1 MiB), and the kernel maps code in whole fault-around windows, so
//! code the agent never runs, interleaved with the code it does, still costs it memory
//! (benches/README.md, "Peak resident memory").

use std::process::ExitCode;

use clap::Parser;
use tessera::logging::{self, LogFormat};

#[path = "cmd/node.rs"]
mod node;

#[derive(Parser)]
#[command(
    name = "tessera-node",
    version,
    about = "Tessera node agent (DaemonSet): advertise GPUs to the kubelet"
)]
struct Cli {
    #[command(flatten)]
    node: node::Args,
    /// Log lines as plain text (no colour unless stderr is a terminal) or as one JSON
    /// object per line, for log pipelines.
    #[arg(
        long,
        env = "TESSERA_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init("info", cli.log_format);
    logging::exit_code(node::run(cli.node), cli.log_format)
}
