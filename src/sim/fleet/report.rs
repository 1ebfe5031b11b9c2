//! The three-fleet comparison as a table (metrics down, fleets across) or JSON.

use std::fmt::Write as _;

use super::run::FleetResult;
use super::Comparison;

/// A row of the table: its name and how to show one fleet's value.
type Row = (&'static str, Box<dyn Fn(&FleetResult) -> String>);

/// The comparison as the table `tessera simulate fleet` prints.
pub fn table(c: &Comparison) -> String {
    let k = &c.knobs;
    let s = &c.sizing;
    let mut out = String::new();
    let models: Vec<String> = k
        .gpu_models
        .iter()
        .map(|m| format!("{} nodes × {} {}", m.nodes, k.gpus_per_node, m.model))
        .collect();
    let _ = writeln!(
        out,
        "Fleet: {} GPUs ({}), {} day(s) of the Alibaba DLRM inference trace 2025 ({} services), seed {}",
        k.gpus,
        models.join(" + "),
        k.days,
        c.services,
        k.seed
    );
    let _ = writeln!(
        out,
        "Inference: peak {} GPUs of replicas (mean {:.0}) → dedicated pool {} GPUs; inference quota in the shared fleets {} GPUs",
        s.inference_peak_gpus, s.inference_mean_gpus, s.inference_pool_gpus, s.inference_quota_gpus
    );
    let _ = writeln!(
        out,
        "Training: {} jobs drawn from {} BE/Burstable tasks of the Alibaba GPU trace 2023, offering {:.0} GPUs of work ({}× what inference leaves); checkpoints every {}–{} min",
        c.training_jobs, c.task_shapes, s.training_offered_gpus, k.training_load, k.checkpoint_min.0, k.checkpoint_min.1
    );
    if c.tasks_left_out > 0 {
        let _ = writeln!(
            out,
            "  ({} tasks left out: their gpu_spec names no model of the fleet)",
            c.tasks_left_out
        );
    }
    if let Some(m) = c.fleets.iter().find_map(|f| f.mig.as_ref()) {
        let instances: Vec<String> = m
            .instances
            .iter()
            .map(|(p, n)| format!("{n} × {p}"))
            .collect();
        let _ = writeln!(
            out,
            "MIG (Tessera): the last {} nodes ({} GPUs) laid out `{}`: {}; {} jobs fit a profile and ask for one",
            m.nodes,
            m.gpus,
            k.mig_layout,
            instances.join(", "),
            m.jobs
        );
    }
    let _ = writeln!(
        out,
        "Averages over time after a {} h warm-up.\n",
        k.warmup_hours
    );
    let mut rows: Vec<Row> = vec![
        (
            "GPUs allocated (%)",
            Box::new(|f| format!("{:.1}", f.allocated_pct)),
        ),
        ("GPUs used (%)", Box::new(|f| format!("{:.1}", f.used_pct))),
        (
            "stranded on partly used GPUs (%)",
            Box::new(|f| format!("{:.2}", f.fragmented_pct)),
        ),
        (
            "admitted, waiting for a node (%)",
            Box::new(|f| format!("{:.2}", f.admitted_unplaced_pct)),
        ),
        (
            "inference demand-to-ready p50/p99 (s)",
            Box::new(|f| {
                format!(
                    "{} / {}",
                    secs(f.inference.ready_p50_s),
                    secs(f.inference.ready_p99_s)
                )
            }),
        ),
        (
            "  waits (demand units short of a replica)",
            Box::new(|f| f.inference.waits.to_string()),
        ),
        (
            "  p99 while within quota (s)",
            Box::new(|f| secs(f.inference.ready_p99_within_quota_s)),
        ),
        (
            "  under-provisioned (% of time)",
            Box::new(|f| format!("{:.2}", f.inference.under_provisioned_pct)),
        ),
        (
            "training useful GPU-hours",
            Box::new(|f| format!("{:.0}", f.training.useful_gpu_hours)),
        ),
        (
            "  jobs started / completed",
            Box::new(|f| format!("{} / {}", f.training.started, f.training.completed)),
        ),
        (
            "  queueing p50/p95 (min)",
            Box::new(|f| {
                format!(
                    "{:.1} / {:.0}",
                    f.training.queue_p50_min, f.training.queue_p95_min
                )
            }),
        ),
        (
            "  never started",
            Box::new(|f| f.training.never_started.to_string()),
        ),
        (
            "  preemptions",
            Box::new(|f| f.training.preemptions.to_string()),
        ),
        (
            "  rework (GPU-h; GPU-min/preemption)",
            Box::new(|f| {
                format!(
                    "{:.1}; {:.1}",
                    f.training.rework_gpu_hours, f.training.rework_gpu_min_per_preemption
                )
            }),
        ),
        (
            "scaler step (ns, mean)",
            Box::new(|f| format!("{:.0}", f.costs.scaler_step_ns_mean)),
        ),
        (
            "quota engine call (µs, mean)",
            Box::new(|f| format!("{:.1}", f.costs.quota_call_us_mean)),
        ),
        (
            "placement (µs, mean)",
            Box::new(|f| format!("{:.1}", f.costs.placement_us_mean)),
        ),
        ("wall (s)", Box::new(|f| format!("{:.1}", f.wall_s))),
    ];
    if c.fleets.iter().any(|f| f.mig.is_some()) {
        let mig: Vec<Row> = vec![
            (
                "  on MIG GPUs: allocated / used (%)",
                Box::new(|f| {
                    f.mig.as_ref().map_or("–".into(), |m| {
                        format!("{:.1} / {:.1}", m.allocated_pct, m.used_pct)
                    })
                }),
            ),
            (
                "  MIG jobs started / asking",
                Box::new(|f| {
                    f.mig
                        .as_ref()
                        .map_or("–".into(), |m| format!("{} / {}", m.started, m.jobs))
                }),
            ),
        ];
        rows.splice(2..2, mig);
    }
    let first = rows
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0);
    let width = |f: &FleetResult| f.label.chars().count().max(12);
    let _ = write!(out, "{:first$}", "");
    for f in &c.fleets {
        let _ = write!(out, "  {:>w$}", f.label, w = width(f));
    }
    out.push('\n');
    for (name, cell) in &rows {
        let _ = write!(out, "{name:first$}");
        for f in &c.fleets {
            let _ = write!(out, "  {:>w$}", cell(f), w = width(f));
        }
        out.push('\n');
    }
    out
}

/// Whole seconds, or `–` when nothing waited.
fn secs(v: Option<f64>) -> String {
    v.map_or("–".into(), |s| format!("{s:.0}"))
}

/// The comparison as JSON (the series included).
pub fn json(c: &Comparison) -> serde_json::Value {
    serde_json::to_value(c).unwrap_or(serde_json::Value::Null)
}
