//! `homing bench --latency N`: how long an idle system takes from enqueue to start. The
//! throughput phases measure a worker that is never idle; this one measures the path a lone job
//! takes to a worker that is asleep (the doorbells of docs/fastpath.md, Redis's blocked read),
//! where a lost wake-up shows as a job that waits for the fallback poll: a p99 several
//! milliseconds above the p50.
//!
//! Two settings, each on the backends chosen: jobs enqueued by this process into `--workers`
//! separate `homing worker` processes, and jobs posted to the HTTP API of one `homing up`
//! whose built-in worker runs them (enqueue and worker in one process). One no-op job at a
//! time: the next is enqueued only once the previous one has finished and a random pause of
//! 5–15 ms has passed (random, so the samples do not fall in step with any poll). Latency is
//! read from the job records (created → started: the enqueue's commit and publish, the wake-up
//! and the reservation, up to the worker's call to start it). A worker stamps `started_at` when
//! it asks the store to start the job, so the start transaction itself, and any wait in it for
//! a row the producer still holds, is not in that figure: created → finished is reported beside
//! it (for a no-op job, the start's commit, the handler and the committer's pickup; the
//! completion's own commit comes after the stamp). Each setting also reports the CPU time its
//! processes used over 10 s of idleness, from /proc/PID/stat: waiting must not be polling.

use anyhow::Context as _;
use serde::Serialize;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use super::super::chaos::services::{Postgres, Redis};
use crate::cli::{BenchArgs, Global};
use crate::output::{self, outln};
use homing::redact::redact_url;
use homing::store::WorkerStatus;
use homing::{Backends, Client, EnqueueRequest, JobId, JobState};

/// How long each setting sits idle while its CPU time is measured.
const IDLE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize)]
struct Setting {
    setting: String,
    samples: usize,
    p50_ms: f64,
    p95_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Created → finished of the same jobs.
    done_p50_ms: f64,
    done_p99_ms: f64,
    /// CPU time (user + system) of the setting's processes over `idle_window_s` of idleness.
    idle_cpu_ms: u64,
    idle_window_s: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    broker: String,
    store: String,
    settings: Vec<Setting>,
}

