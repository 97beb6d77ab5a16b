//! The store: the source of truth for every job (docs/design.md section 1, guarantee 9).
//!
//! Every state change a job goes through is one call here, and each call is one transaction:
//! either all of it is committed or none of it. Each method says what a crash in the middle
//! leaves behind ("crash contract"); the conformance suite in [`crate::conformance::store`]
//! checks the observable part of each contract against every implementation.
//!
//! What a transition does is decided in [`crate::transition`]; a store reads the row, asks it,
//! and writes the answer. A row whose data cannot be decoded is still read (the column shows
//! as null, named in [`Job::unreadable`]), so one bad job cannot fail a page, a batch or a queue.

pub mod audit;
pub(crate) mod limits;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queues;
pub(crate) mod schedules;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub(crate) mod stats_sql;
mod worker_status;

pub use worker_status::WorkerStatus;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::events::{Event, NewEvent, Subscriber};
use crate::job::{Job, JobId, JobState, NewJob};
use crate::time::Micros;
use crate::workflow::{NewWorkflow, Workflow, WorkflowId, WorkflowPage};

/// A job that must be (re)published to the broker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToPublish {
    pub id: JobId,
    pub queue: String,
    /// The job's priority: a broker that can order by it starts higher ones first.
    pub priority: i32,
}

impl From<Job> for ToPublish {
    fn from(job: Job) -> Self {
        ToPublish {
            id: job.id,
            queue: job.queue,
            priority: job.priority,
        }
    }
}

/// What [`Store::insert`] did with one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Inserted {
    pub id: JobId,
    pub queue: String,
    pub state: JobState,
    /// `true` when the idempotency key matched an existing job, which is returned instead.
    pub existed: bool,
}

impl Inserted {
    /// Whether the caller should publish this job now.
    pub fn needs_dispatch(&self) -> bool {
        !self.existed && self.state == JobState::Queued
    }
}

/// The messages an insert's caller publishes: one per job it inserted `queued`, with the
/// priority asked for (`priorities[i]` for `inserted[i]`). A job that already existed is not
/// published again, so its priority is never taken from this call.
pub fn to_dispatch(inserted: &[Inserted], priorities: &[i32]) -> Vec<ToPublish> {
    inserted
        .iter()
        .zip(priorities)
        .filter(|(i, _)| i.needs_dispatch())
        .map(|(i, p)| ToPublish {
            id: i.id,
            queue: i.queue.clone(),
            priority: *p,
        })
        .collect()
}

/// The decision [`Store::start`] takes for one delivery (docs/design.md section 4, step 2).
#[derive(Debug, Clone, PartialEq)]
pub enum StartOutcome {
    /// Run it: the job is now `running` under this worker with a new epoch.
    Run(Box<Job>),
    /// Do not run it (terminal, cancelled, or already running under a worker): acknowledge.
    Skip(JobState),
    /// It is scheduled and not yet due: acknowledge; the scheduler dispatches it when due.
    Defer(Micros),
    /// Its crash budget is spent: it is now `dead`; acknowledge.
    Dead,
    /// Its queue is paused: it stays `queued`, undispatched, and is published again once the
    /// queue is resumed; acknowledge.
    Parked,
    /// No such job: the message is garbage; dead-letter it.
    Missing,
    /// The worker was presumed dead ([`Store::presume_lost`]) before this start: nothing of
    /// the batch runs or is written, the job stays as it was, and the message stays reserved
    /// for the rescuer to put back. The worker has learnt it is presumed dead: its session is
    /// over (it rejoins under a new name). Without this a worker slow to notice would run again
    /// what the rescuer had just put back, beside the worker that takes it next.
    Presumed,
    /// Nothing could be decided or written for this job (the store failed on it, even when
    /// making it `dead`): its batch-mates are decided normally, and this delivery alone is
    /// handed back to be tried again later. The reason is for the log.
    Unstartable(String),
}

pub use crate::transition::Outcome;

/// What [`Store::presume_lost`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presumption {
    /// The worker is presumed dead: by this call, which recorded its runs, or an earlier one.
    Made,
    /// A lock the presumption needs was held longer than the store waits (a start of the worker
    /// still in flight, its process paused mid-transaction): nothing was written; try again on
    /// the next pass.
    Deferred,
}

/// One fenced completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: JobId,
    /// The epoch the run started under; the commit applies only if it is still current.
    pub epoch: u64,
    pub outcome: Outcome,
}

/// What [`Store::complete`] did with one completion.
#[derive(Debug, Clone, PartialEq)]
pub enum Committed {
    /// Applied. `dispatch` lists jobs that are now queued and must be published (follow-ups,
    /// a released job).
    Applied {
        state: JobState,
        dispatch: Vec<ToPublish>,
    },
    /// Rejected: the epoch is stale (a zombie's write) or the job is no longer running.
    Stale,
    /// Nothing could be written for this completion (the store failed on it, even when making
    /// the job `dead`, or became unavailable before its turn): the rest of the batch committed
    /// normally; this run is left `running` and its message must not be acknowledged (a worker
    /// keeps it and commits the outcome again later). The reason is for the log.
    Unstored(String),
}

/// What [`Store::mark_lost`] did with a job whose worker was lost.
#[derive(Debug, Clone, PartialEq)]
pub enum Lost {
    /// It was running under that worker: `crashes + 1`, back to `queued` (undispatched).
    Requeued,
    /// It was running under that worker and its crash budget is now spent: `dead`.
    Dead,
    /// It was running under that worker with a cancel request: `cancelled`.
    Cancelled,
    /// It was not running under that worker; nothing changed. Its state is given so the caller
    /// knows whether the lost worker's message must be put back (`queued`) or dropped.
    NotOwned(JobState),
    Missing,
}

/// An operator's settings of one queue (`homing queues pause`, docs/limits.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    pub queue: String,
    pub paused: bool,
    /// Cluster-wide limits (`homing queues limit`); all absent when unlimited.
    #[serde(default)]
    pub limits: crate::limit::QueueLimits,
}

/// How many of a resumed queue's waiting jobs [`Store::set_paused`] hands back to publish at
/// once; the reconciler publishes any beyond it.
pub const RESUME_PUBLISH_LIMIT: usize = 10_000;

