//! Memory accounting: the [`Ledger`] decides whether an allocation fits the device's
//! slice, remembers what each handle was charged and credits frees. Pure Rust over a
//! [`usage::Usage`] counter (in-process or the shared file); the FFI layer only feeds it
//! sizes, handles and device ordinals.

pub mod allocs;
pub mod graph_walk;
pub mod reservoirs;
pub mod retained;
pub mod shared;
pub mod sizes;
pub mod usage;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::config::MAX_DEVICES;
use allocs::{AllocTable, Charge};
use reservoirs::{Key, Reservoirs};
use usage::Usage;

/// Asks the driver how many bytes a reservoir holds (`RESERVED_MEM_CURRENT`).
pub type ReservedQuery = Box<dyn Fn(Key) -> Option<u64> + Send + Sync>;

/// Granularity used until the driver tells us (the CUDA minimum for device memory).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;
/// A measured context overhead above this is noise from another process, not ours.
pub const MAX_CONTEXT_OVERHEAD: u64 = 2 << 30;

/// Why an allocation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("device {dev}: {want} bytes would raise usage {used} past the limit {limit}")]
    OverLimit {
        dev: usize,
        want: u64,
        used: u64,
        limit: u64,
    },
    #[error("device ordinal {0} is beyond the devices the shim tracks")]
    BadDevice(usize),
}

/// Which handle namespace a charge lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device pointers (`cuMemAlloc*`, managed, pitch, stream-ordered).
    Ptr,
    /// `CUarray` / `CUmipmappedArray` handles.
    Array,
    /// `CUmemGenericAllocationHandle` (VMM physical memory).
    Vmm,
}

/// Per-process accounting over a container-wide [`Usage`].
pub struct Ledger {
    limits: [Option<u64>; MAX_DEVICES],
    /// Some device has a limit (otherwise nothing is ever charged or looked up).
    any_limit: bool,
    usage: Box<dyn Usage>,
    ptrs: AllocTable,
    arrays: AllocTable,
    vmm: AllocTable,
    ctx_handles: AllocTable,
    granularity: [AtomicU64; MAX_DEVICES],
    contexts: [AtomicU32; MAX_DEVICES],
    ctx_charge: [AtomicU64; MAX_DEVICES],
    reservoirs: Reservoirs,
    reserved_query: OnceLock<ReservedQuery>,
}

impl Ledger {
    pub fn new(limits: [Option<u64>; MAX_DEVICES], usage: Box<dyn Usage>) -> Ledger {
        Ledger {
            any_limit: limits.iter().any(Option::is_some),
            limits,
            usage,
            ptrs: AllocTable::default(),
            arrays: AllocTable::with_capacity(1 << 12),
            vmm: AllocTable::with_capacity(1 << 14),
            ctx_handles: AllocTable::with_capacity(64),
            granularity: std::array::from_fn(|_| AtomicU64::new(0)),
            contexts: std::array::from_fn(|_| AtomicU32::new(0)),
            ctx_charge: std::array::from_fn(|_| AtomicU64::new(0)),
            reservoirs: Reservoirs::default(),
            reserved_query: OnceLock::new(),
        }
    }

    /// How to ask the driver what a pool holds (set once by the FFI layer).
    pub fn set_reserved_query(&self, q: ReservedQuery) {
        let _ = self.reserved_query.set(q);
    }

    fn table(&self, kind: Kind) -> &AllocTable {
        match kind {
            Kind::Ptr => &self.ptrs,
            Kind::Array => &self.arrays,
            Kind::Vmm => &self.vmm,
        }
    }

    /// Does any device have a memory limit?
    pub fn any_limit(&self) -> bool {
        self.any_limit
    }

    /// The memory limit of `dev`, if any.
    pub fn limit(&self, dev: usize) -> Option<u64> {
        self.limits.get(dev).copied().flatten()
    }

    /// Whether `dev`'s granularity still needs to be asked of the driver.
    pub fn needs_granularity(&self, dev: usize) -> bool {
        self.limit(dev).is_some()
            && self
                .granularity
                .get(dev)
                .is_some_and(|g| g.load(Ordering::Relaxed) == 0)
    }

    /// Record the driver's allocation granularity for `dev` (0 or absurd values ignored).
    pub fn set_granularity(&self, dev: usize, g: u64) {
        if let Some(cell) = self.granularity.get(dev) {
            let g = if g.is_power_of_two() && g <= (1 << 30) {
                g
            } else {
                DEFAULT_GRANULARITY
            };
            cell.store(g, Ordering::Relaxed);
        }
    }

