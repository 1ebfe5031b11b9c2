//! The DRA driver `gpu.tessera.io` (issue 5).
//!
//! - [`slices`]: the ResourceSlices for whole GPUs, partitionable MIG and vGPU capacity (pure);
//! - [`publish`]: writing them and keeping them written (kube);
//! - [`checkpoint`]: the crash-safe record of prepared claims.

pub mod checkpoint;
pub mod publish;
pub mod slices;
