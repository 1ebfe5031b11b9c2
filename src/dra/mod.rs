//! The DRA driver `gpu.tessera.io` (issue 5).
//!
//! - [`names`]: the driver's name and its device names (`gpu-3`, `gpu-0-mig-1g-10gb-4`), parsed back;
//! - [`slices`]: the ResourceSlices for whole GPUs, partitionable MIG and vGPU capacity (pure);
//! - [`publish`]: writing them and keeping them written (kube);
//! - [`prepare`]: NodePrepareResources as a pure plan (devices, MIG instances, CDI spec);
//! - [`sharing`]: the claims' opaque config (time-slicing), parsed strictly (pure);
//! - [`status`]: the claims' `status.devices` entries (pure);
//! - [`status_queue`]: writing them after the kubelet's answer, per claim in order;
//! - [`health`]: GPU health as the `DRAResourceHealth` stream and device taints;
//! - [`checkpoint`]: the crash-safe record of prepared claims;
//! - [`envelope`]: the versioned, checksummed JSON envelope of the node's state files;
//! - [`owned`]: the GPUs and devices the driver owns now; claims outside them are refused;
//! - [`node`]: the real `ClaimPreparer` (MIG on demand, CDI spec per claim, checkpoint);
//! - [`socket`]: the plugin-watcher constants, socket paths, errors and binding a socket;
//! - [`kubelet`]: [`kubelet::serve`]: both kubelet-facing servers, served together;
//! - [`registration`]: plugin-watcher registration (`GetInfo`, re-offer on rejection);
//! - [`plugin`]: `DRAPlugin` v1 + v1beta1 over one `ClaimPreparer`, health placeholders.

pub mod checkpoint;
pub(crate) mod envelope;
pub mod health;
pub mod kubelet;
pub mod names;
pub mod node;
pub mod owned;
pub mod plugin;
pub mod prepare;
pub mod publish;
pub mod registration;
pub mod sharing;
pub mod slices;
pub mod socket;
pub(crate) mod status;
pub mod status_queue;
