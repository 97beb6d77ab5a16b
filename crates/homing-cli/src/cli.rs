//! The command line: every command, flag and default, in one place so `--help` and the docs
//! agree with what runs.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The one way a flag reads a duration: `500ms`, `2s`, `5m` (a bare number is seconds), within
/// the flag's range (its --help says which). Out of range or unparsable is a usage error
/// (exit 2) with the reason; nothing later does arithmetic on an unchecked value.
fn duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| homing::time::parse_duration_in(s, min, max)
}

/// How long history is kept; `None` is `forever`. A type of its own because clap reads an
/// `Option` field as "the flag may be absent".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retention(pub Option<Duration>);

fn retention(s: &str) -> Result<Retention, String> {
    if s == "forever" {
        return Ok(Retention(None));
    }
    match homing::time::parse_duration_in(s, Duration::ZERO, homing::time::MAX_DURATION)? {
        d if d < SECOND => Err(
            "a retention under 1s would delete jobs as they finish; use 'forever' to keep everything"
                .into(),
        ),
        d => Ok(Retention(Some(d))),
    }
}

/// A whole number between `min` and `max` (its --help says which).
fn count_in(
    min: usize,
    max: usize,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s| match s.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' must be a whole number from {min} to {max}")),
    }
}

/// A rate of jobs per second: a number above 0, at most 100000.
fn rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 100_000.0 => Ok(r),
        _ => Err(format!("'{s}' must be a number above 0 and at most 100000")),
    }
}

/// Hostile requests per second: 0 (none) to 1000.
fn hostile_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && (0.0..=1000.0).contains(&r) => Ok(r),
        _ => Err(format!("'{s}' must be a number from 0 to 1000")),
    }
}

/// A queue name (see `homing::validate::name`).
fn queue_name(s: &str) -> Result<String, String> {
    homing::validate::name("queue", s).map(|_| s.to_string())
}

#[derive(Debug, Parser)]
#[command(
    name = "homing",
    version,
    about = "Crash-safe background jobs: no job lost, no job completed twice.",
    long_about = "Crash-safe background jobs: no job lost, no job completed twice.\n\n\
        Start with `homing up`: one process with the HTTP API, a worker and the rescuer, on an \
        embedded SQLite file in ./homing-data. In another terminal, in the same directory, \
        `homing enqueue builtin.sleep --args '{\"ms\": 1000}' --wait` runs a job."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Where messages travel: sqlite://PATH (embedded default), redis://[:PASSWORD@]HOST:PORT/DB,
    /// rediss://… (TLS), redis+unix:///PATH/TO/SOCKET, or a Redis Cluster's seed nodes
    /// redis+cluster://[:PASSWORD@]HOST:PORT,HOST:PORT (rediss+cluster:// for TLS); `?prefix=NAME`
    /// sets the Redis key namespace (default `homing`).
    #[arg(long, global = true, env = "HOMING_BROKER", default_value = homing::DEFAULT_URL, hide_env_values = true)]
    pub broker: String,
    /// Where job records live: sqlite://PATH (embedded default) or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, global = true, env = "HOMING_STORE", default_value = homing::DEFAULT_URL, hide_env_values = true)]
    pub store: String,
    /// Log format: human or json. The level comes from HOMING_LOG (e.g. `info`, `homing=debug`).
    #[arg(long, global = true, env = "HOMING_LOG_FORMAT", default_value = "human", value_parser = ["human", "json"])]
    pub log_format: String,
    /// How many distinct queue names the store accepts: enqueueing to a new queue beyond it is
    /// refused (`too many queues`); existing queues keep working.
    #[arg(long, global = true, env = "HOMING_MAX_QUEUES", default_value_t = homing::store::queues::DEFAULT_MAX_QUEUES)]
    pub max_queues: u64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run everything in one process: API, dashboard, a worker and the rescuer, on the embedded default.
    Up(UpArgs),
    /// Run the API, dashboard and maintenance loops (rescuer, scheduler, periodic schedules,
    /// reconciler), no worker.
    Server(ServerArgs),
    /// Run a worker on one or more queues.
    Worker(WorkerArgs),
    /// Enqueue a job and print its id (with --wait, the final record as JSON).
    Enqueue(EnqueueArgs),
    /// Look at and steer jobs.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// Create, look at and cancel workflows (DAGs of steps, docs/workflows.md).
    Workflows {
        #[command(subcommand)]
        command: WorkflowsCommand,
    },
    /// Show each queue's jobs by state and the broker's message counts; pause and resume queues.
    Queues(QueuesArgs),
    /// Show workers: live, stopped and lost, with what each is running.
    Workers(WorkersArgs),
    /// Periodic schedules: a job per cron tick or per interval, exactly one per tick.
    #[command(long_about = SCHEDULES_ABOUT)]
    Schedules {
        #[command(subcommand)]
        command: SchedulesCommand,
    },
    /// Measure throughput and latency: enqueue N no-op jobs and drain them with W worker processes.
    #[command(
        long_about = "Measure throughput and latency: enqueue N no-op jobs and drain them with W worker processes.\n\n\
            The worker processes (and, with --backends, the redis-server and PostgreSQL) it starts \
            die with it, also when it is killed with -9."
    )]
    Bench(BenchArgs),
    /// Prove the guarantees: run a real deployment under load, inject faults, check every invariant.
    #[command(long_about = CHAOS_ABOUT)]
    Chaos(ChaosArgs),
    /// Bring the store's schema up to date and print the migrations applied.
    #[command(
        long_about = "Bring the store's schema up to date and print the migrations applied.\n\n\
            For a PostgreSQL store (--store postgres://USER:PASSWORD@HOST/DB) the versioned \
            migrations this build carries are applied under an advisory lock, so it is safe while \
            other homing processes start. `homing up`, `server` and `worker` do the same on start; \
            this command lets a deploy migrate first. A SQLite store is created and upgraded \
            whenever it is opened."
    )]
    Migrate(OutputArgs),
}

