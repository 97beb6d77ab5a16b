//! Conformance suites: the observable part of each backend trait's contract, written once and
//! run unchanged against every implementation (SQLite, Redis, PostgreSQL, and any third-party
//! backend). A backend's test file invokes [`store_conformance!`](crate::store_conformance) or
//! [`broker_conformance!`](crate::broker_conformance) with an expression that makes a fresh
//! backend; each case becomes its own `#[tokio::test]`. A store's test file that can also write
//! raw rows runs [`store_poison_conformance!`](crate::store_poison_conformance) too.

pub mod access;
pub mod batch;
pub mod broker;
pub mod cluster_limits;
pub mod counts;
pub mod limits;
pub mod poison;
pub mod queues;
pub mod schedules;
pub mod search;
pub mod stats;
pub mod store;
pub mod timeline;
pub mod workers;
pub mod workflows;

pub use poison::{Poisonable, Tamper};

use crate::job::{new_job_id, JobOptions, NewJob};

/// Counts the turns another task gets on the current runtime: a task that yields in a loop.
/// On a one-thread runtime, how often it ran during a call says whether the call let the
/// runtime's other tasks (a heartbeat) run. Stops with the value.
pub struct OtherTask {
    runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl OtherTask {
    /// Starts the task and gives it its first turn.
    pub async fn start() -> OtherTask {
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = runs.clone();
        let task = tokio::spawn(async move {
            loop {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        });
        tokio::task::yield_now().await;
        OtherTask { runs, task }
    }

    /// Its turns so far.
    pub fn runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for OtherTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A queue name unique to one test case, so cases sharing a backend cannot see each other.
pub fn unique_queue(prefix: &str) -> String {
    format!("{prefix}-{}", &new_job_id().simple().to_string()[20..])
}

/// Starts `ids` under `worker` (each must run) and completes each with `outcome`; the commit's
/// answers.
pub async fn start_and_complete(
    s: &dyn crate::store::Store,
    ids: &[crate::job::JobId],
    worker: &str,
    outcome: crate::store::Outcome,
) -> Vec<crate::store::Committed> {
    use crate::store::{Completion, StartOutcome};
    let done: Vec<Completion> = s
        .start(ids, worker, crate::time::now())
        .await
        .unwrap()
        .into_iter()
        .map(|o| match o {
            StartOutcome::Run(j) => Completion {
                id: j.id,
                epoch: j.epoch,
                outcome: outcome.clone(),
            },
            other => panic!("expected Run, got {other:?}"),
        })
        .collect();
    s.complete(&done, crate::time::now()).await.unwrap()
}

/// [`start_and_complete`] with every job succeeded.
pub async fn run_to_success(
    s: &dyn crate::store::Store,
    ids: &[crate::job::JobId],
    worker: &str,
) -> Vec<crate::store::Committed> {
    let succeeded = crate::store::Outcome::Succeeded(serde_json::json!(null));
    start_and_complete(s, ids, worker, succeeded).await
}

/// A plain job for `queue`.
pub fn new_job(queue: &str, task: &str) -> NewJob {
    NewJob {
        id: new_job_id(),
        task: task.into(),
        queue: queue.into(),
        args: serde_json::json!({"n": 1}),
        options: JobOptions::default(),
        created_at: crate::time::now(),
        run_at: None,
    }
}
