//! Responsible for the faults: a schedule drawn from the seed alone (so `--seed` replays the
//! same faults at the same offsets), and their injection into the running deployment. Faults
//! run one after another; each one records when it began and ended and which jobs were running
//! on its target, which the checker needs to explain duplicate calls and to time recovery.

use serde::Serialize;
use std::time::Duration;

use super::counter::Counter;
use super::deployment::{Deployment, Workers};
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
    /// `kill -9` of the `homing server` the Python workers talk to, started again on the same
    /// address (Python workers only: Rust workers do not go through it).
    ServerKill,
    /// The embedded file's write lock held by another program (a transaction left open) for
    /// longer than the heartbeat TTL, then released: nobody could write, so no heartbeat could
    /// be refreshed, and that must not be taken for a crash (embedded broker, Rust workers).
    LockHold,
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
            Kind::ServerKill => "server_kill",
            Kind::LockHold => "lock_hold",
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

/// The kinds that apply to the chosen backends and workers. Python workers talk to the
/// server through a proxy whatever the broker, so they can always be cut off, and the server
/// itself can be killed. A held write lock needs the embedded broker's file.
pub fn applicable(redis: bool, postgres: bool, python: bool, embedded: bool) -> Vec<Kind> {
    let mut k = vec![Kind::Kill9, Kind::Kill9MidCommit, Kind::Pause];
    if redis {
        k.extend([Kind::RedisRestart, Kind::RedisFlushall]);
    }
    if redis || python {
        k.push(Kind::NetCut);
    }
    if postgres {
        k.push(Kind::PostgresRestart);
    }
    if python {
        k.push(Kind::ServerKill);
    }
    if embedded && !python {
        k.push(Kind::LockHold);
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
            Kind::Pause | Kind::NetCut | Kind::LockHold => ttl_ms + rng.u64(500..=2500),
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
            Kind::Pause | Kind::NetCut | Kind::LockHold => param_ms,
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

async fn running_on(b: &Backends, owners: Option<&[String]>) -> Vec<JobId> {
    match b.store.running(10_000).await {
        Ok(v) => v
            .into_iter()
            .filter(|(_, w, _)| owners.is_none_or(|o| o.iter().any(|p| w.starts_with(p))))
            .map(|(id, _, _)| id)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// What the store's worker names of `slot`'s process start with: a Rust worker's identity
/// starts with its slot and generation (`w{slot}g{gen}-`); a Python worker's sessions are
/// told by the pid they registered with (it may have registered several after being presumed
/// dead).
async fn owners(d: &Deployment, b: &Backends, slot: usize) -> Vec<String> {
    match d.plan.kind {
        Workers::Rust => vec![format!("w{slot}g{}-", d.slots[slot].generation)],
        Workers::Python(_) => {
            let pid = d.slot_pid(slot);
            let since = now() - 3_600_000_000;
            b.store
                .workers(since)
                .await
                .unwrap_or_default()
                .into_iter()
                .filter(|w| w.info.remote.is_some() && w.info.pid == pid)
                .map(|w| w.info.id)
                .collect()
        }
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
    let mut prefix = match slot {
        Some(s) => Some(owners(d, b, s).await),
        None => None,
    };
    let mut running = running_on(b, prefix.as_deref()).await;
    if let Some(planned) = slot.filter(|_| running.is_empty()) {
        // An idle target proves little: take the next slot that is running something.
        let all = b.store.running(10_000).await.unwrap_or_default();
        let n = d.slots.len();
        for k in 1..n {
            let s = (planned + k) % n;
            let theirs = owners(d, b, s).await;
            let mine: Vec<JobId> = all
                .iter()
                .filter(|(_, w, _)| theirs.iter().any(|p| w.starts_with(p)))
                .map(|(id, _, _)| *id)
                .collect();
            if !mine.is_empty() {
                note = format!("slot {planned} was idle; ");
                slot = Some(s);
                running = mine;
                prefix = Some(theirs);
                break;
            }
        }
    }
    let target = slot.unwrap_or(0);
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
        Kind::ServerKill => {
            at = now();
            running = running_on(b, None).await;
            d.kill_server().await?;
        }
        Kind::LockHold => {
            let path = homing::sqlite::path_from_url(&d.broker_url)
                .ok_or_else(|| anyhow::anyhow!("lock_hold needs the embedded broker"))?;
            running = running_on(b, None).await;
            let hold = Duration::from_millis(p.param_ms);
            at = now();
            tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
                let c = rusqlite::Connection::open(path)?;
                c.busy_timeout(Duration::from_secs(30))?;
                c.execute_batch("BEGIN IMMEDIATE")?;
                std::thread::sleep(hold);
                c.execute_batch("COMMIT")
            })
            .await??;
            note += &format!("held {} ms", p.param_ms);
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
