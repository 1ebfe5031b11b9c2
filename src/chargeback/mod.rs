//! Chargeback: GPU-seconds per namespace, queue or team, allocated and used, split by
//! GPU model and sharing mode (docs/chargeback.md).
//!
//! ```text
//! rule     Slice → share of a GPU (pure, the documented rule)
//! ledger   ChargeLabels + (share, busy, seconds) → GPU-seconds per series (pure)
//! metrics  the counters the node agent exports (prometheus-client) + their text form
//! report   window, grouping, PromQL, rows, table/csv/json (pure)
//! read     runs the report's queries against Prometheus (src/prometheus.rs)
//! ```

pub mod ledger;
pub mod metrics;
pub mod read;
pub mod report;
pub mod rule;

pub use ledger::{charge_of, Account, ChargeLabels, Ledger};
pub use metrics::{ChargebackMetrics, ALLOCATED, USED};
pub use rule::{Mode, RuleError, Slice};
