//! Inference autoscaling with KEDA's semantics, coupled with quota (issue 20).
//!
//! Pure: no kube, no HTTP, time passed in; the controller and the fleet simulation run
//! the same code.
//! - [`spec`]: an InferenceScaler's spec (KEDA's ScaledObject field names, unknown fields
//!   refused) validated into [`Settings`], every default filled in, errors naming the field;
//! - [`behavior`]: the HPA's stabilization windows and rate policies;
//! - [`engine`]: one scaler's decisions poll by poll: HPA's formula and tolerance,
//!   activation and scale-to-zero after `cooldownPeriod`, fallback after failed polls,
//!   and the coupling with quota (replicas that wait are not capacity).
//!
//! docs/autoscale.md describes the semantics and where Tessera departs from KEDA.

pub mod behavior;
pub mod engine;
#[cfg(test)]
mod engine_tests;
pub mod spec;

pub use engine::{Coupling, Decision, Observation, Reading, Scaler, Why};
pub use spec::{ScalerSpec, Settings, SpecError};
