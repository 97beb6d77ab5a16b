//! The pipelines' tasks, one file per pipeline.

pub mod exhibition;
pub mod ocr;

use homing::TaskError;

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
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            TaskError::fatal(format!("the handler panicked on this input: {message}"))
        } else {
            TaskError::retry("the work was stopped before it finished (shutting down)")
        }
    })
}

#[cfg(test)]
mod tests {
    use homing::TaskError;

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
