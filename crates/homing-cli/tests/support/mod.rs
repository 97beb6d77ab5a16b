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

/// An HTTP client for talking to the processes under test. reqwest needs the process's TLS
/// provider chosen before it builds a client (see `homing::tls`).
pub fn http_client() -> reqwest::Client {
    homing::tls::install_crypto_provider();
    reqwest::Client::new()
}

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
            // The test witnesses (Counter, stand-ins) listen on loopback, which deployments on
            // PostgreSQL refuse by default; tests of the policy override this.
            .env("HOMING_HTTP_ALLOW", "loopback")
            .env_remove("HOMING_HTTP_DENY")
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

    /// Runs a `homing` command whose standard output has no reader (a pipe whose reading end
    /// closed before it wrote, as when `head` has exited): its exit code and standard error.
    pub fn run_without_reader(&self, args: &[&str]) -> (Option<i32>, String) {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run homing");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait for homing");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Starts a long-running `homing` process; its log goes to `<dir>/<name>.log`.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        self.spawn_with_env(name, args, &[])
    }

    /// Like [`Env::spawn`], with extra environment variables for this process only.
    pub fn spawn_with_env(&self, name: &str, args: &[&str], vars: &[(&str, &str)]) -> Proc {
        let log_path = self.dir.path().join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("log file");
        let mut cmd = self.command(args);
        cmd.env_remove("HOMING_CONFIG")
            .env_remove("HOMING_WEBHOOKS");
        let child = cmd
            .env("HOMING_LOG", "info")
            .envs(vars.iter().copied())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn homing");
        Proc::adopt(child, log_path, name)
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

/// The pids of every [`Proc`] not yet reaped. A `Proc` kept in a `static` (a server shared by a
/// test file) is never dropped, so `Drop` alone would leave it running after the test binary
/// exits; [`kill_leftovers`] runs at exit (after passing or failing tests alike) and kills them.
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static REAPER: std::sync::Once = std::sync::Once::new();

#[allow(unsafe_code)]
fn track(pid: u32) {
    REAPER.call_once(|| {
        // SAFETY: registers a plain function with no captured state; libc runs it at exit().
        let rc = unsafe { libc::atexit(kill_leftovers) };
        assert_eq!(rc, 0, "atexit");
    });
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

fn untrack(pid: u32) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

#[allow(unsafe_code)]
extern "C" fn kill_leftovers() {
    // try_lock: a thread still running at exit may hold the lock; never block exit on it.
    let pids = match LIVE.try_lock() {
        Ok(p) => p.clone(),
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().clone(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: kill(2) on a pid this process spawned and has not reaped (so not reused).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Proc {
    /// Takes charge of a child started elsewhere (killed when dropped, like the others, and
    /// when the test binary exits if it is never dropped).
    pub fn adopt(child: Child, log: PathBuf, name: &str) -> Proc {
        track(child.id());
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
            untrack(c.id());
        }
    }

    /// SIGTERM, then wait for the exit code.
    pub fn terminate(&mut self, limit: Duration) -> Option<i32> {
        self.stop_with("-TERM", limit)
    }

    /// [`Proc::terminate`] with another signal (`kill`'s `-HUP`, `-INT`, ...).
    pub fn stop_with(&mut self, signal: &str, limit: Duration) -> Option<i32> {
        let c = self.child.as_mut()?;
        let _ = Command::new("kill")
            .args([signal, &c.id().to_string()])
            .status();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                untrack(c.id());
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
            Some(c) => {
                let done = matches!(c.try_wait(), Ok(Some(_)));
                if done {
                    untrack(c.id());
                }
                done
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to 10 s) for `needle` in the log: a line logged while another is being written
    /// is left to the process's log thread (crates/homing-cli/src/logs.rs), so a line logged
    /// just before an effect the test saw may land a moment later.
    pub async fn wait_log(&self, needle: &str) {
        eventually(
            Duration::from_secs(10),
            &format!("'{needle}' in {}'s log", self.name),
            || async { self.log_text().contains(needle).then_some(()) },
        )
        .await
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
            .filter(|w| {
                w.status == homing::store::WorkerStatus::Live
                    && w.info.queues.iter().any(|q| q == queue)
            })
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

/// The shape of a kill -9 scenario: how many worker and server processes, jobs and kills.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub workers: usize,
    pub servers: usize,
    pub jobs: usize,
    pub kills: usize,
}

impl Default for Scenario {
    /// The core issue's scenario: 200 jobs, 2 workers, one of them killed three times.
    fn default() -> Self {
        Scenario {
            workers: 2,
            servers: 0,
            jobs: 200,
            kills: 3,
        }
    }
}

fn free_listen() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// Guarantees 1, 2, 3 and 5 with real processes: jobs calling an external service (300 ms each),
/// the first worker killed with SIGKILL mid-job `kills` times and restarted. Checks every job
/// succeeded with its own result, each extra handler call is explained by a kill and came within
/// heartbeat TTL + one sweep + 1 s, crashes never spend retries, and every crash was reclaimed by
/// exactly one rescuer (counted from all processes' logs).
pub async fn kill_9_scenario(env: Env, sc: Scenario) {
    let counter = Counter::start().await;
    let client = env.client().await;
    let queue = "crash";
    let mut procs: Vec<Proc> = Vec::new();
    for i in 0..sc.servers {
        let listen = free_listen();
        procs.push(env.spawn(
            &format!("server{i}"),
            &["server", "--listen", &listen, "--rescue-interval", "200ms"],
        ));
    }
    let mut first = env.worker("w0-0", queue, &["--concurrency", "4"]);
    for i in 1..sc.workers {
        procs.push(env.worker(&format!("w{i}"), queue, &["--concurrency", "4"]));
    }
    wait_workers(&client, queue, sc.workers, Duration::from_secs(30)).await;

    let reqs: Vec<homing::EnqueueRequest> = (0..sc.jobs)
        .map(|_| {
            let mut r = http_job(&counter.url("delay_ms=300"));
            r.options.queue = Some(queue.into());
            r
        })
        .collect();
    let ids: Vec<_> = client
        .enqueue_many(reqs)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();

    let mut kills = Vec::new();
    let mut killed_logs = Vec::new();
    for round in 1..=sc.kills {
        // Let the worker get into its jobs, then kill it while handlers are mid-call.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let running = client.store().running(1000).await.unwrap();
        assert!(
            !running.is_empty(),
            "round {round}: jobs should be running when the worker is killed"
        );
        first.kill9();
        kills.push(Instant::now());
        killed_logs.push(first.log.clone());
        first = env.worker(&format!("w0-{round}"), queue, &["--concurrency", "4"]);
    }

    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(120)).await;
    let mut reclaimed = 0;
    for j in &jobs {
        assert_eq!(
            j.state,
            JobState::Succeeded,
            "job {} ended {:?}: {:?}",
            j.id,
            j.state,
            j.error
        );
        let result = j.result.as_ref().expect("a succeeded job has its result");
        assert_eq!(result["status"], 200);
        assert_eq!(
            result["body"]["key"],
            j.id.to_string(),
            "the result is this job's own call"
        );
        assert_eq!(j.attempts, 0, "crashes must not spend retries");
        assert_eq!(
            j.epoch,
            u64::from(j.crashes) + 1,
            "one start per delivery: {j:?}"
        );
        if j.crashes > 0 {
            reclaimed += 1;
        }
        let calls = counter.calls(&j.id.to_string());
        assert!(!calls.is_empty(), "job {} never called the service", j.id);
        for pair in calls.windows(2) {
            let kill = kills
                .iter()
                .find(|k| **k >= pair[0].at && **k <= pair[1].at)
                .unwrap_or_else(|| panic!("job {} called twice without a kill in between", j.id));
            let recovery = pair[1].at.duration_since(*kill);
            assert!(
                recovery <= Duration::from_millis(600 + 200 + 1000),
                "job {} ran again {recovery:?} after the kill",
                j.id
            );
        }
        assert!(calls.len() <= 1 + kills.len());
    }
    assert!(
        reclaimed >= sc.kills,
        "each kill should have interrupted at least one job (reclaimed {reclaimed})"
    );

    // Each crash was reclaimed by exactly one of the rescuers running in every process.
    let mut logs: Vec<String> = procs.iter().map(|p| p.log_text()).collect();
    logs.push(first.log_text());
    for path in &killed_logs {
        logs.push(std::fs::read_to_string(path).unwrap_or_default());
    }
    for j in jobs.iter().filter(|j| j.crashes > 0) {
        let id = j.id.to_string();
        let reclaims: usize = logs
            .iter()
            .map(|l| {
                l.lines()
                    .filter(|line| line.contains("job.reclaimed") && line.contains(&id))
                    .count()
            })
            .sum();
        assert_eq!(
            reclaims, j.crashes as usize,
            "job {id}: {} crashes but {reclaims} reclaims logged",
            j.crashes
        );
    }
}

/// A load of `n` jobs calling the counter (20 ms each) on the Redis environment.
pub async fn load(env: &Env, counter: &Counter, queue: &str, n: usize) -> Vec<homing::JobId> {
    let client = env.client().await;
    let reqs: Vec<homing::EnqueueRequest> = (0..n)
        .map(|_| {
            let mut r = http_job(&counter.url("delay_ms=20"));
            r.options.queue = Some(queue.into());
            r
        })
        .collect();
    client
        .enqueue_many(reqs)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect()
}

/// Every job succeeded with one committed result, and any repeated handler call belongs to a job
/// whose delivery was lost (crashes > 0).
pub async fn assert_all_once(env: &Env, counter: &Counter, ids: &[homing::JobId], limit: Duration) {
    let client = env.client().await;
    let jobs = wait_all_terminal(&client, ids, limit).await;
    for j in &jobs {
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        assert_eq!(j.result.as_ref().unwrap()["body"]["key"], j.id.to_string());
        assert_eq!(j.epoch, u64::from(j.crashes) + 1, "{j:?}");
        let calls = counter.count(&j.id.to_string());
        assert!(
            calls >= 1 && calls <= 1 + j.crashes as usize,
            "job {} called {calls} times with {} crashes",
            j.id,
            j.crashes
        );
    }
}

pub async fn wait_progress(env: &Env, ids: &[homing::JobId], done: usize) {
    let client = env.client().await;
    eventually(
        Duration::from_secs(60),
        "part of the load to finish",
        || async {
            let mut n = 0;
            for id in ids {
                if client.get(*id).await.ok()?.state.is_terminal() {
                    n += 1;
                }
            }
            (n >= done).then_some(())
        },
    )
    .await;
}

/// The fields of `/proc/PID/stat` after the command name (which is in parentheses and may hold
/// spaces): the state first, then the parent's pid. `None`: no such process.
fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether `pid` still runs: gone, or a zombie waiting for a parent that no longer exists (a
/// container's pid 1 may not reap), does not.
pub fn process_running(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|f| !matches!(f.first().map(String::as_str), Some("Z" | "X") | None))
}

/// The processes whose parent is `parent`.
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|&pid| {
            proc_stat(pid).and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()))
                == Some(parent)
        })
        .collect()
}

/// SIGKILL to `pid`, for a process this test did not spawn itself (a child's child).
#[allow(unsafe_code)]
pub fn kill9_pid(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// A free loopback port below the kernel's ephemeral range (32768 and up by default): a port
/// from that range can be taken, between the choice and the server's bind, or while a server is
/// down to be restarted on it, by another process binding port 0 or as an outgoing connection's
/// local port (a client reconnecting to it can even connect to itself), and the server then
/// cannot bind. Ports are handed out once per process, from a random start.
pub fn free_port() -> u16 {
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
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN);
}

/// Starts `homing up` on a free port with a fast heartbeat and waits until it answers; returns
/// the process and its base URL.
pub async fn start_up(env: &Env, envs: &[(&str, &str)]) -> (Proc, String) {
    start_up_with(env, &[], envs).await
}

/// [`start_up`] with extra arguments for `homing up`.
pub async fn start_up_with(env: &Env, extra: &[&str], envs: &[(&str, &str)]) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "up",
        "--listen",
        listen.as_str(),
        "--heartbeat-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let proc = env.spawn_with_env("up", &args, envs);
    let base = format!("http://{listen}");
    let http = http_client();
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

/// CPU time so far, in clock ticks, of each thread of process `pid` (from /proc).
pub fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: utime and stime are the 12th and
        // 13th of them.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
        out.insert(t.file_name().to_string_lossy().into_owned(), ticks);
    }
    out
}

/// The threads of process `pid` that used at least 5 clock ticks (50 ms) of CPU in `window`,
/// counted from `after` from now: with their ticks, busiest first.
pub async fn busy_threads(pid: u32, after: Duration, window: Duration) -> Vec<(String, u64)> {
    tokio::time::sleep(after).await;
    let start = cpu_by_thread(pid);
    tokio::time::sleep(window).await;
    let mut busy: Vec<(String, u64)> = cpu_by_thread(pid)
        .into_iter()
        .map(|(t, n)| (t.clone(), n - start.get(&t).copied().unwrap_or(0)))
        .filter(|(_, d)| *d >= 5)
        .collect();
    busy.sort_by_key(|b| std::cmp::Reverse(b.1));
    busy
}

/// The threads of process `pid` (from /proc).
pub fn thread_count(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read /proc status")
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads line")
}
