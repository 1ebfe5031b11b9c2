//! GPU fragmentation as the FGD paper defines it.
//!
//! A node's free GPU capacity is a *fragment* for a task when the task cannot use it:
//! if the task cannot run on the node at all (too little CPU, too few fitting GPUs, wrong
//! GPU model, or it needs no GPU), all of the node's free GPU milli is fragment; if it can
//! run, the free milli on GPUs too small for its per-GPU request is fragment. The node's
//! fragmentation for a workload is the expectation over the workload's task mix (the
//! "target workload", the most popular task shapes covering 95% of the tasks).

use std::collections::HashMap;

use super::cluster::{model_allowed, NodeClass};
use super::types::{Demand, GpuFree};

/// One task shape of the target workload and its share of tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetPod {
    pub cpu_milli: u32,
    pub gpu_count: u8,
    pub gpu_milli: u16,
    pub models: Option<u64>,
    /// Share of tasks with this shape, 0..=1, summing to 1 over the workload.
    pub freq: f64,
}

/// The target workload: task shapes and their popularity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub pods: Vec<TargetPod>,
}

impl Workload {
    /// Builds the target workload from demands as the paper does: count tasks per shape
    /// (CPU, GPU count, GPU milli, GPU models), keep the most popular shapes until they
    /// cover `coverage` (e.g. 0.95) of the tasks, and renormalise their shares.
    pub fn from_demands<'a>(demands: impl IntoIterator<Item = &'a Demand>, coverage: f64) -> Self {
        let mut counts: HashMap<(u32, u8, u16, Option<u64>), u64> = HashMap::new();
        let mut total = 0u64;
        for d in demands {
            *counts
                .entry((d.cpu_milli, d.gpu_count, d.gpu_milli, d.models))
                .or_default() += 1;
            total += 1;
        }
        if total == 0 {
            return Self::default();
        }
        let mut shapes: Vec<_> = counts.into_iter().collect();
        // Most popular first; a total order on the key keeps the cut deterministic.
        shapes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let target = coverage * total as f64;
        let mut kept = Vec::new();
        let mut cum = 0u64;
        for (k, n) in shapes {
            if cum as f64 >= target {
                break;
            }
            cum += n;
            kept.push((k, n));
        }
        let pods = kept
            .into_iter()
            .map(|((cpu_milli, gpu_count, gpu_milli, models), n)| TargetPod {
                cpu_milli,
                gpu_count,
                gpu_milli,
                models,
                freq: n as f64 / cum as f64,
            })
            .collect();
        Self { pods }
    }
}

impl Workload {
    /// The most popular shapes covering `coverage` of the tasks, shares renormalised.
    pub fn popular(&self, coverage: f64) -> Self {
        let mut kept = Vec::new();
        let mut cum = 0.0;
        for t in &self.pods {
            if cum >= coverage - 1e-12 {
                break;
            }
            cum += t.freq;
            kept.push(t.clone());
        }
        Self { pods: kept }.reweighted(|_| 1.0)
    }

    /// Shares multiplied by `weight(shape)` and renormalised to sum to 1.
    pub fn reweighted(&self, weight: impl Fn(&TargetPod) -> f64) -> Self {
        let mut pods: Vec<TargetPod> = self
            .pods
            .iter()
            .map(|t| TargetPod {
                freq: t.freq * weight(t),
                ..t.clone()
            })
            .collect();
        let sum: f64 = pods.iter().map(|t| t.freq).sum();
        if sum > 0.0 {
            pods.iter_mut().for_each(|t| t.freq /= sum);
        }
        Self { pods }
    }
}

