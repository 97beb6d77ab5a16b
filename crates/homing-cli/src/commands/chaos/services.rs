//! Throwaway redis-server and PostgreSQL for a chaos run or a benchmark, started from the
//! installed binaries into the run's temporary directory. Redis listens on a loopback port (the
//! workers reach it through the cuttable proxy); PostgreSQL only on a unix socket. Both can be
//! restarted on the same address, which is what the broker- and store-restart faults do.

use anyhow::{bail, Context as _};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::child::Proc;

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// A free loopback port below the kernel's ephemeral range (32768 and up by default). The
/// faults restart Redis and the API server on their ports while clients keep reconnecting; a
/// port in that range can meanwhile be taken by another process binding port 0 or as an
/// outgoing connection's local port (a client reconnecting to it can even connect to itself),
/// and the restart then cannot bind.
pub(super) fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10000;
    const SPAN: u32 = 22000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // A random start, once per process: processes started together have nearly consecutive
    // pids, and counting up from `pid % SPAN` they would try each other's ports at once.
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        (random % u64::from(SPAN)) as u32
    });
    for _ in 0..SPAN {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {LOW} and {}", LOW + SPAN)
}

/// A redis-server without persistence: its data lives only as long as the process.
pub struct Redis {
    dir: PathBuf,
    pub port: u16,
    proc: Option<Proc>,
    starts: u32,
}

/// The persistence settings, stated in reports: homing keeps its truth in the store and
/// re-dispatches from it when the broker loses its data, so the broker runs without any.
pub const REDIS_SETTINGS: &str = "save \"\", appendonly no, maxmemory-policy noeviction";

impl Redis {
    pub fn start(dir: &Path) -> anyhow::Result<Redis> {
        if on_path("redis-server").is_none() {
            bail!("redis-server is not installed (apt-get install redis-server)");
        }
        let mut r = Redis {
            dir: dir.to_path_buf(),
            port: free_port()?,
            proc: None,
            starts: 0,
        };
        r.launch()?;
        Ok(r)
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&self.dir);
        let log = self.dir.join("redis.log");
        self.proc = Some(Proc::spawn("redis-server", cmd, &log)?);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self
                .command("PING")
                .map(|r| r.contains("PONG"))
                .unwrap_or(false)
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "redis-server did not answer within 10 s; see {}",
            log.display()
        )
    }

    /// `redis://` URL for clients that connect directly (`port` may be a proxy's).
    pub fn url(port: u16) -> String {
        format!("redis://127.0.0.1:{port}/0?prefix=homing")
    }

    /// One inline command over a fresh connection; returns the raw reply.
    pub fn command(&self, line: &str) -> anyhow::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(format!("{line}\r\n").as_bytes())?;
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Kills the server (its data is gone: no persistence) and starts it again, empty.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut p) = self.proc.take() {
            p.kill9();
        }
        self.launch()
    }
}

/// A PostgreSQL server in a fresh data directory, on a unix socket only.
pub struct Postgres {
    dir: PathBuf,
    data: PathBuf,
    postgres: PathBuf,
    user: Option<(u32, u32)>,
    pub fsync: bool,
    proc: Option<Proc>,
}

const PG_USER: &str = "homing";

fn pg_binaries() -> anyhow::Result<(PathBuf, PathBuf)> {
    if let (Some(i), Some(p)) = (on_path("initdb"), on_path("postgres")) {
        return Ok((i, p));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((v, e.path().join("bin")))
                })
                .filter(|(_, b)| b.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    match found.pop() {
        Some((_, b)) => Ok((b.join("initdb"), b.join("postgres"))),
        None => bail!("PostgreSQL server binaries are not installed (apt-get install postgresql)"),
    }
}

fn id_of(args: &[&str]) -> anyhow::Result<u32> {
    let out = Command::new("id").args(args).output()?;
    if !out.status.success() {
        bail!("id {args:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

impl Postgres {
    /// `initdb` and start. PostgreSQL refuses to run as root; as root it runs as `postgres`.
    pub fn start(dir: &Path, fsync: bool) -> anyhow::Result<Postgres> {
        let (initdb, postgres) = pg_binaries()?;
        let user = if id_of(&["-u"])? == 0 {
            let uid = id_of(&["-u", "postgres"])
                .context("running as root needs a `postgres` user to run PostgreSQL as")?;
            Some((uid, id_of(&["-g", "postgres"])?))
        } else {
            None
        };
        let pg_dir = dir.join("pg");
        std::fs::create_dir_all(&pg_dir)?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&pg_dir, Some(uid), Some(gid))?;
        }
        let data = pg_dir.join("data");
        let mut init = Self::as_user(user, &initdb);
        init.arg("-D")
            .arg(&data)
            .args([
                "-U",
                PG_USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ])
            .current_dir(&pg_dir);
        let out = init.output().context("cannot run initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut pg = Postgres {
            dir: pg_dir,
            data,
            postgres,
            user,
            fsync,
            proc: None,
        };
        pg.launch()?;
        Ok(pg)
    }

    fn as_user(user: Option<(u32, u32)>, program: &Path) -> Command {
        match user {
            None => Command::new(program),
            Some((uid, gid)) => {
                let mut c = Command::new("setpriv");
                c.args([
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--clear-groups".into(),
                    // Credential changes clear the parent-death signal; set it again after them.
                    "--pdeathsig=KILL".into(),
                    "--".into(),
                ])
                .arg(program);
                c
            }
        }
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.data.join("postmaster.pid"));
        let mut cmd = Self::as_user(self.user, &self.postgres);
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-k")
            .arg(&self.dir)
            .args(["-p", "5432", "-c", "listen_addresses="])
            .args([
                "-c",
                &format!("fsync={}", if self.fsync { "on" } else { "off" }),
            ])
            .args(["-c", "max_connections=400"])
            .current_dir(&self.dir);
        let log = self.dir.join("postgres.log");
        let p = Proc::spawn("postgres", cmd, &log)?;
        // The log file is created by us (root); the server writes through the inherited fd.
        self.proc = Some(p);
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid_file = self.data.join("postmaster.pid");
        while Instant::now() < deadline {
            if let Ok(s) = std::fs::read_to_string(&pid_file) {
                if s.lines().any(|l| l.trim() == "ready") {
                    return Ok(());
                }
            }
            if self.proc.as_mut().map(|p| p.exited()).unwrap_or(true) {
                bail!("PostgreSQL exited at start; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "PostgreSQL was not ready within 60 s; see {}",
            log.display()
        )
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://{PG_USER}@localhost:5432/postgres?host={}",
            self.dir.display()
        )
    }

    /// Stops the server — `immediate` is a crash (SIGQUIT: no checkpoint, recovery from WAL on
    /// the next start), otherwise a fast shutdown (SIGINT: sessions cut) — and starts it again.
    pub fn restart(&mut self, immediate: bool) -> anyhow::Result<()> {
        if let Some(mut p) = self.proc.take() {
            let sig = if immediate {
                libc::SIGQUIT
            } else {
                libc::SIGINT
            };
            p.stop_with(sig, Duration::from_secs(30));
        }
        self.launch()
    }

    pub fn settings(&self) -> String {
        format!(
            "fsync={}, synchronous_commit=on, unix socket only",
            if self.fsync { "on" } else { "off" }
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop_with(libc::SIGQUIT, Duration::from_secs(10));
        }
    }
}
