//! Usage counters: how many bytes the container has charged per device. [`LocalUsage`] is
//! in-process atomics (no shared file configured); [`shared::SharedUsage`] is the
//! cross-process table in the accounting file. Both charge with one compare-and-swap on the
//! device total so concurrent charges can never pass the limit.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::MAX_DEVICES;

/// A per-device byte counter shared by everything that charges one container.
pub trait Usage: Send + Sync {
    /// Add `bytes` to `dev` unless the total would pass `limit`. True when charged.
    fn try_charge(&self, dev: usize, bytes: u64, limit: u64) -> bool;
    /// Add `bytes` without a limit check (context overhead that already happened).
    fn force_charge(&self, dev: usize, bytes: u64);
    /// Give `bytes` back.
    fn credit(&self, dev: usize, bytes: u64);
    /// Container-wide bytes charged on `dev`.
    fn used(&self, dev: usize) -> u64;
    /// Bytes this process has charged on `dev`.
    fn own(&self, dev: usize) -> u64;
    /// Credit back the memory of dead processes (slow path before refusing). Returns the
    /// number of bytes reclaimed.
    fn reclaim_dead(&self) -> u64 {
        0
    }
}

/// CAS-add `bytes` to `cell` unless the result would pass `limit`.
pub fn cas_charge(cell: &AtomicU64, bytes: u64, limit: u64) -> bool {
    let mut cur = cell.load(Ordering::Relaxed);
    loop {
        let Some(new) = cur.checked_add(bytes) else {
            return false;
        };
        if new > limit {
            return false;
        }
        match cell.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(seen) => cur = seen,
        }
    }
}

/// Subtract without staying wrapped below zero (a corrupt or raced counter must not wrap
/// to 2^64, which would refuse everything forever). One atomic on the common path; a
/// wrap is repaired by clamping back to zero.
pub fn saturating_sub(cell: &AtomicU64, bytes: u64) {
    let prev = cell.fetch_sub(bytes, Ordering::AcqRel);
    if prev < bytes {
        let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
            // Still wrapped (huge): clamp to zero. Someone charged meanwhile: keep theirs.
            Some(if v > u64::MAX / 2 { 0 } else { v })
        });
    }
}

/// In-process counters.
#[derive(Default)]
pub struct LocalUsage {
    used: [AtomicU64; MAX_DEVICES],
}

impl Usage for LocalUsage {
    fn try_charge(&self, dev: usize, bytes: u64, limit: u64) -> bool {
        self.used
            .get(dev)
            .is_some_and(|c| cas_charge(c, bytes, limit))
    }
    fn force_charge(&self, dev: usize, bytes: u64) {
        if let Some(c) = self.used.get(dev) {
            c.fetch_add(bytes, Ordering::AcqRel);
        }
    }
    fn credit(&self, dev: usize, bytes: u64) {
        if let Some(c) = self.used.get(dev) {
            saturating_sub(c, bytes);
        }
    }
    fn used(&self, dev: usize) -> u64 {
        self.used.get(dev).map_or(0, |c| c.load(Ordering::Acquire))
    }
    fn own(&self, dev: usize) -> u64 {
        self.used(dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_charge_respects_limit_table() {
        // (start, bytes, limit, charged, end)
        let cases = [
            (0, 10, 10, true, 10),
            (5, 6, 10, false, 5),
            (u64::MAX - 1, 5, u64::MAX, false, u64::MAX - 1),
            (0, 0, 0, true, 0),
        ];
        for (start, bytes, limit, ok, end) in cases {
            let c = AtomicU64::new(start);
            assert_eq!(cas_charge(&c, bytes, limit), ok, "{start}+{bytes}<={limit}");
            assert_eq!(c.load(Ordering::Relaxed), end);
        }
    }

    #[test]
    fn saturating_credit() {
        let u = LocalUsage::default();
        u.force_charge(0, 5);
        u.credit(0, 7);
        assert_eq!(u.used(0), 0);
        assert!(
            !u.try_charge(MAX_DEVICES, 1, 10),
            "out-of-range device refuses"
        );
    }

    #[test]
    fn concurrent_charges_never_pass_limit() {
        let u = LocalUsage::default();
        let limit = 1000;
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..500 {
                        if u.try_charge(0, 7, limit) {
                            assert!(u.used(0) <= limit);
                            u.credit(0, 7);
                        }
                    }
                });
            }
        });
        assert_eq!(u.used(0), 0);
    }
}
