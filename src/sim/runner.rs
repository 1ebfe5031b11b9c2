//! Runs policies × seeds on worker threads and summarises the curves per policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use super::protocol::{run_one, Prepared, RunResult};
use crate::placement::PolicyKind;

/// The paper's seeds start at 42.
pub const FIRST_SEED: u64 = 42;

/// Runs every (policy, seed) pair on `threads` threads. `progress(done, total)` is called
/// after each run, from the worker that finished it.
pub fn run_all(
    p: &Prepared,
    policies: &[PolicyKind],
    seeds: &[u64],
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<RunResult> {
    let jobs: Vec<(PolicyKind, u64)> = policies
        .iter()
        .flat_map(|&k| seeds.iter().map(move |&s| (k, s)))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(kind, seed)) = jobs.get(j) else {
                    break;
                };
                let r = run_one(p, kind, seed);
                if let Ok(mut v) = results.lock() {
                    v.push((j, r));
                }
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, jobs.len());
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_else(|e| e.into_inner());
    v.sort_by_key(|(j, _)| *j);
    v.into_iter().map(|(_, r)| r).collect()
}

/// Mean (and spread) over seeds at one checkpoint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SummaryPoint {
    pub arrived_pct: u32,
    pub alloc_pct_mean: f64,
    pub alloc_pct_sd: f64,
    pub frag_pct_mean: f64,
    pub failed_pods_mean: f64,
}

/// One policy's curve, averaged over its seeds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicySummary {
    pub policy: PolicyKind,
    pub seeds: usize,
    pub curve: Vec<SummaryPoint>,
}

impl PolicySummary {
    /// The summary point at `arrived_pct`, if recorded.
    pub fn at(&self, arrived_pct: u32) -> Option<&SummaryPoint> {
        self.curve.iter().find(|p| p.arrived_pct == arrived_pct)
    }
}

/// Averages runs per policy, in the order policies first appear.
pub fn summarize(results: &[RunResult]) -> Vec<PolicySummary> {
    let mut order: Vec<PolicyKind> = Vec::new();
    for r in results {
        if !order.contains(&r.policy) {
            order.push(r.policy);
        }
    }
    order
        .into_iter()
        .map(|k| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.policy == k).collect();
            let n = runs.len() as f64;
            let len = runs.iter().map(|r| r.curve.len()).min().unwrap_or(0);
            let curve = (0..len)
                .map(|i| {
                    let a: Vec<f64> = runs.iter().map(|r| r.curve[i].alloc_pct).collect();
                    let mean = a.iter().sum::<f64>() / n;
                    let var = if a.len() > 1 {
                        a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
                    } else {
                        0.0
                    };
                    SummaryPoint {
                        arrived_pct: runs[0].curve[i].arrived_pct,
                        alloc_pct_mean: mean,
                        alloc_pct_sd: var.sqrt(),
                        frag_pct_mean: runs.iter().map(|r| r.curve[i].frag_pct).sum::<f64>() / n,
                        failed_pods_mean: runs
                            .iter()
                            .map(|r| f64::from(r.curve[i].failed_pods))
                            .sum::<f64>()
                            / n,
                    }
                })
                .collect();
            PolicySummary {
                policy: k,
                seeds: runs.len(),
                curve,
            }
        })
        .collect()
}
