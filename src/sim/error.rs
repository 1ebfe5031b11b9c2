//! Errors of the simulator.

/// What can go wrong reading traces or running the protocol.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A row or header of a CSV file is malformed.
    #[error("{file}:{line}: {reason}")]
    Malformed {
        file: String,
        line: usize,
        reason: String,
    },
    /// A CSV file has a header but no rows.
    #[error("{0}: no data rows")]
    Empty(String),
    /// The node list has no GPUs, so allocation ratios are undefined.
    #[error("the node list has no GPUs")]
    NoGpus,
    /// The placement engine rejected the cluster or a request.
    #[error(transparent)]
    Placement(#[from] crate::placement::Error),
}

/// Result alias of the simulator.
pub type Result<T> = std::result::Result<T, Error>;
