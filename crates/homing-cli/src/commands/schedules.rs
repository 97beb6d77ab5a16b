//! `homing schedules …`: set, list, pause, resume and delete periodic schedules
//! (docs/schedules.md). Flags are checked by clap (names, cron, time zone, interval, policy);
//! what only the whole definition can tell is checked by `homing::client::check_schedule`, the
//! same rules as the HTTP API's.

use anyhow::Context as _;
use std::process::ExitCode;

use super::audit::{audited, NotFound};
use super::open;
use crate::cli::{Global, ScheduleSetArgs, SchedulesCommand};
use crate::output::{self, outln};
use homing::schedule::{ScheduleDef, ScheduleView, Spec};
use homing::time::{now, rfc3339};
use homing::JobOptions;

pub async fn run(g: &Global, cmd: SchedulesCommand) -> anyhow::Result<ExitCode> {
    let b = open(g).await?;
    let store = b.store.clone();
    match cmd {
        SchedulesCommand::Set(a) => {
            let json = a.json;
            let allow_unknown_task = a.allow_unknown_task;
            let def = definition(a)?;
            homing::client::check_schedule(&def)?;
            if !allow_unknown_task && !homing::client::keeps_task(&*store, &def).await? {
                let registry = crate::tasks::registry(&crate::pipelines::for_routing());
                super::enqueue::require_known(&*store, &registry, &def.task).await?;
            }
            let target = format!("name={}", def.name);
            let put = store.put_schedule(&def, now()).await;
            let s = audited(&*store, "cli schedules set", &target, put).await?;
            if json {
                output::json(&ScheduleView::from(s));
            } else {
                outln!("{}", s.def.name);
            }
        }
        SchedulesCommand::List(out) => {
            // A page at a time, a schedule may carry 1 MiB of args: the table keeps only its
            // rows' text (the JSON form prints every schedule whole, as asked).
            let mut all: Vec<ScheduleView> = Vec::new();
            let mut rows = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let page = store.schedules_page(after.as_deref(), 1000).await?;
                let views = page.schedules.into_iter().map(ScheduleView::from);
                if out.json {
                    all.extend(views);
                } else {
                    rows.extend(views.map(|v| row(&v)));
                }
                after = page.next;
                if after.is_none() {
                    break;
                }
            }
            if out.json {
                output::json(&all);
            } else {
                output::table(
                    &[
                        "name", "task", "queue", "when", "missed", "state", "next", "last", "job",
                    ],
                    rows,
                );
            }
        }
        SchedulesCommand::Pause { name } => {
            let done = found(store.pause_schedule(&name, true, now()).await, &name);
            audited(
                &*store,
                "cli schedules pause",
                &format!("name={name}"),
                done,
            )
            .await?;
            outln!("paused {name}");
        }
        SchedulesCommand::Resume { name } => {
            let done = found(store.pause_schedule(&name, false, now()).await, &name);
            audited(
                &*store,
                "cli schedules resume",
                &format!("name={name}"),
                done,
            )
            .await?;
            outln!("resumed {name}");
        }
        SchedulesCommand::Delete { name } => {
            let done = found(
                store.delete_schedule(&name).await.map(|d| d.then_some(())),
                &name,
            );
            audited(
                &*store,
                "cli schedules delete",
                &format!("name={name}"),
                done,
            )
            .await?;
            outln!("deleted {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A write to the schedule `name`, which fails when there is none.
fn found<T>(v: homing::Result<Option<T>>, name: &str) -> anyhow::Result<T> {
    v?.ok_or_else(|| NotFound(format!("no schedule named '{name}'")).into())
}

fn definition(a: ScheduleSetArgs) -> anyhow::Result<ScheduleDef> {
    let args = super::input::read_args(&a.args).context("--args")?;
    let spec = match (a.cron, a.every) {
        (Some(expr), None) => Spec::Cron {
            expr,
            timezone: a.timezone,
        },
        (None, Some(interval)) => Spec::Every { interval },
        // clap's group makes exactly one of them present.
        _ => anyhow::bail!("give exactly one of --cron and --every"),
    };
    Ok(ScheduleDef {
        name: a.name,
        task: a.task,
        args,
        queue: a.queue,
        options: JobOptions {
            max_retries: a.max_retries,
            time_limit: a.time_limit,
            ..JobOptions::default()
        },
        spec,
        missed: a.missed,
    })
}

/// How a schedule's ticks fall, in a few words.
pub fn when(spec: &Spec) -> String {
    match spec {
        Spec::Cron { expr, timezone } => format!("cron {expr} ({timezone})"),
        Spec::Every { interval } => {
            format!("every {}", homing::time::format_duration(*interval))
        }
    }
}

fn row(v: &ScheduleView) -> Vec<String> {
    let s = &v.schedule;
    vec![
        s.def.name.clone(),
        s.def.task.clone(),
        s.def.queue.clone(),
        when(&s.def.spec),
        s.def.missed.to_string(),
        if s.paused { "paused" } else { "active" }.into(),
        v.next_tick.map(rfc3339).unwrap_or_else(|| "-".into()),
        s.last_tick.map(rfc3339).unwrap_or_else(|| "-".into()),
        s.last_job
            .map(|j| j.to_string())
            .unwrap_or_else(|| "-".into()),
    ]
}
