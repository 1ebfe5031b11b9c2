//! Errors of the placement engine.

/// What can go wrong when building a cluster or a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A node spec is unusable (e.g. more GPUs than the engine supports).
    #[error("node {node}: {reason}")]
    InvalidNode { node: String, reason: String },
    /// A request is unusable (e.g. gpu_milli above 1000, zero-GPU MIG request).
    #[error("invalid request field `{field}`: {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    /// Too many distinct GPU models for the model bit set.
    #[error("more than {max} distinct GPU models in the cluster")]
    TooManyModels { max: usize },
    /// A policy name that does not exist.
    #[error("unknown policy `{0}` (expected one of: random, dotproduct, gpuclustering, gpupacking, bestfit, fgd, tessera)")]
    UnknownPolicy(String),
}

/// Result alias of the placement engine.
pub type Result<T> = std::result::Result<T, Error>;
