//! The DRA driver `gpu.tessera.io` (issue 5).
//!
//! - [`slices`]: the ResourceSlices for whole GPUs, partitionable MIG and vGPU capacity (pure);
//! - [`publish`]: writing them and keeping them written (kube);
//! - [`prepare`]: NodePrepareResources as a pure plan (devices, MIG instances, CDI spec);
//! - [`checkpoint`]: the crash-safe record of prepared claims.

pub mod checkpoint;
pub mod prepare;
pub mod publish;
pub mod slices;
