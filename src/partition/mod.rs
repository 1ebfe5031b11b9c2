//! Partition layouts: which devices each GPU is cut into.
//!
//! - [`config`]: the node layout ConfigMap (NVIDIA device-plugin `version: v1` files plus
//!   Tessera's per-GPU rules), parsed and validated into a [`config::NodeConfig`];
//! - [`catalog`]: the MIG profile and placement tables per GPU model;
//! - [`layout`]: the pure function from inventory + config to the [`layout::Advertisement`]
//!   (resources and their devices) that the device-plugin servers publish.

pub mod catalog;
pub mod config;
pub mod layout;
