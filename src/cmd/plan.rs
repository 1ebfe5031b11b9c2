//! `tessera plan -f scenario.yaml [-o json|table] [--until 2h]`: offline quota what-if.
//!
//! Reads flavors, queues, priority classes and workloads, applies them in file order and
//! prints the admission events and the final state (JSON shape in `docs/plan.md`).

use anyhow::Context;
use std::io::Write;
use std::path::PathBuf;
use tessera::quota::events::{EventType, FinalState};
use tessera::quota::quantity::parse_duration;
use tessera::quota::scenario::{PlanOptions, PlanOutput, Scenario};

/// Output formats of `tessera plan`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Table,
}

/// Flags of `tessera plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario file (multi-document YAML); `-` reads stdin.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Format,
    /// Stop the plan at this offset from the start (e.g. `2h`); default: when nothing
    /// is left to happen.
    #[arg(long)]
    pub until: Option<String>,
    /// How InferenceScalers couple with quota: `quota` (Tessera: waiting replicas are not
    /// capacity, a non-urgent scale-up waits for its demand to persist before it
    /// preempts) or `off` (KEDA + Kueue as they are, for comparison).
    #[arg(long, value_enum, default_value = "quota")]
    pub scaling_coupling: CouplingArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CouplingArg {
    Quota,
    Off,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let limit = tessera::quota::scenario::MAX_PLAN_BYTES;
    let text = if args.file.as_os_str() == "-" {
        use std::io::Read;
        let mut text = String::new();
        std::io::stdin()
            .take(limit + 1)
            .read_to_string(&mut text)
            .context("reading the scenario from stdin")?;
        tessera::yaml::check_size(text.len(), limit).context("the scenario on stdin")?;
        text
    } else {
        tessera::yaml::read_bounded(&args.file, limit)
            .with_context(|| format!("reading scenario {}", args.file.display()))?
    };
    let until = args
        .until
        .as_deref()
        .map(parse_duration)
        .transpose()
        .context("--until")?;
    let scenario = Scenario::parse(&text).with_context(|| format!("in {}", args.file.display()))?;
    let out = scenario
        .run(&PlanOptions {
            until,
            coupling: match args.scaling_coupling {
                CouplingArg::Quota => tessera::autoscale::Coupling::Quota,
                CouplingArg::Off => tessera::autoscale::Coupling::Off,
            },
        })
        .with_context(|| format!("planning {}", args.file.display()))?;
    let mut stdout = std::io::stdout().lock();
    let written = match args.output {
        Format::Json => serde_json::to_writer_pretty(&mut stdout, &out)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(stdout)),
        Format::Table => write_table(&mut stdout, &out),
    };
    match written {
        // `tessera plan ... | head` is fine.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other.context("writing the plan")?),
    }
}

fn write_table(w: &mut impl Write, out: &PlanOutput) -> std::io::Result<()> {
    writeln!(
        w,
        "{:>9}  {:<9}  {:<28}  {:<16}  DETAILS",
        "TIME(s)", "EVENT", "WORKLOAD", "QUEUE"
    )?;
    for e in &out.events {
        let details = match e.kind {
            EventType::Admitted => {
                let mut d = flavors_text(e.flavors.as_ref());
                if e.borrowing == Some(true) {
                    d.push_str(" borrowing");
                }
                if let Some(c) = &e.pod_counts {
                    let parts: Vec<String> = c.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    d.push_str(&format!(" pods[{}]", parts.join(",")));
                }
                d
            }
            EventType::Preempted => format!(
                "{} by {} (rework {}s)",
                e.reason.as_deref().unwrap_or(""),
                e.by.as_deref().unwrap_or(""),
                e.expected_rework.unwrap_or(0.0)
            ),
            EventType::Pending | EventType::Scaled => format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or(""),
                e.message.as_deref().unwrap_or("")
            ),
            EventType::Evicted | EventType::Finished => e.reason.clone().unwrap_or_default(),
        };
        writeln!(
            w,
            "{:>9.1}  {:<9}  {:<28}  {:<16}  {}",
            e.time,
            format!("{:?}", e.kind),
            e.workload,
            e.cluster_queue.as_deref().unwrap_or("-"),
            details
        )?;
    }
    write_final(w, &out.final_state)
}

fn flavors_text(f: Option<&tessera::quota::events::FlavorMap>) -> String {
    let Some(f) = f else { return String::new() };
    let mut parts = Vec::new();
    for (ps, res) in f {
        for (r, fl) in res {
            parts.push(format!("{ps}:{r}={fl}"));
        }
    }
    parts.join(" ")
}

fn write_final(w: &mut impl Write, f: &FinalState) -> std::io::Result<()> {
    writeln!(w, "\nADMITTED ({})", f.admitted.len())?;
    for a in &f.admitted {
        writeln!(
            w,
            "  {:<28}  {:<16}  {}{}",
            a.workload,
            a.cluster_queue,
            flavors_text(Some(&a.flavors)),
            if a.borrowing { " borrowing" } else { "" }
        )?;
    }
    writeln!(w, "PENDING ({})", f.pending.len())?;
    for p in &f.pending {
        writeln!(
            w,
            "  {:<28}  {:<16}  {}: {}",
            p.workload,
            p.cluster_queue.as_deref().unwrap_or("-"),
            p.reason,
            p.message
        )?;
    }
    writeln!(w, "FINISHED ({})", f.finished.len())?;
    writeln!(w, "QUEUES")?;
    for q in &f.cluster_queues {
        let usage: Vec<String> = q
            .resources
            .iter()
            .map(|r| {
                format!(
                    "{}/{}={}/{}",
                    r.flavor, r.resource, r.usage, r.nominal_quota
                )
            })
            .collect();
        writeln!(
            w,
            "  {:<16}  cohort={:<12}  admitted={} pending={}  {}",
            q.name,
            q.cohort.as_deref().unwrap_or("-"),
            q.admitted_workloads,
            q.pending_workloads,
            usage.join(" ")
        )?;
    }
    Ok(())
}