#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct QueuesArgs {
    #[command(subcommand)]
    pub command: Option<QueuesCommand>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub enum QueuesCommand {
    /// Stop starting jobs from a queue: it still accepts jobs, and running ones finish.
    Pause {
        /// The queue's name.
        queue: String,
    },
    /// Start jobs from a paused queue again, the ones it held back first.
    Resume {
        /// The queue's name.
        queue: String,
    },
    /// Set a queue's cluster-wide limits (replacing its previous ones).
    #[command(
        long_about = "Set a queue's cluster-wide limits, replacing its previous ones.\n\n\
        --concurrency N: at most N of the queue's jobs run at once, across every worker and \
        server. --rate COUNT/PERIOD (e.g. 10/1s, 100/1m, or 10/s for 10/1s): at most COUNT starts in each \
        PERIOD-long window aligned to the Unix epoch (10/1s: ten per whole second of the clock; \
        a stretch straddling two windows can see up to 2 x COUNT). --key-arg NAME: apply each limit per value of the jobs' top-level argument \
        NAME (e.g. --key-arg user_id --concurrency 1: at most one running job per user).\n\n\
        A job over the limit stays queued: it is not failed, spends no retry and holds no \
        worker slot; it starts when a running job of its queue (or key) finishes or, for a \
        rate, when the window rolls. A slot held by a worker that dies is freed when the \
        rescuer reclaims its job. --clear removes every limit. See docs/limits.md."
    )]
    Limit {
        /// The queue's name.
        queue: String,
        /// At most this many running at once (1..1000000).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        concurrency: Option<u32>,
        /// At most COUNT starts in each aligned PERIOD window, e.g. 10/1s (period 10ms..24h).
        #[arg(long, value_name = "COUNT/PERIOD", value_parser = homing::limit::Rate::parse)]
        rate: Option<homing::limit::Rate>,
        /// Apply the limits per value of this top-level job argument.
        #[arg(long, value_name = "NAME")]
        key_arg: Option<String>,
        /// Remove the queue's limits.
        #[arg(long, conflicts_with_all = ["concurrency", "rate", "key_arg"])]
        clear: bool,
    },
}

