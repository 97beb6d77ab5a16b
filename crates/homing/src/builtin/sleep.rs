//! `builtin.sleep {ms}`: waits, stopping early when cancelled, and reports progress in quarters
//! when it sleeps a second or more. For trying out long jobs, shutdown, cancellation and the
//! dashboard's progress bar.

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
        // Short sleeps (benchmarks) stay one timer; progress writes would dominate them.
        let steps: u64 = if args.ms >= 1000 { 4 } else { 1 };
        for step in 1..=steps {
            let part = Duration::from_millis(args.ms / steps);
            tokio::select! {
                _ = tokio::time::sleep(part) => {}
                _ = ctx.cancelled() => return Err(TaskError::retry("cancelled while sleeping")),
            }
            if step < steps {
                ctx.progress(
                    step as f64 / steps as f64,
                    format!("slept {} of {} ms", args.ms / steps * step, args.ms),
                )
                .await;
            }
        }
        Ok(serde_json::json!({ "slept_ms": args.ms }))
    }
}
