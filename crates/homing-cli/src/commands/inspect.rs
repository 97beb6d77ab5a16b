//! `homing jobs …`, `homing queues`, `homing workers`: read and steer from the terminal.

use std::process::ExitCode;

use super::open;
use crate::cli::{
    Global, JobsCommand, OutputArgs, QueuesArgs, QueuesCommand, WorkersArgs, WorkflowsCommand,
};
use crate::{output, tasks, views};
use homing::store::{JobFilter, WorkerStatus};
use homing::time::rfc3339;
use homing::{Client, JobId, JobState};

fn parse_id(s: &str) -> anyhow::Result<JobId> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("'{s}' is not a job id (a UUID)"))
}

fn print_workflow(w: &homing::workflow::Workflow, out: &OutputArgs) {
    if out.json {
        output::json(w);
        return;
    }
    println!("workflow {} ({}): {}", w.id, w.name, w.state);
    let rows = w
        .steps
        .iter()
        .map(|(name, s)| {
            vec![
                name.clone(),
                s.job.to_string(),
                s.task.clone(),
                s.state.to_string(),
                s.after.join(","),
                s.run_on.as_str().to_string(),
            ]
        })
        .collect();
    output::table(&["step", "job", "task", "state", "after", "run_on"], rows);
}

pub async fn workflows(g: &Global, cmd: WorkflowsCommand) -> anyhow::Result<ExitCode> {
    let b = open(g, false).await?;
    let client = Client::new(b.broker.clone(), b.store.clone())
        .with_registry(tasks::registry(&crate::pipelines::for_routing()));
    let wf_id = |s: &str| -> anyhow::Result<homing::workflow::WorkflowId> {
        s.parse()
            .map_err(|_| anyhow::anyhow!("'{s}' is not a workflow id (a UUID)"))
    };
    match cmd {
        WorkflowsCommand::Create { file } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&file)
                    .map_err(|e| anyhow::anyhow!("cannot read {file}: {e}"))?
            };
            let spec: homing::workflow::WorkflowSpec = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{file} is not a workflow: {e}"))?;
            output::json(&client.create_workflow(spec).await?);
        }
        WorkflowsCommand::Get { id, out } => {
            print_workflow(&client.workflow(wf_id(&id)?).await?, &out)
        }
        WorkflowsCommand::Cancel { id, out } => {
            print_workflow(&client.cancel_workflow(wf_id(&id)?).await?, &out)
        }
        WorkflowsCommand::List { limit, cursor, out } => {
            let page = client.workflows(cursor.as_deref(), limit).await?;
            if out.json {
                output::json(&page);
            } else {
                let rows = page
                    .workflows
                    .iter()
                    .map(|w| {
                        vec![
                            w.id.to_string(),
                            w.name.clone(),
                            w.state.to_string(),
                            w.steps.len().to_string(),
                            rfc3339(w.created_at),
                        ]
                    })
                    .collect();
                output::table(&["id", "name", "state", "steps", "created"], rows);
                if let Some(c) = page.next_cursor {
                    println!("more: --cursor {c}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn jobs(g: &Global, cmd: JobsCommand) -> anyhow::Result<ExitCode> {
    let b = open(g, false).await?;
    let client = Client::new(b.broker.clone(), b.store.clone())
        .with_registry(tasks::registry(&crate::pipelines::for_routing()));
    let (job, out) = match cmd {
        JobsCommand::Get { id, out } => (client.get(parse_id(&id)?).await?, out),
        JobsCommand::Retry { id, out } => (client.retry(parse_id(&id)?).await?, out),
        JobsCommand::Cancel { id, out } => (client.cancel(parse_id(&id)?).await?, out),
        JobsCommand::List {
            state,
            queue,
            task,
            limit,
            cursor,
            out,
        } => {
            if limit == 0 || limit > 1000 {
                anyhow::bail!("--limit must be between 1 and 1000");
            }
            let state = state
                .map(|s| s.parse::<JobState>())
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let page = client
                .list(&JobFilter { state, queue, task }, cursor.as_deref(), limit)
                .await?;
            if out.json {
                output::json(&page);
            } else {
                let rows = page
                    .jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.id.to_string(),
                            j.task.clone(),
                            j.queue.clone(),
                            j.state.to_string(),
                            j.attempts.to_string(),
                            j.crashes.to_string(),
                            rfc3339(j.created_at),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "id", "task", "queue", "state", "attempts", "crashes", "created",
                    ],
                    rows,
                );
                if let Some(c) = page.next_cursor {
                    println!("more: --cursor {c}");
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if out.json {
        output::json(&job);
    } else {
        output::job(&job);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn queues(g: &Global, a: QueuesArgs) -> anyhow::Result<ExitCode> {
    if let Some(cmd) = a.command {
        let (queue, pause) = match cmd {
            QueuesCommand::Pause { queue } => (queue, true),
            QueuesCommand::Resume { queue } => (queue, false),
        };
        // Checked before anything is opened, so a bad name gets its own reason.
        homing::validate::producer_queue(&queue).map_err(anyhow::Error::msg)?;
        let b = open(g, false).await?;
        let client = homing::Client::new(b.broker.clone(), b.store.clone());
        if pause {
            client.pause_queue(&queue).await?;
            println!("paused {queue}");
        } else {
            client.resume_queue(&queue).await?;
            println!("resumed {queue}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let out = a.out;
    let b = open(g, false).await?;
    // The store bounds the number of queue names (--max-queues), so one page holds them all.
    let qs = views::queues(&b, None, usize::MAX).await?.queues;
    if out.json {
        output::json(&serde_json::json!({ "queues": qs }));
        return Ok(ExitCode::SUCCESS);
    }
    let rows = qs
        .iter()
        .map(|q| {
            let j = &q.jobs;
            vec![
                j.queue.clone(),
                j.scheduled.to_string(),
                j.waiting.to_string(),
                j.queued.to_string(),
                j.running.to_string(),
                j.succeeded.to_string(),
                j.failed.to_string(),
                j.dead.to_string(),
                j.cancelled.to_string(),
                q.broker.dead_letters.to_string(),
                if q.paused { "paused" } else { "" }.to_string(),
            ]
        })
        .collect();
    output::table(
        &[
            "queue",
            "scheduled",
            "waiting",
            "queued",
            "running",
            "succeeded",
            "failed",
            "dead",
            "cancelled",
            "dead letters",
            "paused",
        ],
        rows,
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn workers(g: &Global, a: WorkersArgs) -> anyhow::Result<ExitCode> {
    let b = open(g, false).await?;
    let since = if a.all {
        0
    } else {
        homing::time::now() - 3600 * 1_000_000
    };
    let ws = views::workers(&b, since).await?;
    if a.out.json {
        output::json(&serde_json::json!({ "workers": ws }));
        return Ok(ExitCode::SUCCESS);
    }
    let rows = ws
        .iter()
        .map(|w| {
            let r = &w.record;
            vec![
                r.info.id.clone(),
                if w.alive {
                    "live".into()
                } else if r.status == WorkerStatus::Live {
                    "unresponsive".into()
                } else {
                    r.status.to_string()
                },
                r.info.queues.join(","),
                r.info.concurrency.to_string(),
                r.running.len().to_string(),
                match w.heartbeat_expires_in_s {
                    Some(s) => format!("in {s:.1}s"),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    output::table(
        &[
            "worker",
            "status",
            "queues",
            "concurrency",
            "running",
            "heartbeat expires",
        ],
        rows,
    );
    Ok(ExitCode::SUCCESS)
}
