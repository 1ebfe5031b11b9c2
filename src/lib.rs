//! Tessera: one GPU fleet shared by training and inference on Kubernetes.
//!
//! The library holds every subsystem; the `tessera` binary (`src/main.rs`) only parses
//! flags and calls in. Pure decision logic (`partition`, `placement`, `quota`) never
//! imports tonic or kube: the gRPC and Kubernetes shells translate types and call it.
//!
//! Data path for a kubelet request: `main` → `cmd::node` → [`deviceplugin::supervisor`]
//! (one gRPC server per resource) → [`deviceplugin::server`] → the pure
//! [`partition`] advertisement and [`cdi`] spec writer.

pub mod agent;
pub mod autoscale;
pub mod cdi;
pub mod chargeback;
pub mod controller;
pub mod deviceplugin;
pub mod diagnose;
pub mod dra;
pub(crate) mod fsio;
pub mod gpu;
pub mod grpc;
pub mod logging;
pub mod metrics;
pub mod partition;
pub mod placement;
pub mod prometheus;
pub mod proto;
pub mod quota;
pub(crate) mod retry;
pub mod shimfiles;
pub mod sim;
pub mod vgpu;
pub mod yaml;
