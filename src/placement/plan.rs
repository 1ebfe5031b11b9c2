//! Packing plan for GPU-sharing tasks: which free-capacity levels a good packing of the
//! workload's sizes passes through.
//!
//! GPU-sharing tasks of a few sizes (810, 650, 470, 320 milli, …) share GPUs; how they
//! are combined decides how much GPU stays idle (a 470 next to a 320 leaves 210 that
//! almost nothing fills, two 470s leave 60). The best mix of combinations (*patterns*)
//! for the workload's size distribution is the classic cutting-stock linear programme
//! (Gilmore–Gomory): cover each size's share with patterns, each pattern one GPU, using
//! as few GPUs as possible. It is solved by column generation, with a bounded knapsack
//! pricing new patterns. The plan then lists every free capacity a GPU passes through
//! while it is filled with one of the chosen patterns, in any order. A placement that
//! leaves a GPU at such a level stays on a good packing; one that leaves another level
//! (e.g. 210 after 470 + 320) is off plan.
//!
//! This follows the idea of distribution-aware online bin packing (Csirik et al.'s
//! Sum-of-Squares and SS*: plan against the LP of the size distribution), reduced to
//! the part the placement policy needs: a yes/no per free-capacity level.

use super::frag::Workload;
use super::types::MILLI;

/// Patterns used by less than this share of the GPU-sharing tasks are left out of the
/// plan (an LP vertex can carry tiny leftovers that no packing would really use).
const MIN_PATTERN_SHARE: f64 = 5e-4;
/// Column-generation rounds before settling for the current (feasible) patterns.
const MAX_ROUNDS: usize = 2_000;
const EPS: f64 = 1e-9;

/// Which free GPU capacities (in milli) a good packing of the sharing sizes passes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePlan {
    /// `on_plan[m]`: a GPU with `m` milli free is on a planned pattern.
    on_plan: Vec<bool>,
}

impl SharePlan {
    /// The plan for the GPU-sharing shapes (one GPU, less than a whole) of `workload`,
    /// weighted by their shares; `None` when the workload has no sharing shape.
    pub fn from_workload(workload: &Workload) -> Option<Self> {
        let mut demand: Vec<(u16, f64)> = Vec::new();
        for t in &workload.pods {
            if t.gpu_count != 1 || t.gpu_milli == 0 || t.gpu_milli >= MILLI || t.freq <= 0.0 {
                continue;
            }
            match demand.iter_mut().find(|(s, _)| *s == t.gpu_milli) {
                Some((_, f)) => *f += t.freq,
                None => demand.push((t.gpu_milli, t.freq)),
            }
        }
        Self::from_sizes(&demand)
    }

    /// The plan for sharing sizes (milli, share); `None` when there are none.
    pub fn from_sizes(demand: &[(u16, f64)]) -> Option<Self> {
        let demand: Vec<(u16, f64)> = demand
            .iter()
            .copied()
            .filter(|&(s, f)| s > 0 && s < MILLI && f > 0.0)
            .collect();
        if demand.is_empty() {
            return None;
        }
        let sizes: Vec<u16> = demand.iter().map(|d| d.0).collect();
        let b: Vec<f64> = demand.iter().map(|d| d.1).collect();
        let total: f64 = b.iter().sum();
        let cap = usize::from(MILLI);
        let mut on_plan = vec![false; cap + 1];
        for (pattern, x) in cutting_stock_lp(&sizes, &b).patterns {
            if x < MIN_PATTERN_SHARE * total {
                continue;
            }
            // Every sub-multiset of the pattern is a state on the way to filling it.
            let mut reach = vec![false; cap + 1];
            reach[0] = true;
            for (&s, &n) in sizes.iter().zip(&pattern) {
                for _ in 0..n {
                    for used in (usize::from(s)..=cap).rev() {
                        if reach[used - usize::from(s)] {
                            reach[used] = true;
                        }
                    }
                }
            }
            for (used, _) in reach.iter().enumerate().filter(|(_, &r)| r) {
                on_plan[cap - used] = true;
            }
        }
        Some(Self { on_plan })
    }

