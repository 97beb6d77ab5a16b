//! `homing bench`: the numbers users compare. Enqueues N jobs while W real worker processes
//! drain them, then measures from the job records themselves (created → started → finished), so
//! the figures include every state write. A second phase sends jobs one at a time to idle
//! workers for the unloaded enqueue→start latency; with `--kills`, a third kills a busy worker
//! with SIGKILL and times how long its jobs take to run again. `--backends` starts throwaway
//! servers (the chaos tool's) so every backend combination is measured the same way.

mod latency;

use anyhow::Context as _;
use serde::Serialize;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use super::chaos::services::{Postgres, Redis, REDIS_SETTINGS};
use crate::cli::{BenchArgs, Global};
use crate::output::{self, outln};
use homing::redact::redact_url;
use homing::store::{JobFilter, WorkerStatus};
use homing::{Backends, Client, EnqueueRequest, Job, JobState};

#[derive(Debug, Serialize)]
struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    jobs: usize,
    workers: usize,
    concurrency: usize,
    broker: String,
    store: String,
    work: String,
    /// The queue's cluster-wide limits during the run; empty when none.
    limits: homing::limit::QueueLimits,
    enqueue_per_s: f64,
    throughput_per_s: f64,
    latency_ms: Percentiles,
    idle_latency_ms: Percentiles,
    worker_rss_mb: Vec<f64>,
    /// Seconds from each kill -9 to the last of the killed worker's jobs running again.
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery_s: Option<Recovery>,
    heartbeat_ms: u64,
    /// The persistence settings of the backends measured.
    settings: std::collections::BTreeMap<String, String>,
    elapsed_s: f64,
}

#[derive(Debug, Serialize)]
struct Recovery {
    median: f64,
    max: f64,
    kills: Vec<f64>,
}

fn percentiles(mut v: Vec<f64>) -> Percentiles {
    if v.is_empty() {
        return Percentiles {
            p50: 0.0,
            p99: 0.0,
            p999: 0.0,
        };
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| {
        let idx = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        (v[idx] * 100.0).round() / 100.0
    };
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
    }
}

fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((kb / 1024.0 * 10.0).round() / 10.0)
}

