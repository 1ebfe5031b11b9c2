//! `tessera simulate fleet`: training and inference sharing one GPU fleet over days of
//! simulated time, against dedicated pools, on real traces, driven by the engines the
//! controller runs (issue 22; `docs/fleet-simulation.md`).
//!
//! ```text
//! DLRM inference trace ─► demand::parse_services (instances alive per service)
//! Alibaba GPU trace 2023 ─► demand::parse_tasks (BE + Burstable) ─► demand::arrivals (seeded)
//!   └─► run::sizing (inference peak, quota split, offered training load)
//!         └─► run::run_fleet × {dedicated, shared (Kueue + KEDA), Tessera}
//!               quota::Engine + placement::{Cluster, Policy} + autoscale::Scaler
//!         └─► report (table / JSON) + plot (SVG)
//! ```

pub mod config;
pub mod demand;
pub mod nodes;
pub mod plot;
pub mod report;
pub mod run;

use std::sync::Mutex;

use serde::Serialize;

pub use config::{FleetKind, InvalidKnob, Knobs, ModelNodes};
pub use run::{FleetResult, MigStats, RunError, Sizing};

/// The demand every fleet of a run faces.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub services: Vec<demand::Service>,
    pub jobs: Vec<demand::Job>,
    pub sizing: Sizing,
    /// How many task shapes the jobs were drawn from.
    pub task_shapes: usize,
    /// Tasks of the trace left out: their `gpu_spec` names no model of the fleet.
    pub tasks_left_out: usize,
}

impl Inputs {
    /// Validates the knobs, sizes the fleet and draws the training jobs.
    pub fn new(
        knobs: &Knobs,
        services: Vec<demand::Service>,
        shapes: &[demand::TaskShape],
    ) -> Result<Self, RunError> {
        knobs
            .validate()
            .map_err(|e| RunError::Sizing(e.to_string()))?;
        let sizing = run::sizing(&services, knobs)?;
        let jobs = demand::arrivals(
            shapes,
            &demand::Arrivals {
                offered_gpus: sizing.training_offered_gpus,
                until: knobs.horizon(),
                checkpoint: knobs.checkpoint_ms(),
                seed: knobs.seed,
            },
        );
        Ok(Inputs {
            services,
            jobs,
            sizing,
            task_shapes: shapes.len(),
            tasks_left_out: 0,
        })
    }
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub knobs: Knobs,
    pub sizing: Sizing,
    pub services: usize,
    pub training_jobs: usize,
    pub task_shapes: usize,
    pub tasks_left_out: usize,
    pub fleets: Vec<FleetResult>,
}

/// Runs `fleets` on up to `threads` threads. `progress(fraction)` is the mean progress
/// of the fleets in simulated time.
pub fn run_all(
    knobs: &Knobs,
    inputs: &Inputs,
    fleets: &[FleetKind],
    threads: usize,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Comparison, RunError> {
    let done = Mutex::new(vec![0.0f64; fleets.len()]);
    let report = |i: usize, f: f64| {
        if let Ok(mut d) = done.lock() {
            d[i] = f;
            progress(d.iter().sum::<f64>() / d.len().max(1) as f64);
        }
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, fleets.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&kind) = fleets.get(i) else { break };
                let r = run::run_fleet(
                    kind,
                    knobs,
                    inputs.sizing,
                    &inputs.services,
                    &inputs.jobs,
                    &|f| report(i, f),
                );
                if let Ok(mut v) = results.lock() {
                    v.push((i, r));
                }
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|(i, _)| *i);
    let fleets = v
        .into_iter()
        .map(|(_, r)| r)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Comparison {
        knobs: knobs.clone(),
        sizing: inputs.sizing,
        services: inputs.services.len(),
        training_jobs: inputs.jobs.len(),
        task_shapes: inputs.task_shapes,
        tasks_left_out: inputs.tasks_left_out,
        fleets,
    })
}