/// Filters for [`Store::list`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub queue: Option<String>,
    pub task: Option<String>,
}

/// A page of jobs, newest first; `next_cursor` continues after the last one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    pub next_cursor: Option<String>,
}

impl JobPage {
    /// Makes a page of `jobs`, newest first; when `more` match after them, the next page starts
    /// after the last one.
    pub fn new(jobs: Vec<Job>, more: bool) -> JobPage {
        let next_cursor = if more {
            jobs.last().map(|j| j.id.to_string())
        } else {
            None
        };
        JobPage { jobs, next_cursor }
    }
}

/// The most stored text (args, result, error, progress, chained jobs and the rest, as the
/// store holds them) one page of jobs carries, beside its count limit. A job may hold 1 MiB of
/// args and 8 MiB of result, so a page of 1,000 could otherwise be gigabytes in the process that
/// answers it, from one read. A page always holds at least one job, so paging goes on.
pub const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Decides which matching rows, newest first, make a page: every store reads up to `limit + 1`
/// rows and offers each one's stored size here before decoding it.
#[derive(Debug)]
pub struct PageFill {
    limit: usize,
    budget: usize,
    taken: usize,
    bytes: usize,
}

impl PageFill {
    pub fn new(limit: usize) -> PageFill {
        PageFill::with_budget(limit, PAGE_BYTES)
    }

    pub fn with_budget(limit: usize, budget: usize) -> PageFill {
        PageFill {
            limit,
            budget,
            taken: 0,
            bytes: 0,
        }
    }

    /// Whether the page holds its `limit` of jobs already: the next row will not go on it,
    /// whatever its size.
    pub fn counted_out(&self) -> bool {
        self.taken == self.limit
    }

    /// Whether the next row, of `bytes` stored, goes on the page. The first `false` ends the
    /// page, and says that another follows: the row offered is its first.
    pub fn take(&mut self, bytes: usize) -> bool {
        let full = self.counted_out()
            || (self.taken > 0 && self.bytes.saturating_add(bytes) > self.budget);
        if !full {
            self.taken += 1;
            self.bytes = self.bytes.saturating_add(bytes);
        }
        !full
    }
}

/// One page of [`Store::schedules_page`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulePage {
    pub schedules: Vec<crate::schedule::Schedule>,
    /// The name to ask for the next page after; `None` on the last page.
    pub next: Option<String>,
}

/// What one [`Store::purge`] call deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub jobs: u64,
    pub events: u64,
    pub workers: u64,
    /// Audit entries recorded before the cut-off (docs/access.md).
    pub audit: u64,
    /// Workflows deleted as a whole (docs/workflows.md).
    pub workflows: u64,
    /// Rollup rows of the charts (docs/charts.md), all spans and tables together.
    pub stats: u64,
}

/// Counts per queue and state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub queue: String,
    pub scheduled: u64,
    /// Workflow steps waiting for their parents: accepted, not yet runnable.
    #[serde(default)]
    pub waiting: u64,
    pub queued: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub cancelled: u64,
}

/// Jobs of one queue that finished since a given time (the dashboard's "last hour").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FinishedCounts {
    pub queue: String,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub cancelled: u64,
}

impl From<QueueStats> for FinishedCounts {
    fn from(q: QueueStats) -> Self {
        Self {
            queue: q.queue,
            succeeded: q.succeeded,
            failed: q.failed,
            dead: q.dead,
            cancelled: q.cancelled,
        }
    }
}

impl From<crate::stats::CountRow> for FinishedCounts {
    fn from(r: crate::stats::CountRow) -> Self {
        Self {
            queue: r.queue,
            succeeded: r.succeeded,
            failed: r.failed,
            dead: r.dead,
            cancelled: r.cancelled,
        }
    }
}

/// Folds `(queue, state, count)` rows, sorted by queue, into one [`QueueStats`] per queue: the
/// shape both stores' `GROUP BY queue, state` queries return.
pub(crate) fn group_counts(
    rows: impl IntoIterator<Item = (String, String, i64)>,
) -> Vec<QueueStats> {
    let mut out: Vec<QueueStats> = Vec::new();
    for (queue, state, n) in rows {
        if out.last().map(|q| q.queue != queue).unwrap_or(true) {
            out.push(QueueStats {
                queue,
                ..Default::default()
            });
        }
        let q = out.last_mut().expect("pushed above");
        let n = n.max(0) as u64;
        match state.as_str() {
            "scheduled" => q.scheduled = n,
            "waiting" => q.waiting = n,
            "queued" => q.queued = n,
            "running" => q.running = n,
            "succeeded" => q.succeeded = n,
            "failed" => q.failed = n,
            "dead" => q.dead = n,
            "cancelled" => q.cancelled = n,
            _ => {}
        }
    }
    out
}

/// Decodes a stored JSON column without failing the row: text that cannot be decoded (invalid,
/// or nested deeper than the decoder reads) becomes `None`, and a note naming the column is added
/// to `unreadable` (it becomes [`Job::unreadable`]).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    text: Option<&str>,
    column: &str,
    unreadable: &mut Vec<String>,
) -> Option<T> {
    match serde_json::from_str(text?) {
        Ok(v) => Some(v),
        Err(e) => {
            unreadable.push(format!("{column} cannot be read: {e}"));
            None
        }
    }
}

/// A stored integer column that must fit a `u32` (a counter, a budget), decoded without failing
/// the row: a value out of range or of another type becomes `None` with a note in `unreadable`.
pub(crate) fn read_u32(
    value: Option<i64>,
    column: &str,
    unreadable: &mut Vec<String>,
) -> Option<u32> {
    match value.map(u32::try_from) {
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => {
            unreadable.push(format!("{column} cannot be read: {e}"));
            None
        }
        None => None,
    }
}

