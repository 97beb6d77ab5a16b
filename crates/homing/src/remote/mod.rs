//! The remote worker gateway (docs/remote-workers.md): what `homing server` does for a worker in
//! another language that speaks the HTTP protocol, with the guarantees of a Rust worker.
//!
//! It keeps nothing in memory but the sweep's hint ([`strays::Sightings`], whose loss only
//! delays a put-back). A session is a broker consumer (its heartbeat and the messages it
//! reserved) plus a worker row in the store (its queues and declared task defaults), so any
//! server can answer any call, and a server may die between any two steps: what it leaves behind
//! is what a Rust worker dying there leaves, and the rescuer, the reconciler and the heartbeat's
//! housekeeping below finish the work. The HTTP handlers only parse and map errors; every
//! decision is here or, when pure, in [`decide`].

pub mod decide;
#[cfg(feature = "sqlite")]
mod embedded;
pub mod strays;

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::{Broker, Delivery};
use crate::events::{NewEvent, WORKER_READY, WORKER_SHUTDOWN};
use crate::job::{Job, JobId, JobState};
use crate::store::{
    Committed, Completion, Lost, Outcome, RunningUnder, StartOutcome, Store, WorkerInfo,
    WorkerStatus,
};
use crate::time::now;
use crate::validate;

/// Prefix of every session id: `remote-<uuid>`.
pub const SESSION_PREFIX: &str = "remote-";
/// Heartbeat intervals a session may ask for; its TTL is three of them, as a Rust worker's.
pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(200);
pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(60);
pub const MAX_CONCURRENCY: u32 = 10_000;
pub const MAX_QUEUES: usize = 64;
pub const MAX_TASKS: usize = 1_000;
/// Most deliveries one `reserve` returns, and most items of one `complete` or heartbeat.
pub const MAX_RESERVE: u32 = 1_000;
pub const MAX_BATCH: usize = 1_000;
/// Most jobs one heartbeat lists (its body stays well under the 2 MiB limit).
pub const MAX_HELD: usize = 20_000;
/// The longest long poll: well below the API server's 60 s request timeout.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// Largest progress document (JSON).
pub const MAX_PROGRESS_BYTES: usize = 64 * 1024;
/// Largest `host` and `version` texts.
pub const MAX_LABEL_BYTES: usize = 256;

/// A task's defaults as the worker's code declares them: they apply to a job of that task when
/// the job did not set the option at enqueue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDeclaration {
    pub name: String,
    #[serde(default)]
    pub max_retries: Option<u32>,
    #[serde(default)]
    pub retry_delay_ms: Option<u64>,
    #[serde(default)]
    pub time_limit_ms: Option<u64>,
}

/// What the worker row of a remote session carries besides [`WorkerInfo`]'s common fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteWorker {
    pub heartbeat_interval_ms: u64,
    pub version: String,
    pub tasks: Vec<TaskDeclaration>,
}

impl RemoteWorker {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms).saturating_mul(3)
    }

    fn declared(&self, task: &str) -> Option<&TaskDeclaration> {
        self.tasks.iter().find(|t| t.name == task)
    }
}

fn default_interval() -> u64 {
    2_000
}

/// `POST /v1/remote/sessions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub queues: Vec<String>,
    pub concurrency: u32,
    #[serde(default = "default_interval")]
    pub heartbeat_interval_ms: u64,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub tasks: Vec<TaskDeclaration>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registered {
    pub session: String,
    pub ttl_ms: u64,
    pub heartbeat_interval_ms: u64,
}

/// A job the worker holds (reserved, running, or with a completion not yet acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Held {
    pub job_id: JobId,
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Beat {
    pub alive: bool,
    pub ttl_ms: u64,
    /// Held jobs an operator asked to cancel: stop them and complete them as `cancelled`.
    pub cancel: Vec<JobId>,
}

/// One delivery handed to a remote worker: everything its handler and its completion need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReservedJob {
    pub job_id: JobId,
    pub task: String,
    pub queue: String,
    pub args: serde_json::Value,
    pub epoch: u64,
    /// Runs of this job that ended in a handler error before this one (0 on the first run).
    pub attempt: u32,
    /// Earlier runs lost with their worker.
    pub crashes: u32,
    /// The retry budget that applies (the job's own, else the declared default).
    pub max_retries: u32,
    /// The key to hand to external systems: the job id, the same on every run.
    pub idempotency_key: String,
    pub time_limit_ms: u64,
    /// Opaque: send it back with the completion.
    pub lease: String,
    /// The workflow this job is a step of (docs/workflows.md), for a step only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<crate::workflow::StepLink>,
    /// A step's parents by step name, as committed when it became runnable: a remote handler
    /// sees what a Rust handler's `ctx.parents()` gives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parents: Option<std::collections::BTreeMap<String, crate::workflow::ParentRun>>,
    /// The W3C trace context stored with the job (docs/traces.md), for the handler's own
    /// outgoing calls. The server records the run's span itself, from the reserve and the
    /// completion it sees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportKind {
    Succeeded,
    Error,
    Fatal,
    Snooze,
    Cancelled,
    Released,
}

