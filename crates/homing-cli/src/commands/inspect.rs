//! `homing jobs …`, `homing queues`, `homing workers`: read and steer from the terminal.

use std::process::ExitCode;

use super::{audit, open};
use crate::cli::{
    Global, JobsCommand, OutputArgs, QueuesArgs, QueuesCommand, WorkersArgs, WorkflowsCommand,
};
use crate::output::outln;
use crate::{output, tasks, views};
use homing::store::{JobFilter, WorkerStatus};
use homing::time::rfc3339;
use homing::{Client, JobId, JobState};

/// A search's reason with its field names written as this command's flags.
fn as_flags(reason: &str) -> String {
    let mut r = reason.to_string();
    for f in [
        "created_from",
        "created_to",
        "args_path",
        "args_value",
        "args_contains",
    ] {
        r = r.replace(f, &format!("--{}", f.replace('_', "-")));
    }
    if r.starts_with("id ") || r.starts_with("id:") {
        r = format!("--{r}");
    }
    r
}

fn parse_id(s: &str) -> anyhow::Result<JobId> {
    s.parse()
        .map_err(|_| anyhow::anyhow!("'{s}' is not a job id (a UUID)"))
}

fn print_workflow(w: &homing::workflow::Workflow, out: &OutputArgs) {
    if out.json {
        output::json(w);
        return;
    }
    outln!("workflow {} ({}): {}", w.id, w.name, w.state);
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
    let b = open(g).await?;
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
            homing::validate::exact_integers(text.as_bytes())
                .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            let target = format!("name={}", spec.name);
            let created = client.create_workflow(spec).await;
            let store = &**client.store();
            output::json(&audit::audited(store, "cli workflows create", &target, created).await?);
        }
        WorkflowsCommand::Get { id, out } => {
            print_workflow(&client.workflow(wf_id(&id)?).await?, &out)
        }
        WorkflowsCommand::Cancel { id, out } => {
            let id = wf_id(&id)?;
            let done = client.cancel_workflow(id).await;
            let store = &**client.store();
            let wf =
                audit::audited(store, "cli workflows cancel", &format!("id={id}"), done).await?;
            print_workflow(&wf, &out)
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
                    outln!("more: --cursor {c}");
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn jobs(g: &Global, cmd: JobsCommand) -> anyhow::Result<ExitCode> {
    let b = open(g).await?;
    let client = Client::new(b.broker.clone(), b.store.clone())
        .with_registry(tasks::registry(&crate::pipelines::for_routing()));
    let (job, out) = match cmd {
        JobsCommand::Get { id, out } => (client.get(parse_id(&id)?).await?, out),
        JobsCommand::History { id, out } => {
            let (job, history) = client.history(parse_id(&id)?).await?;
            if out.json {
                output::json(&serde_json::json!({
                    "job": job,
                    "entries": history.entries,
                    "truncated": history.truncated,
                }));
            } else {
                output::history(&job, &history);
            }
            return Ok(ExitCode::SUCCESS);
        }
        JobsCommand::Retry {
            id: Some(id),
            bulk,
            out,
        } if bulk.is_empty() => {
            let id = parse_id(&id)?;
            let done = client.retry(id).await;
            let store = &**client.store();
            let job = audit::audited(store, "cli jobs retry", &format!("id={id}"), done).await?;
            (job, out)
        }
        JobsCommand::Cancel {
            id: Some(id),
            bulk,
            out,
        } if bulk.is_empty() => {
            let id = parse_id(&id)?;
            let done = client.cancel(id).await;
            let store = &**client.store();
            let job = audit::audited(store, "cli jobs cancel", &format!("id={id}"), done).await?;
            (job, out)
        }
        JobsCommand::Retry { id: Some(_), .. } | JobsCommand::Cancel { id: Some(_), .. } => {
            anyhow::bail!(
                "give either a job id or a filter (--state, --queue, --task, --yes), not both"
            )
        }
        JobsCommand::Retry {
            id: None,
            bulk,
            out,
        } => return run_bulk(&client, homing::bulk::Action::Retry, bulk, out).await,
        JobsCommand::Cancel {
            id: None,
            bulk,
            out,
        } => return run_bulk(&client, homing::bulk::Action::Cancel, bulk, out).await,
        JobsCommand::Delete { bulk, out } => {
            return run_bulk(&client, homing::bulk::Action::Delete, bulk, out).await
        }
        JobsCommand::List {
            state,
            queue,
            task,
            id,
            created_from,
            created_to,
            args_path,
            args_value,
            args_contains,
            limit,
            cursor,
            out,
        } => {
            if limit == 0 || limit > 1000 {
                anyhow::bail!("--limit must be between 1 and 1000");
            }
            // The same checks as `GET /v1/jobs`, with the reasons naming the flags.
            let search = homing::search::JobSearch::parse(&homing::search::RawSearch {
                id: id.as_deref(),
                state: state.as_deref(),
                queue: queue.as_deref(),
                task: task.as_deref(),
                created_from: created_from.as_deref(),
                created_to: created_to.as_deref(),
                args_path: args_path.as_deref(),
                args_value: args_value.as_deref(),
                args_contains: args_contains.as_deref(),
            })
            .map_err(|e| anyhow::anyhow!("{}", as_flags(&e)))?;
            let cursor = cursor.filter(|c| !c.is_empty());
            if let Some(c) = &cursor {
                if c.parse::<JobId>().is_err() {
                    anyhow::bail!(
                        "--cursor must be the next_cursor printed by a previous page, not '{}'",
                        c.chars().take(40).collect::<String>()
                    );
                }
            }
            let page = client.search(&search, cursor.as_deref(), limit).await?;
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
                match page.next_cursor {
                    Some(c) => {
                        outln!("next_cursor: {c} (next page: the same command with --cursor {c})")
                    }
                    None => {
                        outln!("next_cursor: none (last page)")
                    }
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
            QueuesCommand::Limit {
                queue,
                concurrency,
                rate,
                key_arg,
                clear,
            } => {
                let limits = homing::limit::QueueLimits {
                    concurrency,
                    rate,
                    key_arg,
                };
                if !clear && !limits.is_limited() {
                    anyhow::bail!(
                        "say --concurrency N and/or --rate COUNT/PERIOD, or --clear to remove the limits"
                    );
                }
                homing::validate::producer_queue(&queue).map_err(anyhow::Error::msg)?;
                limits.check().map_err(anyhow::Error::msg)?;
                let b = open(g).await?;
                let client = homing::Client::new(b.broker.clone(), b.store.clone());
                let done = client.set_queue_limits(&queue, &limits).await;
                let target = format!("queue={queue}&limits={}", describe_limits(&limits));
                audit::audited(&*b.store, "cli queues limit", &target, done).await?;
                outln!("{queue}: {}", describe_limits(&limits));
                return Ok(ExitCode::SUCCESS);
            }
        };
        // Checked before anything is opened, so a bad name gets its own reason.
        homing::validate::producer_queue(&queue).map_err(anyhow::Error::msg)?;
        let b = open(g).await?;
        let client = homing::Client::new(b.broker.clone(), b.store.clone());
        let (done, action, word) = if pause {
            (
                client.pause_queue(&queue).await,
                "cli queues pause",
                "paused",
            )
        } else {
            (
                client.resume_queue(&queue).await,
                "cli queues resume",
                "resumed",
            )
        };
        let target = format!("queue={queue}");
        audit::audited(&*b.store, action, &target, done).await?;
        outln!("{word} {queue}");
        return Ok(ExitCode::SUCCESS);
    }
    let out = a.out;
    let b = open(g).await?;
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
                if q.limits.is_limited() {
                    describe_limits(&q.limits)
                } else {
                    String::new()
                },
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
            "limits",
        ],
        rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// A queue's limits in one line, as `homing queues` shows them.
pub fn describe_limits(l: &homing::limit::QueueLimits) -> String {
    if !l.is_limited() {
        return "no limits".into();
    }
    let mut parts = Vec::new();
    if let Some(n) = l.concurrency {
        parts.push(format!("concurrency {n}"));
    }
    if let Some(r) = &l.rate {
        parts.push(format!("rate {r}"));
    }
    if let Some(k) = &l.key_arg {
        parts.push(format!("per {k}"));
    }
    parts.join(", ")
}

pub async fn workers(g: &Global, a: WorkersArgs) -> anyhow::Result<ExitCode> {
    let b = open(g).await?;
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
    let t = homing::time::now();
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
                r.info.version.clone().unwrap_or_else(|| "-".into()),
                r.info.queues.join(","),
                r.info.concurrency.to_string(),
                r.running.len().to_string(),
                heartbeat_cell(w),
                match r.ended_at {
                    Some(at) => format!(
                        "{} {:.0}s ago{}",
                        r.status,
                        ((t - at).max(0) as f64) / 1e6,
                        match r.reclaimed.len() {
                            0 => String::new(),
                            1 => ", 1 job reclaimed".into(),
                            n => format!(", {n} jobs reclaimed"),
                        }
                    ),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    output::table(
        &[
            "worker",
            "status",
            "version",
            "queues",
            "concurrency",
            "running",
            "heartbeat age / ttl",
            "ended",
        ],
        rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// How long the CLI's bulk action works between two progress lines.
const BULK_PART: std::time::Duration = std::time::Duration::from_secs(2);

/// What liveness compares: the heartbeat's age against the TTL the worker registered with.
fn heartbeat_cell(w: &views::WorkerView) -> String {
    let ttl = w.heartbeat_ttl_s.map(|s| format!("{s:.1}s"));
    match (w.heartbeat_age_s, w.heartbeat_expires_in_s, ttl) {
        (Some(age), _, Some(ttl)) => format!("{age:.1}s / {ttl}"),
        // A worker registered before the TTL was recorded: only the time left is known.
        (None, Some(left), _) => format!("expires in {left:.1}s"),
        (None, None, Some(ttl)) => format!("- / {ttl}"),
        _ => "-".into(),
    }
}

/// A bulk action from the CLI: counts the matching jobs, asks for confirmation on a terminal
/// (refuses without --yes when nobody can answer), then runs it and prints what it did.
async fn run_bulk(
    client: &Client,
    action: homing::bulk::Action,
    bulk: crate::cli::BulkArgs,
    out: crate::cli::OutputArgs,
) -> anyhow::Result<ExitCode> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    let state = bulk
        .state
        .as_deref()
        .map(|s| s.parse::<JobState>())
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let filter = JobFilter {
        state,
        queue: bulk.queue,
        task: bulk.task,
    };
    homing::bulk::check(action, &filter).map_err(anyhow::Error::msg)?;
    // The filter as the audit entry names it, `state=failed&task=x` (docs/access.md).
    let target = [
        ("state", filter.state.map(|s| s.to_string())),
        ("queue", filter.queue.clone()),
        ("task", filter.task.clone()),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
    .collect::<Vec<_>>()
    .join("&");
    let matching = client.count(&filter).await?;
    let verb = action.as_str();
    let audit_action = format!("cli jobs {verb}");
    let store = &**client.store();
    if !bulk.yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "{matching} jobs match; pass --yes to {verb} them without a prompt (stdin is not a terminal)"
            );
        }
        eprint!("{matching} jobs match; {verb} them? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing done");
            return Ok(ExitCode::FAILURE);
        }
    }
    // In parts of a few seconds, each committed before the next, so a long action shows its
    // progress and, if it is stopped, says truthfully how far it got (docs/bulk.md).
    let mut done = homing::bulk::Outcome::default();
    let mut cursor: Option<String> = None;
    loop {
        let part = match client
            .bulk_part(action, &filter, cursor.as_deref(), BULK_PART)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                // Recorded with what was done before it stopped.
                let e = anyhow::Error::from(e);
                let status = audit::failure(&e);
                audit::record(store, &audit_action, &target, status, Some(done.count)).await;
                anyhow::bail!(
                    "{verb} stopped after {} jobs: {e}; running the same command again is safe and finishes it",
                    done.count
                )
            }
        };
        done.count += part.done.count;
        done.skipped += part.done.skipped;
        match part.next {
            Some(c) => {
                if !out.json {
                    eprintln!("{verb}: {} jobs so far…", done.count);
                }
                cursor = Some(c);
            }
            None => break,
        }
    }
    audit::record(store, &audit_action, &target, 200, Some(done.count)).await;
    if out.json {
        output::json(&serde_json::json!({
            "action": verb,
            "count": done.count,
            "skipped": done.skipped,
        }));
    } else {
        outln!(
            "{verb}: {} jobs ({} skipped: changed by someone else meanwhile, or workflow steps)",
            done.count,
            done.skipped
        );
    }
    Ok(ExitCode::SUCCESS)
}
