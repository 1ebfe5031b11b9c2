//! The DRA driver `gpu.tessera.io` (issue 5): ResourceSlices for whole GPUs, MIG
//! partitions and vGPU capacity. (Registration, the kubelet plugin and claim preparation
//! come in further modules.)

pub mod publish;
pub mod slices;