    /// `bytes` rounded up to `dev`'s granularity.
    pub fn round(&self, dev: usize, bytes: u64) -> u64 {
        let g = self
            .granularity
            .get(dev)
            .map(|g| g.load(Ordering::Relaxed))
            .filter(|g| *g != 0)
            .unwrap_or(DEFAULT_GRANULARITY);
        // Granularities are powers of two (set_granularity enforces it): mask, not divide.
        bytes.checked_add(g - 1).map_or(!(g - 1), |b| b & !(g - 1))
    }

    /// Charge an allocation of `bytes` on `dev` before it is made. `Ok(None)`: the device
    /// has no limit, nothing to remember.
    pub fn reserve(&self, dev: usize, bytes: u64) -> Result<Option<Charge>, Refusal> {
        self.reserve_exact(dev, self.round(dev, bytes))
    }

    /// Like [`Ledger::reserve`] for a size that is already what the driver uses.
    pub fn reserve_exact(&self, dev: usize, bytes: u64) -> Result<Option<Charge>, Refusal> {
        if dev >= MAX_DEVICES {
            return Err(Refusal::BadDevice(dev));
        }
        let Some(limit) = self.limit(dev) else {
            return Ok(None);
        };
        if self.usage.try_charge(dev, bytes, limit)
            || (self.reclaim() && self.usage.try_charge(dev, bytes, limit))
        {
            return Ok(Some(Charge { dev, bytes }));
        }
        Err(Refusal::OverLimit {
            dev,
            want: bytes,
            used: self.usage.used(dev),
            limit,
        })
    }

    /// Slow path before a refusal: credit dead processes and memory the driver's pools
    /// released. True when anything came back.
    fn reclaim(&self) -> bool {
        let dead = self.usage.reclaim_dead();
        let released = self.resync_reservoirs(false);
        dead > 0 || released > 0
    }

    /// The allocation failed in the driver: give the reservation back.
    pub fn cancel(&self, charge: Option<Charge>) {
        if let Some(c) = charge {
            self.usage.credit(c.dev, c.bytes);
        }
    }

    /// The allocation succeeded: remember `handle` so its free is credited.
    pub fn commit(&self, kind: Kind, handle: u64, charge: Option<Charge>) {
        if let Some(c) = charge {
            self.table(kind).insert(handle, c);
        }
    }

    /// `handle` was freed: credit what it was charged.
    /// Returns whether `handle` was charged.
    pub fn release(&self, kind: Kind, handle: u64) -> bool {
        if !self.any_limit {
            return false;
        }
        match self.table(kind).remove(handle) {
            Some(c) => {
                self.usage.credit(c.dev, c.bytes);
                true
            }
            None => false,
        }
    }

    /// Is `handle` charged (tests, diagnostics)?
    pub fn charged(&self, kind: Kind, handle: u64) -> Option<Charge> {
        let t = self.table(kind);
        let c = t.remove(handle)?;
        t.insert(handle, c);
        Some(c)
    }

    /// A context was created on `dev` (`handle`: a created context; `None`: a primary
    /// context retain). The first context of the process charges `overhead`.
    pub fn context_opened(&self, dev: usize, handle: Option<u64>, overhead: u64) {
        if dev >= MAX_DEVICES || self.limit(dev).is_none() {
            return;
        }
        if let Some(h) = handle {
            self.ctx_handles.insert(h, Charge { dev, bytes: 0 });
        }
        if self.contexts[dev].fetch_add(1, Ordering::AcqRel) == 0 && overhead > 0 {
            self.ctx_charge[dev].store(overhead, Ordering::Release);
            self.usage.force_charge(dev, overhead);
        }
    }

    /// Is this the first context on `dev` (so its overhead should be measured)?
    pub fn first_context(&self, dev: usize) -> bool {
        self.contexts
            .get(dev)
            .is_some_and(|c| c.load(Ordering::Acquire) == 0)
    }

    /// A created context was destroyed.
    pub fn context_destroyed(&self, handle: u64) {
        if let Some(c) = self.ctx_handles.remove(handle) {
            self.context_closed(c.dev, None);
        }
    }

    /// A context on `dev` went away; the last one credits the overhead.
    pub fn context_closed(&self, dev: usize, _handle: Option<u64>) {
        if dev >= MAX_DEVICES || self.limit(dev).is_none() {
            return;
        }
        let prev = self.contexts[dev]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1));
        if prev == Ok(1) {
            let c = self.ctx_charge[dev].swap(0, Ordering::AcqRel);
            self.usage.credit(dev, c);
        }
    }

    /// Container-wide bytes charged on `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        self.usage.used(dev)
    }

    /// This process's bytes charged on `dev`.
    pub fn own(&self, dev: usize) -> u64 {
        self.usage.own(dev)
    }

    /// The slice view `(free, total)` given the driver's `(free, total)`. Memory of dead
    /// processes is credited first, so the view never shows what a killed process held.
    pub fn mem_info(&self, dev: usize, real_free: u64, real_total: u64) -> (u64, u64) {
        match self.limit(dev) {
            None => (real_free, real_total),
            Some(limit) => {
                self.usage.reclaim_dead();
                self.resync_reservoirs(true);
                let total = limit.min(real_total);
                let free = total.saturating_sub(self.used(dev)).min(real_free);
                (free, total)
            }
        }
    }

    /// The slice view `(used, total)` for NVML given the driver's total.
    pub fn nvml_info(&self, dev: usize, real_total: u64) -> Option<(u64, u64)> {
        let limit = self.limit(dev)?;
        self.usage.reclaim_dead();
        self.resync_reservoirs(true);
        let total = limit.min(real_total);
        Some((self.used(dev).min(total), total))
    }
}

