//! GPU-seconds accumulated per label set from allocation intervals: what the node agent's
//! chargeback counters hold, and what a test computes to check a report against. Pure;
//! time is passed in as the seconds an interval lasted.

use super::rule::Mode;
use std::collections::BTreeMap;

/// The labels of one chargeback series: one container's hold on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChargeLabels {
    pub node: String,
    /// The GPU's UUID (a MIG device is charged to its parent GPU's UUID).
    pub gpu: String,
    /// The GPU's model, as the inventory names it (e.g. `H100-80GB`).
    pub model: String,
    pub mode: Mode,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The pod's LocalQueue (`kueue.x-k8s.io/queue-name` or `tessera.io/queue-name`); empty
    /// when it has none.
    pub queue: String,
    /// The value of the pod label the agent is configured to read as the team (default key
    /// `team`); empty when the pod lacks it.
    pub team: String,
}

/// GPU-seconds one series has accumulated.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Account {
    /// Share × seconds held.
    pub allocated_seconds: f64,
    /// Share × busy fraction × seconds held (≤ `allocated_seconds`).
    pub used_seconds: f64,
}

/// What one interval adds: `share` of a GPU (from [`super::rule::Slice::share`]) held for
/// `seconds`, busy `busy` of that time (0–1 of the device's share: NVML utilization for a
/// whole GPU or MIG device, the shim's SM use against its limit for a vGPU slice). Values
/// out of range are clamped; a negative or non-finite interval adds nothing.
pub fn charge_of(share: f64, busy: f64, seconds: f64) -> Account {
    let clamp01 = |v: f64| {
        if v.is_finite() {
            v.clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let seconds = if seconds.is_finite() && seconds > 0.0 {
        seconds
    } else {
        0.0
    };
    let allocated = clamp01(share) * seconds;
    Account {
        allocated_seconds: allocated,
        used_seconds: allocated * clamp01(busy),
    }
}

/// GPU-seconds per series, in label order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    accounts: BTreeMap<ChargeLabels, Account>,
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one interval (see [`charge_of`]) to `labels`' account.
    pub fn charge(&mut self, labels: &ChargeLabels, share: f64, busy: f64, seconds: f64) {
        let add = charge_of(share, busy, seconds);
        // Look up before inserting: the labels are cloned once per series, not per tick.
        let account = match self.accounts.get_mut(labels) {
            Some(account) => account,
            None => self.accounts.entry(labels.clone()).or_default(),
        };
        account.allocated_seconds += add.allocated_seconds;
        account.used_seconds += add.used_seconds;
    }

    /// Drops a series (its counter starts again from 0 if charged later: a counter reset).
    pub fn forget(&mut self, labels: &ChargeLabels) -> Option<Account> {
        self.accounts.remove(labels)
    }

    pub fn get(&self, labels: &ChargeLabels) -> Option<Account> {
        self.accounts.get(labels).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ChargeLabels, &Account)> {
        self.accounts.iter()
    }

    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pod: &str) -> ChargeLabels {
        ChargeLabels {
            node: "n1".into(),
            gpu: "GPU-1".into(),
            model: "H100-80GB".into(),
            mode: Mode::Mig,
            namespace: "ns".into(),
            pod: pod.into(),
            container: "main".into(),
            queue: "q".into(),
            team: "t".into(),
        }
    }

    #[test]
    fn intervals_add_up_per_series_and_used_never_exceeds_allocated() {
        let mut ledger = Ledger::new();
        let a = labels("a");
        ledger.charge(&a, 1.0 / 7.0, 0.5, 700.0);
        ledger.charge(&a, 1.0 / 7.0, 2.0, 70.0); // busy clamped to 1
        ledger.charge(&labels("b"), 0.25, 0.0, 100.0);
        ledger.charge(&labels("b"), 0.25, 0.5, -5.0); // adds nothing
        ledger.charge(&labels("b"), f64::NAN, 0.5, 5.0); // adds nothing
        let got = ledger.get(&a).unwrap();
        assert!((got.allocated_seconds - 110.0).abs() < 1e-9, "{got:?}");
        assert!((got.used_seconds - 60.0).abs() < 1e-9, "{got:?}");
        assert_eq!(
            ledger.get(&labels("b")),
            Some(Account {
                allocated_seconds: 25.0,
                used_seconds: 0.0
            })
        );
        assert_eq!(ledger.len(), 2);
        assert!(ledger.forget(&a).is_some());
        ledger.charge(&a, 1.0, 1.0, 3.0);
        assert_eq!(ledger.get(&a).unwrap().allocated_seconds, 3.0);
    }
}