#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct WorkerTuning {
    /// Handlers that run at once (1-10000).
    #[arg(long, default_value_t = 8, value_parser = count_in(1, 10_000))]
    pub concurrency: usize,
    /// Messages reserved at once (default: the concurrency; 1-100000).
    #[arg(long, value_parser = count_in(1, 100_000))]
    pub prefetch: Option<usize>,
    /// How often the worker's heartbeat is refreshed; it expires after 3 intervals (10ms-1h).
    #[arg(long, default_value = "2s", value_parser = duration_in(10 * MS, HOUR))]
    pub heartbeat_interval: Duration,
    /// On SIGTERM/SIGINT, how long running jobs may take before they are released to other
    /// workers (0s-1h).
    #[arg(long, default_value = "25s", value_parser = duration_in(Duration::ZERO, HOUR))]
    pub shutdown_grace: Duration,
    /// How long finished jobs, delivered events, departed workers and dead letters are kept
    /// before this process's maintenance deletes them (`forever` keeps everything). Unfinished
    /// jobs are never deleted. With several processes, the shortest retention among them applies.
    /// From 1s to 100 years.
    #[arg(long, env = "HOMING_RETENTION", default_value = "7d", value_parser = retention)]
    pub retention: Retention,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address of the API and dashboard.
    #[arg(long, env = "HOMING_LISTEN", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// Queues the built-in worker runs (repeatable).
    #[arg(long = "queue", default_values_t = vec!["default".to_string()], value_parser = queue_name)]
    pub queues: Vec<String>,
    #[command(flatten)]
    pub tuning: WorkerTuning,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// The HTTP server's limits against slow, idle and too many clients (README: "Limits").
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// A client must send a request's headers within this time of connecting or of its previous
    /// answer; it is also how long an idle keep-alive connection stays open.
    #[arg(long, env = "HOMING_HEADER_TIMEOUT", default_value = "10s", value_parser = duration_in(10 * MS, DAY))]
    pub header_timeout: Duration,
    /// A request's body must arrive, and its answer be ready, within this time of its headers
    /// (408 otherwise). Streamed answers such as the job event stream are not cut.
    #[arg(long, env = "HOMING_REQUEST_TIMEOUT", default_value = "60s", value_parser = duration_in(10 * MS, DAY))]
    pub request_timeout: Duration,
    /// Connections served at once; more wait in the kernel's accept queue until one closes.
    #[arg(long, env = "HOMING_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_connections: u32,
    /// `/healthz` answers 503 once a background loop (rescuer, scheduler, periodic, reconciler,
    /// pruner, notifier, rollup) has failed without a success for longer than this.
    #[arg(long, env = "HOMING_UNHEALTHY_AFTER", default_value = "30s", value_parser = duration_in(SECOND, DAY))]
    pub unhealthy_after: Duration,
    /// How often the dashboard's charts are brought up to date from the store (the rollups
    /// of docs/charts.md; 100ms-1h).
    #[arg(long, env = "HOMING_STATS_INTERVAL", default_value = "15s", value_parser = duration_in(100 * MS, HOUR))]
    pub stats_interval: Duration,
    /// How long one call of a bulk action (`POST /v1/jobs/retry|cancel|delete`) works before it
    /// answers what it did so far and the cursor to go on from (docs/bulk.md); at most a
    /// quarter of --request-timeout is used, so a bulk call is never cut by it.
    #[arg(long, env = "HOMING_BULK_PART", default_value = "10s", value_parser = duration_in(MS, HOUR))]
    pub bulk_part: Duration,
}

impl HttpArgs {
    pub fn limits(&self) -> crate::http_server::Limits {
        crate::http_server::Limits {
            header_timeout: self.header_timeout,
            request_timeout: self.request_timeout,
            max_connections: self.max_connections as usize,
        }
    }
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address of the API and dashboard.
    #[arg(long, env = "HOMING_LISTEN", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// How often the rescuer looks for lost workers (10ms-1h).
    #[arg(long, default_value = "2s", value_parser = duration_in(10 * MS, HOUR))]
    pub rescue_interval: Duration,
    /// How long finished jobs, delivered events, departed workers and dead letters are kept
    /// before they are deleted (`forever` keeps everything). Unfinished jobs are never deleted.
    /// From 1s to 100 years.
    #[arg(long, env = "HOMING_RETENTION", default_value = "7d", value_parser = retention)]
    pub retention: Retention,
    #[command(flatten)]
    pub http: HttpArgs,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// A queue to run (repeatable).
    #[arg(long = "queue", required_unless_present = "celery_queues", value_parser = queue_name)]
    pub queues: Vec<String>,
    #[command(flatten)]
    pub tuning: WorkerTuning,
    /// Do not run the rescuer, scheduler and reconciler in this process (a server runs them).
    #[arg(long)]
    pub no_maintenance: bool,
    /// Threads of this process's async runtime (1-1024). The worker's loops, its jobs' awaits
    /// and its Redis and PostgreSQL calls run there; the pipelines' heavy steps run on separate
    /// blocking threads. With 1 (the default) everything async runs on the main thread, so the
    /// hand-offs between the fetcher, the jobs and the committer wake no other thread, and the
    /// embedded file's calls run on it too unless one would wait for another process's lock
    /// (then on a blocking thread): the fastest for jobs that mostly wait (BENCHMARKS.md, "One
    /// runtime thread per worker"). With more, the file's calls run on blocking threads. Raise
    /// it when the worker's jobs spend much CPU on the runtime (say, large Celery payloads to
    /// decode), or run more worker processes. A worker does not read TOKIO_WORKER_THREADS.
    #[arg(long, env = "HOMING_RUNTIME_THREADS", default_value_t = 1, value_parser = count_in(1, 1024))]
    pub runtime_threads: usize,
    #[command(flatten)]
    pub celery: CeleryWorkerArgs,
}

