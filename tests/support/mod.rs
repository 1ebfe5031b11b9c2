//! Test doubles shared by the integration tests.

pub mod agent;
pub mod apiserver;
pub mod kubelet;
pub mod schema;
