//! The store on the embedded SQLite file: the default, for one machine. Every method is one
//! `BEGIN IMMEDIATE` transaction, so a process killed mid-call leaves either the old state or
//! the new one, never a mix.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, Transaction};
use std::sync::Arc;

use super::*;
use crate::error::Error;
use crate::events::CALLBACK_TARGET;
use crate::job::{JobOptions, DEFAULT_MAX_CRASHES};
use crate::sqlite::Db;

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Arc<Db>,
    /// Distinct queue names enqueue accepts (`store::queues`).
    max_queues: u64,
}

impl SqliteStore {
    pub fn new(db: Arc<Db>) -> Self {
        Self {
            db,
            max_queues: super::queues::DEFAULT_MAX_QUEUES,
        }
    }

    /// Sets how many distinct queue names enqueue accepts (`store::queues`).
    pub fn with_max_queues(mut self, max: u64) -> Self {
        self.max_queues = max;
        self
    }

    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }
}

const COLUMNS: &str = "id, task, queue, state, args, result, error, attempts, crashes, epoch, \
    max_retries, max_crashes, retry_policy, time_limit_ms, idempotency_key, progress, worker, \
    created_at, scheduled_at, started_at, finished_at, cancel_requested, on_success, on_failure, \
    callback_url";

fn corrupt(what: &str, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(format!("corrupt {what}: {e}").into())
}

fn json_col(row: &Row<'_>, idx: usize, what: &str) -> rusqlite::Result<Option<serde_json::Value>> {
    let s: Option<String> = row.get(idx)?;
    s.map(|s| serde_json::from_str(&s).map_err(|e| corrupt(what, e)))
        .transpose()
}

fn typed_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    idx: usize,
    what: &str,
) -> rusqlite::Result<Option<T>> {
    let s: Option<String> = row.get(idx)?;
    s.map(|s| serde_json::from_str(&s).map_err(|e| corrupt(what, e)))
        .transpose()
}

fn row_to_job(row: &Row<'_>) -> rusqlite::Result<Job> {
    let id: String = row.get(0)?;
    let state: String = row.get(3)?;
    Ok(Job {
        id: id.parse().map_err(|e| corrupt("job id", e))?,
        task: row.get(1)?,
        queue: row.get(2)?,
        state: state.parse().map_err(|e| corrupt("state", e))?,
        args: json_col(row, 4, "args")?.unwrap_or(serde_json::Value::Null),
        result: json_col(row, 5, "result")?,
        error: row.get(6)?,
        attempts: row.get(7)?,
        crashes: row.get(8)?,
        epoch: row.get::<_, i64>(9)? as u64,
        max_retries: row.get(10)?,
        max_crashes: row.get(11)?,
        retry_policy: typed_col(row, 12, "retry policy")?,
        time_limit: row
            .get::<_, Option<i64>>(13)?
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64)),
        idempotency_key: row.get(14)?,
        progress: json_col(row, 15, "progress")?,
        worker: row.get(16)?,
        created_at: row.get(17)?,
        scheduled_at: row.get(18)?,
        started_at: row.get(19)?,
        finished_at: row.get(20)?,
        cancel_requested: row.get::<_, i64>(21)? != 0,
        on_success: typed_col(row, 22, "on_success")?,
        on_failure: typed_col(row, 23, "on_failure")?,
        callback_url: row.get(24)?,
    })
}

