//! Responsible for the faults: a schedule drawn from the seed alone (so `--seed` replays the
//! same faults at the same offsets), and their injection into the running deployment. Faults
//! run one after another; each one records when it began and ended and which jobs were running
//! on its target, which the checker needs to explain duplicate calls and to time recovery.

use serde::Serialize;
use std::time::Duration;

use super::counter::Counter;
use super::deployment::Deployment;
use homing::time::{now, Micros};
use homing::{Backends, JobId};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// SIGKILL of a worker at a random moment.
    Kill9,
    /// SIGKILL of a worker right after the counter answered one of its jobs: mid-commit.
    Kill9MidCommit,
    /// SIGSTOP for longer than the heartbeat TTL, then SIGCONT: a zombie that wakes up.
    Pause,
    /// redis-server killed and started again empty (no persistence).
    RedisRestart,
    RedisFlushall,
    /// One worker's connections to Redis stall (a partition), then heal.
    NetCut,
    /// PostgreSQL stopped (fast, or immediate: a crash) and started again.
    PostgresRestart,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill9 => "kill9",
            Kind::Kill9MidCommit => "kill9_mid_commit",
            Kind::Pause => "pause",
            Kind::RedisRestart => "redis_restart",
            Kind::RedisFlushall => "redis_flushall",
            Kind::NetCut => "net_cut",
            Kind::PostgresRestart => "postgres_restart",
        }
    }

    /// Faults whose target is one worker.
    fn targets_worker(self) -> bool {
        matches!(
            self,
            Kind::Kill9 | Kind::Kill9MidCommit | Kind::Pause | Kind::NetCut
        )
    }
}

/// The kinds that apply to the chosen backends.
pub fn applicable(redis: bool, postgres: bool) -> Vec<Kind> {
    let mut k = vec![Kind::Kill9, Kind::Kill9MidCommit, Kind::Pause];
    if redis {
        k.extend([Kind::RedisRestart, Kind::RedisFlushall, Kind::NetCut]);
    }
    if postgres {
        k.push(Kind::PostgresRestart);
    }
    k
}

#[derive(Debug, Clone, Serialize)]
pub struct Planned {
    /// Offset from the start of the load.
    pub at_ms: u64,
    pub kind: Kind,
    pub slot: usize,
    /// How long a pause or a cut lasts; the delay before a mid-commit kill; for a PostgreSQL
    /// restart, odd means immediate (a crash).
    pub param_ms: u64,
}

/// Draws the schedule: first every applicable kind once in a seeded order, then kinds at
/// random; gaps of 0.5–1.5 × `every` between the end of one fault and the next.
pub fn schedule(
    seed: u64,
    kinds: &[Kind],
    workers: usize,
    ttl: Duration,
    run: Duration,
    every: Duration,
) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut first: Vec<Kind> = kinds.to_vec();
    rng.shuffle(&mut first);
    let warmup = Duration::from_secs(3).min(run / 4);
    let tail = Duration::from_secs(3).min(run / 4);
    let mut t = warmup;
    let mut out = Vec::new();
    let ttl_ms = ttl.as_millis() as u64;
    while t + tail < run {
        let kind = if out.len() < first.len() {
            first[out.len()]
        } else {
            kinds[rng.usize(..kinds.len())]
        };
        let param_ms = match kind {
            Kind::Pause | Kind::NetCut => ttl_ms + rng.u64(500..=2500),
            Kind::Kill9MidCommit => rng.u64(0..=5),
            Kind::PostgresRestart => rng.u64(0..=1),
            _ => 0,
        };
        out.push(Planned {
            at_ms: t.as_millis() as u64,
            kind,
            slot: rng.usize(..workers.max(1)),
            param_ms,
        });
        let gap = every.mul_f64(0.5 + rng.f64());
        t += Duration::from_millis(match kind {
            Kind::Pause | Kind::NetCut => param_ms,
            _ => 0,
        }) + gap;
    }
    out
}

