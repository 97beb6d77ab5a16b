//! `builtin.sleep {ms}`: waits, stopping early when cancelled. For trying out long jobs,
//! shutdown and cancellation.

use serde::Deserialize;
use std::time::Duration;

use crate::task::{Context, Task, TaskError};

#[derive(Debug, Clone, Copy, Default)]
pub struct Sleep;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepArgs {
    pub ms: u64,
}

#[async_trait::async_trait]
impl Task for Sleep {
    const NAME: &'static str = "builtin.sleep";
    type Args = SleepArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, args: SleepArgs) -> Result<serde_json::Value, TaskError> {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(args.ms)) => Ok(serde_json::json!({ "slept_ms": args.ms })),
            _ = ctx.cancelled() => Err(TaskError::retry("cancelled while sleeping")),
        }
    }
}
