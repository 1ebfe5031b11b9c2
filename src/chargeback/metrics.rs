//! The metric contract: the two counters the node agent exports so GPU-seconds can be
//! read back from Prometheus, their labels, and a text encoder for the same series with
//! timestamps (backfills, tests).
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `tessera_chargeback_gpu_allocated_seconds_total` | [`ChargeLabels`] | share × seconds a container held a device |
//! | `tessera_chargeback_gpu_used_seconds_total` | [`ChargeLabels`] | share × busy fraction × seconds |
//!
//! Labels: `node, gpu, model, mode, namespace, pod, container, queue, team`. The agent
//! calls [`ChargebackMetrics::charge`] once per held device per accounting tick, and
//! [`ChargebackMetrics::forget`] for a container gone (after at least two scrape intervals,
//! so its last increments are scraped). A counter that starts again from 0 (an agent
//! restart, a forgotten series charged again) is a reset, which the report handles.

use super::ledger::{charge_of, ChargeLabels};
use super::rule::Mode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::fmt::Write;
use std::sync::atomic::AtomicU64;

/// The allocated counter's full name, as Prometheus stores it.
pub const ALLOCATED: &str = "tessera_chargeback_gpu_allocated_seconds_total";
/// The used counter's full name.
pub const USED: &str = "tessera_chargeback_gpu_used_seconds_total";
/// The label names, in the order they are written.
pub const LABELS: [&str; 9] = [
    "node",
    "gpu",
    "model",
    "mode",
    "namespace",
    "pod",
    "container",
    "queue",
    "team",
];

const ALLOCATED_HELP: &str =
    "GPU-seconds allocated: the charged share of a GPU times the seconds a container held it";
const USED_HELP: &str =
    "GPU-seconds used: allocated GPU-seconds times the fraction the device was busy";

impl EncodeLabelValue for Mode {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl EncodeLabelSet for ChargeLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelSet::encode(&pairs(self), encoder)
    }
}

/// `(name, value)` for every label, in [`LABELS`] order.
pub fn pairs(labels: &ChargeLabels) -> [(&'static str, &str); 9] {
    let values = [
        labels.node.as_str(),
        labels.gpu.as_str(),
        labels.model.as_str(),
        labels.mode.as_str(),
        labels.namespace.as_str(),
        labels.pod.as_str(),
        labels.container.as_str(),
        labels.queue.as_str(),
        labels.team.as_str(),
    ];
    let mut out = [("", ""); 9];
    for (slot, (name, value)) in out.iter_mut().zip(LABELS.iter().zip(values)) {
        *slot = (name, value);
    }
    out
}

type Seconds = Counter<f64, AtomicU64>;

/// The two chargeback counter families, registered on the agent's `tessera` registry.
#[derive(Debug, Clone, Default)]
pub struct ChargebackMetrics {
    pub allocated: Family<ChargeLabels, Seconds>,
    pub used: Family<ChargeLabels, Seconds>,
}

impl ChargebackMetrics {
    /// Registers both families on `registry`, which must have the `tessera` prefix
    /// (`Registry::with_prefix("tessera")`, as `NodeMetrics` builds it).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "chargeback_gpu_allocated_seconds",
            ALLOCATED_HELP,
            metrics.allocated.clone(),
        );
        registry.register(
            "chargeback_gpu_used_seconds",
            USED_HELP,
            metrics.used.clone(),
        );
        metrics
    }

    /// Adds one interval: `share` of a GPU ([`super::rule::Slice::share`]) held for
    /// `seconds`, busy `busy` (0–1) of it; the same arithmetic as [`super::Ledger::charge`].
    /// `busy` `None` (not measured: a MIG device without GPM) charges the allocated
    /// GPU-seconds only: the used counter is not created or moved, so a report shows
    /// `n/a` for it rather than a made-up 0.
    pub fn charge(&self, labels: &ChargeLabels, share: f64, busy: Option<f64>, seconds: f64) {
        let add = charge_of(share, busy.unwrap_or(0.0), seconds);
        self.allocated
            .get_or_create(labels)
            .inc_by(add.allocated_seconds);
        if busy.is_some() {
            self.used.get_or_create(labels).inc_by(add.used_seconds);
        }
    }

    /// Stops exporting a container's series.
    pub fn forget(&self, labels: &ChargeLabels) {
        self.allocated.remove(labels);
        self.used.remove(labels);
    }
}

/// `# HELP` and `# TYPE` lines for the family whose sample name is `name` ([`ALLOCATED`]
/// or [`USED`]), in OpenMetrics text.
pub fn write_family_header(out: &mut String, name: &str) {
    let family = name.trim_end_matches("_total");
    let help = if name == USED {
        USED_HELP
    } else {
        ALLOCATED_HELP
    };
    let _ = writeln!(out, "# HELP {family} {help}.");
    let _ = writeln!(out, "# TYPE {family} counter");
}

/// One sample line `name{labels} value [timestamp]` in OpenMetrics text; the samples of
/// one family must follow its header together, each series' timestamps increasing, and
/// the text end with `# EOF` (what `promtool tsdb create-blocks-from openmetrics` reads).
pub fn write_sample(
    out: &mut String,
    name: &str,
    labels: &ChargeLabels,
    value: f64,
    timestamp: Option<i64>,
) {
    out.push_str(name);
    out.push('{');
    for (i, (key, value)) in pairs(labels).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push_str("} ");
    let _ = write!(out, "{value:?}");
    if let Some(ts) = timestamp {
        let _ = write!(out, " {ts}");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn labels() -> ChargeLabels {
        ChargeLabels {
            node: "n1".into(),
            gpu: "GPU-1".into(),
            model: "A100-80GB".into(),
            mode: Mode::Vgpu,
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: "main".into(),
            queue: "research".into(),
            team: "vision \"core\"".into(),
        }
    }

    #[test]
    fn the_agent_families_and_the_text_helper_write_the_same_series() {
        let mut registry = Registry::with_prefix("tessera");
        let metrics = ChargebackMetrics::register(&mut registry);
        metrics.charge(&labels(), 0.5, Some(0.25), 60.0);
        let mut page = String::new();
        encode(&mut page, &registry).unwrap();
        let mut helper = String::new();
        write_family_header(&mut helper, ALLOCATED);
        write_sample(&mut helper, ALLOCATED, &labels(), 30.0, None);
        write_family_header(&mut helper, USED);
        write_sample(&mut helper, USED, &labels(), 7.5, None);
        helper.push_str("# EOF\n");
        assert_eq!(page, helper);
        metrics.forget(&labels());
        let mut page = String::new();
        encode(&mut page, &registry).unwrap();
        assert!(!page.contains("train-0"), "{page}");
    }
}
