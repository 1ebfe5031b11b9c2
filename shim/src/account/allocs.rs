//! Allocation table: which handle (device pointer, array, VMM handle) was charged how many
//! bytes on which device, so frees can be credited. Sharded so concurrent threads rarely
//! contend on one lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 64;

/// One charged allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub dev: usize,
    pub bytes: u64,
}

/// Multiplicative hasher for integer keys (handles are already well spread).
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Shard = Mutex<HashMap<u64, Charge, BuildHasherDefault<IntHasher>>>;

/// Handle → charge map.
pub struct AllocTable {
    shards: Vec<Shard>,
}

impl Default for AllocTable {
    fn default() -> Self {
        AllocTable {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
        }
    }
}

impl AllocTable {
    fn shard(&self, key: u64) -> &Shard {
        let h = (key ^ (key >> 21) ^ (key >> 9)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.shards[h as usize % SHARDS]
    }

    /// Record `key`; returns a previous charge under the same key (the driver reused a
    /// handle we never saw freed), which the caller must credit.
    pub fn insert(&self, key: u64, charge: Charge) -> Option<Charge> {
        match self.shard(key).lock() {
            Ok(mut m) => m.insert(key, charge),
            Err(poisoned) => poisoned.into_inner().insert(key, charge),
        }
    }

    /// Remove `key`, returning what it was charged.
    pub fn remove(&self, key: u64) -> Option<Charge> {
        match self.shard(key).lock() {
            Ok(mut m) => m.remove(&key),
            Err(poisoned) => poisoned.into_inner().remove(&key),
        }
    }

    /// Number of live entries (tests and diagnostics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| match s.lock() {
                Ok(m) => m.len(),
                Err(p) => p.into_inner().len(),
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_roundtrip_and_reuse() {
        let t = AllocTable::default();
        assert!(t.is_empty());
        let c = Charge {
            dev: 1,
            bytes: 2 << 20,
        };
        assert_eq!(t.insert(0x7f00_0000_0000, c), None);
        assert_eq!(t.insert(0x7f00_0000_0000, c), Some(c));
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(0x7f00_0000_0000), Some(c));
        assert_eq!(t.remove(0x7f00_0000_0000), None);
    }

    #[test]
    fn many_threads() {
        let t = AllocTable::default();
        std::thread::scope(|s| {
            for th in 0..8u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..1000u64 {
                        let k = (th << 40) | (i << 21);
                        t.insert(k, Charge { dev: 0, bytes: 1 });
                    }
                });
            }
        });
        assert_eq!(t.len(), 8000);
    }
}
