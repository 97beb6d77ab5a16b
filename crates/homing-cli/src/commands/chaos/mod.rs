//! `homing chaos`: proves the guarantees of docs/design.md section 1 on a real deployment instead of
//! asserting them. It starts a server and worker processes on this machine (and its own
//! redis-server and PostgreSQL in the distributed modes), pushes a steady load of jobs that call
//! an external counter with their idempotency key, injects faults on a seeded schedule, lets the
//! system drain, and then checks the store, the counter and the logs against the invariants.
//! Any violation makes the exit code non-zero.
//!
//! One file per part: [`deployment`] (the processes), [`services`] (Redis, PostgreSQL),
//! [`child`] (processes that die with the tool), [`proxy`] (the cuttable network), [`counter`]
//! (the witness), [`load`], [`hostile`] (refused input beside the load), [`faults`],
//! [`invariants`], [`rollups`] (the charts' rollups against the jobs), [`report`].

pub(crate) mod child;
mod counter;
mod counts;
mod crashes;
mod deployment;
mod faults;
mod hostile;
mod invariants;
mod limited;
mod load;
mod proxy;
mod report;
mod rollups;
pub(crate) mod services;
mod slots;
mod timeline;

/// A job record as the API returns it, for the checks' unit tests.
#[cfg(test)]
fn test_job(id: homing::JobId, task: &str, queue: &str, state: homing::JobState) -> homing::Job {
    serde_json::from_value(serde_json::json!({
        "id": id,
        "task": task,
        "queue": queue,
        "state": state,
        "args": {},
        "attempts": 0,
        "crashes": 0,
        "epoch": 1,
        "max_crashes": 3,
        "priority": 0,
        "created_at": "2026-01-01T00:00:00Z",
        "scheduled_at": null,
        "started_at": null,
        "finished_at": null,
        "cancel_requested": false,
    }))
    .expect("a job")
}

/// A timeline entry of run `epoch`, for the checks' unit tests.
#[cfg(test)]
fn test_entry(
    kind: homing::history::Kind,
    state: homing::JobState,
    at: homing::time::Micros,
    epoch: u64,
    crashes: u32,
) -> homing::history::Entry {
    homing::history::Entry {
        at,
        kind,
        state,
        epoch: Some(epoch),
        worker: Some("w".into()),
        attempts: 0,
        crashes,
        message: None,
        data: None,
    }
}

use anyhow::{bail, Context as _};
use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::cli::{ChaosArgs, Global};
use crate::output::outln;
use deployment::{BrokerChoice, Deployment, Plan, StoreChoice, Workers};
use homing::redact::redact_url;
use homing::store::JobFilter;
use homing::{Backends, Client, Job};

fn broker_choice(url: &str) -> BrokerChoice {
    match url {
        u if u == homing::DEFAULT_URL || u == "embedded" || u == "sqlite" => BrokerChoice::Embedded,
        "redis" => BrokerChoice::Redis,
        u => BrokerChoice::Url(u.to_string()),
    }
}

fn store_choice(url: &str) -> StoreChoice {
    match url {
        u if u == homing::DEFAULT_URL || u == "embedded" || u == "sqlite" => StoreChoice::Embedded,
        "postgres" | "postgresql" => StoreChoice::Postgres,
        u => StoreChoice::Url(u.to_string()),
    }
}

/// Every job of `queue`, or of every queue.
async fn all_jobs(client: &Client, queue: Option<&str>) -> anyhow::Result<Vec<Job>> {
    let filter = JobFilter {
        queue: queue.map(str::to_string),
        ..Default::default()
    };
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client.list(&filter, cursor.as_deref(), 1000).await?;
        out.extend(page.jobs);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(out),
        }
    }
}

/// Whether the schedule has enqueued the last whole-second tick at or before `until`.
async fn ticks_reach(client: &Client, until: homing::time::Micros) -> bool {
    all_jobs(client, Some(invariants::TICK_QUEUE))
        .await
        .is_ok_and(|jobs| {
            jobs.iter()
                .filter_map(|j| j.scheduled_tick)
                .any(|t| t + 1_000_000 > until)
        })
}