#[cfg(test)]
mod tests {
    use super::usage::LocalUsage;
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ledger(limit_mib: u64) -> Ledger {
        let mut limits = [None; MAX_DEVICES];
        limits[0] = Some(limit_mib * MIB);
        Ledger::new(limits, Box::<LocalUsage>::default())
    }

    #[test]
    fn rounds_to_granularity() {
        let l = ledger(100);
        // (granularity, request, charged)
        let cases = [
            (0, 1, 2 * MIB),
            (0, 2 * MIB, 2 * MIB),
            (0, 2 * MIB + 1, 4 * MIB),
            (MIB, 1, MIB),
            (3, 1, 2 * MIB),
        ];
        for (g, req, want) in cases {
            if g != 0 {
                l.set_granularity(0, g);
            }
            assert_eq!(l.round(0, req), want, "g={g} req={req}");
        }
    }

    #[test]
    fn reserve_commit_release_cycle() {
        let l = ledger(10);
        let a = l.reserve(0, 3 * MIB).unwrap();
        assert_eq!(
            a,
            Some(Charge {
                dev: 0,
                bytes: 4 * MIB
            })
        );
        l.commit(Kind::Ptr, 0x1000, a);
        let b = l.reserve(0, 6 * MIB).unwrap();
        l.commit(Kind::Ptr, 0x2000, b);
        assert_eq!(l.used(0), 10 * MIB);
        let err = l.reserve(0, 1).unwrap_err();
        assert!(matches!(err, Refusal::OverLimit { dev: 0, used, .. } if used == 10 * MIB));
        l.release(Kind::Ptr, 0x1000);
        l.release(Kind::Ptr, 0x1000);
        assert_eq!(l.used(0), 6 * MIB, "double free credits once");
        l.release(Kind::Array, 0x2000);
        assert_eq!(l.used(0), 6 * MIB, "kinds are separate namespaces");
        let c = l.reserve(0, MIB).unwrap();
        l.cancel(c);
        assert_eq!(l.used(0), 6 * MIB);
    }

    #[test]
    fn unlimited_devices_are_not_counted() {
        let l = ledger(10);
        assert_eq!(l.reserve(1, 1 << 40), Ok(None));
        assert_eq!(
            l.reserve(MAX_DEVICES, 1),
            Err(Refusal::BadDevice(MAX_DEVICES))
        );
        assert_eq!(l.mem_info(1, 5, 80), (5, 80));
        assert_eq!(l.nvml_info(1, 80), None);
        assert!(l.any_limit());
        let none = Ledger::new([None; MAX_DEVICES], Box::<LocalUsage>::default());
        assert!(
            !none.any_limit(),
            "no limit anywhere: hooks skip all bookkeeping"
        );
    }

    #[test]
    fn slice_view() {
        let l = ledger(10);
        l.commit(Kind::Vmm, 7, l.reserve(0, 4 * MIB).unwrap());
        assert_eq!(
            l.mem_info(0, 70 * 1024 * MIB, 80 * 1024 * MIB),
            (6 * MIB, 10 * MIB)
        );
        assert_eq!(
            l.mem_info(0, MIB, 80 * 1024 * MIB),
            (MIB, 10 * MIB),
            "real free caps"
        );
        assert_eq!(l.nvml_info(0, 80 * 1024 * MIB), Some((4 * MIB, 10 * MIB)));
    }

    #[test]
    fn context_overhead_charged_once_and_credited_by_last_close() {
        let l = ledger(100);
        assert!(l.first_context(0));
        l.context_opened(0, None, 30 * MIB);
        l.context_opened(0, Some(0xc0), 30 * MIB);
        assert!(!l.first_context(0));
        assert_eq!(l.used(0), 30 * MIB);
        l.context_destroyed(0xc0);
        l.context_destroyed(0xc0);
        assert_eq!(l.used(0), 30 * MIB);
        l.context_closed(0, None);
        l.context_closed(0, None);
        assert_eq!(l.used(0), 0);
    }
}
