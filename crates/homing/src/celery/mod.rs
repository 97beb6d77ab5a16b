//! Celery interoperability (feature `celery`), so teams can move slow workers off Python without
//! touching the Django/FastAPI code that enqueues with `apply_async`, and so a homing application
//! can hand tasks to Python workers that already exist.
//!
//! - [`Ingress`] takes Celery protocol 2 messages from kombu's Redis lists (priority lists
//!   included) and records each as a homing job whose id is the Celery task id; from then on it
//!   is a normal homing job with every guarantee of docs/design.md section 1.
//! - [`results`] writes terminal outcomes (and `RETRY`) to Celery's Redis result backend, through
//!   a follow-up job committed with the terminal state, so `AsyncResult.get()` sees them.
//! - [`CeleryClient`] publishes messages a stock Celery worker runs, and reads their results.
//!
//! [`wire`] is the format both ways; [`keys`] names every Redis key involved.

mod conn;
pub mod ingress;
pub mod keys;
mod publisher;
pub mod results;
mod scripts;
pub mod wire;

pub use conn::Conn;
pub use ingress::{Ingress, IngressConfig};
pub use publisher::{CeleryClient, CelerySend};

use crate::task::Registry;

/// The tasks a worker needs to run Celery jobs: every task of `registry`, reporting retries to
/// the result backend, plus the result follow-up task. `backend` is the Celery result backend
/// URL, if the Python callers read results.
pub fn registry(registry: &Registry, backend: Option<&str>) -> crate::Result<Registry> {
    let conn = backend.map(Conn::open).transpose()?;
    Ok(results::wrap(
        registry,
        conn,
        results::DEFAULT_RESULT_EXPIRES,
    ))
}