/// A stored state, decoded without failing the row: an unknown word is noted in `unreadable`
/// and shown as `queued`, a state from which a start makes it `dead` with that note as its
/// reason (a job whose state nobody knows is neither run nor left waiting forever).
pub(crate) fn read_state(text: Option<&str>, unreadable: &mut Vec<String>) -> JobState {
    match text.map(str::parse::<JobState>) {
        Some(Ok(s)) => s,
        Some(Err(e)) => {
            unreadable.push(format!("state cannot be read: {e}"));
            JobState::Queued
        }
        None => {
            unreadable.push("state cannot be read: it is not text".into());
            JobState::Queued
        }
    }
}

/// The job each store's `bury` statement reports, from the only columns it reads (id, task, queue,
/// worker, callback_url): enough for its `job.dead` event, and readable on any row. The columns
/// it did not read are noted in `unreadable`.
pub(crate) fn buried_job(
    id: JobId,
    task: String,
    queue: String,
    worker: Option<String>,
    callback_url: Option<String>,
    reason: &str,
    now: Micros,
) -> Job {
    Job {
        id,
        task,
        queue,
        state: JobState::Dead,
        args: serde_json::Value::Null,
        result: None,
        error: Some(reason.to_string()),
        attempts: 0,
        crashes: 0,
        epoch: 0,
        max_retries: None,
        max_crashes: 0,
        idempotency_key: None,
        priority: 0,
        progress: None,
        worker,
        created_at: 0,
        scheduled_at: None,
        started_at: None,
        finished_at: Some(now),
        retry_policy: None,
        time_limit: None,
        on_success: None,
        on_failure: None,
        cancel_requested: false,
        callback_url,
        schedule: None,
        scheduled_tick: None,
        workflow: None,
        parents: None,
        traceparent: None,
        unreadable: vec![
            "made dead as a last resort: only id, task, queue, worker and callback_url were read"
                .into(),
        ],
    }
}

/// A stored event's data, or what a reader is shown instead when it cannot be decoded:
/// `{"unreadable": "<why>"}`, so one bad event never fails a page of events.
pub(crate) fn read_event_data(text: &str) -> std::result::Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("event data cannot be read: {e}"))
}

/// The second line of defence of batch calls (docs/design.md section 12, bad input): `batch` runs
/// everything in one transaction; when that fails for a reason other than the store being
/// unavailable (so one item's data is at fault), each item runs alone in its own transaction,
/// and an item that still fails is handed to `isolate` with its error, which confines it to
/// its own job (it becomes `dead`) so its neighbours commit normally.
///
/// Once the items run one by one, the call never fails as a whole: items before may already be
/// committed, and a caller that saw an error would treat them as not done (a started job would
/// stay `running` with no handler). An item that cannot be isolated either, or that meets the
/// store unavailable, gets its own outcome from `failed` instead. The call fails only when
/// nothing was committed: the batch's transient error, or one item's before any committed.
pub(crate) async fn isolating<I, O, B, BF, S, SF, X, XF, F>(
    items: Vec<I>,
    batch: B,
    single: S,
    isolate: X,
    failed: F,
) -> Result<Vec<O>>
where
    I: Clone,
    B: FnOnce(Vec<I>) -> BF,
    BF: std::future::Future<Output = Result<Vec<O>>>,
    S: Fn(I) -> SF,
    SF: std::future::Future<Output = Result<O>>,
    X: Fn(I, crate::error::Error) -> XF,
    XF: std::future::Future<Output = Result<O>>,
    F: Fn(&crate::error::Error) -> O,
{
    match batch(items.clone()).await {
        Ok(v) => return Ok(v),
        Err(e) if e.is_transient() || items.is_empty() => return Err(e),
        Err(e) => {
            tracing::warn!(error = %e, items = items.len(), "a batch failed; trying its items one by one");
        }
    }
    let mut out = Vec::with_capacity(items.len());
    let mut unavailable: Option<crate::error::Error> = None;
    for item in items {
        // Each outcome below was committed (or committed nothing), so from the first one on,
        // an error is this item's alone.
        let committed = !out.is_empty();
        if let Some(e) = &unavailable {
            out.push(failed(e));
            continue;
        }
        let e = match single(item.clone()).await {
            Ok(o) => {
                out.push(o);
                continue;
            }
            Err(e) if e.is_transient() => e,
            Err(e) => match isolate(item, e).await {
                Ok(o) => {
                    out.push(o);
                    continue;
                }
                Err(e) => e,
            },
        };
        if !committed && e.is_transient() {
            return Err(e);
        }
        tracing::error!(error = %e, "an item of a batch could not be written nor isolated; it is answered alone");
        out.push(failed(&e));
        if e.is_transient() {
            // The store is unavailable: the remaining items are answered untried.
            unavailable = Some(e);
        }
    }
    Ok(out)
}

/// What one [`Store::fan_out`] call did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FanOut {
    /// Pending events it handled (marked dispatched), matching subscribers or not.
    pub events: usize,
    /// The `builtin.webhook` jobs it inserted, to publish now (the reconciler publishes them
    /// otherwise).
    pub dispatch: Vec<ToPublish>,
}

/// What a worker says about itself when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: String,
    pub hostname: String,
    pub pid: u32,
    pub queues: Vec<String>,
    pub concurrency: u32,
    pub tasks: Vec<String>,
    #[serde(with = "crate::time::as_rfc3339")]
    pub started_at: Micros,
    /// Set for a remote worker session (docs/remote-workers.md): what the gateway needs to
    /// answer its calls from any server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::remote::RemoteWorker>,
    /// The worker's software version: homing's for a worker of this crate, what a remote
    /// worker sent (the Python package's) otherwise; `None` for rows written before it was
    /// recorded, or a remote worker that sent none.
    #[serde(default)]
    pub version: Option<String>,
    /// The heartbeat TTL it registered with: liveness compares the heartbeat's age with it.
    /// `None` for rows written before it was recorded.
    #[serde(default)]
    pub heartbeat_ttl_ms: Option<u64>,
}

/// What decides whether a completion for an epoch was already committed
/// ([`Store::last_completion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionState {
    pub state: JobState,
    /// The current epoch (of the latest start).
    pub epoch: u64,
    /// The epoch of the last completion committed for this job, if any.
    pub completed_epoch: Option<u64>,
}

/// A job running under one worker ([`Store::running_under`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningUnder {
    pub id: JobId,
    pub epoch: u64,
    pub started_at: Micros,
}

