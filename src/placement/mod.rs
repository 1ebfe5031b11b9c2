//! Placement engine: picks a node and GPU(s) for one request.
//!
//! Pure decision logic over plain types (std + serde + thiserror only). The simulator
//! (`crate::sim`) and the live scheduler extender call the same code:
//!
//! ```text
//! NodeSpec[] ──► Cluster (free CPU / memory / per-GPU milli + memory, state classes)
//! Request ──► Cluster::demand ──► Demand ──► Policy::place ──► Placement ──► Cluster::apply
//! ```
//!
//! Requests can ask for a fraction of one GPU (`gpu_milli`, optionally GPU memory and
//! cores), whole GPUs, or a MIG profile, restricted to a set of GPU models, plus node CPU
//! and memory. Policies: the six baselines of the FGD paper (ATC'23) and Tessera's own
//! (`tessera`), see [`policy`].

mod cluster;
mod error;
mod frag;
mod hash;
mod plan;
pub mod policy;
mod rng;
mod types;

pub use cluster::{ClassId, Cluster, NodeClass, NodeState};
pub use error::{Error, Result};
pub use frag::{frag_milli, node_frag_milli, TargetPod, Workload};
pub use plan::{min_gpus_lp, SharePlan};
pub use policy::{Policy, PolicyContext, PolicyKind, TieBreak};
pub use rng::SplitMix64;
pub use types::{
    Demand, DemandId, GpuDemand, GpuFree, MigProfile, NodeSpec, Placement, Request, MILLI,
};
