//! A ClusterQueue's ordered set of waiting workloads (its `pending` or `parked` keys)
//! that also counts its members per LocalQueue, so the controller's per-LocalQueue
//! pending gauges are read in a walk over the LocalQueues, never over the workloads.
//! Reads go through `Deref` to an order-statistic set (`indexset`'s `BTreeSet`): a key's
//! rank and the key at a rank are lookups, so a place in a long line costs no walk
//! (`line.rs`). Every change goes through the methods here, which keep the counts, and
//! count the changes themselves (`line.rs` bounds how far any place in the queue moved by
//! them).

use super::engine::OrderKey;
use super::model::LqId;
use indexset::BTreeSet;
use std::collections::HashMap;
use std::ops::Deref;

/// Keys per node of the set: an insert or removal moves at most this many keys within
/// its node, and a new node rebuilds the set's rank index (one count per node). The
/// crate's default (1,024) would make an insert into a long line move some 24 KiB on
/// average, and allocate 48 KiB for every empty set.
const NODE_KEYS: usize = 64;

/// Ordered workload keys with a member count per LocalQueue (the key's last element).
#[derive(Clone, Debug)]
pub(crate) struct KeySet {
    set: BTreeSet<OrderKey>,
    per_lq: HashMap<LqId, usize>,
    /// Keys inserted or removed so far (never reset).
    changes: u64,
}

impl Default for KeySet {
    fn default() -> Self {
        KeySet {
            set: BTreeSet::with_maximum_node_size(NODE_KEYS),
            per_lq: HashMap::new(),
            changes: 0,
        }
    }
}

impl Deref for KeySet {
    type Target = BTreeSet<OrderKey>;

    fn deref(&self) -> &BTreeSet<OrderKey> {
        &self.set
    }
}

impl KeySet {
    /// Inserts `key`; `false` when it was there already.
    pub fn insert(&mut self, key: OrderKey) -> bool {
        let lq = key.4;
        let new = self.set.insert(key);
        if new {
            self.changes += 1;
            *self.per_lq.entry(lq).or_insert(0) += 1;
        }
        new
    }

    /// Removes `key`; `false` when it was not there.
    pub fn remove(&mut self, key: &OrderKey) -> bool {
        let gone = self.set.remove(key);
        if gone {
            self.changes += 1;
            if let Some(n) = self.per_lq.get_mut(&key.4) {
                *n -= 1;
                if *n == 0 {
                    self.per_lq.remove(&key.4);
                }
            }
        }
        gone
    }

    /// Moves every key of `other` into this set (into an empty one, the whole set at
    /// once).
    pub fn append(&mut self, other: KeySet) {
        if self.set.is_empty() {
            let changes = self.changes + other.set.len() as u64;
            *self = KeySet { changes, ..other };
            return;
        }
        for key in other.set {
            self.insert(key);
        }
    }

    /// Takes every key out, leaving the set empty (each key counts as a change here, and
    /// the returned set starts counting from nothing).
    pub fn take(&mut self) -> KeySet {
        let changes = self.changes + self.set.len() as u64;
        let mut out = std::mem::take(self);
        out.changes = 0;
        self.changes = changes;
        out
    }

    /// How many keys were inserted or removed so far: a key's place in the set moved by
    /// at most the changes between two looks at it.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The members per LocalQueue (only those with some).
    pub fn per_local_queue(&self) -> impl Iterator<Item = (LqId, usize)> + '_ {
        self.per_lq.iter().map(|(&lq, &n)| (lq, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(id: usize, lq: LqId) -> OrderKey {
        (
            0,
            id as u64,
            Arc::from(format!("ns/w{id}").as_str()),
            id,
            lq,
        )
    }

    fn counts(s: &KeySet) -> Vec<(LqId, usize)> {
        let mut v: Vec<_> = s.per_local_queue().collect();
        v.sort();
        v
    }

    #[test]
    fn counts_follow_inserts_removes_and_moves() {
        let mut a = KeySet::default();
        assert!(a.insert(key(1, 0)));
        assert!(a.insert(key(2, 0)));
        assert!(a.insert(key(3, 7)));
        // Twice the same key counts once; removing a stranger changes nothing.
        assert!(!a.insert(key(1, 0)));
        assert!(!a.remove(&key(9, 0)));
        assert_eq!(counts(&a), vec![(0, 2), (7, 1)]);
        assert!(a.remove(&key(3, 7)));
        assert_eq!(counts(&a), vec![(0, 2)]);
        let mut b = KeySet::default();
        b.insert(key(4, 7));
        b.append(a.take());
        assert!(a.is_empty());
        assert_eq!(counts(&a), vec![]);
        assert_eq!(counts(&b), vec![(0, 2), (7, 1)]);
        assert_eq!(b.len(), 3);
        assert_eq!(b.first().map(|k| k.3), Some(1));
        // Into an empty set, the whole set moves at once: the same keys and counts, and
        // one change per key.
        let mut c = KeySet::default();
        c.append(b.take());
        assert_eq!(counts(&c), vec![(0, 2), (7, 1)]);
        assert_eq!((c.len(), c.changes()), (3, 3));
        assert_eq!(c.iter().map(|k| k.3).collect::<Vec<_>>(), [1, 2, 4]);
    }

    #[test]
    fn changes_count_every_key_in_or_out() {
        let mut a = KeySet::default();
        a.insert(key(1, 0));
        a.insert(key(2, 0));
        // Neither a key there already nor a stranger's removal is a change.
        a.insert(key(1, 0));
        a.remove(&key(9, 0));
        assert_eq!(a.changes(), 2);
        a.remove(&key(1, 0));
        assert_eq!(a.changes(), 3);
        // Taking counts each key taken out; the taken set counts from nothing, and
        // appending it counts each key put in.
        let taken = a.take();
        assert_eq!((a.changes(), taken.changes()), (4, 0));
        let mut b = KeySet::default();
        b.append(taken);
        assert_eq!(b.changes(), 1);
    }
}
