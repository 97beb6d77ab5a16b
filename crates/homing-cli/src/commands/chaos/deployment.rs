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

/// What runs in the worker slots.
#[derive(Debug, Clone)]
pub enum Workers {
    /// `homing worker` processes, reaching Redis through their slot's proxy.
    Rust,
    /// `python -m homing worker` processes (this interpreter), running [`PYTHON_MODULE`] over
    /// the remote worker protocol, reaching the server through their slot's proxy.
    Python(PathBuf),
}

/// The Python twin of the load's `builtin.http` task (`chaos.call`).
pub const PYTHON_TASKS: &str = include_str!("chaos_tasks.py");
pub const PYTHON_MODULE: &str = "homing_chaos_tasks";
pub const PYTHON_TASK: &str = "chaos.call";

/// scripts/python-venv's interpreter: under `target/` of the working directory, else beside the
/// `target/<profile>/` this binary was built into, so a run started from another directory
/// finds it too.
fn default_python() -> PathBuf {
    let rel = PathBuf::from("target/python-venv/bin/python");
    if rel.exists() {
        return rel;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("python-venv/bin/python")))
        .filter(|p| p.exists())
        .unwrap_or(rel)
}

/// The interpreter for Python workers, or a one-line reason naming what is missing.
pub fn find_python(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let py = given
        .or_else(|| std::env::var_os("HOMING_PYTHON").map(PathBuf::from))
        .unwrap_or_else(default_python);
    let out = Command::new(&py)
        .args(["-c", "import homing, httpx; homing.App"])
        .output();
    match out {
        // Absolute, for workers that run in the run's directory; not canonical: a virtualenv's
        // interpreter is a symlink whose target would lose the virtualenv.
        Ok(o) if o.status.success() => Ok(std::path::absolute(&py).unwrap_or(py)),
        Ok(o) => bail!(
            "--worker-kind python: {} cannot import the homing package ({}); install it with scripts/python-venv (or pip install ./clients/python) and pass that interpreter with --python",
            py.display(),
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("no error text").trim()
        ),
        Err(e) => bail!(
            "--worker-kind python: cannot run {} ({e}); make the virtualenv with scripts/python-venv (needs the Debian packages python3 and python3-venv) or pass an interpreter with --python",
            py.display()
        ),
    }
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
    pub kind: Workers,
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
    /// Where the server listens (kept for its restart after a `server_kill`).
    listen: String,
    pub slots: Vec<Slot>,
    /// Every worker log ever written (restarted slots write new files).
    pub worker_logs: Vec<PathBuf>,
    pub plan: Plan,
    exe: PathBuf,
}

/// Marks a directory a run kept on purpose (`--keep`): the sweep for stale ones leaves it.
const KEPT: &str = "KEPT";

/// Removes chaos directories left by runs that were themselves killed with SIGKILL (their
/// children died with them, but nothing was left to delete the directory). A directory kept
/// with `--keep` is the user's to delete.
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
        if !Path::new(&format!("/proc/{pid}")).exists() && !e.path().join(KEPT).exists() {
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
            listen: String::new(),
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
        let api_port = super::services::free_port()?;
        // The network each worker slot can lose: Redis for Rust workers, the server's API for
        // Python ones.
        let upstream = match plan.kind {
            Workers::Rust => d.redis.as_ref().map(|r| r.port),
            Workers::Python(_) => {
                std::fs::write(d.dir.join(format!("{PYTHON_MODULE}.py")), PYTHON_TASKS)?;
                Some(api_port)
            }
        };
        if let Some(port) = upstream {
            for _ in 0..plan.workers {
                d.proxies.push(Proxy::start(port).await?);
            }
        }
        d.listen = format!("127.0.0.1:{api_port}");
        d.api_url = format!("http://{}", d.listen);
        d.start_server()?;
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

    fn start_server(&mut self) -> anyhow::Result<()> {
        let hb = format!("{}ms", self.plan.heartbeat.as_millis());
        let mut server = self.command(&self.broker_url.clone());
        server.args(["server", "--listen", &self.listen, "--rescue-interval", &hb]);
        self.server = Some(Proc::spawn("server", server, &self.dir.join("server.log"))?);
        Ok(())
    }

    /// `kill -9` of the server, started again on the same address (a supervisor's restart).
    pub async fn kill_server(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.server {
            p.kill9();
        }
        self.start_server()?;
        // Until it listens again, callers get connection refused, as from a dead server.
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.listen).await.is_err() {
            if Instant::now() > deadline {
                bail!("the restarted server did not listen within 30 s");
            }
            // Its address may not be free again yet: start it again.
            if self.server.as_mut().is_some_and(|p| p.exited()) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.start_server()?;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The pid of the process in `slot`.
    pub fn slot_pid(&self, slot: usize) -> u32 {
        self.slots[slot].proc.pid()
    }

    fn command(&self, broker: &str) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(["--broker", broker, "--store", &self.store_url])
            .args(["--log-format", "json"])
            // The committer logs every applied commit at debug: the checker counts them.
            .env(
                "HOMING_LOG",
                "info,homing::worker::committer=debug,homing::remote=debug",
            )
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
        if let Workers::Python(py) = &self.plan.kind {
            return self.spawn_python(py.clone(), slot, generation);
        }
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

    fn spawn_python(&mut self, py: PathBuf, slot: usize, generation: u32) -> anyhow::Result<Proc> {
        let url = match self.proxies.get(slot) {
            Some(p) => format!("http://127.0.0.1:{}", p.port),
            None => self.api_url.clone(),
        };
        let mut c = Command::new(py);
        c.args(["-m", "homing", "worker", PYTHON_MODULE])
            .args(["--queue", &self.plan.queue])
            .args(["--queue", super::limited::QUEUE])
            .args(["--concurrency", &self.plan.concurrency.to_string()])
            .args([
                "--heartbeat-interval",
                &format!("{}ms", self.plan.heartbeat.as_millis()),
            ])
            .args(["--grace", "5s", "--poll", "1s"])
            .env("HOMING_URL", url)
            .env_remove("HOMING_API_TOKEN")
            .env("PYTHONUNBUFFERED", "1")
            .current_dir(&self.dir);
        let log = self.dir.join(format!("worker-{slot}-{generation}.log"));
        self.worker_logs.push(log.clone());
        Proc::spawn(&format!("python worker {slot}"), c, &log)
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
            if let Err(e) = std::fs::write(dir.join(KEPT), "kept by homing chaos --keep\n") {
                eprintln!(
                    "chaos: could not mark {} as kept ({e}); the next run may delete it",
                    dir.display()
                );
            }
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
