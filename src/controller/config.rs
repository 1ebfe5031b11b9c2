//! The controller's configuration: the file (`tessera controller --config FILE`), Kueue's
//! manager `Configuration` parsed by the engine's own reader
//! ([`crate::quota::kueue_config`], shared with `tessera plan`), and the reconcile loop's
//! settings ([`Config`]) built from it and the flags. A leaf of the pass modules.

pub use crate::quota::kueue_config::{ConfigError, KueueConfig as ControllerConfig};

use super::time::Millis;
use crate::quota::WaitForPodsReady;
use std::collections::BTreeMap;
use std::time::Duration;

/// Settings of the reconcile loop.
///
/// The `kube::Client` given to the loop should be built with `default_retry = false`
/// (as `tessera controller` does): kube's default retry layer would retry an eviction a
/// PodDisruptionBudget refuses (429) for many minutes inside one pass, while the loop
/// retries it after its own backoff and reports it as the preemptor's pending reason.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace of the Lease.
    pub lease_namespace: String,
    pub lease_name: String,
    /// This instance's name in the Lease (the pod name in a Deployment).
    pub identity: String,
    /// `leaseDurationSeconds`, in milliseconds; renewed every third of it.
    pub lease_duration: Millis,
    /// Longest wait between passes without a watch event.
    pub resync: Duration,
    /// Name written as `reportingController` on Events.
    pub reporting_controller: String,
    /// First retry delay of an eviction refused by a PodDisruptionBudget (429); doubles
    /// per refusal up to `eviction_backoff_max`.
    pub eviction_backoff_base: Millis,
    pub eviction_backoff_max: Millis,
    /// DRA device class name → quota resource (else the class name is the resource).
    pub device_classes: BTreeMap<String, String>,
    /// Kueue's `waitForPodsReady` (off when `None`).
    pub pods_ready: Option<WaitForPodsReady>,
    /// Kueue's `kueue.x-k8s.io/queue-name` also names a queue (`--accept-kueue-labels`;
    /// off: objects carrying only Kueue's label are Kueue's and never read).
    pub accept_kueue_labels: bool,
}

impl Config {
    /// The labels naming a queue that this controller honours.
    pub fn queue_labels(&self) -> &'static [&'static str] {
        super::webhook::Options {
            accept_kueue_labels: self.accept_kueue_labels,
        }
        .queue_labels()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease_namespace: "tessera-system".into(),
            lease_name: "tessera-controller".into(),
            identity: "tessera-controller".into(),
            lease_duration: 15_000,
            resync: Duration::from_secs(30),
            reporting_controller: "tessera.io/controller".into(),
            eviction_backoff_base: 5_000,
            eviction_backoff_max: 300_000,
            device_classes: BTreeMap::new(),
            pods_ready: None,
            accept_kueue_labels: false,
        }
    }
}
