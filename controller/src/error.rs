//! Errors of a reconcile pass. Spec problems are not errors: they end up in a condition.
//! What remains is transient (the API server, the network) and is retried with backoff.

use thiserror::Error;

/// Why a reconcile pass did not finish.
#[derive(Debug, Error)]
pub enum Error {
    /// A Kubernetes API request failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// An object came without a field every stored object has (name, namespace, uid).
    #[error("{kind} object without {field}")]
    MissingField {
        /// Kind of the object.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
}

/// Result of a reconcile step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short, bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::MissingField { .. } => "invalid_object",
        }
    }
}
