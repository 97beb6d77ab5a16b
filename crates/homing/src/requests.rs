//! The share of the embedded store's threads that requests from outside may take.
//!
//! An embedded file's calls run on the runtime's blocking pool (512 threads), which the
//! process's workers, heartbeats and maintenance loops use too. Requests a server takes from
//! outside can be slow (an args search with no match reads every row: about half a second at a
//! million jobs), and a flood of them filled the pool: 600 searches at once, which a `read`
//! token may send, left a `homing up` running no job for minutes. A server runs each request
//! inside [`serving`]; its store calls then wait for one of the budget's permits, as futures,
//! before they take a thread, so requests hold at most [`budget`] threads at once and the
//! process's own calls never queue behind them. Calls made outside [`serving`] are not limited.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

tokio::task_local! {
    static BUDGET: Arc<Semaphore>;
}

/// How many store calls of requests may hold a thread at once: four per core, at least eight.
/// More would not run sooner on a machine with that many cores, and a request's call that waits
/// for SQLite's write lock holds its thread meanwhile.
pub fn budget() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 4).max(8)
}

/// A budget of [`budget`] permits, for one server.
pub fn new_budget() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(budget()))
}

/// Runs `f` (a request's handling) with its store calls limited by `budget`.
pub async fn serving<F: Future>(budget: Arc<Semaphore>, f: F) -> F::Output {
    BUDGET.scope(budget, f).await
}

/// A permit for one store call when the caller runs inside [`serving`]; `None` otherwise.
/// Waiting for it is what limits requests: a request that gives up meanwhile (its timeout)
/// leaves the queue and never takes a thread.
pub async fn permit() -> Option<OwnedSemaphorePermit> {
    let budget = BUDGET.try_with(Arc::clone).ok()?;
    budget.acquire_owned().await.ok()
}