fn get_job(tx: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<Job>> {
    tx.query_row(
        &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
        [id],
        row_to_job,
    )
    .optional()
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

fn insert_one(tx: &Transaction<'_>, job: &NewJob) -> rusqlite::Result<Inserted> {
    if let Some(key) = &job.options.idempotency_key {
        let existing = tx
            .query_row(
                "SELECT id, queue, state FROM jobs WHERE idempotency_key = ?1",
                [key],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                },
            )
            .optional()?;
        if let Some((id, queue, state)) = existing {
            return Ok(Inserted {
                id: id.parse().map_err(|e| corrupt("job id", e))?,
                queue,
                state: state.parse().map_err(|e| corrupt("state", e))?,
                existed: true,
            });
        }
    }
    let o: &JobOptions = &job.options;
    let scheduled = job.run_at.filter(|t| *t > job.created_at);
    let state = if scheduled.is_some() {
        JobState::Scheduled
    } else {
        JobState::Queued
    };
    tx.prepare_cached(
        "INSERT INTO jobs (id, task, queue, state, args, max_retries, max_crashes, retry_policy, \
         time_limit_ms, idempotency_key, created_at, scheduled_at, updated_at, on_success, on_failure, \
         callback_url) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?11, ?13, ?14, ?15)",
    )?
    .execute(params![
        job.id.to_string(),
        job.task,
        job.queue,
        state.as_str(),
        to_json(&job.args),
        o.max_retries,
        o.max_crashes.unwrap_or(DEFAULT_MAX_CRASHES),
        o.retry_policy.as_ref().map(to_json),
        o.time_limit.map(|d| d.as_millis() as i64),
        o.idempotency_key,
        job.created_at,
        scheduled,
        o.on_success.as_ref().map(to_json),
        o.on_failure.as_ref().map(to_json),
        o.callback_url,
    ])?;
    Ok(Inserted {
        id: job.id,
        queue: job.queue.clone(),
        state,
        existed: false,
    })
}

/// Applies `set` to job `id` only while run `epoch` owns it (the fence), returning the updated
/// row; `None` means a newer run or a terminal transition got there first. One statement, so
/// the common path reads the row once.
fn fenced_update(
    tx: &Transaction<'_>,
    set: &str,
    id: &str,
    epoch: u64,
    values: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<Option<Job>> {
    let sql = format!(
        "UPDATE jobs SET {set} WHERE id = ?1 AND state = 'running' AND epoch = ?2 RETURNING {COLUMNS}"
    );
    let mut all: Vec<&dyn rusqlite::ToSql> = vec![&id, &epoch];
    all.extend_from_slice(values);
    tx.prepare_cached(&sql)?
        .query_row(all.as_slice(), row_to_job)
        .optional()
}

fn complete_one(tx: &Transaction<'_>, c: &Completion, now: Micros) -> rusqlite::Result<Committed> {
    let id = c.id.to_string();
    let mut dispatch = Vec::new();
    let (updated, state) = match &c.outcome {
        Outcome::Succeeded(v) => (
            fenced_update(
                tx,
                "state = 'succeeded', result = ?3, error = NULL, finished_at = ?4, updated_at = ?4",
                &id,
                c.epoch,
                &[&to_json(v), &now],
            )?,
            JobState::Succeeded,
        ),
        Outcome::Retry { error, at } => (
            fenced_update(
                tx,
                "state = 'scheduled', attempts = attempts + 1, error = ?3, scheduled_at = ?4, \
                 worker = NULL, updated_at = ?5",
                &id,
                c.epoch,
                &[error, at, &now],
            )?,
            JobState::Scheduled,
        ),
        Outcome::Failed { error } => (
            fenced_update(
                tx,
                "state = 'failed', attempts = attempts + 1, error = ?3, finished_at = ?4, \
                 updated_at = ?4",
                &id,
                c.epoch,
                &[error, &now],
            )?,
            JobState::Failed,
        ),
        Outcome::Snooze { at } => (
            fenced_update(
                tx,
                "state = 'scheduled', scheduled_at = ?3, worker = NULL, updated_at = ?4",
                &id,
                c.epoch,
                &[at, &now],
            )?,
            JobState::Scheduled,
        ),
        Outcome::Cancelled => (
            fenced_update(
                tx,
                "state = 'cancelled', error = 'cancelled', finished_at = ?3, updated_at = ?3",
                &id,
                c.epoch,
                &[&now],
            )?,
            JobState::Cancelled,
        ),
        Outcome::Released => (
            fenced_update(
                tx,
                "state = 'queued', dispatched = 0, worker = NULL, updated_at = ?3",
                &id,
                c.epoch,
                &[&now],
            )?,
            JobState::Queued,
        ),
        Outcome::Dead { reason } => (
            fenced_update(
                tx,
                "state = 'dead', error = ?3, finished_at = ?4, updated_at = ?4",
                &id,
                c.epoch,
                &[reason, &now],
            )?,
            JobState::Dead,
        ),
    };
    let Some(job) = updated else {
        return Ok(Committed::Stale);
    };
    if state == JobState::Queued {
        dispatch.push(Dispatch {
            id: job.id,
            queue: job.queue.clone(),
        });
    }
    if NewEvent::wanted(&job, state) {
        terminal_event(tx, &id, now)?;
    }
    let follow = match state {
        JobState::Succeeded => job.on_success.as_ref(),
        JobState::Failed | JobState::Dead => job.on_failure.as_ref(),
        _ => None,
    };
    if let Some(f) = follow {
        let nj = f.job_for(&job, state, now);
        let ins = insert_one(tx, &nj)?;
        if ins.needs_dispatch() {
            dispatch.push(Dispatch {
                id: ins.id,
                queue: ins.queue,
            });
        }
    }
    Ok(Committed::Applied { state, dispatch })
}

fn dead_with_follow_up(
    tx: &Transaction<'_>,
    job: &mut Job,
    reason: &str,
    now: Micros,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE jobs SET state = 'dead', error = ?2, finished_at = ?3, updated_at = ?3 WHERE id = ?1",
        params![job.id.to_string(), reason, now],
    )?;
    job.error = Some(reason.to_string());
    if NewEvent::wanted(job, JobState::Dead) {
        terminal_event(tx, &job.id.to_string(), now)?;
    }
    if let Some(f) = job.on_failure.clone() {
        insert_one(tx, &f.job_for(job, JobState::Dead, now))?;
    }
    Ok(())
}

/// Writes the event of a terminal transition just made to job `id`, inside that transition's
/// transaction (DESIGN.md section 1, guarantee 9: follow-up work commits with its cause).
fn terminal_event(tx: &Transaction<'_>, id: &str, now: Micros) -> rusqlite::Result<()> {
    if let Some(ev) = get_job(tx, id)?.as_ref().and_then(NewEvent::for_terminal) {
        insert_event(tx, &ev, now)?;
    }
    Ok(())
}

fn insert_event(tx: &Transaction<'_>, ev: &NewEvent, now: Micros) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "INSERT INTO events (kind, job_id, worker, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        ev.kind,
        ev.job_id.map(|i| i.to_string()),
        ev.worker,
        to_json(&ev.data),
        now
    ])?;
    Ok(tx.last_insert_rowid())
}