/// Running tasks that Python apps enqueue with Celery (README: "Celery apps").
#[derive(Debug, Clone, Args)]
pub struct CeleryWorkerArgs {
    /// A Celery queue (kombu list on the Celery broker) whose messages this worker runs as homing
    /// jobs on the homing queue of the same name (repeatable).
    #[arg(long = "celery-queue")]
    pub celery_queues: Vec<String>,
    /// The Celery broker URL (Celery's `broker_url`: redis://, rediss://, redis+socket://).
    /// Defaults to --broker when that is a Redis URL.
    #[arg(long, env = "HOMING_CELERY_BROKER", hide_env_values = true)]
    pub celery_broker: Option<String>,
    /// Celery's Redis result backend URL: results (SUCCESS, FAILURE, RETRY) go there for
    /// `AsyncResult.get()`. Without it, results stay in homing's store only.
    #[arg(long, env = "HOMING_CELERY_RESULT_BACKEND", hide_env_values = true)]
    pub celery_result_backend: Option<String>,
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The task's name, e.g. builtin.sleep (with --celery, the Celery task name).
    #[arg(required_unless_present = "from_file")]
    pub task: Option<String>,
    /// Enqueue many jobs from a JSON Lines file (`-` reads standard input): one JSON object
    /// per line with the fields of POST /v1/jobs (task, args, queue, idempotency_key, countdown,
    /// priority, unique_for, ...); blank lines are skipped. The jobs go in chunks of 10000 lines,
    /// each chunk in one transaction, all or nothing. A bad line stops the command with its
    /// line number: nothing from its chunk is stored, chunks before it stay committed (the
    /// message says how many jobs and up to which line), so after fixing the line, run again
    /// from the first line not committed (or give every job an idempotency key and run the
    /// whole file again). Prints each job's id in file order, and how many were enqueued.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "task", "celery", "priority", "unique_for", "queue", "args", "idempotency_key",
        "countdown", "max_retries", "retry_delay", "time_limit", "max_crashes", "callback_url",
        "wait", "timeout", "json",
    ])]
    pub from_file: Option<String>,
    /// Publish a Celery message for Python Celery workers instead of a homing job: --args is a
    /// JSON array (positional args) or object (kwargs), --queue the Celery queue (default
    /// `celery`), --countdown honoured; prints the Celery task id.
    #[arg(long)]
    pub celery: bool,
    /// With --celery: the Celery broker URL (defaults to --broker when that is a Redis URL).
    #[arg(long, env = "HOMING_CELERY_BROKER", hide_env_values = true)]
    pub celery_broker: Option<String>,
    /// Higher runs first within the queue; equal priorities run in enqueue order (default 0,
    /// from -1000 to 1000). With --celery: the message's priority, 0-9 (lower runs first on
    /// kombu's Redis transport).
    #[arg(long, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-(homing::validate::MAX_PRIORITY as i64)..=homing::validate::MAX_PRIORITY as i64))]
    pub priority: Option<i32>,
    /// Make the job unique for this long: while a job of the same task, queue and args is
    /// scheduled, queued or running, or finished less than this long ago, enqueue returns that
    /// job instead of a new one (1s to 366 days).
    #[arg(long, value_parser = duration_in(homing::validate::MIN_UNIQUE_FOR, homing::validate::MAX_DELAY))]
    pub unique_for: Option<Duration>,
    /// A W3C trace context (`00-<trace id>-<span id>-<flags>`): the job's enqueue and runs join
    /// that trace (docs/traces.md).
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// Queue (default: the task's own queue, else `default`).
    #[arg(long)]
    pub queue: Option<String>,
    /// The task's input as JSON; `@FILE` reads a file, `-` reads standard input.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// A second enqueue with the same key returns the first job instead of a new one.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Run no earlier than this from now (e.g. 30s, 5m; 0s-366d).
    #[arg(long, value_parser = duration_in(Duration::ZERO, homing::validate::MAX_DELAY))]
    pub countdown: Option<Duration>,
    /// Retries after a handler error (default: the task's own, else 3; 0-10000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=homing::validate::MAX_RETRIES as i64))]
    pub max_retries: Option<u32>,
    /// A fixed delay between retries (default: exponential, 10s × 2ⁿ ± 10 %; 0s-366d).
    #[arg(long, value_parser = duration_in(Duration::ZERO, homing::validate::MAX_DELAY))]
    pub retry_delay: Option<Duration>,
    /// Cancel the handler if it runs longer than this (default: the task's own, else 1h;
    /// 1ms-366d).
    #[arg(long, value_parser = duration_in(MS, homing::validate::MAX_DELAY))]
    pub time_limit: Option<Duration>,
    /// Deliveries lost with their worker before the job is dead (default 3; 1-1000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=homing::validate::MAX_CRASHES as i64))]
    pub max_crashes: Option<u32>,
    /// Call this http(s) URL (a JSON POST of the event, with retries) when the job finishes.
    #[arg(long)]
    pub callback_url: Option<String>,
    /// Enqueue even if no worker has ever registered this task (with --from-file: any line's
    /// task).
    #[arg(long)]
    pub allow_unknown_task: bool,
    /// Wait for the job to finish and print its record as JSON; exit 1 unless it succeeded.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up waiting after this long (0s-366d; default: 366d).
    #[arg(long, value_parser = duration_in(Duration::ZERO, homing::validate::MAX_DELAY))]
    pub timeout: Option<Duration>,
    /// Print the job as JSON instead of its id.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum WorkflowsCommand {
    /// Create a workflow from a JSON file (`{"name": ..., "steps": {...}}`, as POST
    /// /v1/workflows takes it; `-` reads standard input) and print its id and steps' job ids.
    Create { file: String },
    /// Show one workflow: its state and each step's job and state.
    Get {
        id: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// List workflows, newest first.
    List {
        /// Workflows per page (1-200).
        #[arg(long, default_value_t = 20, value_parser = count_in(1, 200))]
        limit: usize,
        /// Continue after this cursor (printed by the previous page).
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Cancel a workflow's unfinished steps.
    Cancel {
        id: String,
        #[command(flatten)]
        out: OutputArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Show one job.
    Get {
        id: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Show one job's timeline: every run with its epoch and worker, every crash, error (with
    /// its traceback), retry, cancel and progress report, oldest first (docs/timeline.md).
    History {
        id: String,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// List or search jobs, newest first, a page at a time (docs/operate.md, "Job search").
    /// Every filter given must match.
    List {
        /// Only jobs in this state (scheduled, waiting, queued, running, succeeded, failed, dead,
        /// cancelled).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only jobs of this task.
        #[arg(long)]
        task: Option<String>,
        /// A job id, or the first hex digits of one (dashes optional): every job whose id
        /// starts with them.
        #[arg(long)]
        id: Option<String>,
        /// Only jobs created at or after this time: RFC 3339 (2026-12-01T00:00:00Z) or
        /// microseconds since the epoch.
        #[arg(long, value_name = "TIME")]
        created_from: Option<String>,
        /// Only jobs created before this time (same forms as --created-from).
        #[arg(long, value_name = "TIME")]
        created_to: Option<String>,
        /// A path into the args: keys separated by dots, array indexes in brackets
        /// (customer.id, items[0].sku); with --args-value, only jobs whose args hold that value
        /// there.
        #[arg(long, value_name = "PATH")]
        args_path: Option<String>,
        /// The JSON value to find at --args-path: 42, true, null, "text" (quoted), or a bare
        /// word taken as a string.
        #[arg(long, value_name = "JSON")]
        args_value: Option<String>,
        /// Only jobs whose args' JSON text contains this text, byte for byte (no wildcards).
        #[arg(long, value_name = "TEXT")]
        args_contains: Option<String>,
        /// Jobs per page (1-1000).
        #[arg(long, default_value_t = 50, value_parser = count_in(1, 1000))]
        limit: usize,
        /// Continue after this cursor: the next_cursor printed by the previous page (the same
        /// filters must be given again).
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Put a failed, dead or cancelled job back in its queue; without an id, every job matching
    /// --state (failed, dead or cancelled), --task and --queue.
    Retry {
        id: Option<String>,
        #[command(flatten)]
        bulk: BulkArgs,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Cancel a queued, scheduled or running job; without an id, every job matching --state
    /// (scheduled, waiting, queued or running), --task and --queue.
    Cancel {
        id: Option<String>,
        #[command(flatten)]
        bulk: BulkArgs,
        #[command(flatten)]
        out: OutputArgs,
    },
    /// Delete every finished job matching --state (succeeded, failed, dead or cancelled),
    /// --task and --queue. Workflow steps are left to retention.
    Delete {
        #[command(flatten)]
        bulk: BulkArgs,
        #[command(flatten)]
        out: OutputArgs,
    },
}

/// The filter of a bulk action (docs/access.md): it shows how many jobs match and asks before
/// it runs, unless --yes.
#[derive(Debug, Args)]
pub struct BulkArgs {
    /// Only jobs in this state (required for a bulk action).
    #[arg(long)]
    pub state: Option<String>,
    #[arg(long)]
    pub queue: Option<String>,
    #[arg(long)]
    pub task: Option<String>,
    /// Run without asking for confirmation (needed when stdin is not a terminal).
    #[arg(long)]
    pub yes: bool,
}

impl BulkArgs {
    pub fn is_empty(&self) -> bool {
        self.state.is_none() && self.queue.is_none() && self.task.is_none() && !self.yes
    }
}

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// Include workers not heard of in the last hour.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Jobs to enqueue (1-10000000).
    #[arg(long, default_value_t = 20_000, value_parser = count_in(1, 10_000_000))]
    pub jobs: usize,
    /// Worker processes (1-256).
    #[arg(long, default_value_t = 2, value_parser = count_in(1, 256))]
    pub workers: usize,
    /// Concurrency of each worker (1-10000).
    #[arg(long, default_value_t = 32, value_parser = count_in(1, 10_000))]
    pub concurrency: usize,
    /// Jobs sent one by one to idle workers to measure enqueue→start latency without load
    /// (0-100000).
    #[arg(long, default_value_t = 200, value_parser = count_in(0, 100_000))]
    pub idle_samples: usize,
    /// Measure only the idle enqueue→start latency, with this many samples (0 = off; up to
    /// 100000): one no-op job at a time, each enqueued once the previous one finished and a
    /// random 5–15 ms passed, first into --workers separate `homing worker` processes (enqueued
    /// by this process), then through the HTTP API of one `homing up` that runs them itself.
    /// Prints p50/p95/p99/max of created → started from the job records (`started_at` is
    /// stamped when the worker asks to start the job, before the start transaction), p50/p99 of
    /// created → finished (which holds that transaction), and the CPU time the processes use
    /// over 10 s of idleness (from /proc/PID/stat). Skips the throughput phases.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = count_in(0, 100_000),
          conflicts_with_all = ["enqueue_only", "kills", "limit_concurrency", "limit_rate"])]
    pub latency: usize,
    /// What each job does: `noop`, or a sleep such as `10ms`.
    #[arg(long, default_value = "noop")]
    pub work: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Keep the benchmark's database instead of deleting it (when it is a temporary one).
    #[arg(long)]
    pub keep: bool,
    /// Start throwaway backends for the run: `embedded` (SQLite), `redis-sqlite` (a
    /// redis-server of its own, the store in SQLite) or `redis-postgres` (redis-server and
    /// PostgreSQL of its own, fsync on). Overrides --broker/--store.
    #[arg(long, value_parser = ["embedded", "redis-sqlite", "redis-postgres"])]
    pub backends: Option<String>,
    /// After the throughput phases, kill -9 a busy worker this many times and report how long
    /// until its jobs ran again (median and max; 0-1000).
    #[arg(long, default_value_t = 0, value_parser = count_in(0, 1000))]
    pub kills: usize,
    /// Workers' heartbeat interval (recovery after a kill takes about 3 intervals + one sweep;
    /// 10ms-1h).
    #[arg(long, default_value = "2s", value_parser = duration_in(10 * MS, HOUR))]
    pub heartbeat_interval: Duration,
    /// Give the benchmark's queue a cluster-wide concurrency limit (docs/limits.md), to measure
    /// what limits cost: set it at or above --workers x --concurrency to measure the mechanism
    /// alone, lower to measure a binding limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub limit_concurrency: Option<u32>,
    /// Give the benchmark's queue a rate limit, COUNT/PERIOD (e.g. 1000000/1s).
    #[arg(long, value_name = "COUNT/PERIOD", value_parser = homing::limit::Rate::parse)]
    pub limit_rate: Option<homing::limit::Rate>,
    /// Only enqueue the jobs, start no worker, and print the queue's name and the enqueue rate
    /// (with --json, one object): a backlog for workers started afterwards, e.g. by
    /// scripts/bench-million. Needs --broker and --store (a throwaway database would be gone).
    #[arg(long, conflicts_with_all = ["backends", "kills", "keep"])]
    pub enqueue_only: bool,
}

const CHAOS_ABOUT: &str = "Prove the guarantees: run a real deployment under load, inject faults, check every invariant.

Starts, on this machine, a `homing server` and --workers worker processes, then enqueues \
--rate jobs per second. Each job is a `builtin.http` call (answered after --job-ms) to a \
counter inside this process that records every call per Idempotency-Key. Beside them, \
--hostile-rate bodies per second that break the input rules (too deep, bad or internal names, \
NUL, out-of-range numbers) are posted to the API. Meanwhile faults are injected on a schedule \
drawn from --seed (the same seed replays the same schedule):

  kill9             SIGKILL of a worker running jobs (a supervisor restarts it)
  kill9_mid_commit  SIGKILL right after the counter answered one of the worker's jobs
  pause             SIGSTOP longer than the heartbeat TTL, then SIGCONT (a zombie wakes up)
  redis_restart     redis-server killed and started again empty      (--broker redis)
  redis_flushall    FLUSHALL                                          (--broker redis)
  net_cut           one worker's connections to Redis stall, then heal (--broker redis)
  postgres_restart  PostgreSQL stopped (fast, or immediate = crash), started again (--store postgres)
  lock_hold         the embedded file's write lock held longer than the heartbeat TTL by another
                    program, then released: must not be taken for a crash   (embedded broker)

Backends: by default the embedded SQLite in a temporary directory. `--broker redis` and \
`--store postgres` start a throwaway redis-server (no persistence) and PostgreSQL (fsync on, \
unix socket) of this tool's own; a redis:// or postgres:// URL uses that server instead (then \
only worker faults are injected: nothing else of yours is restarted or flushed).

When the time is up the load stops, the system drains, and the checker reads the store, the \
counter and the workers' logs: every accepted job must have succeeded (lost = 0), no job may have \
two applied commits in the logs nor one at an epoch other than its final one, and its result \
must answer a call made by its final run (completed twice = 0), every repeated call must follow \
a fault, no worker may ever have had more jobs running under its name than its prefetch (read \
from the job timelines), and every \
hostile request must have been refused with a 4xx and none stored. It reports zombie writes \
rejected, duplicate calls by cause, and recovery time from each kill to the killed jobs running \
again. Exit code 1 on any violation.

With --worker-kind python the workers are `python -m homing worker` processes (the package in \
clients/python, e.g. in scripts/python-venv's virtualenv) talking to the server over the remote \
worker protocol through a cuttable proxy each; their task calls the same counter the same way, \
and `server_kill` (SIGKILL of the server, restarted on its address) joins the faults.

Everything it starts dies with it (also on Ctrl-C or if it is killed); its directory under /tmp \
is removed unless --keep; it only talks to 127.0.0.1 and unix sockets. A run takes --duration \
plus the drain (at most --drain-limit).";

#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// How long to run the load and inject faults (1s-30d).
    #[arg(long, default_value = "60s", value_parser = duration_in(SECOND, 30 * DAY))]
    pub duration: Duration,
    /// Seed of the fault schedule (default: drawn from the clock and printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Worker processes (1-64).
    #[arg(long, default_value_t = 4, value_parser = count_in(1, 64))]
    pub workers: usize,
    /// Concurrency of each worker (1-10000).
    #[arg(long, default_value_t = 16, value_parser = count_in(1, 10_000))]
    pub concurrency: usize,
    /// Jobs enqueued per second (above 0, at most 100000).
    #[arg(long, default_value_t = 200.0, value_parser = rate)]
    pub rate: f64,
    /// How long the counter takes to answer each job's call, in milliseconds (0-600000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub job_ms: u64,
    /// Workers' heartbeat interval (the TTL is three of them; pauses and cuts outlast it;
    /// 10ms-1h).
    #[arg(long, default_value = "1s", value_parser = duration_in(10 * MS, HOUR))]
    pub heartbeat_interval: Duration,
    /// Mean time between the end of one fault and the start of the next (10ms-1d).
    #[arg(long, default_value = "4s", value_parser = duration_in(10 * MS, DAY))]
    pub fault_every: Duration,
    /// Only these fault kinds, comma-separated (default: every kind that applies).
    #[arg(long)]
    pub faults: Option<String>,
    /// Hostile `POST /v1/jobs` requests per second beside the load (too deep, bad names, NUL,
    /// internal tasks and queues, out-of-range numbers): each must be refused with a 4xx and
    /// none stored (0 turns them off; at most 1000).
    #[arg(long, default_value_t = 4.0, value_parser = hostile_rate)]
    pub hostile_rate: f64,
    /// Crash budget of each job: a fault-heavy run must not mistake its jobs for poison (1-1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_crashes: u32,
    /// After the load stops, how long the system may take to finish every job (1s-1d).
    #[arg(long, default_value = "180s", value_parser = duration_in(SECOND, DAY))]
    pub drain_limit: Duration,
    /// Run the throwaway PostgreSQL with fsync=off (faster, not crash-safe).
    #[arg(long)]
    pub pg_fsync_off: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Keep the run's directory (logs, databases) instead of deleting it; later runs leave it
    /// too (it holds a KEPT file), so delete it yourself.
    #[arg(long)]
    pub keep: bool,
    /// What the worker processes are: `rust` (`homing worker`) or `python` (`python -m homing
    /// worker` over the remote worker protocol, running a Python task that mirrors the Rust
    /// one; adds the `server_kill` fault, and `net_cut` cuts the workers from the server).
    #[arg(long, value_enum, default_value_t = ChaosWorkerKind::Rust)]
    pub worker_kind: ChaosWorkerKind,
    /// With --worker-kind python: the Python interpreter that has the homing package (default:
    /// $HOMING_PYTHON, else target/python-venv/bin/python as scripts/python-venv makes it, in
    /// the working directory or beside the target/<profile>/ holding this binary).
    #[arg(long)]
    pub python: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosWorkerKind {
    Rust,
    Python,
}

const SCHEDULES_ABOUT: &str = "Periodic schedules: a job per cron tick or per interval.\n\n\
    Every `homing up`, `server` and `worker` (unless --no-maintenance) runs the schedules; \
    however many run and whichever dies, each tick gets exactly one job, which carries \
    `schedule` and `scheduled_tick` in its record. Ticks missed while nothing ran (more than 10s \
    late) follow the schedule's --missed policy. Schedules can also be declared in the \
    HOMING_CONFIG file (\"schedules\": [...]), set again at every start.";

/// A schedule's name: the rules of task and queue names.
fn schedule_name(s: &str) -> Result<String, String> {
    homing::validate::name("schedule", s).map(|_| s.to_string())
}

fn missed_policy(s: &str) -> Result<homing::schedule::Missed, String> {
    s.parse()
}

fn cron_expr(s: &str) -> Result<String, String> {
    homing::schedule::check_cron(s).map(|_| s.to_string())
}

fn time_zone(s: &str) -> Result<String, String> {
    homing::schedule::check_timezone(s).map(|_| s.to_string())
}

/// An interval: whole seconds, from 1s to 366d.
fn interval(s: &str) -> Result<Duration, String> {
    let d = homing::time::parse_duration_in(
        s,
        homing::schedule::MIN_INTERVAL,
        homing::schedule::MAX_INTERVAL,
    )?;
    if d.subsec_nanos() != 0 {
        return Err(format!("'{s}' must be a whole number of seconds"));
    }
    Ok(d)
}

#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// Create or replace a schedule. Setting it again with the same cron/interval keeps its
    /// progress; a new cron/interval starts counting now.
    Set(ScheduleSetArgs),
    /// List schedules with their next tick, last tick and last job.
    List(OutputArgs),
    /// Stop enqueueing a schedule's ticks (it stays, with its progress).
    Pause {
        #[arg(value_parser = schedule_name)]
        name: String,
    },
    /// Enqueue a paused schedule's ticks again, from now on (ticks that fell while it was
    /// paused are not enqueued).
    Resume {
        #[arg(value_parser = schedule_name)]
        name: String,
    },
    /// Delete a schedule. Its jobs stay.
    Delete {
        #[arg(value_parser = schedule_name)]
        name: String,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["cron", "every"])))]
pub struct ScheduleSetArgs {
    /// The schedule's name: 1-128 letters, digits, '.', '_', '-', ':'.
    #[arg(value_parser = schedule_name)]
    pub name: String,
    /// The task each tick's job runs, e.g. builtin.http. It must be one a worker has
    /// registered (or a builtin), as for `homing enqueue`, unless --allow-unknown-task.
    #[arg(long)]
    pub task: String,
    /// Set the schedule even if no worker has ever registered its task (its ticks' jobs wait
    /// until one does).
    #[arg(long)]
    pub allow_unknown_task: bool,
    /// The jobs' input as JSON; `@FILE` reads a file.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// The jobs' queue.
    #[arg(long, default_value = "default", value_parser = queue_name)]
    pub queue: String,
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds
    /// first), e.g. "0 3 * * *" or "*/10 * * * * *"; nicknames such as @hourly work too.
    #[arg(long, value_parser = cron_expr, conflicts_with = "every")]
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in (e.g. Europe/Paris); across daylight
    /// saving changes it runs as cron does.
    #[arg(long, default_value = "UTC", value_parser = time_zone)]
    pub timezone: String,
    /// A fixed interval instead of cron, counted from when the schedule is set: whole seconds
    /// from 1s to 366d (e.g. 30s, 5m, 1h).
    #[arg(long, value_parser = interval)]
    pub every: Option<Duration>,
    /// Ticks missed while nothing ran: `latest` enqueues the newest one once, `skip` none,
    /// `all:N` each of the newest N (N from 1 to 1000).
    #[arg(long, default_value = "latest", value_parser = missed_policy)]
    pub missed: homing::schedule::Missed,
    /// Retries after a handler error (default: the task's own, else 3; 0-10000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=homing::validate::MAX_RETRIES as i64))]
    pub max_retries: Option<u32>,
    /// Cancel a tick's handler if it runs longer than this (1ms-366d).
    #[arg(long, value_parser = duration_in(MS, homing::validate::MAX_DELAY))]
    pub time_limit: Option<Duration>,
    /// Print the schedule as JSON.
    #[arg(long)]
    pub json: bool,
}
