//! The library's error type. Backends map their own failures onto these variants so that callers
//! (the worker runtime, the HTTP API) can tell a client's mistake from a backend that went away.

use crate::job::{JobId, JobState};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The underlying failure of a backend error (a driver's error), kept for callers that inspect
/// it (`std::error::Error::source`).
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot be reached right now (connection refused or lost, busy past its
    /// timeout). Nothing was committed by the failing call; it is safe to try again.
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    #[error("job {0} not found")]
    NotFound(JobId),
    #[error("workflow {0} not found")]
    WorkflowNotFound(uuid::Uuid),
    /// The caller's input is invalid (bad JSON, oversized payload, unknown state, ...).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The request is valid but not in the job's current state (e.g. retrying a running job).
    #[error("job {id} is {state}: {message}")]
    Conflict {
        id: JobId,
        state: JobState,
        message: String,
    },
    /// The backend answered with something it should not have (corrupt row, failed migration).
    #[error("{backend} error: {message}")]
    Backend {
        backend: &'static str,
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

impl Error {
    /// A transient failure described by `message` alone (a timeout, no connection).
    pub fn unavailable(backend: &'static str, message: impl std::fmt::Display) -> Self {
        Error::Unavailable {
            backend,
            message: message.to_string(),
            source: None,
        }
    }

    /// A transient failure caused by a driver's error, which stays reachable as the source.
    /// Its text is the message too, so logs that print only the error lose nothing.
    pub fn unavailable_from<E>(backend: &'static str, cause: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Error::Unavailable {
            backend,
            message: cause.to_string(),
            source: Some(Box::new(cause)),
        }
    }

    /// A backend misbehaving, described by `message` alone.
    pub fn backend(backend: &'static str, message: impl std::fmt::Display) -> Self {
        Error::Backend {
            backend,
            message: message.to_string(),
            source: None,
        }
    }

    /// A backend misbehaving, caused by a driver's error (kept as the source).
    pub fn backend_from<E>(backend: &'static str, cause: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Error::Backend {
            backend,
            message: cause.to_string(),
            source: Some(Box::new(cause)),
        }
    }

    /// Says what was being done (`cannot open FILE`) before a backend error's message; the
    /// source stays as it was. Other errors are returned unchanged.
    pub fn context(self, what: impl std::fmt::Display) -> Self {
        match self {
            Error::Unavailable {
                backend,
                message,
                source,
            } => Error::Unavailable {
                backend,
                message: format!("{what}: {message}"),
                source,
            },
            Error::Backend {
                backend,
                message,
                source,
            } => Error::Backend {
                backend,
                message: format!("{what}: {message}"),
                source,
            },
            other => other,
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_driver_error_stays_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable_from("redis", io);
        assert!(e.is_transient());
        assert_eq!(e.to_string(), "redis unavailable: refused");
        let source = e.source().expect("the cause is kept");
        let io = source.downcast_ref::<std::io::Error>().expect("as itself");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(Error::backend("sqlite", "corrupt row").source().is_none());
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = Error::unavailable_from("sqlite", io).context("cannot open /x.db");
        assert_eq!(
            e.to_string(),
            "sqlite unavailable: cannot open /x.db: denied"
        );
        assert!(e.source().is_some_and(|s| s.is::<std::io::Error>()));
    }
}
