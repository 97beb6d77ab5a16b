//! The pipelines' tasks, one file per pipeline.

pub mod exhibition;
pub mod ocr;

use futures_util::FutureExt;
use homing::{Context, RetryPolicy, Task, TaskError};
use std::panic::AssertUnwindSafe;
use std::time::Duration;

/// The pipelines' services, or a retryable error: a full disk or a locked database is
/// transient, and the job's retries outlive it.
pub(crate) async fn services(
    p: &crate::Pipelines,
) -> Result<std::sync::Arc<crate::Services>, TaskError> {
    p.services()
        .await
        .map_err(|e| TaskError::retry(format!("cannot open the pipelines' storage: {e:#}")))
}

/// The outcome of work run on the blocking pool. A panic there comes from the input — the same
/// image, or the same seed, panics again on every retry — so it fails the job at once with the
/// panic's message; work the runtime dropped while shutting down never ran, so it is retried.
pub(crate) fn joined<T>(r: Result<T, tokio::task::JoinError>) -> Result<T, TaskError> {
    r.map_err(|e| {
        if e.is_panic() {
            panicked(e.into_panic())
        } else {
            TaskError::retry("the work was stopped before it finished (shutting down)")
        }
    })
}

/// A panic as the fatal error it is: a pipeline handler that panics on a job's input panics on
/// it again at every retry.
fn panicked(payload: Box<dyn std::any::Any + Send>) -> TaskError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    TaskError::fatal(format!("the handler panicked on this input: {message}"))
}

/// A pipeline task whose panics fail its job at once (the worker's default for a panicking
/// handler is a retry, which suits code that can fail for a passing reason; the pipelines'
/// handlers only panic on what their input makes them do). Everything else is the task's own.
#[derive(Debug, Clone)]
pub struct FatalOnPanic<T>(pub T);

#[homing::async_trait]
impl<T: Task> Task for FatalOnPanic<T> {
    const NAME: &'static str = T::NAME;
    type Args = T::Args;
    type Output = T::Output;

    async fn run(&self, ctx: Context, args: T::Args) -> Result<T::Output, TaskError> {
        AssertUnwindSafe(self.0.run(ctx, args))
            .catch_unwind()
            .await
            .unwrap_or_else(|payload| Err(panicked(payload)))
    }

    fn queue(&self) -> &str {
        self.0.queue()
    }
    fn max_retries(&self) -> u32 {
        self.0.max_retries()
    }
    fn retry_policy(&self) -> RetryPolicy {
        self.0.retry_policy()
    }
    fn time_limit(&self) -> Duration {
        self.0.time_limit()
    }
}

#[cfg(test)]
mod tests {
    use super::FatalOnPanic;
    use homing::{Context, EnqueueRequest, JobState, Task, TaskError};
    use std::time::{Duration, Instant};

    #[derive(Debug, Clone)]
    struct Explodes;

    #[homing::async_trait]
    impl Task for Explodes {
        const NAME: &'static str = "test.explodes";
        type Args = serde_json::Value;
        type Output = ();
        async fn run(&self, _ctx: Context, _args: serde_json::Value) -> Result<(), TaskError> {
            panic!("cannot handle this input")
        }
    }

    /// Through a real worker on a real store: the panicking handler's job fails on its first
    /// attempt, with the panic's message, where the worker alone would retry it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pipeline_handler_that_panics_fails_its_job_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/homing.db", dir.path().display());
        let b = homing::Backends::open(&url, &url).await.unwrap();
        let mut registry = homing::Registry::new();
        registry.register(FatalOnPanic(Explodes));
        let client =
            homing::Client::new(b.broker.clone(), b.store.clone()).with_registry(registry.clone());
        let job = client
            .enqueue(EnqueueRequest {
                task: Explodes::NAME.into(),
                args: serde_json::json!({}),
                options: homing::JobOptions::default(),
            })
            .await
            .unwrap();
        let stop = homing::CancellationToken::new();
        let worker = homing::Worker::new(
            b.broker.clone(),
            b.store.clone(),
            registry,
            homing::WorkerConfig::default(),
        );
        let running = tokio::spawn(worker.run(stop.clone()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let done = loop {
            let j = b.store.get(job.id).await.unwrap().unwrap();
            if j.state.is_terminal() {
                break j;
            }
            assert!(Instant::now() < deadline, "the job never ended: {j:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        stop.cancel();
        let _ = running.await;
        assert_eq!(done.state, JobState::Failed, "{done:?}");
        assert_eq!(done.attempts, 1, "{done:?}");
        assert!(
            done.error
                .as_deref()
                .unwrap_or("")
                .contains("cannot handle this input"),
            "{done:?}"
        );
    }

    #[tokio::test]
    async fn a_panic_on_the_blocking_pool_is_fatal_with_its_message() {
        let r = tokio::task::spawn_blocking(|| -> u32 { panic!("bad pixels") }).await;
        match super::joined(r) {
            Err(TaskError::Fatal(m)) => assert!(m.contains("bad pixels"), "{m}"),
            other => panic!("expected a fatal error, got {other:?}"),
        }
        let ok = tokio::task::spawn_blocking(|| 7u32).await;
        assert_eq!(super::joined(ok).unwrap(), 7);
    }
}
