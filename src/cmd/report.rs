//! `tessera report chargeback --prometheus URL --from T --to T --by namespace|queue|label:KEY
//! -o table|csv|json`: GPU-hours allocated and used per group, model and mode, read back
//! from the node agents' chargeback counters (docs/chargeback.md).

use anyhow::Context;
use std::io::Write;
use std::time::Duration;
use tessera::chargeback::read;
use tessera::chargeback::report::{parse_time, Format, GroupBy, Source, Window};
use tessera::prometheus::PromClient;

/// Flags of `tessera report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub report: Report,
}

#[derive(clap::Subcommand, Debug)]
pub enum Report {
    /// GPU-hours allocated and used per namespace, queue or label, by GPU model and mode.
    Chargeback(ChargebackArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputArg {
    Table,
    Csv,
    Json,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceArg {
    Raw,
    Rules,
}

#[derive(clap::Args, Debug)]
pub struct ChargebackArgs {
    /// Prometheus server address (scheme, host, optional path prefix).
    #[arg(long, env = "TESSERA_PROMETHEUS")]
    pub prometheus: String,
    /// Window start: RFC 3339, Unix seconds, `now` or `now-<n><s|m|h|d|w>`.
    #[arg(long, default_value = "now-7d")]
    pub from: String,
    /// Window end (same forms as --from).
    #[arg(long, default_value = "now")]
    pub to: String,
    /// Group rows by `namespace`, `queue` or `label:KEY` (any label on the counters, e.g.
    /// `label:team`, `label:node`).
    #[arg(long, default_value = "namespace")]
    pub by: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: OutputArg,
    /// Seconds between the increments summed; at most the scrape interval for counter
    /// resets to be counted exactly. The window is rounded down to whole steps.
    #[arg(long, default_value_t = 60)]
    pub step: i64,
    /// `raw`: the counters, increments computed at query time (exact, costs the server
    /// per step and series); `rules`: the per-minute increments the recording rules of
    /// `daemonset/prometheus/tessera-chargeback.rules.yml` stored (fast; they must cover
    /// the whole window; the edges are the rule's evaluation times).
    #[arg(long, value_enum, default_value = "raw")]
    pub source: SourceArg,
    /// Seconds each query may take before the report gives up (Prometheus's own
    /// `--query.timeout` defaults to 2 minutes too; a week for 200 namespaces costs its
    /// server about 25 s of CPU: docs/chargeback.md).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.report {
        Report::Chargeback(args) => chargeback(args),
    }
}

fn chargeback(args: ChargebackArgs) -> anyhow::Result<()> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let from = parse_time("--from", &args.from, now)?;
    let to = parse_time("--to", &args.to, now)?;
    anyhow::ensure!(from < to, "--from must be before --to");
    let window = Window::new(from, to, args.step)?;
    let by = GroupBy::parse(&args.by)?;
    let format = match args.output {
        OutputArg::Table => Format::Table,
        OutputArg::Csv => Format::Csv,
        OutputArg::Json => Format::Json,
    };
    let source = match args.source {
        SourceArg::Raw => Source::Raw,
        SourceArg::Rules => Source::Rules,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let client = PromClient::new(Duration::from_secs(args.timeout))
            .context("building the Prometheus client")?;
        read::run(&client, &args.prometheus, &window, &by, source)
            .await
            .context("chargeback report")
    })?;
    for gap in &report.missing {
        tracing::warn!(from = %gap.from, to = %gap.to, "no chargeback samples in this part of the window; the report leaves it out");
    }
    std::io::stdout()
        .write_all(report.render(format).as_bytes())
        .context("writing the report")?;
    Ok(())
}
