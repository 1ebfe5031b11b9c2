//! Errors of the controller: bad objects from the API server, API calls, TLS setup.

/// What can go wrong in the controller and its webhook.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object read from the API server cannot be used (names the object and field).
    #[error(transparent)]
    Quota(#[from] crate::quota::Error),
    /// A call to the API server failed.
    #[error("API call {what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// An object could not be encoded or decoded as JSON.
    #[error("{what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The webhook's certificate or key could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// A pass was asked to read the watch-fed cache before its first LISTs completed.
    #[error("the object caches have not completed their first LIST yet")]
    NotSynced,
    /// A write kept meeting newer versions of its object (409) and gave up.
    #[error("{0}: still conflicting after retries")]
    Conflicting(String),
    /// An object a write would change is not the one it expects (names it and why).
    #[error("{0}")]
    Unexpected(String),
    /// A listener could not be bound or accepted on.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias of the controller module.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Api { what, source }
    }

    /// Whether an API error is a 409 (stale resourceVersion, or the object exists).
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// Whether an API error is a 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}