/// What happened when a fault was injected.
#[derive(Debug, Clone, Serialize)]
pub struct Injected {
    pub kind: Kind,
    pub slot: Option<usize>,
    pub at: Micros,
    pub end: Micros,
    /// Jobs running on the target when the fault struck.
    #[serde(skip)]
    pub running: Vec<JobId>,
    pub note: String,
}

async fn running_on(b: &Backends, prefix: Option<&str>) -> Vec<JobId> {
    match b.store.running(10_000).await {
        Ok(v) => v
            .into_iter()
            .filter(|(_, w, _)| prefix.is_none_or(|p| w.starts_with(p)))
            .map(|(id, _, _)| id)
            .collect(),
        Err(_) => Vec::new(),
    }
}

pub async fn inject(
    p: &Planned,
    d: &mut Deployment,
    b: &Backends,
    counter: &Counter,
) -> anyhow::Result<Injected> {
    let mut note = String::new();
    let mut slot = p.kind.targets_worker().then_some(p.slot);
    let prefix_of = |d: &Deployment, s: usize| format!("w{s}g{}-", d.slots[s].generation);
    let mut running = running_on(b, slot.map(|s| prefix_of(d, s)).as_deref()).await;
    if let Some(planned) = slot.filter(|_| running.is_empty()) {
        // An idle target proves little: take the next slot that is running something.
        let all = b.store.running(10_000).await.unwrap_or_default();
        let n = d.slots.len();
        for k in 1..n {
            let s = (planned + k) % n;
            let prefix = prefix_of(d, s);
            let mine: Vec<JobId> = all
                .iter()
                .filter(|(_, w, _)| w.starts_with(&prefix))
                .map(|(id, _, _)| *id)
                .collect();
            if !mine.is_empty() {
                note = format!("slot {planned} was idle; ");
                slot = Some(s);
                running = mine;
                break;
            }
        }
    }
    let target = slot.unwrap_or(0);
    let prefix = slot.map(|s| prefix_of(d, s));
    let at;
    match p.kind {
        Kind::Kill9 => {
            at = now();
            d.slots[target].proc.kill9();
            d.restart_slot(target)?;
        }
        Kind::Kill9MidCommit => {
            if running.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                running = running_on(b, prefix.as_deref()).await;
            }
            let keys = running.iter().map(|id| id.to_string()).collect();
            let trap = counter.trap(keys);
            match tokio::time::timeout(Duration::from_secs(3), trap).await {
                Ok(Ok(key)) => {
                    tokio::time::sleep(Duration::from_millis(p.param_ms)).await;
                    note += &format!("{} ms after answering job {key}", p.param_ms);
                }
                _ => note += "no answer to trap within 3 s: plain kill",
            }
            counter.clear_trap();
            at = now();
            d.slots[target].proc.kill9();
            d.restart_slot(target)?;
        }
        Kind::Pause => {
            at = now();
            d.slots[target].paused = true;
            d.slots[target].proc.signal(libc::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(p.param_ms)).await;
            d.slots[target].proc.signal(libc::SIGCONT);
            d.slots[target].paused = false;
            note += &format!("stopped {} ms", p.param_ms);
        }
        Kind::NetCut => {
            at = now();
            if let Some(proxy) = d.proxies.get(target) {
                proxy.cut();
                tokio::time::sleep(Duration::from_millis(p.param_ms)).await;
                proxy.restore();
            }
            note += &format!("cut {} ms", p.param_ms);
        }
        Kind::RedisRestart => {
            at = now();
            if let Some(r) = d.redis.as_mut() {
                r.restart()?;
            }
        }
        Kind::RedisFlushall => {
            at = now();
            if let Some(r) = d.redis.as_ref() {
                note = r.command("FLUSHALL")?.trim().to_string();
            }
        }
        Kind::PostgresRestart => {
            at = now();
            let immediate = p.param_ms % 2 == 1;
            if let Some(pg) = d.pg.as_mut() {
                pg.restart(immediate)?;
            }
            note = if immediate {
                "immediate (crash)"
            } else {
                "fast"
            }
            .into();
        }
    }
    Ok(Injected {
        kind: p.kind,
        slot,
        at,
        end: now(),
        running,
        note,
    })
}