    /// Whether a GPU left with `free` milli is on the plan.
    pub fn keeps(&self, free: u16) -> bool {
        self.on_plan
            .get(usize::from(free))
            .copied()
            .unwrap_or(false)
    }
}

/// The fewest GPUs that can hold `count` tasks of each `size` milli (one GPU-sharing task
/// never spans GPUs), as the cutting-stock LP relaxation: a lower bound on any packing,
/// offline or online. `None` if the solver stopped before proving optimality.
pub fn min_gpus_lp(demand: &[(u16, f64)]) -> Option<f64> {
    let demand: Vec<(u16, f64)> = demand
        .iter()
        .copied()
        .filter(|&(s, n)| s > 0 && n > 0.0)
        .map(|(s, n)| (s.min(MILLI), n))
        .collect();
    let sizes: Vec<u16> = demand.iter().map(|d| d.0).collect();
    let b: Vec<f64> = demand.iter().map(|d| d.1).collect();
    let sol = cutting_stock_lp(&sizes, &b);
    sol.optimal
        .then(|| sol.patterns.iter().map(|(_, x)| x).sum())
}

/// Basic patterns of the cutting-stock LP (counts per size, value).
#[derive(Debug)]
struct LpSolution {
    patterns: Vec<(Vec<u32>, f64)>,
    /// Whether no pattern could improve the solution when the solver stopped.
    optimal: bool,
}

/// Solves min Σx over patterns (multisets of `sizes` fitting one GPU) with
/// Σ x·pattern = `b`, x ≥ 0, by revised simplex with column generation.
fn cutting_stock_lp(sizes: &[u16], b: &[f64]) -> LpSolution {
    let m = sizes.len();
    // Start from one pattern per size holding a single task: B = I, x = b.
    let mut basis: Vec<Vec<u32>> = (0..m)
        .map(|i| (0..m).map(|j| u32::from(i == j)).collect())
        .collect();
    let mut binv: Vec<Vec<f64>> = (0..m)
        .map(|i| (0..m).map(|j| if i == j { 1.0 } else { 0.0 }).collect())
        .collect();
    let mut x: Vec<f64> = b.to_vec();
    let mut optimal = false;
    for _ in 0..MAX_ROUNDS {
        // Duals: y = c_B · B⁻¹ with every cost 1.
        let y: Vec<f64> = (0..m).map(|j| (0..m).map(|i| binv[i][j]).sum()).collect();
        let (value, column) = best_pattern(sizes, &y);
        if value <= 1.0 + EPS {
            optimal = true;
            break;
        }
        let d: Vec<f64> = (0..m)
            .map(|i| {
                (0..m)
                    .map(|j| binv[i][j] * f64::from(column[j]))
                    .sum::<f64>()
            })
            .collect();
        // Ratio test; ties go to the lowest row (Bland) to avoid cycling.
        let mut leave: Option<(usize, f64)> = None;
        for i in 0..m {
            if d[i] > EPS {
                let r = x[i] / d[i];
                if leave.is_none_or(|(_, best)| r < best - EPS) {
                    leave = Some((i, r));
                }
            }
        }
        let Some((r, theta)) = leave else {
            break;
        };
        for i in 0..m {
            x[i] -= theta * d[i];
        }
        x[r] = theta;
        let pivot = d[r];
        let row_r: Vec<f64> = binv[r].iter().map(|v| v / pivot).collect();
        for i in 0..m {
            if i != r {
                let f = d[i];
                for j in 0..m {
                    binv[i][j] -= f * row_r[j];
                }
            }
        }
        binv[r] = row_r;
        basis[r] = column;
    }
    let patterns = basis
        .into_iter()
        .zip(x)
        .map(|(p, v)| (p, v.max(0.0)))
        .collect();
    LpSolution { patterns, optimal }
}