/// A worker as the store last heard of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    #[serde(flatten)]
    pub info: WorkerInfo,
    #[serde(with = "crate::time::as_rfc3339")]
    pub last_seen: Micros,
    pub status: WorkerStatus,
    pub running: Vec<JobId>,
    /// When it was declared `lost` or `stopped`; `None` while live (and for rows ended before
    /// this was recorded).
    #[serde(with = "crate::time::opt_rfc3339")]
    pub ended_at: Option<Micros>,
    /// When a rescuer first found it without a heartbeat ([`Store::presume_lost`]); `None`
    /// until then. Runs it began after this counted no crash when
    /// reclaimed.
    #[serde(with = "crate::time::opt_rfc3339")]
    pub presumed_dead_at: Option<Micros>,
    /// The jobs the rescuer reclaimed from it, newest first (at most
    /// [`crate::reclaim::RECLAIMS_LISTED`]).
    pub reclaimed: Vec<crate::reclaim::Reclaim>,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs and errors (`sqlite`, `postgres`).
    fn kind(&self) -> &'static str;

    /// How many [`Store::complete`] calls one worker may have in flight at once. One for a store
    /// with a single writer; more where a commit mostly waits for its own log flush and
    /// separate connections overlap those waits (docs/fastpath.md).
    fn commits_in_flight(&self) -> usize {
        1
    }

    /// The embedded SQLite file this store lives in, if any: a broker in the same file lets the
    /// committer acknowledge in the commit's own transaction.
    #[cfg(feature = "sqlite")]
    fn embedded_db(&self) -> Option<&std::sync::Arc<crate::sqlite::Db>> {
        None
    }

    /// Inserts new jobs, each `queued` (undispatched) or `scheduled` when `run_at` is in the
    /// future. A job whose idempotency key already exists is not inserted; the existing job is
    /// returned with `existed = true`.
    ///
    /// Crash contract: one transaction for the whole batch; a crash commits all or none.
    async fn insert(&self, jobs: Vec<NewJob>) -> Result<Vec<Inserted>>;

    /// [`Store::insert`] for a store whose embedded file the broker shares
    /// ([`Store::embedded_db`]): in the same transaction, the messages of the jobs to dispatch
    /// (`priorities[i]` for `jobs[i]`) and their `dispatched` mark. One write where enqueue
    /// otherwise takes three (insert, publish, mark), each waiting for the file's write lock.
    /// Other stores answer an internal error; callers check [`Store::embedded_db`] first.
    ///
    /// Crash contract: one transaction: the jobs and their messages are committed together or
    /// not at all.
    #[cfg(feature = "sqlite")]
    async fn insert_and_publish(
        &self,
        jobs: Vec<NewJob>,
        priorities: Vec<i32>,
    ) -> Result<Vec<Inserted>> {
        let _ = (jobs, priorities);
        Err(crate::error::Error::Backend {
            backend: "store",
            message: "insert_and_publish needs a store in an embedded file".into(),
            source: None,
        })
    }

    /// Records that these jobs' messages are in the broker.
    ///
    /// Crash contract: a crash before it leaves them undispatched, and the reconciler publishes
    /// them again; a duplicate message is harmless (the idempotency guard skips it).
    async fn mark_dispatched(&self, ids: &[JobId]) -> Result<()>;

    /// Queued jobs that are not marked dispatched and were last changed before `before`
    /// (the outbox of messages still to publish). A shared store may lease what it returns
    /// (PostgreSQL stamps the rows with the current time), so that reconcilers sweeping at once
    /// do not publish the same jobs; unpublished ones come back once `before` passes the lease.
    ///
    /// Crash contract: a read (plus the lease, one statement); a caller that crashes before
    /// publishing leaves the jobs undispatched, and they come back.
    async fn undispatched(&self, before: Micros, limit: usize) -> Result<Vec<ToPublish>>;

    /// Marks every queued job undispatched, so the reconciler publishes it again: called when
    /// the broker has lost its data.
    ///
    /// Crash contract: one transaction; calling it again is harmless (duplicate messages are
    /// skipped by the idempotency guard).
    async fn redispatch_all(&self) -> Result<u64>;

    /// Decides, atomically, what to do with one delivery of `id` to `worker` at `now`
    /// (docs/design.md section 4, step 2). `Run` increments the epoch and sets `running`, `worker`,
    /// `started_at`.
    ///
    /// The decision is [`crate::transition::start`]'s; a job whose stored data cannot be
    /// decoded is made `dead` with the reason, and its batch-mates start normally. A job on
    /// which even that fails is [`StartOutcome::Unstartable`] alone: once any job of the call
    /// is committed, the call does not fail as a whole.
    ///
    /// A worker presumed dead starts nothing: every outcome is [`StartOutcome::Presumed`].
    ///
    /// Crash contract: one transaction for the batch (one per job if the batch fails for a job's
    /// data, see [`isolating`]); a crash after it leaves the jobs `running` under `worker`, which
    /// the rescuer reclaims once the worker's heartbeat expires.
    async fn start(&self, ids: &[JobId], worker: &str, now: Micros) -> Result<Vec<StartOutcome>>;

    /// Commits outcomes, each only if the job is `running` with exactly that epoch. Follow-ups
    /// declared by a job for the state it reaches are inserted in the same transaction.
    ///
    /// What each outcome writes is [`crate::transition::complete`]'s decision. A completion
    /// that cannot be written (say, a follow-up the database refuses) makes its job `dead` with
    /// the reason instead, and the rest of the batch commits normally.
    ///
    /// Crash contract: one transaction for the batch (one per completion if the batch fails for
    /// one's data, see [`isolating`]); a crash commits all or none of a transaction, and an
    /// uncommitted run is reclaimed and runs again under a new epoch.
    async fn complete(&self, done: &[Completion], now: Micros) -> Result<Vec<Committed>>;

    /// Called by the rescuer for a job whose worker `worker` is lost: counts the crash and puts
    /// the job back (or makes it `dead`/`cancelled`), only if it is running under that worker.
    /// A row with undecodable data is still decided (see [`crate::transition::lost`]); a job
    /// whose new state cannot be written is made `dead` as a last resort.
    ///
    /// A job it reclaims (requeued, dead or cancelled) is recorded in the same transaction as a
    /// [`crate::reclaim::Reclaim`] of `worker` with the lost run's epoch, so the worker view
    /// lists every job taken from a lost worker ([`WorkerRecord::reclaimed`]).
    ///
    /// Crash contract: one transaction; conditional on the owner, so concurrent rescuers count
    /// each crash once (and record its reclaim once).
    ///
    /// The job's slot of a concurrency-limited queue is freed in the same transaction and the
    /// next parked job unparked; [`Store::mark_lost_unparking`] returns it for the caller to
    /// publish, this one leaves it to the reconciler.
    async fn mark_lost(&self, id: JobId, worker: &str, now: Micros) -> Result<Lost> {
        Ok(self.mark_lost_unparking(id, worker, false, now).await?.0)
    }

    /// [`Store::mark_lost`], also returning the job it unparked (stamped `now`, so the
    /// reconciler publishes it only if the caller dies before it does). The rescuers publish it
    /// themselves because the outbox alone can lose it: an older message of that job, taken and
    /// parked while its producer's `mark_dispatched` was still on its way, lets that late mark
    /// set `dispatched` on the unparked job, which then has no message and leaves the outbox.
    ///
    /// With `presumed` (the caller found the worker without a heartbeat and called
    /// [`Store::presume_lost`] first), a run that was not running under the worker when it was
    /// first presumed dead is reclaimed without counting a crash ([`crate::transition::lost`]).
    /// Without it, or for a worker with no record, the crash counts.
    async fn mark_lost_unparking(
        &self,
        id: JobId,
        worker: &str,
        presumed: bool,
        now: Micros,
    ) -> Result<(Lost, Option<ToPublish>)>;

    /// Records that `worker` is presumed dead, the first time only: its row's `presumed_dead_at`
    /// is set to the later of `now` and the store's own clock while it writes (so that a run
    /// begun after it, by the same clock, is never among the recorded runs: what
    /// `homing chaos` checks), and in the same transaction the runs then running under it (job and
    /// epoch) are recorded. Later calls, from any process, change nothing. Those runs count a
    /// crash when reclaimed. It is ordered against the worker's starts: a start in flight
    /// commits first and its runs are recorded, a start after it is refused
    /// ([`StartOutcome::Presumed`]; the worker had not noticed and took back a message a rescuer
    /// put back), so no run of the worker should escape the record; one that did would count
    /// none, however many rescuers reclaim it. Decided by what ran, not by clocks: the runs'
    /// start times are written with the workers' clocks, which may differ from the rescuers'. A
    /// worker with no record is not recorded (its crashes count as before).
    ///
    /// The wait for the starts in flight is bounded: a start that holds it up longer (its
    /// process paused mid-transaction, which the store ends after its idle-in-transaction
    /// timeout) gets [`Presumption::Deferred`] and nothing is written, unless the worker was
    /// presumed already. The caller leaves that worker for its next pass and goes on with the
    /// others, so a stuck start does not fail the whole sweep.
    ///
    /// Crash contract: one transaction; a crash leaves the worker unrecorded (the next caller
    /// records it) or recorded with its runs.
    async fn presume_lost(&self, worker: &str, now: Micros) -> Result<Presumption>;

    /// Moves scheduled jobs whose time has come to `queued` (undispatched) and returns them.
    ///
    /// Crash contract: one transaction; each due job is claimed by exactly one caller even when
    /// many schedulers run; a crash after it leaves them undispatched for the reconciler.
    async fn claim_due(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>>;

    /// Pauses or resumes a queue, registering its name as an enqueue would (a new name counts
    /// against the store's bound on queue names). While a queue is paused [`Store::start`]
    /// parks its jobs instead of running them ([`crate::transition::start_gated`]) and
    /// [`Store::undispatched`] leaves them out; resuming returns up to
    /// [`RESUME_PUBLISH_LIMIT`] of its queued, undispatched jobs, oldest first, to publish now
    /// (the reconciler publishes the rest).
    ///
    /// Crash contract: one transaction; a crash after a resume leaves the jobs undispatched on
    /// a running queue, which the reconciler publishes. Calling it again is harmless.
    async fn set_paused(&self, queue: &str, paused: bool, now: Micros) -> Result<Vec<ToPublish>>;

    /// Every queue with settings of its own (paused or limited), by name.
    async fn queue_settings(&self) -> Result<Vec<QueueSettings>>;

    /// Sets (replaces) a queue's cluster-wide limits, registering its name as
    /// [`Store::set_paused`] does; `QueueLimits::default()` clears them. While a queue is limited
    /// [`Store::start`] grants a start only when the limit has room, counted in the start's
    /// transaction, and parks the job otherwise. Every parked job of the queue is unparked and
    /// up to [`RESUME_PUBLISH_LIMIT`] of them returned to publish now, since the new limits may
    /// admit them (a start parks again what they do not).
    ///
    /// Crash contract: one transaction; a crash after it leaves the unparked jobs undispatched
    /// for the reconciler.
    async fn set_limits(
        &self,
        queue: &str,
        limits: &crate::limit::QueueLimits,
        now: Micros,
    ) -> Result<Vec<ToPublish>>;

    /// Unparks, per limited queue (and key) that is not paused, as many parked jobs as its
    /// limits have room for now, oldest first, at most `limit` in all, and returns them to
    /// publish; forgets rate-limit starts older than their window. A released slot unparks in
    /// its own transaction; this pass is what lets a rate limit's next window start parked jobs,
    /// and what repairs a wake-up lost to a crash between commit and publish.
    ///
    /// Crash contract: one transaction per queue; a crash after one leaves its unparked jobs
    /// undispatched for the reconciler.
    async fn unpark_ready(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>>;

    /// Jobs `running` under any worker: `(id, worker, started_at)`, oldest first.
    async fn running(&self, limit: usize) -> Result<Vec<(JobId, String, Micros)>>;

    /// Jobs `running` under `worker`, oldest start first, at most `limit`: a remote session's
    /// housekeeping compares them with what the session says it holds.
    async fn running_under(&self, worker: &str, limit: usize) -> Result<Vec<RunningUnder>>;

    /// A job's state, current epoch and the epoch of its last committed completion (every
    /// applied [`Store::complete`] records it, in the same statement), or `None` for a missing
    /// job. It is what tells a retried completion whose answer was lost from a zombie's write.
    async fn last_completion(&self, id: JobId) -> Result<Option<CompletionState>>;

    /// What worker `id` said about itself when it registered, or `None`.
    async fn worker_info(&self, id: &str) -> Result<Option<WorkerInfo>>;

    /// Records the handler's progress, only while `epoch` is current.
    ///
    /// Crash contract: one fenced statement; a crash loses at most this report.
    async fn set_progress(
        &self,
        id: JobId,
        epoch: u64,
        progress: serde_json::Value,
    ) -> Result<bool>;

    /// Makes a job `dead` with a reason whatever its state (an undecodable delivery), with its
    /// `job.dead` event and `on_failure` follow-up. Returns `false` for a missing or finished job.
    ///
    /// Crash contract: one transaction: the job is dead with its event and follow-up, or
    /// untouched; calling it again changes nothing.
    async fn mark_dead(&self, id: JobId, reason: &str, now: Micros) -> Result<bool>;

    async fn get(&self, id: JobId) -> Result<Option<Job>>;

    /// Job `id`'s timeline (docs/timeline.md), oldest first: one entry per transition, each
    /// written in its transition's transaction, bounded to the first and the latest
    /// [`crate::history::KEEP_LATEST`]. Empty for a job that does not exist (or was pruned).
    async fn history(&self, id: JobId) -> Result<crate::history::History>;

    async fn get_by_key(&self, idempotency_key: &str) -> Result<Option<Job>>;

    /// Jobs matching `filter`, newest first, at most `limit`, after `cursor`: the search below
    /// with only its state, queue and task fields.
    async fn list(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        let search = crate::search::JobSearch {
            state: filter.state,
            queue: filter.queue.clone(),
            task: filter.task.clone(),
            ..Default::default()
        };
        self.search(&search, cursor, limit).await
    }

    /// Jobs matching every field of `search` (docs/operate.md), newest first (by id), at most
    /// `limit`, after `cursor` (a job id): keyset paging, so a page costs the same deep in the
    /// list as at its head. Nothing of `search` is spliced into SQL.
    async fn search(
        &self,
        search: &crate::search::JobSearch,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage>;

    /// An operator's retry: a `failed`, `dead` or `cancelled` job goes back to `queued`
    /// (undispatched) with its retry budget renewed. Other states are a `Conflict`, and so is a
    /// workflow step that never became runnable whose parents are not yet as it requires
    /// ([`crate::workflow::rerun`]; one whose parents are is given them).
    ///
    /// Crash contract: one transaction deciding on the locked row, so two operators retrying at
    /// once requeue the job once (the second gets a `Conflict`); a crash after it leaves the job
    /// undispatched, and the reconciler publishes it.
    async fn retry(&self, id: JobId, now: Micros) -> Result<Job>;

    /// Cancels a job: `queued` or `scheduled` become `cancelled`; a `running` job is marked
    /// `cancel_requested` and its worker stops it. Terminal jobs are a `Conflict`.
    ///
    /// Crash contract: one transaction deciding on the locked row, with the `job.cancelled`
    /// event of a job with a callback. A request on a running job survives a crash of the
    /// worker: the rescuer finds it and makes the job `cancelled`.
    async fn cancel(&self, id: JobId, now: Micros) -> Result<Job>;

    /// A bulk retry's step (docs/bulk.md): [`Store::retry`] of each of `ids`, all in one
    /// transaction. Returns the jobs it put back in their queue, as the broker needs them (id,
    /// queue, priority: a step never holds its jobs' args and results together); a job that is
    /// gone or that the decision refuses now (another party changed it since it was read) is
    /// left as it is.
    ///
    /// Crash contract: one transaction (the caller keeps the slice small): all of the step's
    /// retries or none; running it again retries what is still retryable.
    async fn retry_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>>;

    /// A bulk cancel's step: [`Store::cancel`] of each of `ids`, all in one transaction.
    /// Returns the jobs it cancelled or asked to stop (as [`Store::retry_many`] does); the
    /// others are left as they are.
    ///
    /// Crash contract: as [`Store::retry_many`].
    async fn cancel_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>>;

    /// Of these jobs, the ones with a cancel request.
    async fn cancel_requested(&self, ids: &[JobId]) -> Result<Vec<JobId>>;

    /// Waits until another party may have enqueued jobs left undispatched for homing to publish
    /// (PostgreSQL: a NOTIFY on `homing_jobs`, sent by `homing_enqueue`, transactional enqueue
    /// and workflow steps made runnable), and at once after (re)connecting, since signals sent
    /// while nobody listened are lost. `Ok(false)` at once when this store has no such signal
    /// (the reconciler's sweep is then the only publisher of those jobs).
    async fn wait_enqueued(&self) -> Result<bool> {
        Ok(false)
    }

    /// Creates a workflow (docs/workflows.md): its row and every step's job, those without
    /// parents `queued` (undispatched: the caller publishes them), the others `waiting`.
    /// Whenever a step reaches a terminal state, [`crate::workflow::settle`] decides its
    /// workflow's waiting steps in that same transaction (every transition above does it), so a
    /// step becomes runnable exactly once.
    ///
    /// Crash contract: one transaction: the whole workflow exists, or nothing of it.
    async fn create_workflow(&self, wf: NewWorkflow) -> Result<Vec<Inserted>>;

    /// A workflow with its steps' states.
    async fn workflow(&self, id: WorkflowId) -> Result<Option<Workflow>>;

    /// Workflows, newest first, at most `limit`, after `cursor` (a workflow id).
    async fn workflows(&self, cursor: Option<&str>, limit: usize) -> Result<WorkflowPage>;

    /// Cancels a workflow: its waiting, queued and scheduled steps become `cancelled` (none is
    /// made runnable by it, `run_on: any` finalisers included), running ones get a cancel
    /// request. `None` for an unknown workflow.
    ///
    /// Crash contract: one transaction, deciding on the workflow's locked steps.
    async fn cancel_workflow(&self, id: WorkflowId, now: Micros) -> Result<Option<Workflow>>;

    /// Each queue's job count per state, from the counts the schema's triggers keep with every
    /// change of a job (docs/counts.md): a few rows whatever the number of jobs. Queues without
    /// jobs are left out.
    async fn queue_stats(&self) -> Result<Vec<QueueStats>>;

    /// The same counts as [`Store::queue_stats`], counted afresh from the jobs themselves (a
    /// full scan): what the conformance suites and the chaos run compare the kept counts with.
    /// Never on a request path.
    async fn queue_stats_recounted(&self) -> Result<Vec<QueueStats>>;

    /// Records a worker's start (`live`) and the task names it runs.
    ///
    /// Crash contract: one transaction; registering again replaces the row.
    async fn register_worker(&self, info: &WorkerInfo, now: Micros) -> Result<()>;

    /// Records that a worker was alive at `now`.
    ///
    /// Crash contract: one statement; a crash loses at most this sighting.
    async fn worker_seen(&self, id: &str, now: Micros) -> Result<()>;

    /// Records a worker's end: `Stopped` or `Lost` (`Live` is refused as invalid input) with
    /// `ended_at = now`, only if it is still `live`, and with it, in
    /// the same transaction, `event` (its `worker.lost` or `worker.shutdown` alert). Returns
    /// whether this call changed the row (of several rescuers declaring the same worker lost,
    /// exactly one gets `true`).
    ///
    /// Crash contract: one transaction: the worker is marked with its alert, or neither is
    /// written; exactly one of several rescuers records the alert, and a crash cannot leave
    /// the worker marked without it.
    async fn worker_gone(
        &self,
        id: &str,
        status: WorkerStatus,
        event: Option<NewEvent>,
        now: Micros,
    ) -> Result<bool>;

    /// Workers heard of since `since`, newest first.
    async fn workers(&self, since: Micros) -> Result<Vec<WorkerRecord>>;

    /// One worker's record, however long ago it was heard of, until retention deletes it.
    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>>;

    /// Every task name that any worker has registered, sorted.
    async fn known_tasks(&self) -> Result<Vec<String>>;

    /// Per queue, jobs with `from <= finished_at < to`, by terminal state. Read from an index on
    /// `(finished_at, queue, state)` alone, so its cost follows the jobs of the window, not the
    /// table; callers keep the window short and take whole minutes from the rollups
    /// ([`crate::stats::list_windows`]).
    async fn finished_between(&self, from: Micros, to: Micros) -> Result<Vec<FinishedCounts>>;

    /// Appends an event that no job transition carries (`worker.ready`, `worker.shutdown`,
    /// `worker.lost`) and returns its id. Job events (`job.failed`, `job.dead`, and terminal
    /// events of jobs with a `callback_url`) are never recorded through this: `complete`,
    /// `start`, `mark_lost`, `mark_dead` and `cancel` write them in the transition's own
    /// transaction (see [`NewEvent::for_terminal`]).
    ///
    /// Crash contract: one insert; a crash before it loses the event, never half of one.
    async fn record_event(&self, event: NewEvent, now: Micros) -> Result<i64>;

    /// The outbox dispatcher's step: takes up to `limit` pending events, oldest first, and for
    /// each matching subscriber (and for the job's `callback_url`, target
    /// [`crate::events::CALLBACK_TARGET`]) inserts a `builtin.webhook` job on
    /// [`crate::events::WEBHOOK_QUEUE`] with idempotency key `<event id>:<target>` and args
    /// `{"event": <event JSON>, "subscription": <name>}` (or `"callback_job": <job id>`), then
    /// marks the event dispatched. Events that match nothing are marked dispatched too, and so
    /// are events whose data cannot be read or whose deliveries cannot be stored (logged as
    /// errors): one bad event never holds up the alerts behind it.
    ///
    /// Crash contract: one transaction (one per event if the batch fails for an event's data):
    /// a crash fans out all of a transaction or none of it; two
    /// concurrent callers never take the same event, and the idempotency keys make a repeated
    /// fan-out of an event insert nothing new.
    async fn fan_out(
        &self,
        subscribers: &[Subscriber],
        limit: usize,
        now: Micros,
    ) -> Result<FanOut>;

    /// Events with an id greater than `after`, oldest first, at most `limit` (pending or not).
    async fn events(&self, after: i64, limit: usize) -> Result<Vec<Event>>;

    /// Retention: deletes at most `limit` finished jobs (succeeded, failed, dead, cancelled)
    /// whose `finished_at` is before `before`, at most `limit` events already fanned out and
    /// created before it, at most `limit` audit entries recorded before it, and the rows of stopped or lost workers last seen before it (with their
    /// reclaims, counted in `workers`). A
    /// workflow is history as a whole: at most `limit` workflows whose every step finished
    /// before `before` are deleted, and a finished step's job only goes once its workflow row
    /// has; a workflow with a live step (or one finished after `before`) keeps its row and
    /// every step. Nothing queued, scheduled, waiting or running and no pending event is
    /// touched. Competing callers (one per process) skip rows another is deleting.
    ///
    /// Crash contract: one transaction: a crash leaves all of one call's deletions or none, and
    /// calling again is harmless.
    async fn purge(&self, before: Micros, limit: usize) -> Result<Purged>;

    /// The charts' rollup cursor (docs/charts.md): every minute before `closed` is closed and
    /// rolled up, and the minute rollups hold every finish the last pass saw before `live`.
    /// `None` before the first rollup; `live` is `closed` until a pass records one.
    async fn stats_cursor(&self) -> Result<Option<crate::stats::Cursor>>;

    /// Recomputes the minute rollups of `[from, to)` (`from` on a minute; `to` may be inside
    /// one, the pass's own time, and then that minute counts the finishes before `to` only)
    /// from the jobs that finished in them, replacing what was stored for those minutes, then
    /// the hour rollups of every hour they touch from the minute rollups; moves the cursor's
    /// `closed` forward to `closed` (never back) and sets its `live` to `to`, which is what the
    /// minute rows now hold, whichever call wrote them last.
    /// Recomputing a period gives the same rows, so callers may repeat it, overlap, or run it
    /// in several processes at once.
    ///
    /// Crash contract: one transaction: a crash leaves the old rows and cursor or the new ones.
    async fn roll_up(&self, from: Micros, to: Micros, closed: Micros) -> Result<()>;

    /// Samples each queue's depth (jobs `queued`) into the minute and the hour holding `at`,
    /// keeping the period's maximum.
    ///
    /// Crash contract: one transaction; a lost sample is a missing point, nothing else.
    async fn sample_depth(&self, at: Micros) -> Result<()>;

    /// The stored rollup rows of span `span_secs` (60 or 3600) whose period starts in
    /// `[from, to)`, for every queue.
    async fn stats_rows(
        &self,
        span_secs: i64,
        from: Micros,
        to: Micros,
    ) -> Result<crate::stats::Rows>;

    /// How many jobs match `filter` (docs/access.md: the count a bulk action shows before it
    /// runs). Exact. Without a task in the filter it sums the kept counts (docs/counts.md); with
    /// one it reads every matching row's index entry.
    async fn count(&self, filter: &JobFilter) -> Result<u64>;

    /// An operator's delete: removes those of `ids` that are finished (succeeded, failed, dead,
    /// cancelled) and not a step of a workflow (a workflow reads its steps until it ends;
    /// retention removes them with it). Returns how many it removed; the others are left as
    /// they are.
    ///
    /// Crash contract: one transaction (the caller keeps the batch small): all of the batch's
    /// deletions or none; running it again deletes what is left.
    async fn delete_finished(&self, ids: &[JobId]) -> Result<u64>;

    /// Records one entry of the audit log (docs/access.md), cut with
    /// [`audit::NewAudit::bounded`]. Returns its id.
    ///
    /// Crash contract: one statement; the entry is recorded or not.
    async fn record_audit(&self, entry: audit::NewAudit, now: Micros) -> Result<i64>;

    /// The audit log, newest first, at most `limit` (1–1000) entries after `cursor`.
    async fn audit(&self, cursor: Option<&str>, limit: usize) -> Result<audit::AuditPage>;

    /// Creates or replaces a schedule (docs/schedules.md). A new schedule, or one whose spec
    /// changed, starts at the current second (its first tick is the spec's next one after it);
    /// one set again with the same spec keeps its cursor, paused flag and last tick. The caller
    /// checks the definition first ([`crate::schedule::check`]).
    ///
    /// Crash contract: one statement; a crash leaves the old definition or the new one.
    async fn put_schedule(
        &self,
        def: &crate::schedule::ScheduleDef,
        now: Micros,
    ) -> Result<crate::schedule::Schedule>;

    /// Schedules by name (bytewise), after `after` when given: at most `limit`, and a page ends
    /// before the schedule that would take its stored definitions past [`PAGE_BYTES`] (it
    /// always holds one), since a schedule may carry 1 MiB of args. `next` names the page's last
    /// schedule when more follow. A row whose definition cannot be read is left out (logged).
    async fn schedules_page(&self, after: Option<&str>, limit: usize) -> Result<SchedulePage>;

    async fn schedule(&self, name: &str) -> Result<Option<crate::schedule::Schedule>>;

    /// Every unpaused schedule's name, spec and cursor, by name: what the periodic pass reads
    /// every time to find the due ones, without their args. A row whose spec cannot be read is
    /// left out (logged).
    async fn schedule_heads(&self) -> Result<Vec<crate::schedule::ScheduleHead>>;

    /// How many times what [`Store::schedule_heads`] reads has changed: a count that moves with
    /// every schedule created or deleted and every change of a name, spec, cursor or paused
    /// flag, however it is written (triggers in the store), and by exactly one with a firing
    /// that moved a cursor ([`Store::fire_schedule`] answering `Some`). It includes every change
    /// committed before it is read. The periodic pass reads the heads again only when it moved
    /// by more than its own firings. `None` (the default): this store keeps no count, and the
    /// pass reads the heads every time.
    async fn schedule_changes(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Deletes a schedule; `false` when there was none. Its jobs stay.
    async fn delete_schedule(&self, name: &str) -> Result<bool>;

    /// Pauses or resumes a schedule; `None` when there is none. Resuming a paused schedule
    /// moves its cursor to the current second: ticks that fell while it was paused are not owed.
    ///
    /// Crash contract: one statement.
    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: Micros,
    ) -> Result<Option<crate::schedule::Schedule>>;

    /// Applies one decision of [`crate::schedule::due`]: only if the schedule is not paused and
    /// its cursor is still `expected_cursor`, moves it to `new_cursor`, inserts the ticks' jobs
    /// (each with its tick's idempotency key) and records the last tick and its job. `None`:
    /// another scheduler moved the cursor first (or the schedule is paused or gone), and
    /// nothing was written.
    ///
    /// Crash contract: one transaction: the cursor moves with its ticks' jobs or not at all, so
    /// no tick is enqueued twice (the compare-and-set, and the keys behind it) and none is
    /// dropped by a crash (an uncommitted firing is decided again by the next pass). Inserted
    /// queued jobs are undispatched until published, as with [`Store::insert`].
    async fn fire_schedule(
        &self,
        firing: &crate::schedule::Firing,
        now: Micros,
    ) -> Result<Option<Vec<Inserted>>>;
}

#[cfg(test)]
mod tests {
    use super::PageFill;

    #[test]
    fn a_page_stops_at_its_count_or_its_bytes_and_never_holds_nothing() {
        let mut f = PageFill::with_budget(3, 100);
        assert!([10, 10, 10].iter().all(|&b| f.take(b)));
        assert!(!f.take(0), "the count limit ends the page");

        let mut f = PageFill::with_budget(1000, 100);
        assert!(f.take(60) && f.take(40), "exactly the budget fits");
        assert!(!f.take(1), "one byte past it does not");

        let mut f = PageFill::with_budget(1000, 100);
        assert!(
            f.take(usize::MAX),
            "a row larger than the budget still makes a page of one"
        );
        assert!(!f.take(0));
    }
}
