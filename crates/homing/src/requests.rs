//! The share of the embedded store's threads that requests from outside may take.
//!
//! An embedded file's calls run on the runtime's blocking pool (512 threads), which the
//! process's workers, heartbeats and maintenance loops use too. Requests a server takes from
//! outside can be slow (an args search with no match reads every row: about half a second at a
//! million jobs), and a flood of them filled the pool: 600 searches at once, which a `read`
//! token may send, left a `homing up` running no job for minutes. A server runs each request
//! inside [`serving`]; its store calls then wait for one of the budget's permits, as futures,
//! before they take a thread, so requests hold at most [`budget`] threads for each kind of
//! [`Work`] at once and the process's own calls never queue behind them. Calls made outside
//! [`serving`] are not limited.

use std::future::Future;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

tokio::task_local! {
    static BUDGET: Arc<Budget>;
}

/// What a request's work is, each with permits of its own: writes wait for SQLite's write lock
/// while they hold theirs (up to its busy timeout), which must not leave reads waiting behind
/// them, and an answer being serialized already holds its data, which must not queue behind
/// reads that are still to fetch theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Read,
    Write,
    Answer,
}

/// One server's permits: [`budget`] for each kind of [`Work`].
#[derive(Debug)]
pub struct Budget {
    reads: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    answers: Arc<Semaphore>,
}

/// How many store calls of each kind a server's requests may run at once: four per core, at
/// least eight. More would not run sooner on a machine with that many cores.
pub fn budget() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 4).max(8)
}

/// A budget of [`budget`] permits of each kind, for one server.
pub fn new_budget() -> Arc<Budget> {
    let permits = || Arc::new(Semaphore::new(budget()));
    Arc::new(Budget {
        reads: permits(),
        writes: permits(),
        answers: permits(),
    })
}

/// Runs `f` (a request's handling) with its store calls limited by `budget`.
pub async fn serving<F: Future>(budget: Arc<Budget>, f: F) -> F::Output {
    BUDGET.scope(budget, f).await
}

/// A permit for one piece of `work` when the caller runs inside [`serving`]; `None` otherwise.
/// Waiting for it is what limits requests: a request that gives up meanwhile (its timeout)
/// leaves the queue and never takes a thread.
pub async fn permit(work: Work) -> Option<OwnedSemaphorePermit> {
    let budget = BUDGET.try_with(Arc::clone).ok()?;
    let permits = match work {
        Work::Read => &budget.reads,
        Work::Write => &budget.writes,
        Work::Answer => &budget.answers,
    };
    permits.clone().acquire_owned().await.ok()
}