/// The pattern of greatest dual value Σ y·count that fits one GPU (unbounded knapsack
/// over milli), with its value.
fn best_pattern(sizes: &[u16], y: &[f64]) -> (f64, Vec<u32>) {
    let cap = usize::from(MILLI);
    // best[c]: greatest value within capacity c; pick[c]: last size taken (None = carry).
    let mut best = vec![0.0f64; cap + 1];
    let mut pick: Vec<Option<usize>> = vec![None; cap + 1];
    for c in 1..=cap {
        best[c] = best[c - 1];
        for (i, &s) in sizes.iter().enumerate() {
            let s = usize::from(s);
            if y[i] > EPS && s <= c && best[c - s] + y[i] > best[c] + EPS {
                best[c] = best[c - s] + y[i];
                pick[c] = Some(i);
            }
        }
    }
    let mut counts = vec![0u32; sizes.len()];
    let mut c = cap;
    while c > 0 {
        match pick[c] {
            Some(i) => {
                counts[i] += 1;
                c -= usize::from(sizes[i]);
            }
            None => c -= 1,
        }
    }
    (best[cap], counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_keeps_the_levels_of_the_best_combinations() {
        // Two 470s per 650 + 320: the best packing pairs 470 with 470 and 650 with 320.
        let plan = SharePlan::from_sizes(&[(470, 2.0), (650, 1.0), (320, 1.0)]).unwrap();
        let cases: [(u16, bool); 9] = [
            (1000, true), // an empty GPU
            (530, true),  // one 470, waiting for another
            (60, true),   // two 470s
            (350, true),  // a 650, waiting for a 320
            (680, true),  // a 320, waiting for a 650
            (30, true),   // 650 + 320
            (210, false), // 470 + 320: only tiny tasks could use the rest
            (880, false), // nothing of size 120
            (0, false),   // no combination fills a GPU exactly
        ];
        for (free, want) in cases {
            assert_eq!(plan.keeps(free), want, "free {free}");
        }
    }

    #[test]
    fn scarce_small_sizes_go_where_they_fill_best() {
        // As many 160s as 810s: each 810 takes one (waste 30), never two 160s elsewhere.
        let plan = SharePlan::from_sizes(&[(810, 1.0), (160, 1.0)]).unwrap();
        assert!(plan.keeps(190) && plan.keeps(840) && plan.keeps(30));
        assert!(!plan.keeps(680), "two 160s on one GPU are off plan");
    }

    #[test]
    fn lp_finds_the_cutting_stock_optimum() {
        // Sizes 500 ×3 and 300 ×2 + 200 ×2: 500+500, 500+300+200, 300+200 … optimum 2.5.
        let sizes = [500u16, 300, 200];
        let b = [3.0, 2.0, 2.0];
        let sol = cutting_stock_lp(&sizes, &b);
        assert!(sol.optimal);
        let bins: f64 = sol.patterns.iter().map(|(_, x)| x).sum();
        let total = 3.0 * 500.0 + 2.0 * 300.0 + 2.0 * 200.0;
        assert!((bins - total / 1000.0).abs() < 1e-6, "{sol:?}");
        for i in 0..sizes.len() {
            let covered: f64 = sol.patterns.iter().map(|(p, x)| f64::from(p[i]) * x).sum();
            assert!(
                (covered - b[i]).abs() < 1e-6,
                "size {}: {covered}",
                sizes[i]
            );
        }
    }

    #[test]
    fn min_gpus_is_the_lp_bound() {
        // Two 600s cannot share a GPU; 810 + 160 can; five 200s fill one GPU.
        let cases: [(&[(u16, f64)], f64); 4] = [
            (&[], 0.0),
            (&[(600, 2.0)], 2.0),
            (&[(810, 3.0), (160, 3.0)], 3.0),
            (&[(200, 5.0), (1000, 1.0)], 2.0),
        ];
        for (demand, want) in cases {
            let got = min_gpus_lp(demand).unwrap();
            assert!((got - want).abs() < 1e-6, "{demand:?}: {got}");
        }
    }

    #[test]
    fn no_sharing_sizes_no_plan() {
        assert_eq!(SharePlan::from_sizes(&[]), None);
        assert_eq!(SharePlan::from_sizes(&[(1000, 1.0), (0, 2.0)]), None);
        assert_eq!(SharePlan::from_workload(&Workload::default()), None);
    }
}
