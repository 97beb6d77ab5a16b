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
