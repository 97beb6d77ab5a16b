//! `builtin.noop`: returns its args. The cheapest possible job, for measuring homing itself.

use crate::task::{Context, Task, TaskError};

#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

#[async_trait::async_trait]
impl Task for Noop {
    const NAME: &'static str = "builtin.noop";
    type Args = serde_json::Value;
    type Output = serde_json::Value;

    async fn run(
        &self,
        _ctx: Context,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, TaskError> {
        Ok(args)
    }
}
