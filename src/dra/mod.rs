//! The DRA driver `gpu.tessera.io` (issue 5).
//!
//! - [`kubelet`]: socket paths, errors and [`kubelet::serve`]: both kubelet-facing servers;
//! - [`registration`]: plugin-watcher registration (`GetInfo`, re-offer on rejection);
//! - [`plugin`]: `DRAPlugin` v1 + v1beta1 over one `ClaimPreparer`, health placeholders.

pub mod kubelet;
pub mod plugin;
pub mod registration;