/// Expected fragmented GPU milli of a node with this free capacity, for `workload`.
pub fn frag_milli(model: u8, cpu_left: u32, gpus: &[GpuFree], workload: &Workload) -> f64 {
    let total: u32 = gpus.iter().map(|g| u32::from(g.milli)).sum();
    if total == 0 {
        return 0.0;
    }
    let total_f = f64::from(total);
    let mut frag = 0.0;
    for t in &workload.pods {
        if t.gpu_count == 0 || !model_allowed(model, t.models) || cpu_left < t.cpu_milli {
            frag += t.freq * total_f;
            continue;
        }
        let mut usable = 0u8;
        let mut small = 0u32;
        for g in gpus {
            if g.milli >= t.gpu_milli {
                usable += 1;
            } else {
                small += u32::from(g.milli);
            }
        }
        frag += t.freq
            * if usable >= t.gpu_count {
                f64::from(small)
            } else {
                total_f
            };
    }
    frag
}

/// [`frag_milli`] of a node class.
pub fn node_frag_milli(class: &NodeClass, workload: &Workload) -> f64 {
    frag_milli(class.model, class.cpu_left, &class.gpus, workload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{Cluster, NodeSpec, Request};

    fn g(milli: u16) -> GpuFree {
        GpuFree {
            milli,
            memory_mib: u32::MAX,
        }
    }

    fn demands(c: &mut Cluster, reqs: &[Request]) -> Vec<Demand> {
        reqs.iter().map(|r| c.demand(r).unwrap()).collect()
    }

    #[test]
    fn workload_keeps_most_popular_shapes_and_renormalises() {
        let mut c = Cluster::new(vec![NodeSpec::new("a", 1000, 1000, 1, "T4")]).unwrap();
        let mut reqs = vec![Request::shared(100, 1, 500); 6];
        reqs.extend(vec![Request::whole(100, 1, 1); 3]);
        reqs.push(Request::cpu(100, 1));
        let ds = demands(&mut c, &reqs);
        let w = Workload::from_demands(&ds, 0.9);
        assert_eq!(w.pods.len(), 2);
        assert!((w.pods[0].freq - 6.0 / 9.0).abs() < 1e-12);
        assert!((w.pods[1].freq - 3.0 / 9.0).abs() < 1e-12);
        let all = Workload::from_demands(&ds, 1.0);
        assert_eq!(all.pods.len(), 3);
    }

    #[test]
    fn fragment_rules_match_the_paper() {
        let mut c = Cluster::new(vec![NodeSpec::new("a", 1000, 1000, 1, "T4")]).unwrap();
        // Single-shape workloads make each rule visible on its own.
        let shape =
            |c: &mut Cluster, r: Request| Workload::from_demands(&[c.demand(&r).unwrap()], 1.0);
        let half = shape(&mut c, Request::shared(1000, 1, 500));
        let whole2 = shape(&mut c, Request::whole(1000, 1, 2));
        let cpu = shape(&mut c, Request::cpu(1000, 1));
        let other_model = shape(&mut c, Request::shared(1000, 1, 500).on_models(&["A100"]));
        let t4 = 0u8;
        let cases: Vec<(&Workload, u32, Vec<u16>, f64)> = vec![
            // Task fits: GPUs with less than 500 free are fragment (300 + 100).
            (&half, 8000, vec![1000, 700, 300, 100], 400.0),
            // Too little CPU: everything free is fragment.
            (&half, 500, vec![1000, 700, 300, 100], 2100.0),
            // Two whole GPUs needed, only one free: all fragment.
            (&whole2, 8000, vec![1000, 700], 1700.0),
            // Two free: partial GPUs are fragment for whole-GPU tasks.
            (&whole2, 8000, vec![1000, 1000, 700], 700.0),
            // CPU-only tasks never use GPUs: all free GPU is fragment.
            (&cpu, 8000, vec![1000], 1000.0),
            // Wrong model: all fragment. Empty node: nothing to fragment.
            (&other_model, 8000, vec![1000], 1000.0),
            (&half, 8000, vec![0, 0], 0.0),
        ];
        for (w, cpu_left, gpus, want) in cases {
            let gs: Vec<GpuFree> = gpus.iter().map(|&m| g(m)).collect();
            assert_eq!(
                frag_milli(t4, cpu_left, &gs, w),
                want,
                "{gpus:?} cpu {cpu_left}"
            );
        }
    }
}
