//! `tessera simulate fleet` (issue 22) and the FGD-protocol headline of plain
//! `tessera simulate`, pinned so that a regression in the quota, placement or autoscaling
//! engine shows up here. Kept within the debug-build budget: a two-day fleet run (the
//! documented default is seven) and three seeds of the protocol.

use std::process::Command;

use tessera::placement::{PolicyKind, TieBreak};
use tessera::sim::fleet::{self, demand, FleetKind, FleetResult, Inputs, Knobs};
use tessera::sim::protocol::{run_one, Prepared};
use tessera::sim::trace;

const DLRM: &str = include_str!("../data/alibaba-dlrm-inference-v2025/dlrm_hn_instances.csv");
const PODS: &str = include_str!("../data/alibaba-gpu-v2023/openb_pod_list_default.csv");
const NODES: &str = include_str!("../data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

fn within(what: &str, got: f64, want: f64, tolerance: f64) {
    assert!(
        (got - want).abs() <= tolerance,
        "{what}: {got:.3}, pinned {want} ± {tolerance}"
    );
}

#[test]
fn bundled_traces_hold_the_documented_demand() {
    let services = demand::parse_services(DLRM, "dlrm").unwrap();
    assert_eq!(services.len(), 156);
    let instances: usize = services
        .iter()
        .map(|s| s.steps.windows(2).filter(|w| w[1].1 > w[0].1).count())
        .sum();
    assert!(instances > 1000, "{instances} scale-ups");
    let tasks = demand::parse_tasks(PODS, "pods").unwrap();
    assert_eq!(
        tasks.len(),
        3046,
        "BE + Burstable tasks with GPUs and a lifetime"
    );
    assert!(tasks.iter().any(|t| t.gpu_milli < 1000));
}

/// The default knobs over two days: the headline numbers of the three fleets, pinned
/// (measured with `tessera simulate fleet --days 2 --json`; docs/fleet-simulation.md).
#[test]
fn two_day_run_keeps_the_headline_numbers() {
    let knobs = Knobs {
        days: 2.0,
        ..Knobs::default()
    };
    let services = demand::parse_services(DLRM, "dlrm").unwrap();
    let shapes = demand::parse_tasks(PODS, "pods").unwrap();
    let inputs = Inputs::new(&knobs, services, &shapes).unwrap();
    let c = fleet::run_all(&knobs, &inputs, &FleetKind::ALL, 2, &|_| {}).unwrap();
    let get = |k: FleetKind| -> &FleetResult { c.fleets.iter().find(|f| f.fleet == k).unwrap() };
    let (dedicated, shared, t) = (
        get(FleetKind::Dedicated),
        get(FleetKind::Shared),
        get(FleetKind::Tessera),
    );

    // The targets.
    assert!(t.allocated_pct >= 85.0, "{}", t.allocated_pct);
    let p99 = t.inference.ready_p99_within_quota_s.unwrap();
    assert!(p99 <= 30.0, "{p99}");
    assert!(t.training.rework_gpu_min_per_preemption <= 15.0);

    // Pinned values.
    within("Tessera allocated %", t.allocated_pct, 98.12, 1.0);
    within("Tessera used %", t.used_pct, 88.07, 1.0);
    within(
        "Tessera useful GPU-h",
        t.training.useful_gpu_hours,
        21381.0,
        640.0,
    );
    within("dedicated allocated %", dedicated.allocated_pct, 99.45, 1.0);
    within("dedicated used %", dedicated.used_pct, 85.33, 1.0);
    within(
        "dedicated useful GPU-h",
        dedicated.training.useful_gpu_hours,
        16664.0,
        500.0,
    );
    within("shared used %", shared.used_pct, 85.48, 1.0);
    within(
        "Tessera inference p99 (s)",
        t.inference.ready_p99_s.unwrap(),
        10.5,
        5.0,
    );

    // What sharing buys on this demand.
    assert!(t.used_pct > dedicated.used_pct + 1.5);
    assert!(t.training.useful_gpu_hours > 1.2 * dedicated.training.useful_gpu_hours);
    assert!(shared.training.queue_p50_min <= dedicated.training.queue_p50_min);
    // The engines were exercised, not bypassed.
    for f in &c.fleets {
        assert!(f.costs.scaler_steps > 100_000, "{:?}", f.fleet);
        assert!(f.costs.placements > 10_000 && f.costs.quota_calls > 10_000);
        assert!(f.training.completed > 15_000);
        assert_eq!(f.series.len(), 481, "{:?}", f.fleet);
    }
}

/// The FGD paper's protocol on the default trace (all 1,213 nodes and 8,152 pods): Tessera's
/// policy at ≥ 96.0 % of GPUs allocated when 100 % of the capacity has arrived, above FGD,
/// averaged over three of the paper's seeds.
#[test]
fn fgd_protocol_headline_tessera_at_least_96_and_above_fgd() {
    let nodes = trace::parse_node_list(NODES, "nodes").unwrap();
    let pods = trace::parse_pod_list(PODS, "pods").unwrap();
    let p = Prepared::new(nodes, &pods, 1.3, 0.95, TieBreak::First).unwrap();
    let at_100 = |k: PolicyKind, seed: u64| {
        run_one(&p, k, seed)
            .curve
            .iter()
            .find(|c| c.arrived_pct == 100)
            .map(|c| c.alloc_pct)
            .unwrap()
    };
    let seeds = [42, 43, 44];
    let mean = |k: PolicyKind| seeds.iter().map(|&s| at_100(k, s)).sum::<f64>() / 3.0;
    let (t, fgd) = (mean(PolicyKind::Tessera), mean(PolicyKind::Fgd));
    assert!(t >= 96.0, "Tessera {t:.2} %");
    assert!(t > fgd, "Tessera {t:.2} % vs FGD {fgd:.2} %");
}

#[test]
fn cli_prints_the_table_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("fleet.svg");
    let out = tessera()
        .args(["simulate", "fleet", "--days", "0.25", "--warmup-hours", "1"])
        .args(["--fleets", "dedicated,tessera", "--gpus", "4096", "--json"])
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let fleets = v["fleets"].as_array().unwrap();
    assert_eq!(fleets.len(), 2);
    assert_eq!(fleets[0]["fleet"], "dedicated");
    assert_eq!(fleets[1]["fleet"], "tessera");
    for key in ["allocated_pct", "used_pct", "fragmented_pct"] {
        assert!(fleets[1][key].as_f64().is_some(), "{key}");
    }
    assert!(fleets[1]["inference"]["ready_p99_s"].as_f64().is_some());
    assert!(fleets[1]["training"]["rework_gpu_hours"].as_f64().is_some());
    assert!(fleets[1]["costs"]["scaler_step_ns_mean"].as_f64().is_some());
    assert_eq!(v["services"], 156);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("Tessera") && chart.contains("polyline"));
    // The table, and no progress bar when stderr is not a terminal.
    let out = tessera()
        .args(["simulate", "fleet", "--days", "0.1", "--warmup-hours", "0"])
        .args(["--fleets", "shared"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("GPUs allocated (%)") && table.contains("shared, Kueue + KEDA"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains('['));
}

#[test]
fn invalid_knobs_are_refused_with_the_reason() {
    let cases: &[(&[&str], &str)] = &[
        (&["--gpus", "100"], "--gpus"),
        (&["--gpus", "512"], "inference peak"),
        (&["--days", "40"], "--days"),
        (&["--checkpoint", "30-5"], "--checkpoint"),
        (&["--checkpoint", "soon"], "--checkpoint"),
        (&["--inference-share", "1.2"], "--inference-share"),
        (&["--fleets", "tessera,mine"], "--fleets"),
        (&["--training-load=-1"], "--training-load"),
        (&["--polling", "0"], "--polling"),
    ];
    for (args, reason) in cases {
        let out = tessera()
            .args(["simulate", "fleet"])
            .args(*args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran");
        assert!(err.contains(reason), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
