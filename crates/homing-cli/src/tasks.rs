//! The tasks this binary's workers run: homing's built-ins and the pipelines', plus (only when
//! `HOMING_TEST_TASKS=1`) tasks that misbehave on purpose for the crash and poison tests.

use homing::{Registry, TaskDefaults, TaskError};
use homing_pipelines::Pipelines;

pub fn registry(pipelines: &Pipelines) -> Registry {
    let mut r = homing::builtin::registry();
    r.merge(&pipelines.registry());
    if std::env::var("HOMING_TEST_TASKS").as_deref() == Ok("1") {
        add_test_tasks(&mut r);
    }
    r
}

fn add_test_tasks(r: &mut Registry) {
    // Kills its own worker process, like an OOM or a segfault in a native library.
    r.register_fn(
        "test.abort",
        TaskDefaults::default(),
        |_ctx, _args| async move {
            crate::logs::say(format_args!("test.abort: aborting the worker process"));
            crate::logs::flush();
            std::process::abort();
        },
    );
    // Fails `fail_times` times (a retryable error), then succeeds.
    r.register_fn(
        "test.flaky",
        TaskDefaults::default(),
        |ctx, args| async move {
            let fail_times = args.get("fail_times").and_then(|v| v.as_u64()).unwrap_or(1) as u32;
            if ctx.attempt() < fail_times {
                return Err(TaskError::retry(format!(
                    "planned failure {} of {fail_times}",
                    ctx.attempt() + 1
                )));
            }
            Ok(serde_json::json!({ "attempt": ctx.attempt() }))
        },
    );
    r.register_fn(
        "test.panic",
        TaskDefaults::default(),
        |_ctx, _args| async move {
            panic!("planned panic");
        },
    );
}
