//! The [`Ledger`]'s side of [`super::reservoirs`]: stream-ordered pool allocations and
//! graph launches charged for what the driver's pools hold, and resynchronised with the
//! driver's own `RESERVED_MEM_CURRENT` when it may have released memory.

use super::reservoirs::{Key, Ticket};
use super::{Ledger, Refusal};
use crate::config::MAX_DEVICES;

impl Ledger {
    /// Take `bytes` (already rounded) from reservoir `key` on `dev`, charging the part it
    /// cannot serve from what it holds. `Ok(None)`: `dev` has no limit.
    pub fn reservoir_take(
        &self,
        key: Key,
        dev: usize,
        bytes: u64,
    ) -> Result<Option<Ticket>, Refusal> {
        if dev >= MAX_DEVICES {
            return Err(Refusal::BadDevice(dev));
        }
        let Some(limit) = self.limit(dev) else {
            return Ok(None);
        };
        self.reservoirs.mark_used();
        for attempt in 0..2 {
            {
                let mut b = self.reservoirs.lock();
                let t = b.plan(key, dev, bytes);
                if t.extra == 0 || self.usage.try_charge(dev, t.extra, limit) {
                    b.take(&t);
                    return Ok(Some(t));
                }
            }
            if attempt == 0 && !self.reclaim() {
                break;
            }
        }
        Err(Refusal::OverLimit {
            dev,
            want: bytes,
            used: self.usage.used(dev),
            limit,
        })
    }

    /// After the driver call: keep the charge (and remember `ptr`'s pool) or roll back.
    pub fn reservoir_settle(&self, t: Option<Ticket>, ptr: Option<u64>, ok: bool) {
        let Some(t) = t else {
            return;
        };
        let mut b = self.reservoirs.lock();
        match (ok, ptr) {
            (true, Some(p)) if matches!(t.key, Key::Pool(_)) => {
                b.ptrs.insert(p, (t.key, t.bytes));
                self.reservoirs.note_ptrs(&b);
            }
            (true, _) => {}
            (false, _) => {
                let back = b.untake(&t);
                drop(b);
                self.usage.credit(t.dev, back);
            }
        }
    }

    /// A stream-ordered pointer was freed: it goes back to its pool, which keeps it
    /// charged (the driver still holds it) unless the pool was destroyed. Returns whether
    /// `ptr` came from a pool.
    pub fn reservoir_free(&self, ptr: u64) -> bool {
        if !self.reservoirs.tracks_ptrs() {
            return false;
        }
        let freed = {
            let mut b = self.reservoirs.lock();
            let f = b.free(ptr);
            self.reservoirs.note_ptrs(&b);
            f
        };
        if let Some((dev, credit, pending)) = freed {
            if credit > 0 {
                self.usage.credit(dev, credit);
            }
            if pending {
                self.reservoirs.set_release_pending(true);
            }
            return true;
        }
        false
    }

    /// Whether a synchronisation may have released pool memory (cheap check).
    pub fn release_pending(&self) -> bool {
        self.reservoirs.release_pending()
    }

    /// Ask the driver what reservoirs hold — all of them, or only those that may have
    /// released memory — and move the charges to match. Returns the bytes credited.
    pub fn resync_reservoirs(&self, only_releasable: bool) -> u64 {
        if !self.reservoirs.any() {
            return 0;
        }
        let Some(query) = self.reserved_query.get() else {
            return 0;
        };
        let mut b = self.reservoirs.lock();
        let keys = if only_releasable {
            b.releasable()
        } else {
            b.keys()
        };
        let mut credited = 0;
        for k in keys {
            let Some(reported) = query(k) else {
                continue;
            };
            if let Some((dev, credit, charge)) = b.resync(k, reported) {
                if credit > 0 {
                    self.usage.credit(dev, credit);
                    credited += credit;
                }
                if charge > 0 {
                    self.usage.force_charge(dev, charge);
                }
            }
        }
        self.reservoirs.set_release_pending(b.any_releasable());
        credited
    }

