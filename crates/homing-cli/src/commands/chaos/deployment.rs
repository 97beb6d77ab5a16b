//! A real homing deployment on this machine, owned by the chaos tool: a `homing server`, several
//! `homing worker` processes (each in a numbered slot that a supervisor would restart), and, for
//! the distributed modes, the tool's own redis-server and PostgreSQL. Workers reach Redis through
//! one cuttable proxy per slot. Everything lives in one temporary directory that is removed at
//! the end, and every process dies with the tool.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::child::Proc;
use super::proxy::Proxy;
use super::services::{Postgres, Redis};
use homing::Backends;

/// Which backends to run, and whose.
#[derive(Debug, Clone)]
pub enum BrokerChoice {
    Embedded,
    /// Start our own redis-server.
    Redis,
    Url(String),
}

#[derive(Debug, Clone)]
pub enum StoreChoice {
    Embedded,
    Postgres,
    Url(String),
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub broker: BrokerChoice,
    pub store: StoreChoice,
    pub workers: usize,
    pub concurrency: usize,
    pub heartbeat: Duration,
    pub queue: String,
    pub pg_fsync: bool,
}

pub struct Slot {
    pub proc: Proc,
    pub generation: u32,
    pub paused: bool,
}

pub struct Deployment {
    pub dir: PathBuf,
    pub broker_url: String,
    pub store_url: String,
    pub redis: Option<Redis>,
    pub pg: Option<Postgres>,
    pub proxies: Vec<Proxy>,
    pub server: Option<Proc>,
    /// The server's API, `http://127.0.0.1:PORT`.
    pub api_url: String,
    pub slots: Vec<Slot>,
    /// Every worker log ever written (restarted slots write new files).
    pub worker_logs: Vec<PathBuf>,
    pub plan: Plan,
    exe: PathBuf,
}

