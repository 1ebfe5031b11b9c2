//! Test doubles shared by the integration tests.

pub mod agent;
pub mod apiserver;
pub mod dra_agent;
pub mod dra_kubelet;
pub mod dra_pool;
pub mod exposition;
pub mod http;
pub mod kubelet;
pub mod prometheus;
pub mod rbac;
pub mod schema;
pub mod skip;