fn row_to_event(r: &Row<'_>) -> rusqlite::Result<Event> {
    let job_id: Option<String> = r.get(2)?;
    Ok(Event {
        id: r.get(0)?,
        kind: r.get(1)?,
        job_id: job_id.map(parse_id).transpose()?,
        worker: r.get(3)?,
        data: json_col(r, 4, "event data")?.unwrap_or(serde_json::Value::Null),
        created_at: r.get(5)?,
        dispatched_at: r.get(6)?,
    })
}

const EVENT_COLUMNS: &str = "id, kind, job_id, worker, data, created_at, dispatched_at";

fn parse_id(s: String) -> rusqlite::Result<JobId> {
    s.parse().map_err(|e| corrupt("job id", e))
}

#[async_trait]
impl Store for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn insert(&self, jobs: Vec<NewJob>) -> Result<Vec<Inserted>> {
        let max_queues = self.max_queues;
        self.db
            .write(move |tx| {
                super::queues::admit_sqlite(tx, &jobs, max_queues, crate::time::now())?;
                jobs.iter().map(|j| insert_one(tx, j)).collect()
            })
            .await
    }

    async fn mark_dispatched(&self, ids: &[JobId]) -> Result<()> {
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        self.db
            .write(move |tx| {
                let mut st = tx.prepare_cached(
                    "UPDATE jobs SET dispatched = 1 WHERE id = ?1 AND state = 'queued'",
                )?;
                for id in &ids {
                    st.execute([id])?;
                }
                Ok(())
            })
            .await
    }

    async fn undispatched(&self, before: Micros, limit: usize) -> Result<Vec<Dispatch>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, queue FROM jobs WHERE state = 'queued' AND dispatched = 0 \
                     AND updated_at < ?1 ORDER BY updated_at LIMIT ?2",
                )?;
                let rows = st.query_map(params![before, limit as i64], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?;
                rows.map(|r| {
                    let (id, queue) = r?;
                    Ok(Dispatch {
                        id: parse_id(id)?,
                        queue,
                    })
                })
                .collect()
            })
            .await
    }

    async fn redispatch_all(&self) -> Result<u64> {
        self.db
            .write(|tx| {
                tx.execute(
                    "UPDATE jobs SET dispatched = 0, updated_at = 0 WHERE state = 'queued'",
                    [],
                )
                .map(|n| n as u64)
            })
            .await
    }

    async fn start(&self, ids: &[JobId], worker: &str, now: Micros) -> Result<Vec<StartOutcome>> {
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let worker = worker.to_string();
        self.db
            .write(move |tx| {
                let mut out = Vec::with_capacity(ids.len());
                // The common case in one statement: a startable job starts. Anything else
                // (missing, running, terminal, early, out of crash budget) is sorted out below.
                let mut fast = tx.prepare_cached(&format!(
                    "UPDATE jobs SET state = 'running', epoch = epoch + 1, worker = ?2, \
                     started_at = ?3, dispatched = 1, updated_at = ?3 WHERE id = ?1 \
                     AND crashes < max_crashes AND (state = 'queued' OR (state = 'scheduled' \
                     AND COALESCE(scheduled_at, 0) <= ?3)) RETURNING {COLUMNS}"
                ))?;
                for id in &ids {
                    if let Some(job) = fast
                        .query_row(params![id, worker, now], row_to_job)
                        .optional()?
                    {
                        out.push(StartOutcome::Run(Box::new(job)));
                        continue;
                    }
                    let Some(mut job) = get_job(tx, id)? else {
                        out.push(StartOutcome::Missing);
                        continue;
                    };
                    if job.state.is_terminal() || job.state == JobState::Running {
                        out.push(StartOutcome::Skip(job.state));
                        continue;
                    }
                    if job.state == JobState::Scheduled {
                        let due = job.scheduled_at.unwrap_or(0);
                        if due > now {
                            out.push(StartOutcome::Defer(due));
                            continue;
                        }
                    }
                    if job.crashes >= job.max_crashes {
                        let reason = format!(
                            "lost its worker {} times (max_crashes = {})",
                            job.crashes, job.max_crashes
                        );
                        dead_with_follow_up(tx, &mut job, &reason, now)?;
                        out.push(StartOutcome::Dead);
                        continue;
                    }
                    let job = tx
                        .prepare_cached(&format!(
                            "UPDATE jobs SET state = 'running', epoch = epoch + 1, worker = ?2, \
                             started_at = ?3, dispatched = 1, updated_at = ?3 WHERE id = ?1 \
                             RETURNING {COLUMNS}"
                        ))?
                        .query_row(params![id, worker, now], row_to_job)?;
                    out.push(StartOutcome::Run(Box::new(job)));
                }
                Ok(out)
            })
            .await
    }

    async fn complete(&self, done: &[Completion], now: Micros) -> Result<Vec<Committed>> {
        let done = done.to_vec();
        self.db
            .write(move |tx| done.iter().map(|c| complete_one(tx, c, now)).collect())
            .await
    }

    async fn mark_lost(&self, id: JobId, worker: &str, now: Micros) -> Result<Lost> {
        let worker = worker.to_string();
        self.db
            .write(move |tx| {
                let Some(mut job) = get_job(tx, &id.to_string())? else {
                    return Ok(Lost::Missing);
                };
                if job.state != JobState::Running || job.worker.as_deref() != Some(&worker) {
                    return Ok(Lost::NotOwned(job.state));
                }
                let crashes = job.crashes + 1;
                tx.execute(
                    "UPDATE jobs SET crashes = ?2 WHERE id = ?1",
                    params![id.to_string(), crashes],
                )?;
                job.crashes = crashes;
                if job.cancel_requested {
                    tx.execute(
                        "UPDATE jobs SET state = 'cancelled', error = 'cancelled', finished_at = ?2, \
                         updated_at = ?2 WHERE id = ?1",
                        params![id.to_string(), now],
                    )?;
                    if NewEvent::wanted(&job, JobState::Cancelled) {
                        terminal_event(tx, &id.to_string(), now)?;
                    }
                    return Ok(Lost::Cancelled);
                }
                if crashes >= job.max_crashes {
                    let reason = format!(
                        "lost its worker {crashes} times, last {worker} (max_crashes = {}): \
                         the task may be killing its worker",
                        job.max_crashes
                    );
                    dead_with_follow_up(tx, &mut job, &reason, now)?;
                    return Ok(Lost::Dead);
                }
                tx.execute(
                    "UPDATE jobs SET state = 'queued', dispatched = 0, worker = NULL, updated_at = ?2 \
                     WHERE id = ?1",
                    params![id.to_string(), now],
                )?;
                Ok(Lost::Requeued)
            })
            .await
    }

    async fn claim_due(&self, now: Micros, limit: usize) -> Result<Vec<Dispatch>> {
        self.db
            .write(move |tx| {
                let mut st = tx.prepare_cached(
                    "UPDATE jobs SET state = 'queued', dispatched = 0, updated_at = ?1 WHERE id IN \
                     (SELECT id FROM jobs WHERE state = 'scheduled' AND scheduled_at <= ?1 \
                      ORDER BY scheduled_at LIMIT ?2) RETURNING id, queue",
                )?;
                let rows = st.query_map(params![now, limit as i64], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?;
                rows.map(|r| {
                    let (id, queue) = r?;
                    Ok(Dispatch {
                        id: parse_id(id)?,
                        queue,
                    })
                })
                .collect()
            })
            .await
    }

    async fn running(&self, limit: usize) -> Result<Vec<(JobId, String, Micros)>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, worker, started_at FROM jobs WHERE state = 'running' \
                     ORDER BY started_at LIMIT ?1",
                )?;
                let rows = st.query_map([limit as i64], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })?;
                rows.map(|r| {
                    let (id, w, s) = r?;
                    Ok((parse_id(id)?, w.unwrap_or_default(), s.unwrap_or(0)))
                })
                .collect()
            })
            .await
    }

    async fn set_progress(
        &self,
        id: JobId,
        epoch: u64,
        progress: serde_json::Value,
    ) -> Result<bool> {
        self.db
            .write(move |tx| {
                tx.execute(
                    "UPDATE jobs SET progress = ?3 WHERE id = ?1 AND epoch = ?2 AND state = 'running'",
                    params![id.to_string(), epoch as i64, to_json(&progress)],
                )
                .map(|n| n == 1)
            })
            .await
    }

    async fn mark_dead(&self, id: JobId, reason: &str, now: Micros) -> Result<bool> {
        let reason = reason.to_string();
        self.db
            .write(move |tx| {
                let Some(mut job) = get_job(tx, &id.to_string())? else {
                    return Ok(false);
                };
                if job.state.is_terminal() {
                    return Ok(false);
                }
                dead_with_follow_up(tx, &mut job, &reason, now)?;
                Ok(true)
            })
            .await
    }

    async fn get(&self, id: JobId) -> Result<Option<Job>> {
        self.db.read(move |c| get_job(c, &id.to_string())).await
    }

    async fn get_by_key(&self, key: &str) -> Result<Option<Job>> {
        let key = key.to_string();
        self.db
            .read(move |c| {
                c.query_row(
                    &format!("SELECT {COLUMNS} FROM jobs WHERE idempotency_key = ?1"),
                    [key],
                    row_to_job,
                )
                .optional()
            })
            .await
    }

    async fn list(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        if let Some(c) = cursor {
            if c.parse::<JobId>().is_err() {
                return Err(Error::Invalid(format!("invalid cursor '{c}'")));
            }
        }
        let filter = filter.clone();
        let cursor = cursor.map(str::to_string);
        let limit = limit.clamp(1, 1000);
        self.db
            .read(move |c| {
                let mut sql = format!("SELECT {COLUMNS} FROM jobs WHERE 1 = 1");
                let mut args: Vec<String> = Vec::new();
                if let Some(s) = filter.state {
                    args.push(s.as_str().into());
                    sql += &format!(" AND state = ?{}", args.len());
                }
                if let Some(q) = &filter.queue {
                    args.push(q.clone());
                    sql += &format!(" AND queue = ?{}", args.len());
                }
                if let Some(t) = &filter.task {
                    args.push(t.clone());
                    sql += &format!(" AND task = ?{}", args.len());
                }
                if let Some(cur) = &cursor {
                    args.push(cur.clone());
                    sql += &format!(" AND id < ?{}", args.len());
                }
                sql += &format!(" ORDER BY id DESC LIMIT {}", limit + 1);
                let mut st = c.prepare(&sql)?;
                let jobs = st
                    .query_map(rusqlite::params_from_iter(args.iter()), row_to_job)?
                    .collect::<rusqlite::Result<Vec<Job>>>()?;
                Ok(JobPage::cut(jobs, limit))
            })
            .await
    }

    async fn retry(&self, id: JobId, now: Micros) -> Result<Job> {
        let res = self
            .db
            .write(move |tx| {
                let sid = id.to_string();
                let Some(job) = get_job(tx, &sid)? else {
                    return Ok(Err(Error::NotFound(id)));
                };
                if !matches!(
                    job.state,
                    JobState::Failed | JobState::Dead | JobState::Cancelled
                ) {
                    return Ok(Err(Error::Conflict {
                        id,
                        state: job.state,
                        message: "only failed, dead or cancelled jobs can be retried".into(),
                    }));
                }
                tx.execute(
                    "UPDATE jobs SET state = 'queued', dispatched = 0, attempts = 0, crashes = 0, \
                     cancel_requested = 0, worker = NULL, finished_at = NULL, scheduled_at = NULL, \
                     updated_at = ?2 WHERE id = ?1",
                    params![sid, now],
                )?;
                Ok(Ok(get_job(tx, &sid)?.expect("row just updated")))
            })
            .await?;
        res
    }

    async fn cancel(&self, id: JobId, now: Micros) -> Result<Job> {
        let res = self
            .db
            .write(move |tx| {
                let sid = id.to_string();
                let Some(job) = get_job(tx, &sid)? else {
                    return Ok(Err(Error::NotFound(id)));
                };
                match job.state {
                    JobState::Queued | JobState::Scheduled => {
                        tx.execute(
                            "UPDATE jobs SET state = 'cancelled', error = 'cancelled', \
                             finished_at = ?2, updated_at = ?2 WHERE id = ?1",
                            params![sid, now],
                        )?;
                        if NewEvent::wanted(&job, JobState::Cancelled) {
                            terminal_event(tx, &sid, now)?;
                        }
                    }
                    JobState::Running => {
                        tx.execute(
                            "UPDATE jobs SET cancel_requested = 1, updated_at = ?2 WHERE id = ?1",
                            params![sid, now],
                        )?;
                    }
                    st => {
                        return Ok(Err(Error::Conflict {
                            id,
                            state: st,
                            message: "a finished job cannot be cancelled".into(),
                        }))
                    }
                }
                Ok(Ok(get_job(tx, &sid)?.expect("row just updated")))
            })
            .await?;
        res
    }

    async fn cancel_requested(&self, ids: &[JobId]) -> Result<Vec<JobId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT 1 FROM jobs WHERE id = ?1 AND cancel_requested = 1 AND state = 'running'",
                )?;
                let mut out = Vec::new();
                for id in ids {
                    if st.exists([&id])? {
                        out.push(parse_id(id)?);
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.db
            .read(|c| {
                let mut st = c.prepare_cached(
                    "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state ORDER BY queue",
                )?;
                let rows = st.query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                let rows = rows.collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(group_counts(rows))
            })
            .await
    }

    async fn register_worker(&self, info: &WorkerInfo, now: Micros) -> Result<()> {
        let info = info.clone();
        self.db
            .write(move |tx| {
                tx.execute(
                    "INSERT OR REPLACE INTO workers (id, info, started_at, last_seen, status) \
                     VALUES (?1, ?2, ?3, ?4, 'live')",
                    params![info.id, to_json(&info), info.started_at, now],
                )?;
                let mut st = tx.prepare_cached("INSERT OR IGNORE INTO tasks (name) VALUES (?1)")?;
                for t in &info.tasks {
                    st.execute([t])?;
                }
                Ok(())
            })
            .await
    }

    async fn worker_seen(&self, id: &str, now: Micros) -> Result<()> {
        let id = id.to_string();
        self.db
            .write(move |tx| {
                tx.execute(
                    "UPDATE workers SET last_seen = ?2, status = 'live' WHERE id = ?1",
                    params![id, now],
                )
                .map(|_| ())
            })
            .await
    }

    async fn worker_gone(
        &self,
        id: &str,
        status: &str,
        event: Option<NewEvent>,
        now: Micros,
    ) -> Result<bool> {
        let (id, status) = (id.to_string(), status.to_string());
        self.db
            .write(move |tx| {
                let changed = tx.execute(
                    "UPDATE workers SET status = ?2, last_seen = max(last_seen, ?3) WHERE id = ?1 \
                     AND status = 'live'",
                    params![id, status, now],
                )? == 1;
                if let (true, Some(ev)) = (changed, &event) {
                    insert_event(tx, ev, now)?;
                }
                Ok(changed)
            })
            .await
    }

    async fn workers(&self, since: Micros) -> Result<Vec<WorkerRecord>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT info, last_seen, status FROM workers WHERE last_seen >= ?1 \
                     ORDER BY started_at DESC",
                )?;
                let rows = st.query_map([since], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })?;
                let mut running = c.prepare_cached(
                    "SELECT id FROM jobs WHERE state = 'running' AND worker = ?1",
                )?;
                let mut out = Vec::new();
                for r in rows {
                    let (info, last_seen, status) = r?;
                    let info: WorkerInfo =
                        serde_json::from_str(&info).map_err(|e| corrupt("worker", e))?;
                    let ids = running
                        .query_map([&info.id], |r| r.get::<_, String>(0))?
                        .map(|r| r.and_then(parse_id))
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    out.push(WorkerRecord {
                        info,
                        last_seen,
                        status,
                        running: ids,
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn known_tasks(&self) -> Result<Vec<String>> {
        self.db
            .read(|c| {
                let mut st = c.prepare_cached("SELECT name FROM tasks ORDER BY name")?;
                let rows = st.query_map([], |r| r.get::<_, String>(0))?;
                rows.collect()
            })
            .await
    }

    async fn finished_since(&self, since: Micros) -> Result<Vec<FinishedCounts>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT queue, state, count(*) FROM jobs WHERE finished_at >= ?1 \
                     AND finished_at IS NOT NULL GROUP BY queue, state ORDER BY queue",
                )?;
                let rows = st.query_map([since], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                let rows = rows.collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(group_counts(rows).into_iter().map(Into::into).collect())
            })
            .await
    }

    async fn purge(&self, before: Micros, limit: usize) -> Result<Purged> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.db
            .write(move |tx| {
                let jobs = tx.execute(
                    "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE finished_at < ?1 \
                     AND state IN ('succeeded', 'failed', 'dead', 'cancelled') \
                     ORDER BY finished_at LIMIT ?2)",
                    params![before, limit],
                )? as u64;
                let events = tx.execute(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events \
                     WHERE dispatched_at IS NOT NULL AND created_at < ?1 ORDER BY id LIMIT ?2)",
                    params![before, limit],
                )? as u64;
                let workers = tx.execute(
                    "DELETE FROM workers WHERE status <> 'live' AND last_seen < ?1",
                    params![before],
                )? as u64;
                Ok(Purged {
                    jobs,
                    events,
                    workers,
                })
            })
            .await
    }

    async fn record_event(&self, event: NewEvent, now: Micros) -> Result<i64> {
        self.db.write(move |tx| insert_event(tx, &event, now)).await
    }

    async fn fan_out(
        &self,
        subscribers: &[Subscriber],
        limit: usize,
        now: Micros,
    ) -> Result<FanOut> {
        let subscribers = subscribers.to_vec();
        self.db
            .write(move |tx| {
                let events = tx
                    .prepare_cached(&format!(
                        "SELECT {EVENT_COLUMNS} FROM events WHERE dispatched_at IS NULL \
                         ORDER BY id LIMIT ?1"
                    ))?
                    .query_map([limit as i64], row_to_event)?
                    .collect::<rusqlite::Result<Vec<Event>>>()?;
                let mut out = FanOut {
                    events: events.len(),
                    dispatch: Vec::new(),
                };
                let mut has_callback =
                    tx.prepare_cached("SELECT callback_url IS NOT NULL FROM jobs WHERE id = ?1")?;
                let mut done =
                    tx.prepare_cached("UPDATE events SET dispatched_at = ?2 WHERE id = ?1")?;
                for ev in &events {
                    let mut targets: Vec<&str> = subscribers
                        .iter()
                        .filter(|s| s.matches(&ev.kind))
                        .map(|s| s.name.as_str())
                        .collect();
                    if let Some(job) = ev.job_id {
                        let cb = has_callback
                            .query_row([job.to_string()], |r| r.get::<_, bool>(0))
                            .optional()?
                            .unwrap_or(false);
                        if cb {
                            targets.push(CALLBACK_TARGET);
                        }
                    }
                    for t in targets {
                        let ins = insert_one(tx, &ev.delivery_job(t, now))?;
                        if ins.needs_dispatch() {
                            out.dispatch.push(Dispatch {
                                id: ins.id,
                                queue: ins.queue,
                            });
                        }
                    }
                    done.execute(params![ev.id, now])?;
                }
                Ok(out)
            })
            .await
    }

    async fn events(&self, after: i64, limit: usize) -> Result<Vec<Event>> {
        self.db
            .read(move |c| {
                c.prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM events WHERE id > ?1 ORDER BY id LIMIT ?2"
                ))?
                .query_map(params![after, limit as i64], row_to_event)?
                .collect()
            })
            .await
    }
}
