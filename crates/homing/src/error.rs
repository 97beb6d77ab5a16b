//! The library's error type. Backends map their own failures onto these variants so that callers
//! (the worker runtime, the HTTP API) can tell a client's mistake from a backend that went away.

use crate::job::{JobId, JobState};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The backend cannot be reached right now (connection refused or lost, busy past its
    /// timeout). Nothing was committed by the failing call; it is safe to try again.
    #[error("{backend} unavailable: {message}")]
    Unavailable {
        backend: &'static str,
        message: String,
    },
    #[error("job {0} not found")]
    NotFound(JobId),
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
    },
}

impl Error {
    pub fn unavailable(backend: &'static str, e: impl std::fmt::Display) -> Self {
        Error::Unavailable {
            backend,
            message: e.to_string(),
        }
    }

    pub fn backend(backend: &'static str, e: impl std::fmt::Display) -> Self {
        Error::Backend {
            backend,
            message: e.to_string(),
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}
