//! Shared harness for the process-level tests: real `homing` processes on a real database,
//! killed with SIGKILL, and a local HTTP server that counts calls per `Idempotency-Key` — the
//! external witness of how often a handler really ran.

#![allow(dead_code)]

#[path = "../../../homing/tests/support/postgres.rs"]
pub mod postgres;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing::{Backends, Client, Job, JobId, JobState};

pub fn homing_bin() -> &'static str {
    env!("CARGO_BIN_EXE_homing")
}

/// A temporary directory with the embedded database, and the URLs to reach it.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub broker: String,
    pub store: String,
}

impl Env {
    pub fn sqlite() -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/homing.db", dir.path().display());
        Env {
            broker: url.clone(),
            store: url,
            dir,
        }
    }

    /// The embedded broker with a PostgreSQL store (a fresh database on the test binary's server).
    pub async fn sqlite_broker_postgres_store() -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = format!("sqlite://{}/broker.db", dir.path().display());
        let store = postgres::server().fresh_database().await;
        Env { broker, store, dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("homing.db")
    }

    pub async fn backends(&self) -> Backends {
        Backends::open(&self.broker, &self.store)
            .await
            .expect("open backends")
    }

    pub async fn client(&self) -> Client {
        let b = self.backends().await;
        Client::new(b.broker, b.store)
    }

    /// A `homing` command with this environment's backends and the test tasks enabled.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(homing_bin());
        c.args(args)
            .env("HOMING_BROKER", &self.broker)
            .env("HOMING_STORE", &self.store)
            .env("HOMING_TEST_TASKS", "1")
            .env_remove("HOMING_API_TOKEN")
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        c
    }

    /// Runs a command to completion: (exit code, stdout, stderr).
    pub fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.command(args).output().expect("run homing");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts a long-running `homing` process; its log goes to `<dir>/<name>.log`.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        self.spawn_env(name, args, &[])
    }

    /// Like [`Env::spawn`], with extra environment variables (tokens, webhooks).
    pub fn spawn_env(&self, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Proc {
        let log_path = self.dir.path().join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("log file");
        let mut cmd = self.command(args);
        cmd.env_remove("HOMING_CONFIG")
            .env_remove("HOMING_WEBHOOKS");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .env("HOMING_LOG", "info")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn homing");
        Proc {
            child: Some(child),
            log: log_path,
            name: name.to_string(),
        }
    }

    /// Starts a worker process on `queue` with a fast heartbeat.
    pub fn worker(&self, name: &str, queue: &str, extra: &[&str]) -> Proc {
        let mut args = vec!["worker", "--queue", queue, "--heartbeat-interval", "200ms"];
        args.extend_from_slice(extra);
        self.spawn(name, &args)
    }
}

/// A child process that is killed (SIGKILL) when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
    pub name: String,
}

impl Proc {
    /// Takes charge of a child started elsewhere (killed when dropped, like the others).
    pub fn adopt(child: Child, log: PathBuf, name: &str) -> Proc {
        Proc {
            child: Some(child),
            log,
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL, as an OOM killer or a power cut would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for the exit code.
    pub fn terminate(&mut self, limit: Duration) -> Option<i32> {
        let c = self.child.as_mut()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return st.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited (and reaps it).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One call the counter received.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: Instant,
    pub path: String,
}

/// A local HTTP server standing in for an external system (an AI inference server): it counts
/// calls per `Idempotency-Key`, can answer slowly (`?delay_ms=`), and can fail the first calls
/// of each key (`?fail=N` answers 500 N times).
#[derive(Clone)]
pub struct Counter {
    pub addr: std::net::SocketAddr,
    calls: Arc<Mutex<HashMap<String, Vec<Call>>>>,
}

impl Counter {
    pub async fn start() -> Counter {
        use axum::extract::{Query, State};
        use axum::http::{HeaderMap, StatusCode, Uri};
        type Calls = Arc<Mutex<HashMap<String, Vec<Call>>>>;
        let calls: Calls = Arc::default();
        async fn handle(
            State(calls): State<Calls>,
            uri: Uri,
            headers: HeaderMap,
            Query(q): Query<HashMap<String, String>>,
        ) -> (StatusCode, String) {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_string();
            let n = {
                let mut c = calls.lock().unwrap();
                let v = c.entry(key.clone()).or_default();
                v.push(Call {
                    at: Instant::now(),
                    path: uri.path().to_string(),
                });
                v.len()
            };
            if let Some(ms) = q.get("delay_ms").and_then(|v| v.parse::<u64>().ok()) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let fail: usize = q.get("fail").and_then(|v| v.parse().ok()).unwrap_or(0);
            if n <= fail {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("planned failure {n}"),
                );
            }
            (
                StatusCode::OK,
                format!("{{\"key\": \"{key}\", \"call\": {n}}}"),
            )
        }
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind counter");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Counter { addr, calls }
    }

    pub fn url(&self, query: &str) -> String {
        format!("http://{}/call?{query}", self.addr)
    }

    pub fn calls(&self, key: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    pub fn count(&self, key: &str) -> usize {
        self.calls(key).len()
    }

    pub fn total(&self) -> usize {
        self.calls.lock().unwrap().values().map(|v| v.len()).sum()
    }
}

/// Waits until `f` returns `Some`, polling; panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until every job is terminal and returns them.
pub async fn wait_all_terminal(client: &Client, ids: &[JobId], limit: Duration) -> Vec<Job> {
    eventually(limit, "every job to reach a terminal state", || async {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let j = client.get(*id).await.ok()?;
            if !j.state.is_terminal() {
                return None;
            }
            out.push(j);
        }
        Some(out)
    })
    .await
}

/// Waits until the job is in `state`.
pub async fn wait_state(client: &Client, id: JobId, state: JobState, limit: Duration) -> Job {
    eventually(limit, &format!("job {id} to be {state}"), || async {
        client.get(id).await.ok().filter(|j| j.state == state)
    })
    .await
}

/// Waits until `n` live workers serve `queue`.
pub async fn wait_workers(client: &Client, queue: &str, n: usize, limit: Duration) {
    eventually(limit, &format!("{n} live workers on {queue}"), || async {
        let ws = client.store().workers(0).await.ok()?;
        let live = ws
            .iter()
            .filter(|w| w.status == "live" && w.info.queues.iter().any(|q| q == queue))
            .count();
        (live >= n).then_some(())
    })
    .await
}

pub fn http_job(url: &str) -> homing::EnqueueRequest {
    homing::EnqueueRequest::new(
        "builtin.http",
        serde_json::json!({ "url": url, "timeout": "30s" }),
    )
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `homing up` on a free port with a fast heartbeat and waits until it answers; returns
/// the process and its base URL.
pub async fn start_up(env: &Env, envs: &[(&str, &str)]) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "up",
        "--listen",
        listen.as_str(),
        "--heartbeat-interval",
        "200ms",
    ];
    let proc = env.spawn_env("up", &args, envs);
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    eventually(Duration::from_secs(30), "homing up to answer", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    (proc, base)
}

/// The repository's root (tests run with the crate directory as working directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test virtualenv (schemathesis, prometheus_client), created by `scripts/test-venv` when
/// missing. Fails, naming the package, when python3 or its venv module is absent.
pub fn test_venv() -> PathBuf {
    let venv = std::env::var_os("HOMING_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/test-venv"));
    let out = Command::new(repo_root().join("scripts/test-venv"))
        .arg(&venv)
        .output()
        .expect("run scripts/test-venv (needs bash)");
    assert!(
        out.status.success(),
        "scripts/test-venv failed (install the Debian packages python3 and python3-venv): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    venv
}