/// Removes chaos directories left by runs that were themselves killed with SIGKILL (their
/// children died with them, but nothing was left to delete the directory).
fn sweep_stale(tmp: &Path) {
    let Ok(rd) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("homing-chaos-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Deployment {
    pub async fn start(plan: Plan) -> anyhow::Result<Deployment> {
        // /tmp rather than $TMPDIR: PostgreSQL's own user must be able to reach the directory.
        let tmp = PathBuf::from("/tmp");
        sweep_stale(&tmp);
        let dir = tmp.join(format!(
            "homing-chaos-{}-{:06x}",
            std::process::id(),
            fastrand::u32(..0xff_ffff)
        ));
        std::fs::create_dir_all(&dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        }
        let exe = std::env::current_exe().context("cannot find the homing executable")?;
        let mut d = Deployment {
            broker_url: String::new(),
            store_url: String::new(),
            redis: None,
            pg: None,
            proxies: Vec::new(),
            server: None,
            api_url: String::new(),
            slots: Vec::new(),
            worker_logs: Vec::new(),
            plan: plan.clone(),
            exe,
            dir,
        };
        let embedded = format!("sqlite://{}/homing.db", d.dir.display());
        d.broker_url = match &plan.broker {
            BrokerChoice::Embedded => embedded.clone(),
            BrokerChoice::Url(u) => u.clone(),
            BrokerChoice::Redis => {
                let r = Redis::start(&d.dir)?;
                let url = Redis::url(r.port);
                d.redis = Some(r);
                url
            }
        };
        d.store_url = match &plan.store {
            StoreChoice::Embedded => embedded,
            StoreChoice::Url(u) => u.clone(),
            StoreChoice::Postgres => {
                let pg = Postgres::start(&d.dir, plan.pg_fsync)?;
                let url = pg.url();
                d.pg = Some(pg);
                url
            }
        };
        // Migrate (and create the embedded file) once, before processes race to do it.
        Backends::open(&d.broker_url, &d.store_url)
            .await
            .context("cannot open the deployment's backends")?;
        if let Some(r) = &d.redis {
            for _ in 0..plan.workers {
                d.proxies.push(Proxy::start(r.port).await?);
            }
        }
        let listen = format!("127.0.0.1:{}", {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        });
        d.api_url = format!("http://{listen}");
        let hb = format!("{}ms", plan.heartbeat.as_millis());
        let mut server = d.command(&d.broker_url.clone());
        server.args(["server", "--listen", &listen, "--rescue-interval", &hb]);
        d.server = Some(Proc::spawn("server", server, &d.dir.join("server.log"))?);
        for slot in 0..plan.workers {
            let p = d.spawn_worker(slot, 0)?;
            d.slots.push(Slot {
                proc: p,
                generation: 0,
                paused: false,
            });
        }
        Ok(d)
    }

    fn command(&self, broker: &str) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(["--broker", broker, "--store", &self.store_url])
            .args(["--log-format", "json"])
            // The committer logs every applied commit at debug: the checker counts them.
            .env("HOMING_LOG", "info,homing::worker::committer=debug")
            .env("HOMING_DATA_DIR", self.dir.join("pipelines"))
            .env_remove("HOMING_API_TOKEN")
            // The witness counter listens on loopback, which a PostgreSQL deployment refuses by
            // default (homing::egress).
            .env("HOMING_HTTP_ALLOW", "loopback")
            .current_dir(&self.dir);
        c
    }

    /// The broker URL a worker in `slot` uses: through its proxy when there is one.
    fn worker_broker(&self, slot: usize) -> String {
        match self.proxies.get(slot) {
            Some(p) => Redis::url(p.port),
            None => self.broker_url.clone(),
        }
    }

    fn spawn_worker(&mut self, slot: usize, generation: u32) -> anyhow::Result<Proc> {
        let mut c = self.command(&self.worker_broker(slot));
        c.args(["worker", "--queue", &self.plan.queue])
            .args(["--queue", super::limited::QUEUE])
            .args(["--concurrency", &self.plan.concurrency.to_string()])
            .args([
                "--heartbeat-interval",
                &format!("{}ms", self.plan.heartbeat.as_millis()),
            ])
            .args(["--shutdown-grace", "5s"])
            // The worker's identity starts with this, so logs and the store name the slot.
            .env("HOSTNAME", format!("w{slot}g{generation}"));
        let log = self.dir.join(format!("worker-{slot}-{generation}.log"));
        self.worker_logs.push(log.clone());
        Proc::spawn(&format!("worker {slot}"), c, &log)
    }

    /// A supervisor's restart of a slot whose worker died.
    pub fn restart_slot(&mut self, slot: usize) -> anyhow::Result<()> {
        let generation = self.slots[slot].generation + 1;
        let p = self.spawn_worker(slot, generation)?;
        let s = &mut self.slots[slot];
        s.proc = p;
        s.generation = generation;
        s.paused = false;
        Ok(())
    }

    /// Waits until every slot's worker has registered as live.
    pub async fn wait_ready(&mut self, b: &Backends, limit: Duration) -> anyhow::Result<()> {
        let since = homing::time::now() - 60_000_000;
        let deadline = Instant::now() + limit;
        loop {
            let live = b
                .store
                .workers(since)
                .await?
                .iter()
                .filter(|w| {
                    w.status == homing::store::WorkerStatus::Live
                        && w.info.queues.contains(&self.plan.queue)
                })
                .count();
            if live >= self.slots.len() {
                return Ok(());
            }
            for s in &mut self.slots {
                if s.proc.exited() {
                    bail!(
                        "{} exited at start; see {}",
                        s.proc.name,
                        s.proc.log.display()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("only {live} of {} workers came up", self.slots.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Graceful stop of the homing processes (SIGTERM), so their last log lines are written.
    pub fn stop_homing(&mut self) {
        for s in &mut self.slots {
            s.proc.stop_with(libc::SIGTERM, Duration::from_secs(10));
        }
        if let Some(p) = &mut self.server {
            p.stop_with(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    /// Stops everything and removes the directory (unless `keep`).
    pub fn teardown(mut self, keep: bool) -> Option<PathBuf> {
        self.kill_all();
        if keep {
            let dir = self.dir.clone();
            self.dir = PathBuf::new();
            Some(dir)
        } else {
            None
        }
    }

    fn kill_all(&mut self) {
        for p in &self.proxies {
            p.restore();
        }
        self.proxies.clear();
        for s in &mut self.slots {
            s.proc.kill9();
        }
        if let Some(p) = &mut self.server {
            p.kill9();
        }
        self.redis = None;
        self.pg = None;
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.kill_all();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