async fn all_jobs(client: &Client, queue: &str) -> anyhow::Result<Vec<Job>> {
    let filter = JobFilter {
        queue: Some(queue.to_string()),
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

async fn wait_done(b: &Backends, queue: &str, want: u64, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let stats = b.store.queue_stats().await?;
        let q = stats
            .iter()
            .find(|s| s.queue == queue)
            .cloned()
            .unwrap_or_default();
        let finished = q.succeeded + q.failed + q.dead + q.cancelled;
        if finished >= want {
            if q.failed + q.dead > 0 {
                anyhow::bail!(
                    "{} benchmark jobs failed or died; see the workers' log",
                    q.failed + q.dead
                );
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("benchmark timed out: {finished} of {want} jobs finished");
        }
        // Throughput is read from the job records, not from when this loop notices the end;
        // polling faster would only add a whole-table count to the load being measured.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub async fn run(g: &Global, a: BenchArgs) -> anyhow::Result<ExitCode> {
    if a.latency > 0 {
        return latency::run(g, &a).await;
    }
    let embedded_default = g.broker == homing::DEFAULT_URL && g.store == homing::DEFAULT_URL;
    if a.enqueue_only && embedded_default {
        anyhow::bail!(
            "--enqueue-only needs --broker and --store: the jobs must stay where workers started afterwards find them"
        );
    }
    let tmp = if embedded_default || a.backends.is_some() {
        Some(tempdir()?)
    } else {
        None
    };
    let mut settings = std::collections::BTreeMap::new();
    let mut redis = None;
    let mut pg = None;
    let (broker_url, store_url) = match (&tmp, a.backends.as_deref()) {
        (Some(dir), kind) => {
            let sqlite = format!("sqlite://{}/bench.db", dir.display());
            let broker = match kind {
                Some("redis-sqlite") | Some("redis-postgres") => {
                    let r = Redis::start(dir)?;
                    let url = Redis::url(r.port);
                    settings.insert("redis".to_string(), REDIS_SETTINGS.to_string());
                    redis = Some(r);
                    url
                }
                _ => sqlite.clone(),
            };
            let store = match kind {
                Some("redis-postgres") => {
                    let p = Postgres::start(dir, true)?;
                    let url = p.url();
                    settings.insert("postgres".to_string(), p.settings());
                    pg = Some(p);
                    url
                }
                _ => sqlite,
            };
            (broker, store)
        }
        (None, _) => (g.broker.clone(), g.store.clone()),
    };
    if broker_url.starts_with("sqlite:") || store_url.starts_with("sqlite:") {
        settings.insert("sqlite".to_string(), "WAL, synchronous=NORMAL".to_string());
    }
    let (task, args) = match a.work.as_str() {
        "noop" => ("builtin.noop", serde_json::json!({})),
        other => {
            let d =
                homing::time::parse_duration(other).map_err(|e| anyhow::anyhow!("--work: {e}"))?;
            (
                "builtin.sleep",
                serde_json::json!({ "ms": d.as_millis() as u64 }),
            )
        }
    };
    let backends = Backends::open(&broker_url, &store_url)
        .await
        .context("cannot open the benchmark's backends")?;
    let client = Client::new(backends.broker.clone(), backends.store.clone());
    let queue = format!("bench-{:08x}", fastrand_u32());
    let limits = homing::limit::QueueLimits {
        concurrency: a.limit_concurrency,
        rate: a.limit_rate,
        key_arg: None,
    };
    if limits.is_limited() {
        client.set_queue_limits(&queue, &limits).await?;
    }

    let exe = std::env::current_exe().context("cannot find the homing executable")?;
    let hb = format!("{}ms", a.heartbeat_interval.as_millis());
    let spawn_worker = || {
        let mut cmd = tokio::process::Command::new(&exe);
        super::chaos::child::dies_with_bench(&mut cmd);
        cmd.args([
            "worker",
            "--queue",
            &queue,
            "--concurrency",
            &a.concurrency.to_string(),
            "--heartbeat-interval",
            &hb,
        ])
        .args(["--broker", &broker_url, "--store", &store_url])
        .env(
            "HOMING_LOG",
            std::env::var("HOMING_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a worker process")
    };
    let mut children = Vec::new();
    let workers = if a.enqueue_only { 0 } else { a.workers };
    for _ in 0..workers {
        children.push(spawn_worker()?);
    }
    // Wait until every worker has registered, so the measurement starts with all of them up.
    let started = homing::time::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ws = backends.store.workers(started - 1_000_000).await?;
        let ready = ws
            .iter()
            .filter(|w| w.status == WorkerStatus::Live && w.info.queues.contains(&queue))
            .count();
        if ready >= workers {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {ready} of {} worker processes started within 30s",
                a.workers
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let t0 = Instant::now();
    let mut left = a.jobs;
    while left > 0 {
        let n = left.min(500);
        let reqs = (0..n)
            .map(|_| {
                let mut r = EnqueueRequest::new(task, args.clone());
                r.options.queue = Some(queue.clone());
                r
            })
            .collect();
        client.enqueue_many(reqs).await?;
        left -= n;
    }
    let enqueue_s = t0.elapsed().as_secs_f64();
    if a.enqueue_only {
        let rate = (a.jobs as f64 / enqueue_s).round();
        if a.json {
            let out = serde_json::json!({ "queue": queue, "jobs": a.jobs, "enqueue_per_s": rate });
            outln!("{out}");
        } else {
            outln!("enqueued {} jobs on queue {queue} at {rate} jobs/s", a.jobs);
        }
        return Ok(ExitCode::SUCCESS);
    }
    wait_done(&backends, &queue, a.jobs as u64, Duration::from_secs(3600)).await?;

    let loaded = all_jobs(&client, &queue).await?;
    let first_created = loaded.iter().map(|j| j.created_at).min().unwrap_or(0);
    let last_finished = loaded
        .iter()
        .filter_map(|j| j.finished_at)
        .max()
        .unwrap_or(0);
    let span_s = ((last_finished - first_created).max(1) as f64) / 1e6;
    let latency = |jobs: &[Job]| -> Vec<f64> {
        jobs.iter()
            .filter(|j| j.state == JobState::Succeeded)
            .filter_map(|j| j.started_at.map(|s| (s - j.created_at) as f64 / 1000.0))
            .collect()
    };
    let loaded_latency = latency(&loaded);

    // Idle phase: one job at a time into idle workers.
    let idle_queue_count = a.jobs + a.idle_samples;
    let mut idle_ids = Vec::new();
    for _ in 0..a.idle_samples {
        let mut r = EnqueueRequest::new(task, args.clone());
        r.options.queue = Some(queue.clone());
        idle_ids.push(client.enqueue(r).await?.id);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_done(
        &backends,
        &queue,
        idle_queue_count as u64,
        Duration::from_secs(600),
    )
    .await?;
    let mut idle_jobs = Vec::new();
    for id in &idle_ids {
        idle_jobs.push(client.get(*id).await?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss: Vec<f64> = children
        .iter()
        .filter_map(|c| c.id())
        .filter_map(rss_mb)
        .collect();

    let mut kills = Vec::new();
    for _ in 0..a.kills {
        kills.push(
            kill_and_time(&client, &queue, &mut children, a.concurrency, &spawn_worker).await?,
        );
    }

    for c in &children {
        if let Some(pid) = c.id() {
            let _ = crate::signals::terminate(pid);
        }
    }
    for c in &mut children {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }
    drop(backends);
    drop(redis);
    drop(pg);
    remove_scratch(tmp.as_deref(), a.keep);

    let report = Report {
        jobs: a.jobs,
        workers: a.workers,
        concurrency: a.concurrency,
        broker: redact_url(&broker_url),
        store: redact_url(&store_url),
        work: a.work.clone(),
        limits: limits.clone(),
        enqueue_per_s: (a.jobs as f64 / enqueue_s).round(),
        throughput_per_s: (a.jobs as f64 / span_s).round(),
        latency_ms: percentiles(loaded_latency),
        idle_latency_ms: percentiles(latency(&idle_jobs)),
        worker_rss_mb: rss,
        recovery_s: (!kills.is_empty()).then(|| {
            let mut v = kills.clone();
            v.sort_by(|a, b| a.total_cmp(b));
            Recovery {
                median: v[v.len() / 2],
                max: v[v.len() - 1],
                kills,
            }
        }),
        heartbeat_ms: a.heartbeat_interval.as_millis() as u64,
        settings,
        elapsed_s: (t0.elapsed().as_secs_f64() * 100.0).round() / 100.0,
    };
    if a.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        outln!(
            "homing bench: {} {} jobs, {} worker processes × concurrency {}",
            report.jobs,
            report.work,
            report.workers,
            report.concurrency
        );
        outln!("  broker {}  store {}", report.broker, report.store);
        output::table(
            &["measure", "value"],
            vec![
                vec!["enqueue".into(), format!("{} jobs/s", report.enqueue_per_s)],
                vec![
                    "throughput (enqueue → finished)".into(),
                    format!("{} jobs/s", report.throughput_per_s),
                ],
                vec![
                    "enqueue→start under load p50/p99/p99.9".into(),
                    format!(
                        "{} / {} / {} ms",
                        report.latency_ms.p50, report.latency_ms.p99, report.latency_ms.p999
                    ),
                ],
                vec![
                    "enqueue→start idle p50/p99/p99.9".into(),
                    format!(
                        "{} / {} / {} ms",
                        report.idle_latency_ms.p50,
                        report.idle_latency_ms.p99,
                        report.idle_latency_ms.p999
                    ),
                ],
                vec![
                    "idle worker RSS".into(),
                    format!("{:?} MB", report.worker_rss_mb),
                ],
                vec![
                    "recovery after kill -9 (median / max)".into(),
                    match &report.recovery_s {
                        Some(r) => {
                            format!("{} / {} s over {} kills", r.median, r.max, r.kills.len())
                        }
                        None => "not measured (--kills N)".into(),
                    },
                ],
            ],
        );
        for (k, v) in &report.settings {
            outln!("  {k}: {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fastrand_u32() -> u32 {
    let n = homing::job::new_job_id();
    let b = n.as_bytes();
    u32::from_le_bytes([b[12], b[13], b[14], b[15]])
}

/// The run's throwaway database directory: deleted, or kept and named with `--keep`.
fn remove_scratch(dir: Option<&std::path::Path>, keep: bool) {
    let Some(dir) = dir else { return };
    if keep {
        eprintln!("kept the benchmark database in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "homing-bench-{}-{:08x}",
        std::process::id(),
        fastrand_u32()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Gives the workers long jobs, kills with SIGKILL a worker that is running some, restarts it
/// as a supervisor would, and returns the seconds until the last of its jobs started again.
async fn kill_and_time(
    client: &Client,
    queue: &str,
    children: &mut [tokio::process::Child],
    concurrency: usize,
    respawn: &dyn Fn() -> anyhow::Result<tokio::process::Child>,
) -> anyhow::Result<f64> {
    // Fewer jobs than one worker's slots, so the survivors have room for the reclaimed ones.
    let reqs = (0..concurrency)
        .map(|_| {
            let mut r = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": 1500 }));
            r.options.queue = Some(queue.to_string());
            r
        })
        .collect();
    let ids: Vec<_> = client
        .enqueue_many(reqs)
        .await?
        .into_iter()
        .map(|i| i.id)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (victim, jobs) = loop {
        let running = client.store().running(10_000).await?;
        let busy = children.iter().enumerate().find_map(|(i, c)| {
            let mark = format!("-{}-", c.id()?);
            let mine: Vec<_> = running
                .iter()
                .filter(|(_, w, _)| w.contains(&mark))
                .map(|(id, _, _)| *id)
                .collect();
            (!mine.is_empty()).then_some((i, mine))
        });
        if let Some(b) = busy {
            break b;
        }
        if Instant::now() > deadline {
            anyhow::bail!("no worker started the recovery phase's jobs within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let child = &mut children[victim];
    child.start_kill()?;
    let killed_at = homing::time::now();
    let _ = child.wait().await;
    *child = respawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut worst = 0i64;
    for id in &jobs {
        loop {
            let j = client.get(*id).await?;
            match j.started_at {
                Some(s) if s > killed_at => {
                    worst = worst.max(s - killed_at);
                    break;
                }
                _ if j.state.is_terminal() => break,
                _ => {}
            }
            if Instant::now() > deadline {
                anyhow::bail!("job {id} did not run again within 120 s of the kill");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    for id in &ids {
        client.wait(*id, Duration::from_secs(120)).await?;
    }
    Ok((worst as f64 / 1e4).round() / 100.0)
}
