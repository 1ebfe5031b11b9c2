//! Quota admission with Kueue semantics (issue 4): the pure decision engine behind
//! `tessera plan` and, later, the controller.
//!
//! - [`api`]: ResourceFlavor, ClusterQueue, LocalQueue, WorkloadPriorityClass, Workload
//!   with Kueue's field names (plain serde types, no Kubernetes client).
//! - [`Engine`]: queues, cohorts and the scheduling cycle. Time is always an argument.
//! - [`scenario`]: the `tessera plan` file format and its driver.
//! - [`claims`]: what a DRA claim spec costs a queue (plan and controller alike).
//!
//! Module map: `accounting` (fit rule, usage), `assign` (flavors and fungibility),
//! `preempt` (victims, checkpoint-aware), `decide` (one attempt), `lifecycle` (admit,
//! evict, requeue, finish), `wake` (parking without per-cycle cost), `line` (the
//! places waiting workloads' messages show), `reserve` (quota
//! held for a preemptor while its victims terminate), `report`, `restore` (record
//! running workloads after a controller restart), `hold` (capacity a scale-down freed,
//! kept from expensive borrowers for a while).

mod accounting;
pub mod api;
mod assign;
pub(crate) mod claims;
mod decide;
mod engine;
pub(crate) mod error;
pub mod events;
pub mod fixtures;
mod hold;
mod keyset;
pub(crate) mod kueue_config;
mod lifecycle;
mod line;
pub(crate) mod model;
pub(crate) mod objects;
mod preempt;
pub mod quantity;
mod report;
mod reserve;
mod restore;
mod scale_replay;
pub mod scenario;
mod wake;

#[cfg(test)]
mod engine_tests;

pub use engine::{BlockStart, Engine, EngineConfig, Requeue, Stats, WaitForPodsReady};
pub use error::{Error, Result};
pub use events::{Event, EventType, FinalState};
pub use hold::{HeldLevels, HoldFreed};
pub use model::WorkloadInfo;
pub use quantity::{Quantity, Time};
pub use report::{LocalQueueGauges, LocalQueueResource, QueueGauges, QueueStatus, ResourceGauges};
pub use restore::Restored;
pub use scale_replay::{Coupled, Replicas};
