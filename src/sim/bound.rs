//! An offline reference point for the allocation at 100% arrived.
//!
//! At 100% arrived, every GPU milli a GPU-sharing pod leaves unusable is a milli some
//! arrived pod could not get. Packing the sharing pods that arrived within 100% offline,
//! largest first, each into the fullest GPU it fits (best-fit decreasing), shows how
//! much their sizes alone force to stay idle: e.g. a 810m pod leaves 190m that only the
//! rare ≤190m pods can use. The reference ignores CPU, memory and GPU models (optimistic)
//! and BFD is not optimal (slightly pessimistic), so it is a yardstick, not a proof.

use super::protocol::{arrival_order, Prepared};
use crate::placement::{min_gpus_lp, MILLI};

/// The GPU-sharing pod sizes that arrived within 100% of capacity for `seed`.
fn shared_sizes_within_capacity(p: &Prepared, seed: u64) -> Vec<u16> {
    let cap = p.cluster.total_gpu_milli();
    let order = arrival_order(&p.demands, cap, p.inflation, seed);
    let mut sizes: Vec<u16> = Vec::new();
    let mut arrived = 0u64;
    for &i in &order {
        let d = &p.demands[i];
        if (arrived + d.total_milli()) * 100 > 100 * cap {
            break;
        }
        arrived += d.total_milli();
        if d.is_shared() {
            sizes.push(d.gpu_milli);
        }
    }
    sizes
}

/// The allocation percent at 100% arrived if only the sharing pods' sizes wasted GPU, for
/// the arrival order of `seed`, packed best-fit decreasing.
pub fn packing_reference_pct(p: &Prepared, seed: u64) -> f64 {
    let cap = p.cluster.total_gpu_milli();
    let mut sizes = shared_sizes_within_capacity(p, seed);
    let waste = best_fit_decreasing_waste(&mut sizes);
    100.0 - waste as f64 * 100.0 / cap as f64
}

/// The same with the fewest GPUs any packing of those sizes needs (the cutting-stock LP
/// bound): placing every sharing pod that arrived within 100% leaves at least this much
/// idle on their GPUs. `None` if the LP was not solved to optimality.
pub fn packing_lp_bound_pct(p: &Prepared, seed: u64) -> Option<f64> {
    let cap = p.cluster.total_gpu_milli();
    let sizes = shared_sizes_within_capacity(p, seed);
    let total: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    let mut counts: Vec<(u16, f64)> = Vec::new();
    for s in sizes {
        match counts.iter_mut().find(|(v, _)| *v == s) {
            Some((_, n)) => *n += 1.0,
            None => counts.push((s, 1.0)),
        }
    }
    let gpus = min_gpus_lp(&counts)?;
    let waste = (gpus * f64::from(MILLI) - total as f64).max(0.0);
    Some(100.0 - waste * 100.0 / cap as f64)
}

/// Unused milli left in the GPUs opened by best-fit-decreasing packing of `sizes`.
pub fn best_fit_decreasing_waste(sizes: &mut [u16]) -> u64 {
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    // open[r] = number of opened GPUs with exactly r milli free.
    let mut open = vec![0u32; usize::from(MILLI) + 1];
    for &s in sizes.iter() {
        let s = usize::from(s.min(MILLI));
        let r = (s..usize::from(MILLI))
            .find(|&r| open[r] > 0)
            .unwrap_or(usize::from(MILLI));
        if r < usize::from(MILLI) {
            open[r] -= 1;
        }
        open[r - s] += 1;
    }
    open.iter()
        .enumerate()
        .take(usize::from(MILLI))
        .map(|(r, &n)| r as u64 * u64::from(n))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfd_pairs_what_fits_and_counts_the_rest() {
        let table: [(&[u16], u64); 5] = [
            (&[], 0),
            (&[500, 500], 0),
            (&[810], 190),
            (&[810, 160], 30),
            // 700+300 fill one GPU; 600+400 another; the lone 810 wastes 190.
            (&[300, 600, 810, 700, 400], 190),
        ];
        for (sizes, want) in table {
            let mut v = sizes.to_vec();
            assert_eq!(best_fit_decreasing_waste(&mut v), want, "{sizes:?}");
        }
    }
}
