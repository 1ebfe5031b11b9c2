//! Human table and machine JSON of a simulation, beside the paper's numbers.

use std::fmt::Write as _;

use serde::Serialize;

use super::reference::PaperResults;
use super::runner::PolicySummary;
use crate::placement::PolicyKind;

/// Arrived-percent columns of the table (the paper's headline points).
pub const TABLE_POINTS: [u32; 7] = [80, 90, 95, 100, 110, 120, 130];

/// What was simulated.
#[derive(Debug, Clone, Serialize)]
pub struct TraceInfo {
    /// Pod-list name (file stem), e.g. `openb_pod_list_default`.
    pub trace: String,
    pub nodes: usize,
    pub gpus: u64,
    pub pods: usize,
    /// Mean over seeds of [`super::bound::packing_reference_pct`].
    pub packing_reference_pct: Option<f64>,
    /// Mean over seeds of [`super::bound::packing_lp_bound_pct`].
    pub packing_lp_bound_pct: Option<f64>,
}

/// The comparison table, one line per policy plus a `paper` line under each policy the
/// FGD authors ran on this trace.
pub fn table(
    info: &TraceInfo,
    summaries: &[PolicySummary],
    paper: Option<&PaperResults>,
) -> String {
    let seeds = summaries.first().map_or(0, |s| s.seeds);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Trace {} — {} nodes, {} GPUs, {} pods in the list; arrival up to 130% of GPU capacity; mean of {} seed(s)",
        info.trace, info.nodes, info.gpus, info.pods, seeds
    );
    let _ = writeln!(
        out,
        "GPU allocation (% of capacity) when the arrived GPU request reaches X% of capacity:"
    );
    let _ = write!(out, "{:<16}", "policy");
    for p in TABLE_POINTS {
        let _ = write!(out, "{:>8}", format!("{p}%"));
    }
    let _ = writeln!(
        out,
        "{:>10}{:>11}{:>13}",
        "frag@100", "±sd@100", "failed@100"
    );
    for s in summaries {
        let _ = write!(out, "{:<16}", s.policy.name());
        for p in TABLE_POINTS {
            let v = s
                .at(p)
                .map_or("-".to_string(), |x| format!("{:.2}", x.alloc_pct_mean));
            let _ = write!(out, "{v:>8}");
        }
        let at100 = s.at(100);
        let _ = writeln!(
            out,
            "{:>10}{:>11}{:>13}",
            at100.map_or("-".into(), |x| format!("{:.2}", x.frag_pct_mean)),
            at100.map_or("-".into(), |x| format!("{:.2}", x.alloc_pct_sd)),
            at100.map_or("-".into(), |x| format!("{:.0}", x.failed_pods_mean)),
        );
        if let (Some(paper), Some(label)) = (paper, s.policy.paper_label()) {
            if paper.alloc(label, 100).is_some() {
                let _ = write!(out, "{:<16}", "  paper");
                for p in TABLE_POINTS {
                    let v = paper
                        .alloc(label, p)
                        .map_or("-".to_string(), |x| format!("{x:.2}"));
                    let _ = write!(out, "{v:>8}");
                }
                let f = paper
                    .frag(label, 100)
                    .map_or("-".to_string(), |x| format!("{x:.2}"));
                let _ = writeln!(out, "{f:>10}");
            }
        }
    }
    let by = |k: PolicyKind| {
        summaries
            .iter()
            .find(|s| s.policy == k)
            .and_then(|s| s.at(100))
    };
    if let (Some(t), Some(f)) = (by(PolicyKind::Tessera), by(PolicyKind::Fgd)) {
        let gpus = info.gpus as f64;
        let _ = writeln!(
            out,
            "\nAt 100% arrived: tessera {:.2}% vs fgd {:.2}% allocated ({:+.2} points); unallocated GPUs {:.0} vs {:.0} of {}.",
            t.alloc_pct_mean,
            f.alloc_pct_mean,
            t.alloc_pct_mean - f.alloc_pct_mean,
            (100.0 - t.alloc_pct_mean) / 100.0 * gpus,
            (100.0 - f.alloc_pct_mean) / 100.0 * gpus,
            info.gpus
        );
    }
    if let Some(b) = info.packing_reference_pct {
        let _ = writeln!(
            out,
            "Offline packing reference at 100% arrived: {b:.2}% (GPU-sharing pods packed best-fit-decreasing with hindsight, CPU ignored; see docs/simulate.md)."
        );
    }
    if let Some(b) = info.packing_lp_bound_pct {
        let _ = writeln!(
            out,
            "Packing LP bound at 100% arrived: {b:.2}% (fewest GPUs any packing of those GPU-sharing pods needs, cutting-stock LP)."
        );
    }
    if paper.is_some() {
        let _ = writeln!(out, "`paper` rows: the FGD authors' published means for this trace (their simulator, their seeds).");
    }
    out
}

#[derive(Serialize)]
struct JsonPoint {
    arrived_pct: u32,
    alloc_pct_mean: f64,
    alloc_pct_sd: f64,
    frag_pct_mean: f64,
    failed_pods_mean: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    paper_alloc_pct_mean: Option<f64>,
}

#[derive(Serialize)]
struct JsonPolicy {
    policy: PolicyKind,
    seeds: usize,
    curve: Vec<JsonPoint>,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    trace: &'a str,
    nodes: usize,
    gpus: u64,
    pods: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    packing_reference_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    packing_lp_bound_pct: Option<f64>,
    policies: Vec<JsonPolicy>,
}

/// The JSON report: `{"trace":…,"policies":[{"policy":…,"seeds":N,"curve":[…]}]}`.
pub fn json(
    info: &TraceInfo,
    summaries: &[PolicySummary],
    paper: Option<&PaperResults>,
) -> serde_json::Value {
    let policies = summaries
        .iter()
        .map(|s| JsonPolicy {
            policy: s.policy,
            seeds: s.seeds,
            curve: s
                .curve
                .iter()
                .map(|p| JsonPoint {
                    arrived_pct: p.arrived_pct,
                    alloc_pct_mean: round(p.alloc_pct_mean),
                    alloc_pct_sd: round(p.alloc_pct_sd),
                    frag_pct_mean: round(p.frag_pct_mean),
                    failed_pods_mean: round(p.failed_pods_mean),
                    paper_alloc_pct_mean: paper
                        .zip(s.policy.paper_label())
                        .and_then(|(r, l)| r.alloc(l, p.arrived_pct)),
                })
                .collect(),
        })
        .collect();
    let report = JsonReport {
        trace: &info.trace,
        nodes: info.nodes,
        gpus: info.gpus,
        pods: info.pods,
        packing_reference_pct: info.packing_reference_pct.map(round),
        packing_lp_bound_pct: info.packing_lp_bound_pct.map(round),
        policies,
    };
    serde_json::to_value(report).unwrap_or(serde_json::Value::Null)
}

fn round(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}
