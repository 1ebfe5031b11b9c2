//! The kubelet device-plugin API (v1beta1): one gRPC server and socket per resource.
//!
//! ```text
//!  agent ──publishes──▶ watch<Snapshot> ──▶ supervisor ──spawns──▶ server (one per resource)
//!                                             │  ▲                   │ ListAndWatch / Allocate /
//!                                             │  └─ kubelet.sock ────┘ GetPreferredAllocation
//!                                             └──▶ registration::register (Register RPC)
//! ```
//!
//! - [`snapshot`]: what every server reads: advertisement + health, versioned;
//! - [`allocate`] and [`preferred`]: pure decisions (which response, which devices);
//! - [`server`]: the tonic service; translates types and calls the pure functions;
//! - [`registration`]: dialing `kubelet.sock` and registering;
//! - [`supervisor`]: starts/stops servers as resources come and go, and re-registers
//!   everything when the kubelet restarts (inotify on `kubelet.sock`).

pub mod allocate;
pub mod coexist;
pub mod preferred;
pub mod registration;
pub mod server;
pub mod snapshot;
pub mod supervisor;
pub mod topology;

/// The device-plugin API version we speak.
pub const API_VERSION: &str = "v1beta1";
/// `Device.health` values.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// Errors of the device-plugin layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("resource {resource}: unknown device {id:?}")]
    UnknownDevice { resource: String, id: String },
    #[error("resource {resource}: device {id} is unhealthy ({reason})")]
    UnhealthyDevice {
        resource: String,
        id: String,
        reason: String,
    },
    #[error("resource {resource}: device {id} requested twice")]
    DuplicateDevice { resource: String, id: String },
    #[error("resource {resource}: request for {count} devices refused: {reason}")]
    RequestRefused {
        resource: String,
        count: usize,
        reason: String,
    },
    #[error("resource {resource} is no longer advertised by this node")]
    UnknownResource { resource: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the kubelet at {socket}: {reason}")]
    KubeletUnavailable { socket: String, reason: String },
    #[error("kubelet refused registration of {resource}: {reason}")]
    RegistrationRefused { resource: String, reason: String },
    #[error("cannot serve on {socket}: {source}")]
    Serve {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("CDI: {0}")]
    Cdi(#[from] crate::cdi::Error),
    #[error("vGPU refused: {0}")]
    Shim(#[from] crate::shimfiles::Error),
    #[error("MIG device {device}: {source}")]
    MigCaps {
        device: String,
        #[source]
        source: crate::cdi::migcaps::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short, bounded label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::UnknownDevice { .. } => "unknown_device",
            Error::UnhealthyDevice { .. } => "unhealthy_device",
            Error::DuplicateDevice { .. } => "duplicate_device",
            Error::RequestRefused { .. } => "request_refused",
            Error::UnknownResource { .. } => "unknown_resource",
            Error::InvalidRequest(_) => "invalid_request",
            Error::Io { .. } => "io",
            Error::KubeletUnavailable { .. } => "kubelet_unavailable",
            Error::RegistrationRefused { .. } => "registration_refused",
            Error::Serve { .. } => "serve",
            Error::Cdi(_) => "cdi",
            Error::Shim(_) => "shim",
            Error::MigCaps { .. } => "mig_caps",
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        use tonic::Code;
        let code = match &e {
            Error::UnknownDevice { .. }
            | Error::DuplicateDevice { .. }
            | Error::InvalidRequest(_)
            | Error::RequestRefused { .. } => Code::InvalidArgument,
            Error::UnhealthyDevice { .. } | Error::MigCaps { .. } | Error::Shim(_) => {
                Code::FailedPrecondition
            }
            Error::UnknownResource { .. } => Code::NotFound,
            Error::Io { .. }
            | Error::KubeletUnavailable { .. }
            | Error::RegistrationRefused { .. }
            | Error::Serve { .. }
            | Error::Cdi(_) => Code::Unavailable,
        };
        tonic::Status::new(code, e.to_string())
    }
}
