//! `homing enqueue`: one job from the command line, optionally waiting for its end.

use std::process::ExitCode;
use std::time::Duration;

use super::input::read_args;
use super::open;
use crate::cli::{EnqueueArgs, Global};
use crate::output::outln;
use crate::{output, tasks};
use homing::{Client, EnqueueRequest, JobOptions, JobState, RetryPolicy};

pub async fn run(g: &Global, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    if a.celery {
        return super::celery::enqueue(g, a).await;
    }
    if let Some(file) = &a.from_file {
        return super::enqueue_file::run(g, file, a.allow_unknown_task).await;
    }
    // Clap requires the task unless --from-file is given.
    let task = a.task.clone().unwrap_or_default();
    let args = read_args(&a.args)?;
    let req = EnqueueRequest {
        task: task.clone(),
        args,
        options: JobOptions {
            queue: a.queue,
            idempotency_key: a.idempotency_key,
            countdown: a.countdown,
            max_retries: a.max_retries,
            retry_policy: a.retry_delay.map(RetryPolicy::fixed),
            max_crashes: a.max_crashes,
            time_limit: a.time_limit,
            on_success: None,
            on_failure: None,
            callback_url: a.callback_url,
            priority: a.priority,
            unique_for: a.unique_for,
            traceparent: a.traceparent,
        },
    };
    // Before anything is opened or looked up, so a refused value gets its own reason.
    homing::client::validate_request(&req)?;
    let backends = open(g).await?;
    let registry = tasks::registry(&crate::pipelines::for_routing());
    if !a.allow_unknown_task {
        require_known(&*backends.store, &registry, &task).await?;
    }
    let client =
        Client::new(backends.broker.clone(), backends.store.clone()).with_registry(registry);
    let keyed = req.options.idempotency_key.is_some();
    let inserted = client.enqueue(req).await?;
    if inserted.existed {
        // Without a key, only --unique-for can have matched.
        let matched = if keyed {
            "idempotency key"
        } else {
            "--unique-for (same task, queue and args within its window)"
        };
        crate::logs::say(format_args!(
            "note: {matched} matched existing job {}",
            inserted.id
        ));
    }
    if !a.wait {
        if a.json {
            output::json(&client.get(inserted.id).await?);
        } else {
            outln!("{}", inserted.id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let timeout = a.timeout.unwrap_or(Duration::from_secs(365 * 24 * 3600));
    let job = client.wait(inserted.id, timeout).await?;
    output::json(&job);
    match job.state {
        JobState::Succeeded => Ok(ExitCode::SUCCESS),
        st if st.is_terminal() => {
            crate::logs::say(format_args!(
                "error: job {} ended {st}: {}",
                job.id,
                job.error.as_deref().unwrap_or("no reason recorded")
            ));
            Ok(ExitCode::FAILURE)
        }
        st => {
            crate::logs::say(format_args!(
                "error: gave up waiting; job {} is still {st}",
                job.id
            ));
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Fails with the tasks that are known unless a worker has registered `task` or it is one of
/// this binary's (`homing enqueue`, `homing schedules set`).
pub(crate) async fn require_known(
    store: &dyn homing::store::Store,
    registry: &homing::Registry,
    task: &str,
) -> anyhow::Result<()> {
    if registry.get(task).is_some() {
        return Ok(());
    }
    let known = store.known_tasks().await?;
    if known.iter().any(|t| t == task) {
        return Ok(());
    }
    let mut all = registry.names();
    all.extend(known);
    let all = homing::validate::enqueueable_tasks(all);
    anyhow::bail!(
        "no worker has registered task '{}' (known: {}); start a worker that runs it, or pass --allow-unknown-task",
        task,
        all.join(", ")
    )
}
