//! A remote session's round on the embedded file: where broker and store are one SQLite file,
//! a completion call that also reserves commits its outcomes, acknowledges their messages,
//! reserves the next ones and starts their jobs in one write transaction, as a Rust worker's
//! round does (`store::sqlite::complete_and_take`), instead of four (commit, acknowledge,
//! reserve, start). Each write is a trip through the file's one lock and a hand-off to a
//! blocking thread, and a worker with one slot makes one such call per job.
//!
//! The outcomes are decided by the same fence and answered by [`Gateway::answer`], the starts
//! by the store's rule and [`Gateway::settle_starts`], as on the ordinary path. What differs is
//! when things happen: the session's liveness is read under the lock that reserves and starts,
//! so a session ended or presumed dead reserves nothing; jobs the commits make ready (a
//! workflow's next step) are published after the round and reserved by an ordinary reservation
//! in the same call; the long poll, when the round took nothing, is the ordinary one. A round
//! the file refuses for a job's data falls back to the ordinary path, which isolates the job.

use std::sync::Arc;
use std::time::Duration;

use super::{check_reserve, Completed, Gateway, Report, ReservedJob, Result};
use crate::broker::Delivery;
use crate::job::JobId;
use crate::store::{Committed, StartOutcome};

impl Gateway {
    fn shared_db(&self) -> Option<Arc<crate::sqlite::Db>> {
        match (self.store.embedded_db(), self.broker.embedded_db()) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => Some(a.clone()),
            _ => None,
        }
    }

    /// The round in one write, when broker and store share a file. `None`: not taken this way,
    /// and nothing written; the caller goes the ordinary way (which also answers a call this
    /// one would refuse, as it always has).
    pub(super) async fn embedded_round(
        &self,
        session: &str,
        reports: &[Report],
        max: u32,
        wait: Duration,
    ) -> Result<Option<(Vec<Completed>, Result<Vec<ReservedJob>>)>> {
        let Some(db) = self.shared_db() else {
            return Ok(None);
        };
        if check_reserve(max, wait).is_err() {
            return Ok(None);
        }
        // An unknown session's completions still count (the fence decides them): the ordinary
        // path commits them and refuses the reservation.
        let Ok((info, remote)) = self.session(session).await else {
            return Ok(None);
        };
        let p = self.prepare(session, reports, Some(&remote)).await?;
        let take = crate::store::sqlite::Take {
            worker: session.to_string(),
            queues: info.queues.clone(),
            max: max as usize,
        };
        let round = crate::store::sqlite::complete_and_take_alive(
            &db,
            &p.completions,
            &p.leases,
            take,
            p.at,
        )
        .await;
        let (committed, taken) = match round {
            Ok(r) => r,
            // Nothing of it was written; the call fails as the ordinary path's commit would,
            // and the worker sends it again.
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => {
                // Nothing of it was written: the ordinary path isolates the job whose data the
                // file refused. Said aloud: a round that always lands here has lost the
                // one-write path.
                tracing::warn!(error = %e, worker = %session, "a remote round in one write was refused; taking the ordinary path");
                return Ok(None);
            }
        };
        // The commits made jobs ready (a workflow's next step, a job a concurrency limit
        // held): they are published after the round, as on the ordinary path, where the
        // reservation that follows can hand them out in this call too.
        let made_ready = committed
            .iter()
            .any(|c| matches!(c, Committed::Applied { dispatch, .. } if !dispatch.is_empty()));
        // Every outcome of a round that committed is applied or refused by its fence, never
        // unstored (a job's own failure refuses the whole round), so no slot stays taken.
        let results = self.answer(session, reports, p, committed, true).await?;
        let Some(taken) = taken else {
            return Ok(Some((results, Err(Self::expired(session)))));
        };
        let n = taken.len() as u32;
        let mut jobs = match self.settle_taken(session, &remote, taken).await {
            Ok(jobs) => jobs,
            Err(e) => return Ok(Some((results, Err(e)))),
        };
        // What the round left room for: the long poll when it took nothing, the jobs its
        // commits made ready. The ordinary reservation; a failure of it must not hide the jobs
        // this call has started already.
        if n < max && (made_ready || (n == 0 && !wait.is_zero())) {
            let wait = if n == 0 { wait } else { Duration::ZERO };
            match self.reserve(session, max - n, wait).await {
                Ok(more) => jobs.extend(more),
                Err(e) if jobs.is_empty() => return Ok(Some((results, Err(e)))),
                Err(e) => {
                    tracing::warn!(error = %e, worker = %session, "reserving after a round failed; answering what the round took");
                }
            }
        }
        Ok(Some((results, Ok(jobs))))
    }

    async fn settle_taken(
        &self,
        session: &str,
        remote: &super::RemoteWorker,
        taken: Vec<crate::store::sqlite::Taken>,
    ) -> Result<Vec<ReservedJob>> {
        let mut started: Vec<(JobId, Delivery, StartOutcome)> = Vec::with_capacity(taken.len());
        for (d, outcome) in taken {
            match (&d.job, outcome) {
                (Ok(id), Some(o)) => started.push((*id, d, o)),
                (job, _) => {
                    // Reserved but not started: its payload names no job. The round's other
                    // jobs are started, so a broker failure here must not fail the call;
                    // what stays reserved, the rescuer finds once the session ends.
                    let reason = job.as_ref().err().map_or("undecodable", |r| r.as_str());
                    tracing::error!(event = "message.dead_lettered", queue = %d.queue, tag = %d.tag, reason, "dead-lettered a message");
                    if let Err(e) = self.broker.dead_letter(&d, reason).await {
                        tracing::warn!(error = %e, "could not dead-letter a message; the rescuer will find it");
                    }
                }
            }
        }
        self.settle_starts(session, remote, started).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::sqlite::SqliteBroker;
    use crate::broker::Broker;
    use crate::job::{new_job_id, JobOptions, JobState, NewJob};
    use crate::remote::{Registration, RemoteError, ReportKind, Reported, Status};
    use crate::sqlite::Db;
    use crate::store::sqlite::SqliteStore;
    use crate::store::{Store, ToPublish};

    async fn enqueue(store: &SqliteStore, broker: &SqliteBroker, n: usize) -> Vec<JobId> {
        let jobs: Vec<NewJob> = (0..n)
            .map(|_| NewJob {
                id: new_job_id(),
                task: "t".into(),
                queue: "q".into(),
                args: serde_json::json!(null),
                options: JobOptions::default(),
                created_at: crate::time::now(),
                run_at: None,
            })
            .collect();
        store.insert(jobs.clone()).await.unwrap();
        let publish: Vec<ToPublish> = jobs
            .iter()
            .map(|j| ToPublish {
                id: j.id,
                queue: "q".into(),
                priority: 0,
            })
            .collect();
        broker.publish(&publish).await.unwrap();
        jobs.iter().map(|j| j.id).collect()
    }

    async fn setup() -> (
        tempfile::TempDir,
        Arc<Db>,
        Arc<SqliteStore>,
        Arc<SqliteBroker>,
        Gateway,
        String,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("h.db")).unwrap();
        let store = Arc::new(SqliteStore::new(db.clone()));
        let broker = Arc::new(SqliteBroker::new(db.clone()));
        let gw = Gateway::new(broker.clone(), store.clone(), Default::default());
        let session = gw
            .register(Registration {
                queues: vec!["q".into()],
                concurrency: 2,
                heartbeat_interval_ms: 10_000,
                host: None,
                pid: None,
                version: None,
                tasks: vec![],
            })
            .await
            .unwrap()
            .session;
        (dir, db, store, broker, gw, session)
    }

    fn succeeded(j: &ReservedJob) -> Report {
        Report {
            job_id: j.job_id,
            epoch: j.epoch,
            lease: j.lease.clone(),
            outcome: ReportKind::Succeeded,
            result: Some(Reported::Value(serde_json::json!(1))),
            error: None,
            retry_delay_ms: None,
            delay_ms: None,
        }
    }

    /// A completion call that asks for the next job commits the outcome, acknowledges its
    /// message, reserves the next and starts it in one write transaction (the ordinary path
    /// takes four); once the session has ended, the same call still commits its outcome but
    /// reserves nothing, and the next job's message stays ready.
    #[tokio::test]
    async fn a_remote_round_on_the_embedded_file_is_one_write() {
        let (_dir, db, store, broker, gw, session) = setup().await;
        let ids = enqueue(&store, &broker, 3).await;
        let first = gw.reserve(&session, 1, Duration::ZERO).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].job_id, ids[0]);

        let before = db.commits();
        let (results, next) = gw
            .complete_and_reserve(&session, &[succeeded(&first[0])], 1, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(db.commits() - before, 1, "one write for the whole round");
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].status, Status::Applied);
        assert_eq!(results[0].state, Some(JobState::Succeeded));
        let next = next.unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].job_id, ids[1]);
        let running = store.get(ids[1]).await.unwrap().unwrap();
        assert_eq!(running.state, JobState::Running);
        assert_eq!(running.worker.as_deref(), Some(session.as_str()));
        assert_eq!(running.epoch, next[0].epoch);
        let done = store.get(ids[0]).await.unwrap().unwrap();
        assert_eq!(done.state, JobState::Succeeded);
        let depth = &broker.depths().await.unwrap()[0];
        assert_eq!(
            (depth.ready, depth.reserved),
            (1, 1),
            "the first message acknowledged, the second reserved, the third ready"
        );

        // Ended: the outcome stands, nothing more is reserved under the session.
        gw.end(&session).await.unwrap();
        let (results, next) = gw
            .complete_and_reserve(&session, &[succeeded(&next[0])], 1, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(results[0].status, Status::Applied);
        assert!(
            matches!(next, Err(RemoteError::SessionExpired(_))),
            "{next:?}"
        );
        let done = store.get(ids[1]).await.unwrap().unwrap();
        assert_eq!(done.state, JobState::Succeeded);
        let last = store.get(ids[2]).await.unwrap().unwrap();
        assert_eq!(last.state, JobState::Queued);
        let depth = &broker.depths().await.unwrap()[0];
        assert_eq!((depth.ready, depth.reserved), (1, 0));
    }

    /// A round the file refuses for one job's data (its success enqueues a follow-up the file
    /// refuses to store) writes nothing and the call takes the ordinary path: that job is made
    /// dead alone, the other outcome applies once, and the next job is reserved and started.
    #[tokio::test]
    async fn a_refused_round_takes_the_ordinary_path() {
        let (_dir, db, store, broker, gw, session) = setup().await;
        let ids = enqueue(&store, &broker, 3).await;
        let first = gw.reserve(&session, 2, Duration::ZERO).await.unwrap();
        assert_eq!(first.len(), 2);
        let bad = first[0].job_id;
        db.write(move |tx| {
            tx.execute_batch(
                "CREATE TRIGGER refuse_nowhere BEFORE INSERT ON jobs WHEN NEW.queue = 'nowhere' \
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
            )?;
            tx.execute(
                "UPDATE jobs SET on_success = ?2 WHERE id = ?1",
                [
                    bad.to_string(),
                    r#"{"task":"t.next","queue":"nowhere","args":{}}"#.to_string(),
                ],
            )
        })
        .await
        .unwrap();
        let before = db.commits();
        let reports = [succeeded(&first[0]), succeeded(&first[1])];
        let (results, next) = gw
            .complete_and_reserve(&session, &reports, 2, Duration::ZERO)
            .await
            .unwrap();
        assert!(db.commits() - before > 1, "the ordinary path's writes");
        assert_eq!(results[0].status, Status::Applied);
        assert_eq!(results[0].state, Some(JobState::Dead));
        assert_eq!(results[1].status, Status::Applied);
        assert_eq!(results[1].state, Some(JobState::Succeeded));
        let next = next.unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].job_id, ids[2]);
        let depth = &broker.depths().await.unwrap()[0];
        assert_eq!((depth.ready, depth.reserved), (0, 1));
        // Sent again (its answer lost): nothing applies twice.
        let (again, _) = gw
            .complete_and_reserve(&session, &reports, 1, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            again.iter().all(|c| c.status == Status::AlreadyApplied),
            "{again:?}"
        );
    }

    /// The next step of a workflow, made ready by the round's own commit, is handed out by the
    /// same call (published after the round, then reserved), as the ordinary path does.
    #[tokio::test]
    async fn a_step_the_round_makes_ready_comes_back_in_the_same_call() {
        let (_dir, _db, store, broker, gw, session) = setup().await;
        let client = crate::client::Client::new(broker.clone(), store.clone());
        let step = |after: &[&str]| {
            let mut s = crate::workflow::StepSpec::new("t", serde_json::json!(null));
            s.queue = Some("q".into());
            s.after = after.iter().map(|a| a.to_string()).collect();
            s
        };
        let wf = client
            .create_workflow(
                crate::workflow::WorkflowSpec::new("chain")
                    .with_step("a", step(&[]))
                    .with_step("b", step(&["a"])),
            )
            .await
            .unwrap();
        let first = gw.reserve(&session, 1, Duration::ZERO).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].job_id, wf.steps["a"]);
        let (results, next) = gw
            .complete_and_reserve(&session, &[succeeded(&first[0])], 1, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(results[0].state, Some(JobState::Succeeded));
        let next = next.unwrap();
        assert_eq!(next.len(), 1, "{next:?}");
        assert_eq!(next[0].job_id, wf.steps["b"]);
    }
}