    /// Resynchronise one reservoir (after a trim or a graph launch).
    pub fn resync_reservoir(&self, key: Key) {
        if !self.reservoirs.any() {
            return;
        }
        let Some(reported) = self.reserved_query.get().and_then(|q| q(key)) else {
            return;
        };
        let moved = self.reservoirs.lock().resync(key, reported);
        if let Some((dev, credit, charge)) = moved {
            self.usage.credit(dev, credit);
            if charge > 0 {
                self.usage.force_charge(dev, charge);
            }
        }
    }

    /// The application set pool `h`'s release threshold.
    pub fn pool_threshold(&self, h: u64, threshold: u64) {
        self.reservoirs.mark_used();
        self.reservoirs.lock().set_threshold(h, threshold);
    }

    /// Pool `h` was created on `dev` (`None`: in host memory, which is not counted).
    pub fn pool_created(&self, h: u64, dev: Option<usize>) {
        self.reservoirs.mark_used();
        self.reservoirs.lock().locations.insert(h, dev);
    }

    /// Where pool `h` lives, if it was created through the shim (`Some(None)`: host).
    pub fn pool_location(&self, h: u64) -> Option<Option<usize>> {
        if !self.reservoirs.any() {
            return None;
        }
        self.reservoirs.lock().locations.get(&h).copied()
    }

    /// Pool `h` was destroyed: what it retains is credited now.
    pub fn pool_destroyed(&self, h: u64) {
        if !self.reservoirs.any() {
            return;
        }
        let back = {
            let mut b = self.reservoirs.lock();
            b.locations.remove(&h);
            b.destroy(Key::Pool(h))
        };
        if let Some((dev, bytes)) = back {
            self.usage.credit(dev, bytes);
        }
    }

    /// An executable graph was instantiated whose allocation nodes need `needs` (device,
    /// bytes) per launch. Refused when one device's need alone is past its limit.
    pub fn graph_instantiated(&self, exec: u64, needs: &[(usize, u64)]) -> Result<(), Refusal> {
        let mut kept = Vec::new();
        for &(dev, bytes) in needs {
            let Some(limit) = self.limit(dev) else {
                continue;
            };
            if bytes > limit {
                return Err(Refusal::OverLimit {
                    dev,
                    want: bytes,
                    used: self.usage.used(dev),
                    limit,
                });
            }
            if bytes > 0 {
                kept.push((dev, bytes));
            }
        }
        if !kept.is_empty() {
            self.reservoirs.mark_used();
            self.reservoirs.lock().execs.insert(exec, kept);
        }
        Ok(())
    }

    pub fn graph_exec_destroyed(&self, exec: u64) {
        if self.reservoirs.any() {
            self.reservoirs.lock().execs.remove(&exec);
        }
    }

    /// Before launching `exec`: grow each device's graph pool charge to what the graph's
    /// allocations need. On refusal nothing stays charged.
    pub fn graph_launch_begin(&self, exec: u64) -> Result<Vec<Ticket>, Refusal> {
        if !self.reservoirs.any() {
            return Ok(Vec::new());
        }
        let needs = match self.reservoirs.lock().execs.get(&exec) {
            Some(n) => n.clone(),
            None => return Ok(Vec::new()),
        };
        let mut tickets = Vec::with_capacity(needs.len());
        for (dev, bytes) in needs {
            match self.reservoir_take(Key::Graph(dev), dev, bytes) {
                Ok(t) => tickets.extend(t),
                Err(r) => {
                    self.graph_launch_end(tickets, false);
                    return Err(r);
                }
            }
        }
        Ok(tickets)
    }

    /// After the launch: the graph pool keeps what it grew (until trimmed); the charge is
    /// then matched to what the driver reports it reserved.
    pub fn graph_launch_end(&self, tickets: Vec<Ticket>, ok: bool) {
        for t in tickets {
            if ok {
                if let Some(r) = self.reservoirs.lock().res.get_mut(&t.key) {
                    r.in_use = r.in_use.saturating_sub(t.bytes);
                }
                self.resync_reservoir(t.key);
            } else {
                self.reservoir_settle(Some(t), None, false);
            }
        }
    }

