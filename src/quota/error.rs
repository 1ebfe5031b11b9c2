//! Errors of the quota engine: invalid objects, unknown references, bad scenario files.

/// Everything that can go wrong when feeding objects or workloads to the quota engine.
///
/// Each variant names the object and the field at fault so a user can fix the input.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A quantity such as `36Gi` or `500m` could not be parsed.
    #[error("invalid quantity {value:?}: {why}")]
    Quantity { value: String, why: String },
    /// A duration such as `1h30m` could not be parsed.
    #[error("invalid duration {value:?}: {why}")]
    Duration { value: String, why: String },
    /// An object failed validation; `field` is a dotted path inside it.
    #[error("{kind} {name:?}: field {field}: {why}")]
    Invalid {
        kind: &'static str,
        name: String,
        field: String,
        why: String,
    },
    /// A workload names a priority class that does not exist.
    #[error("workload {workload}: unknown WorkloadPriorityClass {class:?}")]
    UnknownPriorityClass { workload: String, class: String },
    /// A workload with this namespace/name already exists.
    #[error("workload {0} already exists")]
    DuplicateWorkload(String),
    /// A LocalQueue or ClusterQueue that the caller named does not exist.
    #[error("{0} not found")]
    UnknownQueue(String),
    /// A workload that the caller named does not exist.
    #[error("workload {0} not found")]
    UnknownWorkload(String),
    /// Scheduling did not settle (a bug guard: it should never trigger).
    #[error("scheduling did not reach a fixed point after {0} cycles")]
    NoFixedPoint(u64),
    /// A scenario file could not be read as YAML or holds an unsupported object.
    #[error("scenario document {doc} (line {line}): {why}")]
    Scenario {
        doc: usize,
        line: usize,
        why: String,
    },
}

/// Result alias of the quota module.
pub type Result<T> = std::result::Result<T, Error>;