pub(super) async fn run(g: &Global, a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let embedded_default = g.broker == homing::DEFAULT_URL && g.store == homing::DEFAULT_URL;
    let tmp = if embedded_default || a.backends.is_some() {
        Some(super::tempdir()?)
    } else {
        None
    };
    let mut redis = None;
    let mut pg = None;
    let (broker_url, store_url) = match (&tmp, a.backends.as_deref()) {
        (Some(dir), kind) => {
            let sqlite = format!("sqlite://{}/bench.db", dir.display());
            let broker = match kind {
                Some("redis-sqlite") | Some("redis-postgres") => {
                    let r = Redis::start(dir)?;
                    let url = Redis::url(r.port);
                    redis = Some(r);
                    url
                }
                _ => sqlite.clone(),
            };
            let store = match kind {
                Some("redis-postgres") => {
                    let p = Postgres::start(dir, true)?;
                    let url = p.url();
                    pg = Some(p);
                    url
                }
                _ => sqlite,
            };
            (broker, store)
        }
        (None, _) => (g.broker.clone(), g.store.clone()),
    };
    let result = measure(a, &broker_url, &store_url).await;
    drop(redis);
    drop(pg);
    super::remove_scratch(tmp.as_deref(), a.keep);
    let report = Report {
        broker: redact_url(&broker_url),
        store: redact_url(&store_url),
        settings: result?,
    };
    if a.json {
        outln!("{}", serde_json::to_string(&report)?);
    } else {
        outln!(
            "homing bench --latency: idle enqueue→start, one no-op job at a time, from the job records"
        );
        outln!("  broker {}  store {}", report.broker, report.store);
        output::table(
            &[
                "setting", "samples", "p50", "p95", "p99", "max", "done p50", "done p99",
                "idle CPU",
            ],
            report
                .settings
                .iter()
                .map(|s| {
                    vec![
                        s.setting.clone(),
                        s.samples.to_string(),
                        format!("{} ms", s.p50_ms),
                        format!("{} ms", s.p95_ms),
                        format!("{} ms", s.p99_ms),
                        format!("{} ms", s.max_ms),
                        format!("{} ms", s.done_p50_ms),
                        format!("{} ms", s.done_p99_ms),
                        format!("{} ms / {} s", s.idle_cpu_ms, s.idle_window_s),
                    ]
                })
                .collect(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(a: &BenchArgs, broker: &str, store: &str) -> anyhow::Result<Vec<Setting>> {
    let backends = Backends::open(broker, store)
        .await
        .context("cannot open the benchmark's backends")?;
    let client = Client::new(backends.broker.clone(), backends.store.clone());
    let exe = std::env::current_exe().context("cannot find the homing executable")?;
    let log = std::env::var("HOMING_LOG").unwrap_or_else(|_| "error".into());
    let spawn = |args: Vec<String>| {
        let mut cmd = tokio::process::Command::new(&exe);
        super::super::chaos::child::dies_with_bench(&mut cmd);
        cmd.args(args)
            .args(["--broker", broker, "--store", store])
            .env("HOMING_LOG", &log)
            .env_remove("HOMING_API_TOKEN")
            .env_remove("HOMING_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a homing process")
    };
    let mut out = Vec::new();

    // Separate worker processes; this process enqueues through the library.
    {
        let queue = format!("latency-{:08x}", super::fastrand_u32());
        let mut children = Vec::new();
        for _ in 0..a.workers {
            children.push(spawn(vec![
                "worker".into(),
                "--queue".into(),
                queue.clone(),
                "--concurrency".into(),
                a.concurrency.to_string(),
            ])?);
        }
        wait_registered(&backends, &queue, a.workers).await?;
        let mut ids = Vec::new();
        for _ in 0..a.latency {
            pause(&client, ids.last().copied()).await?;
            let mut r = EnqueueRequest::new("builtin.noop", serde_json::json!({}));
            r.options.queue = Some(queue.clone());
            ids.push(client.enqueue(r).await?.id);
        }
        let lat = latencies(&client, &ids).await?;
        let pids: Vec<u32> = children.iter().filter_map(|c| c.id()).collect();
        let cpu = idle_cpu(&pids).await;
        stop(&mut children).await;
        out.push(setting(format!("{} × homing worker", a.workers), lat, cpu));
    }

    // One `homing up`: the API and the worker in one process.
    {
        let queue = format!("latency-{:08x}", super::fastrand_u32());
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut children = vec![spawn(vec![
            "up".into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--queue".into(),
            queue.clone(),
            "--concurrency".into(),
            a.concurrency.to_string(),
        ])?];
        wait_registered(&backends, &queue, 1).await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()?;
        let url = format!("http://127.0.0.1:{port}/v1/jobs");
        let mut ids = Vec::new();
        for _ in 0..a.latency {
            pause(&client, ids.last().copied()).await?;
            let body = serde_json::json!({"task": "builtin.noop", "args": {}, "queue": queue});
            let resp = http.post(&url).json(&body).send().await?;
            let status = resp.status();
            let job: serde_json::Value = resp.json().await?;
            if !status.is_success() {
                anyhow::bail!("homing up refused the enqueue ({status}): {job}");
            }
            let id = job["id"]
                .as_str()
                .and_then(|s| s.parse::<JobId>().ok())
                .context("homing up answered an enqueue without a job id")?;
            ids.push(id);
        }
        let lat = latencies(&client, &ids).await?;
        let pids: Vec<u32> = children.iter().filter_map(|c| c.id()).collect();
        let cpu = idle_cpu(&pids).await;
        stop(&mut children).await;
        out.push(setting("homing up (API + worker)".into(), lat, cpu));
    }
    Ok(out)
}

/// Waits until the previous job has finished, then a random 5–15 ms: the next job meets an
/// idle worker.
async fn pause(client: &Client, previous: Option<JobId>) -> anyhow::Result<()> {
    if let Some(id) = previous {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !client.get(id).await?.state.is_terminal() {
            if Instant::now() > deadline {
                anyhow::bail!("job {id} did not finish within 30s; see the workers' log");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_micros(5_000 + fastrand::u64(..10_000))).await;
    Ok(())
}

/// Each job's created → started and created → finished, in milliseconds.
async fn latencies(client: &Client, ids: &[JobId]) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut v = Vec::with_capacity(ids.len());
    for id in ids {
        let deadline = Instant::now() + Duration::from_secs(30);
        let job = loop {
            let job = client.get(*id).await?;
            if job.state.is_terminal() {
                break job;
            }
            if Instant::now() > deadline {
                anyhow::bail!("job {id} did not finish within 30s; see the workers' log");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        if job.state != JobState::Succeeded {
            anyhow::bail!("benchmark job {id} ended {:?}", job.state);
        }
        let started = job
            .started_at
            .context("a finished job without a start time")?;
        let finished = job
            .finished_at
            .context("a finished job without a finish time")?;
        let ms = |t: i64| (t - job.created_at) as f64 / 1000.0;
        v.push((ms(started), ms(finished)));
    }
    Ok(v)
}

fn setting(name: String, v: Vec<(f64, f64)>, idle_cpu_ms: u64) -> Setting {
    let (mut start, mut done): (Vec<f64>, Vec<f64>) = v.into_iter().unzip();
    start.sort_by(|a, b| a.total_cmp(b));
    done.sort_by(|a, b| a.total_cmp(b));
    let at = |v: &[f64], p: f64| {
        if v.is_empty() {
            return 0.0;
        }
        let idx = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        (v[idx] * 1000.0).round() / 1000.0
    };
    Setting {
        setting: name,
        samples: start.len(),
        p50_ms: at(&start, 0.50),
        p95_ms: at(&start, 0.95),
        p99_ms: at(&start, 0.99),
        max_ms: at(&start, 1.0),
        done_p50_ms: at(&done, 0.50),
        done_p99_ms: at(&done, 0.99),
        idle_cpu_ms,
        idle_window_s: IDLE_WINDOW.as_secs(),
    }
}

async fn wait_registered(b: &Backends, queue: &str, want: usize) -> anyhow::Result<()> {
    let since = homing::time::now() - 60_000_000;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = b
            .store
            .workers(since)
            .await?
            .iter()
            .filter(|w| w.status == WorkerStatus::Live && w.info.queues.iter().any(|q| q == queue))
            .count();
        if ready >= want {
            // A registered worker may not have reached its first wait yet.
            tokio::time::sleep(Duration::from_millis(200)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {ready} of {want} homing processes started within 30s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// CPU time (user + system, milliseconds) the processes use over `IDLE_WINDOW`.
async fn idle_cpu(pids: &[u32]) -> u64 {
    let before: u64 = pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after: u64 = pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
    // /proc counts in USER_HZ, which Linux fixes at 100 for every architecture's user ABI.
    after.saturating_sub(before) * 10
}

/// utime + stime of a process, in clock ticks (fields 14 and 15 of /proc/PID/stat, counted
/// after the command name, which may itself hold spaces).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

async fn stop(children: &mut [tokio::process::Child]) {
    for c in children.iter() {
        if let Some(pid) = c.id() {
            let _ = crate::signals::terminate(pid);
        }
    }
    for c in children.iter_mut() {
        let _ = tokio::time::timeout(Duration::from_secs(30), c.wait()).await;
    }
}