    /// Bytes charged for `dev`'s graph memory pool (tests, diagnostics).
    pub fn graph_pool_charged(&self, dev: usize) -> u64 {
        self.reservoirs
            .lock()
            .res
            .get(&Key::Graph(dev))
            .map_or(0, |r| r.charged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::usage::LocalUsage;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;

    fn ledger(limit_mib: u64, driver: Arc<AtomicU64>) -> Ledger {
        let mut limits = [None; MAX_DEVICES];
        limits[0] = Some(limit_mib * MIB);
        let l = Ledger::new(limits, Box::<LocalUsage>::default());
        l.set_reserved_query(Box::new(move |_| Some(driver.load(Ordering::Relaxed))));
        l
    }

    #[test]
    fn pool_memory_stays_charged_until_the_driver_releases_it() {
        let driver = Arc::new(AtomicU64::new(0));
        let l = ledger(100, Arc::clone(&driver));
        let p = Key::Pool(9);
        let t = l.reservoir_take(p, 0, 60 * MIB).unwrap();
        l.reservoir_settle(t, Some(0x1000), true);
        driver.store(60 * MIB, Ordering::Relaxed);
        l.reservoir_free(0x1000);
        assert_eq!(l.used(0), 60 * MIB, "freed into the pool: still held");
        assert!(l.release_pending());
        // A plain allocation that only fits once the pool lets go: the refusal path asks
        // the driver, which has released (a sync happened).
        assert!(l.reserve(0, 50 * MIB).is_err(), "driver still holds it");
        driver.store(0, Ordering::Relaxed);
        assert!(l.reserve(0, 50 * MIB).is_ok());
        assert_eq!(l.used(0), 50 * MIB);
        assert!(!l.release_pending());
    }

    #[test]
    fn pool_take_refused_past_the_limit_and_rolled_back_on_driver_failure() {
        let driver = Arc::new(AtomicU64::new(0));
        let l = ledger(100, driver);
        let p = Key::Pool(1);
        assert!(l.reservoir_take(p, 0, 120 * MIB).is_err());
        let t = l.reservoir_take(p, 0, 40 * MIB).unwrap();
        l.reservoir_settle(t, None, false);
        assert_eq!(l.used(0), 0);
        assert_eq!(
            l.reservoir_take(Key::Pool(1), 1, 1 << 40),
            Ok(None),
            "no limit on 1"
        );
    }

    #[test]
    fn graph_launch_grows_the_pool_once_and_trim_credits() {
        let driver = Arc::new(AtomicU64::new(0));
        let l = ledger(100, Arc::clone(&driver));
        assert!(l.graph_instantiated(1, &[(0, 120 * MIB)]).is_err());
        l.graph_instantiated(2, &[(0, 40 * MIB), (1, 5 * MIB)])
            .unwrap();
        let t = l.graph_launch_begin(2).unwrap();
        driver.store(40 * MIB, Ordering::Relaxed);
        l.graph_launch_end(t, true);
        assert_eq!(l.used(0), 40 * MIB);
        let t = l.graph_launch_begin(2).unwrap();
        assert_eq!(t[0].extra, 0, "second launch reuses the pool");
        l.graph_launch_end(t, true);
        assert_eq!(l.graph_pool_charged(0), 40 * MIB);
        assert!(l.reserve(0, 70 * MIB).is_err(), "pool memory counts");
        driver.store(0, Ordering::Relaxed);
        l.resync_reservoir(Key::Graph(0));
        assert_eq!(l.used(0), 0, "trimmed");
        l.graph_exec_destroyed(2);
        assert!(l.graph_launch_begin(2).unwrap().is_empty());
        assert!(l.graph_launch_begin(77).unwrap().is_empty());
    }
}
