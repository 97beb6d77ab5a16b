//! One module per command; this one opens backends and routes.

mod audit;
mod bench;
mod celery;
mod chaos;
mod enqueue;
mod enqueue_file;
mod input;
mod inspect;
mod migrate;
mod schedules;
mod serve;

use anyhow::Context as _;
use std::process::ExitCode;

use crate::cli::{Cli, Command, Global};
use homing::redact::redact_url;
use homing::Backends;

/// Opens the broker and store for a one-shot command (enqueue, jobs, queues, ...). It refuses
/// to create an embedded database that does not exist yet, so a typo in the directory is an
/// error, not an empty system, and it does not read every page of the file first
/// (`sqlite_check_pages`): at a million jobs that check alone took a second of each command.
pub async fn open(g: &Global) -> anyhow::Result<Backends> {
    for url in [&g.store, &g.broker] {
        if let Some(path) = homing::sqlite::path_from_url(url) {
            if !path.exists() {
                anyhow::bail!(
                    "no homing database at {} (start `homing up` in this directory first, or pass --store/--broker)",
                    path.display()
                );
            }
        }
    }
    open_with(g, false, false).await
}

/// Opens the broker and store for a process that serves (`up`, `server`, `worker`): an
/// embedded file is created if missing and refused if damaged, and its calls may run on the
/// caller's thread when `calls_here` and the runtime has one (`homing worker` by default;
/// docs/fastpath.md, item 15).
pub async fn open_to_serve(g: &Global, calls_here: bool) -> anyhow::Result<Backends> {
    open_with(g, true, calls_here).await
}

async fn open_with(g: &Global, check_pages: bool, calls_here: bool) -> anyhow::Result<Backends> {
    let options = homing::backend::OpenOptions {
        max_queues: g.max_queues,
        sqlite_calls_here: calls_here,
        sqlite_check_pages: check_pages,
    };
    Backends::open_with(&g.broker, &g.store, &options)
        .await
        .with_context(|| {
            format!(
                "cannot open broker {} / store {}",
                redact_url(&g.broker),
                redact_url(&g.store)
            )
        })
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let g = cli.global;
    // Before anything can make a request: the HTTP clients bind the policy when first used.
    homing::egress::install(crate::config::egress_policy(&g.store)?);
    match cli.command {
        Command::Up(a) => serve::up(&g, a).await,
        Command::Server(a) => serve::server(&g, a).await,
        Command::Worker(a) => serve::worker(&g, a).await,
        Command::Enqueue(a) => enqueue::run(&g, a).await,
        Command::Jobs { command } => inspect::jobs(&g, command).await,
        Command::Workflows { command } => inspect::workflows(&g, command).await,
        Command::Queues(a) => inspect::queues(&g, a).await,
        Command::Workers(a) => inspect::workers(&g, a).await,
        Command::Schedules { command } => schedules::run(&g, command).await,
        Command::Bench(a) => bench::run(&g, a).await,
        Command::Chaos(a) => chaos::run(&g, a).await,
        Command::Migrate(a) => migrate::run(&g, a).await,
    }
}