/// Waits until the store holds no unfinished job of `queue` and at least `want` finished ones.
async fn drain(
    b: &Backends,
    d: &mut Deployment,
    want: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let stats = b.store.queue_stats().await.ok();
        // The limited queue's jobs must finish too (they are checked by `limited::check`).
        let limited_open = stats.as_ref().map_or(0, |s| {
            s.iter()
                .filter(|s| s.queue == limited::QUEUE)
                .map(|q| q.scheduled + q.queued + q.running)
                .sum()
        });
        if let Some(q) = stats.and_then(|s| s.into_iter().find(|s| s.queue == d.plan.queue)) {
            let open = q.scheduled + q.waiting + q.queued + q.running + limited_open;
            let done = q.succeeded + q.failed + q.dead + q.cancelled;
            if open == 0 && done as usize >= want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("drain timed out after {limit:?}: {open} jobs still open, {done} finished of {want}");
            }
        } else if Instant::now() > deadline {
            bail!("drain timed out after {limit:?}: the store did not answer");
        }
        supervise(d)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Restarts any worker that exited on its own, as systemd or Kubernetes would.
fn supervise(d: &mut Deployment) -> anyhow::Result<usize> {
    let mut n = 0;
    for slot in 0..d.slots.len() {
        if !d.slots[slot].paused && d.slots[slot].proc.exited() {
            eprintln!(
                "chaos: worker slot {slot} exited on its own; restarting it (see {})",
                d.slots[slot].proc.log.display()
            );
            d.restart_slot(slot)?;
            n += 1;
        }
    }
    Ok(n)
}

pub async fn run(g: &Global, a: ChaosArgs) -> anyhow::Result<ExitCode> {
    let seed = a
        .seed
        .unwrap_or_else(|| homing::time::now() as u64 % 1_000_000);
    let limit = a.duration + a.drain_limit + Duration::from_secs(120);
    let run = execute(g, a, seed);
    let report = tokio::select! {
        r = tokio::time::timeout(limit, run) => match r {
            Ok(r) => r?,
            Err(_) => bail!("the chaos run exceeded its time bound of {limit:?}; everything it started was stopped"),
        },
        _ = tokio::signal::ctrl_c() => {
            eprintln!("chaos: interrupted; every process it started is stopped and its directory removed");
            return Ok(ExitCode::from(130));
        }
    };
    Ok(report)
}