/// How one run ended, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub job_id: JobId,
    pub epoch: u64,
    pub lease: String,
    pub outcome: ReportKind,
    #[serde(default)]
    pub result: Option<Reported>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub retry_delay_ms: Option<u64>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// A result as a worker sent it: the value, or why it cannot be kept as sent (an integer beyond
/// 64 bits, which the JSON reader would keep as a double: [`validate::exact_integers`]; a number
/// or nesting the value reader refuses). Read
/// one result at a time from the call's JSON text, so that a result refused fails its own job
/// ("the handler's result was refused: …") and the call's other completions stand.
#[derive(Debug, Clone, PartialEq)]
pub enum Reported {
    Value(serde_json::Value),
    Inexact(String),
}

impl<'de> Deserialize<'de> for Reported {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        if let Err(e) = validate::exact_integers(raw.get().as_bytes()) {
            return Ok(Reported::Inexact(e));
        }
        // A value the raw reader took but the value reader does not (1e400, deeper than it
        // reads) is this job's failure too, not the call's.
        Ok(serde_json::from_str(raw.get()).map_or_else(
            |e| Reported::Inexact(format!("it cannot be read: {e}")),
            Reported::Value,
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Committed now, and the message acknowledged.
    Applied,
    /// This epoch's completion was committed before (a retried call): nothing changed.
    AlreadyApplied,
    /// Refused: the run no longer owns the job (a zombie's write). Counted.
    Stale,
    /// The store could not write it: the job stays running under the session; send the same
    /// completion again later.
    Unstored,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completed {
    pub job_id: JobId,
    pub status: Status,
    /// The job's state after the call, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<JobState>,
}

/// Why a call about a session was refused.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Not a session id this gateway hands out, or one no server ever registered.
    #[error("{0}")]
    UnknownSession(String),
    /// The session's heartbeat expired (presumed dead): register a new session.
    #[error("{0}")]
    SessionExpired(String),
    #[error(transparent)]
    Other(#[from] crate::error::Error),
}

type Result<T> = std::result::Result<T, RemoteError>;

fn invalid(m: impl Into<String>) -> RemoteError {
    RemoteError::Other(crate::error::Error::Invalid(m.into()))
}

/// The gateway: a broker and a store, shared by every request.
#[derive(Clone)]
pub struct Gateway {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    sightings: Arc<strays::Sightings>,
}

impl Gateway {
    /// `sightings` must outlive the call: the server keeps one for all its gateways, so a
    /// session's sweep for strays ([`strays`]) remembers what the previous one saw.
    pub fn new(
        broker: Arc<dyn Broker>,
        store: Arc<dyn Store>,
        sightings: Arc<strays::Sightings>,
    ) -> Self {
        Self {
            broker,
            store,
            sightings,
        }
    }

    /// Starts a session: the broker consumer with its heartbeat, the worker row (with the
    /// declared task defaults) and the `worker.ready` event.
    pub async fn register(&self, reg: Registration) -> Result<Registered> {
        check_registration(&reg).map_err(invalid)?;
        let id = format!("{SESSION_PREFIX}{}", uuid::Uuid::now_v7());
        let remote = RemoteWorker {
            heartbeat_interval_ms: reg.heartbeat_interval_ms,
            version: reg.version.clone().unwrap_or_default(),
            tasks: reg.tasks.clone(),
        };
        let ttl = remote.ttl();
        self.broker.register(&id, ttl).await?;
        let info = WorkerInfo {
            id: id.clone(),
            hostname: reg.host.clone().unwrap_or_default(),
            pid: reg.pid.unwrap_or(0),
            queues: reg.queues.clone(),
            concurrency: reg.concurrency,
            tasks: reg.tasks.iter().map(|t| t.name.clone()).collect(),
            started_at: now(),
            version: Some(remote.version.clone()).filter(|v| !v.is_empty()),
            heartbeat_ttl_ms: Some(remote.ttl().as_millis().min(u64::MAX as u128) as u64),
            remote: Some(remote),
        };
        self.store.register_worker(&info, now()).await?;
        let ready = NewEvent::worker(
            WORKER_READY,
            &id,
            serde_json::json!({
                "hostname": info.hostname,
                "pid": info.pid,
                "queues": info.queues,
                "concurrency": info.concurrency,
                "remote": true,
            }),
        );
        if let Err(e) = self.store.record_event(ready, now()).await {
            tracing::warn!(error = %e, "could not record the worker.ready event");
        }
        tracing::info!(event = "worker.ready", worker = %id, queues = ?info.queues, concurrency = info.concurrency, "remote worker session registered");
        Ok(Registered {
            session: id,
            ttl_ms: ttl.as_millis().min(u64::MAX as u128) as u64,
            heartbeat_interval_ms: reg.heartbeat_interval_ms,
        })
    }

    /// The session's row, or why there is none.
    async fn session(&self, session: &str) -> Result<(WorkerInfo, RemoteWorker)> {
        check_session_id(session)?;
        let unknown = || {
            RemoteError::UnknownSession(format!(
                "no remote worker session '{session}' is registered; register one with POST /v1/remote/sessions"
            ))
        };
        let info = self.store.worker_info(session).await?.ok_or_else(unknown)?;
        let remote = info.remote.clone().ok_or_else(unknown)?;
        Ok((info, remote))
    }

    fn expired(session: &str) -> RemoteError {
        RemoteError::SessionExpired(format!(
            "session '{session}' expired (no heartbeat within its TTL): it was presumed dead and its jobs are reclaimed; stop its handlers and register a new session"
        ))
    }

    /// Refreshes the session's heartbeat, relays cancel requests for the jobs it holds, and
    /// reclaims the jobs running under it that it no longer holds ([`decide::unheld`]).
    pub async fn heartbeat(&self, session: &str, held: &[Held]) -> Result<Beat> {
        if held.len() > MAX_HELD {
            return Err(invalid(format!(
                "held lists at most {MAX_HELD} jobs (got {})",
                held.len()
            )));
        }
        let (info, remote) = self.session(session).await?;
        let ttl = remote.ttl();
        if !self.broker.heartbeat(session, ttl).await? {
            return Err(Self::expired(session));
        }
        if let Err(e) = self.store.worker_seen(session, now()).await {
            tracing::warn!(error = %e, worker = %session, "could not record a remote worker's sighting");
        }
        let ids: Vec<JobId> = held.iter().map(|h| h.job_id).collect();
        let mut cancel = if ids.is_empty() {
            Vec::new()
        } else {
            self.store.cancel_requested(&ids).await?
        };
        // The heartbeat itself is done: a failure here is tried again at the next one.
        match self
            .housekeeping(session, &remote, &ids.into_iter().collect(), ttl)
            .await
        {
            // Runs the server stopped at their time limit: the worker stops them too.
            Ok(stopped) => {
                for id in stopped {
                    if !cancel.contains(&id) {
                        cancel.push(id);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, worker = %session, "heartbeat housekeeping failed; the next heartbeat tries again")
            }
        }
        // Apart from the housekeeping, so that a job it cannot handle does not stop the sweep.
        let interval = Duration::from_millis(remote.heartbeat_interval_ms);
        if let Err(e) = strays::sweep(
            &self.sightings,
            &*self.broker,
            &*self.store,
            session,
            &info.queues,
            interval,
        )
        .await
        {
            tracing::warn!(error = %e, worker = %session, "cannot look for stray messages reserved under a remote session's name; the next sweep tries again");
        }
        Ok(Beat {
            alive: true,
            ttl_ms: ttl.as_millis().min(u64::MAX as u128) as u64,
            cancel,
        })
    }

    /// Jobs running under `session` that it does not hold are lost exactly as a lost worker's
    /// are (crash counted, message put back): a server died between starting them and
    /// answering `reserve`.
    ///
    /// Held jobs past their time limit plus a TTL of grace are ended as a Rust worker ends a
    /// handler at its limit ([`Gateway::stop_over_limit`]); their ids are returned, for the
    /// heartbeat to tell the worker to stop them.
    async fn housekeeping(
        &self,
        session: &str,
        remote: &RemoteWorker,
        held: &HashSet<JobId>,
        ttl: Duration,
    ) -> Result<Vec<JobId>> {
        let running = self.store.running_under(session, MAX_HELD).await?;
        let lost = decide::unheld(&running, held, ttl, now());
        let stopped = self
            .stop_over_limit(session, remote, &running, held, ttl)
            .await?;
        if lost.is_empty() {
            return Ok(stopped);
        }
        let pending = self.broker.pending(session, MAX_HELD).await?;
        for id in lost {
            let (outcome, unparked) = self
                .store
                .mark_lost_unparking(id, session, false, now())
                .await?;
            if let Some(next) = unparked {
                crate::client::publish(&*self.broker, &*self.store, &[next]).await?;
            }
            let ds: Vec<Delivery> = pending
                .iter()
                .filter(|d| d.job.as_ref().ok() == Some(&id))
                .cloned()
                .collect();
            tracing::warn!(event = "job.reclaimed", job = %id, worker = %session, outcome = ?outcome, "a remote session does not hold a job running under it; reclaimed");
            match outcome {
                Lost::Requeued => {
                    if let Some(d) = ds.first() {
                        if self
                            .broker
                            .requeue(session, std::slice::from_ref(d))
                            .await?
                            > 0
                        {
                            self.store.mark_dispatched(&[id]).await?;
                        }
                    }
                    // Without a message here the job stays undispatched: the reconciler
                    // publishes it.
                }
                Lost::Dead | Lost::Cancelled => self.broker.ack(&ds).await?,
                Lost::NotOwned(_) | Lost::Missing => {}
            }
        }
        Ok(stopped)
    }

    /// Ends the held runs of `session` that are past their time limit plus `grace` with the
    /// outcome a Rust worker commits for a handler that hit its limit (a retryable error: retry
    /// per the job's policy, else failed), fenced by the run's epoch, and acknowledges their
    /// messages. The worker's own completion of such a run arrives late and is refused as stale
    /// ([`decide::stopped_by_server`]). Returns the jobs it ended.
    async fn stop_over_limit(
        &self,
        session: &str,
        remote: &RemoteWorker,
        running: &[RunningUnder],
        held: &HashSet<JobId>,
        grace: Duration,
    ) -> Result<Vec<JobId>> {
        let at = now();
        // No limit is shorter than validate::MIN_TIME_LIMIT: younger runs need no lookup.
        let old = running.iter().filter(|r| {
            held.contains(&r.id)
                && decide::over_limit(r.started_at, validate::MIN_TIME_LIMIT, grace, at)
        });
        let mut completions = Vec::new();
        let mut tasks = Vec::new();
        for r in old {
            let Some(job) = self.store.get(r.id).await? else {
                continue;
            };
            if job.state != JobState::Running || job.epoch != r.epoch {
                continue;
            }
            let defaults = decide::defaults(remote.declared(&job.task));
            let limit = job.time_limit.unwrap_or(defaults.time_limit);
            if !decide::over_limit(r.started_at, limit, grace, at) {
                continue;
            }
            let outcome = crate::worker::outcome_for_error(
                &job,
                &defaults,
                crate::task::TaskError::Retry(decide::time_limit_error(limit)),
                at,
            );
            completions.push(Completion {
                id: r.id,
                epoch: r.epoch,
                outcome,
            });
            tasks.push(job.task.clone());
        }
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let committed = self.store.complete(&completions, at).await?;
        let pending = self.broker.pending(session, MAX_HELD).await?;
        let mut stopped = Vec::new();
        let mut to_ack = Vec::new();
        let mut to_publish = Vec::new();
        for ((c, task), result) in completions.iter().zip(&tasks).zip(committed) {
            // Anything else: the worker's own completion won the race, or it was not stored
            // (tried again at the next heartbeat).
            let Committed::Applied { state, dispatch } = result else {
                continue;
            };
            tracing::warn!(event = "job.time_limit", job = %c.id, worker = %session, epoch = c.epoch, %state, "a remote run passed its time limit and grace: the server ended it");
            log_applied(session, c, state);
            let queue = pending
                .iter()
                .find(|d| d.job.as_ref().ok() == Some(&c.id))
                .map(|d| d.queue.clone());
            if let Some(name) = decide::outcome_metric(&c.outcome, state) {
                crate::metrics::count(name, queue.as_deref().unwrap_or(""), task);
            }
            to_ack.extend(
                pending
                    .iter()
                    .filter(|d| d.job.as_ref().ok() == Some(&c.id))
                    .cloned(),
            );
            to_publish.extend(dispatch);
            stopped.push(c.id);
        }
        if !to_publish.is_empty() {
            if let Err(e) = crate::client::publish(&*self.broker, &*self.store, &to_publish).await {
                tracing::warn!(error = %e, "publish failed; the reconciler will publish these jobs");
            }
        }
        if !to_ack.is_empty() {
            self.broker.ack(&to_ack).await?;
        }
        Ok(stopped)
    }

    /// Reserves up to `max` deliveries for the session, waiting up to `wait`, and starts them in
    /// the store as a Rust worker's executor does: only the jobs to run are returned; duplicates,
    /// early and dead ones are acknowledged, garbage is dead-lettered, and a job the store could
    /// not start is handed back.
    pub async fn reserve(
        &self,
        session: &str,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReservedJob>> {
        check_reserve(max, wait)?;
        let (info, remote) = self.session(session).await?;
        if !self.broker.is_alive(session).await? {
            return Err(Self::expired(session));
        }
        let deliveries = self
            .broker
            .reserve(session, &info.queues, max as usize, wait)
            .await?;
        // The worker may have ended its session (a graceful stop) or been presumed dead while
        // this long poll waited: nothing it reserved may start, since no one would run it. The
        // messages go back unstarted, so no crash is counted against their jobs.
        if !deliveries.is_empty() && !self.broker.is_alive(session).await? {
            let n = self.broker.requeue(session, &deliveries).await?;
            tracing::info!(worker = %session, requeued = n, "session ended during its reserve; its deliveries were handed back unstarted");
            return Err(Self::expired(session));
        }
        let mut startable = Vec::new();
        for d in deliveries {
            match &d.job {
                Ok(id) => startable.push((*id, d)),
                Err(reason) => {
                    tracing::error!(event = "message.dead_lettered", queue = %d.queue, tag = %d.tag, reason, "dead-lettered a message");
                    self.broker.dead_letter(&d, reason).await?;
                }
            }
        }
        if startable.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<JobId> = startable.iter().map(|(id, _)| *id).collect();
        let outcomes = match self.store.start(&ids, session, now()).await {
            Ok(o) => o,
            Err(e) => {
                // Nothing was started (the store isolates a job's own failures): hand the
                // messages back so another call or worker gets them.
                let ds: Vec<Delivery> = startable.into_iter().map(|(_, d)| d).collect();
                if let Err(e2) = self.broker.requeue(session, &ds).await {
                    tracing::warn!(error = %e2, "could not hand back messages; the rescuer will");
                }
                return Err(e.into());
            }
        };
        let started = startable
            .into_iter()
            .zip(outcomes)
            .map(|((id, d), o)| (id, d, o))
            .collect();
        self.settle_starts(session, &remote, started).await
    }

    /// What a reservation does with the store's answers to its starts: the jobs to run are
    /// returned; duplicates, deferred and dead ones acknowledged, a message naming no job
    /// dead-lettered, one the store could not start handed back, and a session presumed dead
    /// meanwhile told so.
    async fn settle_starts(
        &self,
        session: &str,
        remote: &RemoteWorker,
        started: Vec<(JobId, Delivery, StartOutcome)>,
    ) -> Result<Vec<ReservedJob>> {
        let mut out = Vec::new();
        let mut to_ack = Vec::new();
        let mut presumed = Vec::new();
        for (id, d, outcome) in started {
            match outcome {
                StartOutcome::Run(job) => {
                    crate::metrics::count(crate::metrics::JOBS_STARTED, &job.queue, &job.task);
                    let defaults = decide::defaults(remote.declared(&job.task));
                    out.push(ReservedJob {
                        job_id: job.id,
                        lease: decide::lease(&d.tag, job.id, &d.queue, &job.task),
                        task: job.task.clone(),
                        queue: job.queue.clone(),
                        epoch: job.epoch,
                        attempt: job.attempts,
                        crashes: job.crashes,
                        max_retries: job.max_retries.unwrap_or(defaults.max_retries),
                        idempotency_key: job.id.to_string(),
                        time_limit_ms: job
                            .time_limit
                            .unwrap_or(defaults.time_limit)
                            .as_millis()
                            .min(u64::MAX as u128) as u64,
                        workflow: job.workflow,
                        parents: job.parents,
                        traceparent: job.traceparent,
                        args: job.args,
                    });
                }
                StartOutcome::Skip(state) => {
                    // A duplicate message (the job runs, or ran, elsewhere or under this very
                    // session from an earlier delivery): its other delivery carries it.
                    tracing::debug!(job = %id, %state, "duplicate delivery skipped by the idempotency guard");
                    to_ack.push(d);
                }
                // A paused queue's job stays queued (undispatched) until the queue resumes.
                StartOutcome::Defer(_) | StartOutcome::Parked => to_ack.push(d),
                StartOutcome::Dead => {
                    tracing::error!(event = "job.dead", job = %id, queue = %d.queue, "job is dead instead of starting");
                    crate::metrics::count(crate::metrics::JOBS_DEAD, &d.queue, "unknown");
                    to_ack.push(d);
                }
                // From here on, jobs of this call are started: a broker failure must not lose
                // them by failing the call. What it leaves reserved, the rescuer finds once the
                // session ends.
                StartOutcome::Missing => {
                    let reason = format!("message names job {id} which the store does not have");
                    if let Err(e) = self.broker.dead_letter(&d, &reason).await {
                        tracing::warn!(error = %e, "could not dead-letter a message; the rescuer will find it");
                    }
                }
                StartOutcome::Unstartable(reason) => {
                    tracing::error!(job = %id, %reason, "cannot start a job; handing its message back");
                    if let Err(e) = self.broker.requeue(session, std::slice::from_ref(&d)).await {
                        tracing::warn!(error = %e, "could not hand back a message; the rescuer will");
                    }
                }
                // Presumed dead between the liveness check above and the start: refused, and
                // back unstarted.
                StartOutcome::Presumed => presumed.push(d),
            }
        }
        if !presumed.is_empty() {
            if let Err(e) = self.broker.requeue(session, &presumed).await {
                tracing::warn!(error = %e, "could not hand back messages; the rescuer will");
            }
            // The store refuses a batch as a whole, so nothing started, unless the batch was
            // split job by job (for one job's data) and the presumption fell between: then
            // what started is returned, and the next heartbeat tells the session.
            if out.is_empty() {
                return Err(Self::expired(session));
            }
        }
        if !to_ack.is_empty() {
            if let Err(e) = self.broker.ack(&to_ack).await {
                tracing::warn!(error = %e, "could not acknowledge skipped messages; the rescuer will find them");
            }
        }
        Ok(out)
    }

    /// Commits the reported outcomes, each fenced by its epoch, then acknowledges their
    /// messages. A refused one is told apart ([`decide::refused`]): a retried call's is
    /// `already_applied` (acknowledged again), a zombie's is `stale` (counted). The session
    /// need not be alive: the fence decides, not the session.
    pub async fn complete(&self, session: &str, reports: &[Report]) -> Result<Vec<Completed>> {
        let p = self.prepare(session, reports, None).await?;
        let committed = self.store.complete(&p.completions, p.at).await?;
        self.answer(session, reports, p, committed, false).await
    }

    /// Checks a completion call's reports and decides each one's outcome ([`decide::outcome`]);
    /// `known` is the session's worker row if the caller has read it already.
    async fn prepare(
        &self,
        session: &str,
        reports: &[Report],
        known: Option<&RemoteWorker>,
    ) -> Result<Prepared> {
        check_session_id(session)?;
        if reports.len() > MAX_BATCH {
            return Err(invalid(format!(
                "results lists at most {MAX_BATCH} completions (got {})",
                reports.len()
            )));
        }
        let mut leases = Vec::with_capacity(reports.len());
        let mut tasks = Vec::with_capacity(reports.len());
        for r in reports {
            let l = decide::parse_lease(&r.lease, r.job_id).map_err(invalid)?;
            check_delays(r).map_err(invalid)?;
            tasks.push(l.task);
            leases.push(Delivery {
                tag: l.tag,
                queue: l.queue,
                job: Ok(r.job_id),
            });
        }
        // An error's retry rule needs the job (attempts, options) and the declared defaults.
        let read;
        let remote = match known {
            Some(r) => Some(r),
            None if reports.iter().any(|r| r.outcome == ReportKind::Error) => {
                read = self.store.worker_info(session).await?;
                read.as_ref().and_then(|i| i.remote.as_ref())
            }
            None => None,
        };
        let at = now();
        let mut completions = Vec::with_capacity(reports.len());
        // Traces on: each run's span is recorded from the job as it was while it ran.
        let mut ran: Vec<Option<Job>> = Vec::new();
        for r in reports {
            let input = decide::ReportIn {
                kind: r.outcome,
                result: r.result.as_ref(),
                error: r.error.as_deref(),
                retry_delay: r.retry_delay_ms.map(Duration::from_millis),
                delay: r.delay_ms.map(Duration::from_millis),
            };
            let job = if r.outcome == ReportKind::Error || crate::otel::enabled() {
                self.store.get(r.job_id).await?
            } else {
                None
            };
            if crate::otel::enabled() {
                ran.push(job.clone().filter(|j| j.epoch == r.epoch));
            }
            let job = job.filter(|_| r.outcome == ReportKind::Error);
            let outcome = decide::outcome(
                &input,
                job.as_ref(),
                remote
                    .zip(job.as_ref())
                    .and_then(|(w, j)| w.declared(&j.task)),
                at,
            );
            completions.push(Completion {
                id: r.job_id,
                epoch: r.epoch,
                outcome,
            });
        }
        Ok(Prepared {
            completions,
            leases,
            tasks,
            ran,
            at,
        })
    }

    /// Answers a completion call from what the store committed, publishes what the commits made
    /// ready and acknowledges the messages of the outcomes that are settled, unless `acked` says
    /// the commit's own transaction did (a round in one write, which may also have started jobs
    /// for the call to hand over: then no lookup may fail the call).
    async fn answer(
        &self,
        session: &str,
        reports: &[Report],
        p: Prepared,
        committed: Vec<Committed>,
        acked: bool,
    ) -> Result<Vec<Completed>> {
        let Prepared {
            completions,
            leases,
            tasks,
            ran,
            ..
        } = p;
        let mut out = Vec::with_capacity(reports.len());
        let mut to_ack = Vec::new();
        let mut to_publish = Vec::new();
        let items = reports.iter().zip(&completions).zip(leases).zip(tasks);
        for ((((r, c), lease), task), result) in items.zip(committed) {
            match result {
                Committed::Applied { state, dispatch } => {
                    log_applied(session, c, state);
                    if let Some(Some(job)) = ran.get(out.len()) {
                        crate::otel::record_run(job, crate::otel::outcome_name(&c.outcome));
                    }
                    if let Some(name) = decide::outcome_metric(&c.outcome, state) {
                        crate::metrics::count(name, &lease.queue, &task);
                    }
                    to_publish.extend(dispatch);
                    to_ack.push(lease);
                    out.push(Completed {
                        job_id: r.job_id,
                        status: Status::Applied,
                        state: Some(state),
                    });
                }
                Committed::Unstored(reason) => {
                    tracing::error!(job = %r.job_id, %reason, "a remote worker's outcome cannot be stored; it must send it again");
                    out.push(Completed {
                        job_id: r.job_id,
                        status: Status::Unstored,
                        state: None,
                    });
                }
                Committed::Stale => {
                    let (refused, found) = match self.refusal(r.job_id, r.epoch).await {
                        Ok(x) => x,
                        // The round's own transaction acknowledged the messages and may have
                        // started jobs this call must hand over: a refusal whose cause cannot
                        // be read now is answered stale (drop the run; its message is gone
                        // either way) instead of failing the call and hiding those jobs.
                        Err(e) if acked => {
                            tracing::warn!(job = %r.job_id, error = %e, "could not tell a refused completion's cause; answered stale");
                            out.push(Completed {
                                job_id: r.job_id,
                                status: Status::Stale,
                                state: None,
                            });
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    match refused {
                        decide::Refused::AlreadyApplied(state) => {
                            to_ack.push(lease);
                            out.push(Completed {
                                job_id: r.job_id,
                                status: Status::AlreadyApplied,
                                state: Some(state),
                            });
                        }
                        decide::Refused::Stale => {
                            crate::metrics::count(
                                crate::metrics::REMOTE_STALE,
                                &lease.queue,
                                &task,
                            );
                            tracing::warn!(
                                event = "job.zombie_write_rejected",
                                job = %r.job_id,
                                epoch = r.epoch,
                                worker = %session,
                                %task,
                                "remote outcome refused: a newer run of this job owns it (fencing epoch)"
                            );
                            // Its message was put back under a new tag when the job was
                            // reclaimed, so acknowledging this one cannot remove it; it
                            // only drops what the session may still own for a job that is no
                            // longer its own.
                            to_ack.push(lease);
                            out.push(Completed {
                                job_id: r.job_id,
                                status: Status::Stale,
                                state: found.map(|f| f.state),
                            });
                        }
                    }
                }
            }
        }
        if !to_publish.is_empty() {
            if let Err(e) = crate::client::publish(&*self.broker, &*self.store, &to_publish).await {
                tracing::warn!(error = %e, "publish failed; the reconciler will publish these jobs");
            }
        }
        // Late ack. If it fails the caller gets an error and sends the call again: its
        // completions are then `already_applied`, and acknowledged again.
        if !acked && !to_ack.is_empty() {
            self.broker.ack(&to_ack).await?;
        }
        Ok(out)
    }

    /// Why the fence refused a completion for `epoch`: a retried call's (already applied) or a
    /// zombie's (stale), with the job's last completion.
    async fn refusal(
        &self,
        job: JobId,
        epoch: u64,
    ) -> crate::error::Result<(decide::Refused, Option<crate::store::CompletionState>)> {
        let found = self.store.last_completion(job).await?;
        let mut refused = decide::refused(found, epoch);
        if matches!(refused, decide::Refused::AlreadyApplied(_))
            && decide::stopped_by_server(self.store.get(job).await?.as_ref())
        {
            // The run the server ended at its time limit reports late.
            refused = decide::Refused::Stale;
        }
        Ok((refused, found))
    }

    /// Records progress for a run, fenced by its epoch. `false`: the run no longer owns the job.
    pub async fn progress(
        &self,
        session: &str,
        job: JobId,
        epoch: u64,
        progress: serde_json::Value,
    ) -> Result<bool> {
        check_session_id(session)?;
        validate::json("progress", &progress, MAX_PROGRESS_BYTES).map_err(invalid)?;
        Ok(self.store.set_progress(job, epoch, progress).await?)
    }

    /// A completion call that also asks for successors: commits `reports`, then reserves up to
    /// `max` less the completions answered `unstored` ([`decide::refill`]: their jobs keep their
    /// slots, so a worker that counted them free would hold more than its concurrency). The
    /// commits stand whatever happens to the reservation, whose own result comes second.
    pub async fn complete_and_reserve(
        &self,
        session: &str,
        reports: &[Report],
        max: u32,
        wait: Duration,
    ) -> Result<(Vec<Completed>, Result<Vec<ReservedJob>>)> {
        #[cfg(feature = "sqlite")]
        if let Some(round) = self.embedded_round(session, reports, max, wait).await? {
            return Ok(round);
        }
        let results = self.complete(session, reports).await?;
        let max = decide::refill(max, &results);
        let jobs = if max == 0 {
            Ok(Vec::new())
        } else {
            self.reserve(session, max, wait).await
        };
        Ok((results, jobs))
    }

    /// A graceful end: the heartbeat is removed and the worker row marked stopped with its
    /// `worker.shutdown` event. Whatever the session still holds is reclaimed by the rescuer.
    pub async fn end(&self, session: &str) -> Result<()> {
        self.session(session).await?;
        self.broker.unregister(session).await?;
        self.sightings.forget(session);
        let ev = NewEvent::worker(
            WORKER_SHUTDOWN,
            session,
            serde_json::json!({ "remote": true }),
        );
        self.store
            .worker_gone(session, WorkerStatus::Stopped, Some(ev), now())
            .await?;
        tracing::info!(event = "worker.shutdown", worker = %session, "remote worker session ended");
        Ok(())
    }
}

fn log_applied(session: &str, c: &Completion, state: JobState) {
    match &c.outcome {
        Outcome::Failed { error } => {
            tracing::warn!(event = "job.failed", job = %c.id, worker = %session, %error, "job failed")
        }
        _ => {
            tracing::debug!(job = %c.id, worker = %session, %state, epoch = c.epoch, "remote outcome committed")
        }
    }
}

/// A session id as this gateway hands them out: `remote-<uuid>`.
fn check_session_id(session: &str) -> Result<()> {
    let ok = session
        .strip_prefix(SESSION_PREFIX)
        .is_some_and(|u| uuid::Uuid::parse_str(u).is_ok());
    if ok {
        Ok(())
    } else {
        Err(RemoteError::UnknownSession(format!(
            "'{}' is not a remote session id (remote-<uuid>, as POST /v1/remote/sessions returns)",
            validate::text(session, 100)
        )))
    }
}

/// A completion call's reports, checked and decided, before the store commits them.
struct Prepared {
    completions: Vec<Completion>,
    leases: Vec<Delivery>,
    tasks: Vec<String>,
    /// Traces on: each run's job as it was while it ran.
    ran: Vec<Option<Job>>,
    at: crate::time::Micros,
}

fn check_reserve(max: u32, wait: Duration) -> Result<()> {
    if max == 0 || max > MAX_RESERVE {
        return Err(invalid(format!(
            "max must be between 1 and {MAX_RESERVE} (got {max})"
        )));
    }
    if wait > MAX_WAIT {
        return Err(invalid(format!(
            "wait_ms must be at most {} (got {})",
            MAX_WAIT.as_millis(),
            wait.as_millis()
        )));
    }
    Ok(())
}

fn check_delays(r: &Report) -> std::result::Result<(), String> {
    let max = validate::MAX_DELAY.as_millis() as u64;
    for (what, v) in [
        ("retry_delay_ms", r.retry_delay_ms),
        ("delay_ms", r.delay_ms),
    ] {
        if let Some(ms) = v {
            if ms > max {
                return Err(format!("{what} must be at most {max} (got {ms})"));
            }
        }
    }
    Ok(())
}

/// Every rule a registration passes before anything is written.
pub fn check_registration(r: &Registration) -> std::result::Result<(), String> {
    if r.queues.is_empty() || r.queues.len() > MAX_QUEUES {
        return Err(format!(
            "queues must list between 1 and {MAX_QUEUES} queues (got {})",
            r.queues.len()
        ));
    }
    for q in &r.queues {
        validate::producer_queue(q)?;
    }
    validate::count("concurrency", r.concurrency, 1, MAX_CONCURRENCY)?;
    validate::duration(
        "heartbeat_interval_ms",
        Duration::from_millis(r.heartbeat_interval_ms),
        MIN_HEARTBEAT_INTERVAL,
        MAX_HEARTBEAT_INTERVAL,
    )?;
    for (what, v) in [("host", &r.host), ("version", &r.version)] {
        if v.as_ref()
            .is_some_and(|s| s.len() > MAX_LABEL_BYTES || s.contains('\0'))
        {
            return Err(format!(
                "{what} must be at most {MAX_LABEL_BYTES} bytes, without NUL"
            ));
        }
    }
    if r.tasks.len() > MAX_TASKS {
        return Err(format!(
            "tasks lists at most {MAX_TASKS} tasks (got {})",
            r.tasks.len()
        ));
    }
    for t in &r.tasks {
        validate::producer_task(&t.name)?;
        if let Some(n) = t.max_retries {
            validate::count("max_retries", n, 0, validate::MAX_RETRIES)?;
        }
        let max = validate::MAX_DELAY.as_millis() as u64;
        if t.retry_delay_ms.is_some_and(|ms| ms > max) {
            return Err(format!("retry_delay_ms must be at most {max}"));
        }
        if let Some(ms) = t.time_limit_ms {
            validate::duration(
                "time_limit_ms",
                Duration::from_millis(ms),
                validate::MIN_TIME_LIMIT,
                validate::MAX_DELAY,
            )?;
        }
    }
    Ok(())
}