async fn execute(g: &Global, a: ChaosArgs, seed: u64) -> anyhow::Result<ExitCode> {
    let queue = "chaos".to_string();
    let kind = match a.worker_kind {
        crate::cli::ChaosWorkerKind::Rust => Workers::Rust,
        crate::cli::ChaosWorkerKind::Python => {
            Workers::Python(deployment::find_python(a.python.clone())?)
        }
    };
    let python = matches!(kind, Workers::Python(_));
    let task = if python {
        deployment::PYTHON_TASK
    } else {
        "builtin.http"
    };
    let plan = Plan {
        kind,
        broker: broker_choice(&g.broker),
        store: store_choice(&g.store),
        workers: a.workers,
        concurrency: a.concurrency,
        heartbeat: a.heartbeat_interval,
        queue: queue.clone(),
        pg_fsync: !a.pg_fsync_off,
    };
    if !a.json {
        eprintln!("chaos: seed {seed}; starting the deployment");
    }
    let mut d = Deployment::start(plan).await?;
    let b = Backends::open(&d.broker_url, &d.store_url)
        .await
        .context("cannot open the deployment's backends")?;
    let client = Client::new(b.broker.clone(), b.store.clone());
    let counter = counter::Counter::start().await?;
    d.wait_ready(&b, Duration::from_secs(60)).await?;
    // The schedule every process of the deployment runs, checked by `invariants::check_ticks`.
    client
        .set_schedule(&homing::schedule::ScheduleDef {
            name: invariants::TICK_SCHEDULE.into(),
            task: "builtin.noop".into(),
            args: serde_json::json!({}),
            queue: invariants::TICK_QUEUE.into(),
            options: homing::JobOptions::default(),
            spec: homing::schedule::Spec::Every {
                interval: Duration::from_secs(1),
            },
            missed: homing::schedule::Missed::All(homing::schedule::MAX_CATCH_UP),
        })
        .await
        .context("cannot set the deployment's schedule")?;

    limited::configure(&client)
        .await
        .context("cannot set the limited queue's limit")?;

    let ttl = a.heartbeat_interval * 3;
    // Not on a file of the user's own (a sqlite:// URL): only the deployment's.
    let embedded = matches!(d.plan.broker, deployment::BrokerChoice::Embedded);
    let mut kinds = faults::applicable(d.redis.is_some(), d.pg.is_some(), python, embedded);
    if let Some(only) = &a.faults {
        let want: Vec<&str> = only.split(',').map(str::trim).collect();
        kinds.retain(|k| want.contains(&k.name()));
        if kinds.is_empty() {
            bail!("--faults {only}: none of these applies to the chosen backends");
        }
    }
    let schedule = faults::schedule(seed, &kinds, a.workers, ttl, a.duration, a.fault_every);

    let accepted = Arc::new(Mutex::new(load::Accepted::default()));
    let stop_load = CancellationToken::new();
    let load_task = tokio::spawn(load::run(
        client.clone(),
        load::LoadPlan {
            task: task.to_string(),
            rate: a.rate,
            url: counter.url(a.job_ms),
            queue: queue.clone(),
            max_crashes: a.max_crashes,
        },
        accepted.clone(),
        stop_load.clone(),
    ));

    let limited_ids = Arc::new(Mutex::new(Vec::new()));
    let limited_task = tokio::spawn(limited::run(
        client.clone(),
        // Long enough that a burst overlaps: without the limit, four calls would be in flight.
        counter.limited_url(a.job_ms.max(200)),
        task,
        a.max_crashes,
        limited_ids.clone(),
        stop_load.clone(),
    ));

    let hostile_out = Arc::new(Mutex::new(hostile::Outcome::default()));
    let hostile_task = tokio::spawn(hostile::run(
        d.api_url.clone(),
        a.hostile_rate,
        hostile_out.clone(),
        stop_load.clone(),
    ));

    let t0 = Instant::now();
    let mut injected = Vec::new();
    let mut restarts = 0;
    for p in &schedule {
        let at = Duration::from_millis(p.at_ms);
        while t0.elapsed() < at {
            restarts += supervise(&mut d)?;
            // Restarting a dead process can carry the clock past `at`.
            tokio::time::sleep(
                at.saturating_sub(t0.elapsed())
                    .min(Duration::from_millis(100)),
            )
            .await;
        }
        let f = faults::inject(p, &mut d, &b, &counter).await?;
        if !a.json {
            eprintln!(
                "chaos: {:>6.1}s {} {}({} jobs running on the target) {}",
                t0.elapsed().as_secs_f64(),
                f.kind.name(),
                f.slot.map(|s| format!("slot {s} ")).unwrap_or_default(),
                f.running.len(),
                f.note
            );
        }
        injected.push(f);
    }
    while t0.elapsed() < a.duration {
        restarts += supervise(&mut d)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_load.cancel();
    // Every tick up to a second before now must have its job once the deployment settles.
    let ticks_until = homing::time::now() - 1_000_000;
    let _ = load_task.await;
    let _ = hostile_task.await;
    let _ = limited_task.await;
    let limited_ids = std::mem::take(&mut *limited_ids.lock().unwrap_or_else(|p| p.into_inner()));
    let load_s = t0.elapsed().as_secs_f64();
    let (ids, enqueue_errors, workflows) = {
        let g = accepted.lock().unwrap_or_else(|p| p.into_inner());
        (g.ids.clone(), g.enqueue_errors, g.workflows.clone())
    };
    if !a.json {
        eprintln!(
            "chaos: load stopped after {load_s:.1}s ({} jobs accepted); draining",
            ids.len()
        );
    }
    let t_drain = Instant::now();
    let drained = drain(&b, &mut d, ids.len(), a.drain_limit).await;
    let drain_s = t_drain.elapsed().as_secs_f64();
    if let Err(e) = &drained {
        eprintln!("chaos: {e}");
    }
    // The schedule catches up on its own time: a store that failed near the end of the load
    // puts its loop in a back-off of up to 10 s, which may outlast the drain. Its ticks are
    // waited for (within the drain limit), as the drain waits for the jobs.
    let ticks_deadline = t_drain + a.drain_limit;
    while Instant::now() < ticks_deadline && !ticks_reach(&client, ticks_until).await {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    d.stop_homing();
    let job_count_violations = counts::check(&*b.store).await;
    let depth_violations = counts::check_broker(&*b.broker).await;
    let kept_counts = report::KeptCounts {
        job_counts_drifted: job_count_violations.len(),
        broker_depths_drifted: depth_violations.len(),
    };
    let jobs = all_jobs(&client, Some(&queue)).await?;
    let every_job = all_jobs(&client, None).await?;
    let stats_rollups = match rollups::check(&b, &every_job).await {
        Ok(o) => o,
        Err(e) => rollups::Outcome {
            violations: vec![format!("the stats rollup check could not run: {e:#}")],
            ..Default::default()
        },
    };
    let ticks = invariants::check_ticks(&every_job, ticks_until);
    // Every job a worker ran counts against its slots: the load's, the limited queue's, the
    // schedule's ticks, workflow steps.
    // Every timeline is read once, here: the at-risk bound needs every job's, the timeline check
    // the load's.
    let histories = timeline::read(&client, &every_job).await?;
    let (runs, truncated) = slots::runs(histories.values());
    let presumed_dead: HashMap<String, homing::time::Micros> = client
        .store()
        .workers(0)
        .await?
        .into_iter()
        .filter_map(|w| Some((w.info.id, w.presumed_dead_at?)))
        .collect();
    let crashes = crashes::check(&histories, &presumed_dead);
    let not_ticks: Vec<homing::Job> = every_job
        .into_iter()
        .filter(|j| j.schedule.as_deref() != Some(invariants::TICK_SCHEDULE))
        .collect();
    // The limited queue's jobs are the load's too, not hostile ones.
    let not_ticks: Vec<homing::Job> = not_ticks
        .into_iter()
        .filter(|j| j.queue != limited::QUEUE || j.task != task)
        .collect();
    let hostile_stored = hostile::stored(&not_ticks, &queue, task);
    let mut logs = d.worker_logs.clone();
    logs.push(d.dir.join("server.log"));
    let mut facts = invariants::read_logs(&logs);
    let presumptions_logged = facts.presumed_dead.len();
    // The store's presumptions too: a rescuer killed between its presumption's commit and the
    // log line leaves only the store's record, and a zombie call after it is still explained.
    facts.presumed_dead.extend(presumed_dead.values().copied());
    let settle = homing::time::micros(ttl + Duration::from_secs(3));
    // The limited queue's jobs: those accepted, and any the store took although its answer was
    // lost (a burst whose enqueue failed as PostgreSQL restarted, yet committed), like the load's.
    let limited_jobs = all_jobs(&client, Some(limited::QUEUE)).await?;
    let limited_ids = limited::with_unanswered(limited_ids, &limited_jobs, task);
    let mut calls = counter.snapshot();
    // The limited queue's calls are checked by `limited::check`, against its own jobs.
    for id in &limited_ids {
        calls.remove(&id.to_string());
    }
    let f = invariants::check(&ids, &jobs, &calls, &facts, &injected, settle);
    let workflow_violations = invariants::check_workflows(&workflows, &jobs, &calls, &histories);
    let (timeline_violations, timelines) = timeline::check(&client, &jobs, &histories).await?;
    if !a.json {
        eprintln!("chaos: {timelines} job timelines checked against their rows");
    }
    let limited = limited::check(
        &counter.limited_calls(),
        &limited_jobs,
        &limited_ids,
        &injected,
        &facts.presumed_dead,
        settle,
    );
    counter.shutdown();
    let slots = slots::check(
        &runs,
        truncated,
        a.concurrency,
        python,
        &injected,
        settle + homing::time::micros(ttl),
    );

    let mut fault_counts: BTreeMap<String, usize> =
        kinds.iter().map(|k| (k.name().to_string(), 0)).collect();
    for i in &injected {
        *fault_counts.entry(i.kind.name().to_string()).or_default() += 1;
    }
    if restarts > 0 {
        fault_counts.insert("unplanned_worker_exits".into(), restarts);
    }
    let mut settings = BTreeMap::new();
    if d.broker_url.starts_with("sqlite:") || d.store_url.starts_with("sqlite:") {
        settings.insert(
            "sqlite".to_string(),
            "WAL, synchronous=NORMAL (the embedded file)".to_string(),
        );
    }
    if d.redis.is_some() {
        settings.insert("redis".into(), services::REDIS_SETTINGS.into());
    }
    if let Some(pg) = &d.pg {
        settings.insert("postgres".into(), pg.settings());
    }
    settings.insert(
        "job".into(),
        format!(
            "{} to the counter, answered after {} ms; max_crashes {}; {} hostile requests/s",
            if python {
                "chaos.call (Python worker over the remote protocol, httpx)"
            } else {
                "builtin.http"
            },
            a.job_ms,
            a.max_crashes,
            a.hostile_rate
        ),
    );
    let succeeded = jobs
        .iter()
        .filter(|j| j.state == homing::JobState::Succeeded)
        .count();
    let mut violations = f.violations.clone();
    violations.extend(workflow_violations);
    violations.extend(timeline_violations);
    if workflows.is_empty() && !ids.is_empty() {
        violations.push("no workflow was created: the workflow load never ran".into());
    }
    let mut hostile = std::mem::take(&mut *hostile_out.lock().unwrap_or_else(|p| p.into_inner()));
    let kills: Vec<_> = injected
        .iter()
        .filter(|f| f.kind == faults::Kind::ServerKill)
        .map(|f| (f.at, f.end))
        .collect();
    let unexplained = hostile.unexplained(&kills);
    hostile.violations.extend(unexplained);
    violations.extend(hostile.violations.iter().take(20).cloned());
    violations.extend(hostile_stored.iter().take(20).cloned());
    violations.extend(ticks.violations.iter().take(20).cloned());
    violations.extend(limited.violations.iter().cloned());
    violations.extend(slots.violations.iter().cloned());
    violations.extend(crashes.violations.iter().cloned());
    violations.extend(job_count_violations);
    violations.extend(depth_violations);
    violations.extend(stats_rollups.violations.iter().cloned());
    if a.hostile_rate > 0.0 && hostile.sent == 0 {
        violations.push("no hostile request was sent: the hostile load never ran".into());
    }
    if let Err(e) = drained {
        violations.insert(0, e.to_string());
    }
    if ids.is_empty() {
        violations.insert(0, "no job was accepted: the load never ran".into());
    }
    let ok = violations.is_empty()
        && f.lost == 0
        && f.completed_twice == 0
        && f.unexplained_duplicates == 0;
    let mut r = report::Report {
        ok,
        seed,
        duration_s: (load_s * 10.0).round() / 10.0,
        broker: redact_url(&d.broker_url),
        store: redact_url(&d.store_url),
        settings,
        workers: a.workers,
        worker_kind: if python { "python" } else { "rust" }.into(),
        concurrency: a.concurrency,
        heartbeat_ms: a.heartbeat_interval.as_millis() as u64,
        target_rate_per_s: a.rate,
        jobs: f.jobs,
        accepted: ids.len(),
        enqueue_errors,
        hostile_sent: hostile.sent,
        hostile_refused: hostile.answers.clone(),
        hostile_violations: hostile.violations.len() + hostile_stored.len(),
        succeeded_per_s: (succeeded as f64 / load_s).round(),
        faults: fault_counts,
        lost: f.lost,
        lost_by_state: f.lost_by_state.clone(),
        completed_twice: f.completed_twice,
        zombie_writes_rejected: facts.zombie_rejected,
        duplicate_calls: f.duplicate_calls,
        duplicate_causes: f.duplicate_causes.clone(),
        unexplained_duplicates: f.unexplained_duplicates,
        counter_calls: counter.total(),
        reclaimed: facts.reclaimed,
        broker_data_lost_events: facts.broker_data_lost,
        strays_put_back: facts.strays_put_back,
        presumed_dead_events: presumptions_logged,
        recovery_s: report::summary(f.recovery.iter().map(|(_, s)| *s).collect()),
        drain_s: (drain_s * 10.0).round() / 10.0,
        schedule: ticks,
        limited,
        slots,
        crashes,
        stats_rollups,
        kept_counts,
        violations,
        kept_dir: None,
    };
    if let Some(dir) = d.teardown(a.keep) {
        r.kept_dir = Some(dir.display().to_string());
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        r.print_human();
        if let Some(dir) = &r.kept_dir {
            outln!("logs and data kept in {dir}");
        }
    }
    Ok(if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
