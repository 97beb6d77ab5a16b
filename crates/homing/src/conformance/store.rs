//! The store contract, case by case. Each case takes a fresh store and panics on a violation.

use std::sync::Arc;
use std::time::Duration;

pub use super::batch::*;
pub use super::workers::*;
pub use super::workflows::*;
use super::{new_job, unique_queue};
use crate::job::{FollowUp, JobState};
use crate::store::*;
use crate::time::{micros, now};

/// Generates one `#[tokio::test]` per store case; `$make` is an expression whose value is a
/// future of `Arc<dyn Store>`, evaluated afresh for each case.
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(store, $make;
            insert_and_get, idempotency_key_returns_existing, countdown_is_scheduled_and_claimed_once,
            start_fences_and_guards, stale_epoch_is_rejected, crash_budget_makes_dead,
            mark_lost_is_conditional_on_owner, retry_outcome_schedules, follow_up_in_same_transaction,
            release_counts_nothing, outbox_tracks_dispatch, cancel_rules, operator_retry_rules,
            list_filters_and_pages, concurrent_starts_have_one_winner, concurrent_claims_are_exclusive,
            progress_is_fenced, workers_registry, queue_stats_count, start_defers_and_reports_missing,
            mark_dead_is_final, failed_transition_writes_one_event, stale_commit_writes_no_event,
            dead_transitions_write_events, callback_jobs_get_terminal_events,
            fan_out_inserts_each_delivery_once, worker_gone_reports_one_change, finished_between_counts,
            batches_decide_as_one_by_one, purge_deletes_only_old_history,
            pruner_passes_delete_old_finished_jobs_and_nothing_unfinished,
            schedules_are_set_read_paused_and_deleted, schedule_ticks_get_one_job_each,
            schedule_pages_end_before_their_bytes, schedule_changes_are_counted,
            completions_record_their_epoch, running_under_lists_one_workers_jobs,
            remote_worker_info_round_trips, traceparent_goes_with_the_job_and_its_follow_ups,
            workflow_step_runs_once_after_its_parents,
            workflow_failure_cancels_dependents_but_not_finalisers,
            workflow_last_parents_racing_ready_the_step_once,
            workflow_cancel_reaches_every_unfinished_step,
            workflow_rows_are_purged_with_their_steps,
            workflow_parents_results_given_to_a_step_are_bounded,
            workflow_step_cancelled_before_it_ran_is_retried_with_its_parents,
            batch_insert_decides_each_job_as_one_by_one, refused_batch_stores_nothing,
            lost_worker_keeps_its_reclaims,
            a_worker_presumed_dead_starts_nothing_and_only_its_recorded_runs_crash
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($suite:ident, $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend = $make.await;
                $crate::conformance::$suite::$case(backend).await;
            }
        )*
    };
}

async fn insert_one(s: &dyn Store, job: crate::job::NewJob) -> Inserted {
    let mut v = s.insert(vec![job]).await.expect("insert");
    v.remove(0)
}

async fn run_one(s: &dyn Store, id: crate::job::JobId, worker: &str) -> crate::job::Job {
    match s
        .start(&[id], worker, now())
        .await
        .expect("start")
        .remove(0)
    {
        StartOutcome::Run(j) => *j,
        other => panic!("expected Run, got {other:?}"),
    }
}

pub use super::schedules::{
    schedule_changes_are_counted, schedule_pages_end_before_their_bytes,
    schedule_ticks_get_one_job_each, schedules_are_set_read_paused_and_deleted,
};

pub async fn insert_and_get(s: Arc<dyn Store>) {
    let q = unique_queue("ins");
    let mut nj = new_job(&q, "t.insert");
    nj.args = serde_json::json!({"text": "안녕 hello", "list": [1, 2.5, null]});
    nj.options.max_retries = Some(7);
    let ins = insert_one(&*s, nj.clone()).await;
    assert_eq!(ins.id, nj.id);
    assert_eq!(ins.state, JobState::Queued);
    assert!(!ins.existed && ins.needs_dispatch());
    let j = s.get(nj.id).await.unwrap().expect("job exists");
    assert_eq!(j.task, "t.insert");
    assert_eq!(j.queue, q);
    assert_eq!(j.args, nj.args);
    assert_eq!(j.state, JobState::Queued);
    assert_eq!((j.attempts, j.crashes, j.epoch), (0, 0, 0));
    assert_eq!(j.max_retries, Some(7));
    assert_eq!(j.max_crashes, crate::job::DEFAULT_MAX_CRASHES);
    assert_eq!(j.created_at, nj.created_at);
    assert!(j.result.is_none() && j.error.is_none() && j.worker.is_none());
    assert!(s.get(crate::job::new_job_id()).await.unwrap().is_none());
}

pub async fn idempotency_key_returns_existing(s: Arc<dyn Store>) {
    let q = unique_queue("idem");
    let key = unique_queue("key");
    let mut a = new_job(&q, "t");
    a.options.idempotency_key = Some(key.clone());
    let mut b = new_job(&q, "t");
    b.options.idempotency_key = Some(key.clone());
    let first = insert_one(&*s, a.clone()).await;
    let second = insert_one(&*s, b).await;
    assert!(!first.existed);
    assert!(second.existed, "the same key must return the existing job");
    assert_eq!(second.id, a.id);
    assert!(!second.needs_dispatch());
    assert_eq!(s.get_by_key(&key).await.unwrap().unwrap().id, a.id);
    // Both in one batch: still one job.
    let key2 = unique_queue("key");
    let mut c = new_job(&q, "t");
    c.options.idempotency_key = Some(key2.clone());
    let mut d = new_job(&q, "t");
    d.options.idempotency_key = Some(key2);
    let v = s.insert(vec![c.clone(), d]).await.unwrap();
    assert_eq!(v[1].id, c.id);
    assert!(v[1].existed);
}

pub async fn countdown_is_scheduled_and_claimed_once(s: Arc<dyn Store>) {
    let q = unique_queue("cd");
    let mut nj = new_job(&q, "t");
    let due = nj.created_at + micros(Duration::from_secs(60));
    nj.run_at = Some(due);
    let ins = insert_one(&*s, nj.clone()).await;
    assert_eq!(ins.state, JobState::Scheduled);
    assert!(!ins.needs_dispatch());
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(j.scheduled_at, Some(due));
    let early = s.claim_due(due - 1, 100).await.unwrap();
    assert!(!early.iter().any(|d| d.id == nj.id), "claimed before due");
    let claimed = s.claim_due(due, 100).await.unwrap();
    assert!(claimed.contains(&ToPublish {
        id: nj.id,
        queue: q.clone(),
        priority: 0,
    }));
    assert_eq!(s.get(nj.id).await.unwrap().unwrap().state, JobState::Queued);
    let again = s.claim_due(due + 1, 100).await.unwrap();
    assert!(!again.iter().any(|d| d.id == nj.id), "claimed twice");
}

pub async fn start_fences_and_guards(s: Arc<dyn Store>) {
    let q = unique_queue("start");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let t0 = now();
    let j = run_one(&*s, nj.id, "w1").await;
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.epoch, 1);
    assert_eq!(j.worker.as_deref(), Some("w1"));
    assert!(j.started_at.unwrap() >= t0);
    // A duplicate delivery while it runs: skipped.
    let dup = s.start(&[nj.id], "w2", now()).await.unwrap();
    assert_eq!(dup, vec![StartOutcome::Skip(JobState::Running)]);
    let c = Completion {
        id: nj.id,
        epoch: 1,
        outcome: Outcome::Succeeded(serde_json::json!({"ok": true})),
    };
    let r = s.complete(std::slice::from_ref(&c), now()).await.unwrap();
    assert!(
        matches!(
            &r[0],
            Committed::Applied {
                state: JobState::Succeeded,
                ..
            }
        ),
        "{r:?}"
    );
    let done = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(done.state, JobState::Succeeded);
    assert_eq!(done.result, Some(serde_json::json!({"ok": true})));
    assert!(done.finished_at.is_some());
    // A second commit of the same run, and a redelivery after the end: no effect.
    assert_eq!(
        s.complete(&[c], now()).await.unwrap(),
        vec![Committed::Stale]
    );
    assert_eq!(
        s.start(&[nj.id], "w3", now()).await.unwrap(),
        vec![StartOutcome::Skip(JobState::Succeeded)]
    );
    assert_eq!(s.get(nj.id).await.unwrap().unwrap().epoch, 1);
}

pub async fn stale_epoch_is_rejected(s: Arc<dyn Store>) {
    let q = unique_queue("stale");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let first = run_one(&*s, nj.id, "zombie").await;
    assert_eq!(
        s.mark_lost(nj.id, "zombie", now()).await.unwrap(),
        Lost::Requeued
    );
    let lost = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(
        (lost.state, lost.crashes, lost.attempts),
        (JobState::Queued, 1, 0)
    );
    let second = run_one(&*s, nj.id, "w2").await;
    assert_eq!(second.epoch, first.epoch + 1);
    let zombie = Completion {
        id: nj.id,
        epoch: first.epoch,
        outcome: Outcome::Succeeded(serde_json::json!("zombie")),
    };
    assert_eq!(
        s.complete(&[zombie], now()).await.unwrap(),
        vec![Committed::Stale]
    );
    let good = Completion {
        id: nj.id,
        epoch: second.epoch,
        outcome: Outcome::Succeeded(serde_json::json!("w2")),
    };
    assert!(matches!(
        s.complete(&[good], now()).await.unwrap()[0],
        Committed::Applied { .. }
    ));
    assert_eq!(
        s.get(nj.id).await.unwrap().unwrap().result,
        Some(serde_json::json!("w2"))
    );
}

pub async fn crash_budget_makes_dead(s: Arc<dyn Store>) {
    let q = unique_queue("poison");
    let mut nj = new_job(&q, "t");
    nj.options.on_failure = Some(FollowUp {
        task: "t.alert".into(),
        queue: Some(q.clone()),
        args: serde_json::json!({}),
    });
    insert_one(&*s, nj.clone()).await;
    for round in 1..=3u32 {
        run_one(&*s, nj.id, &format!("w{round}")).await;
        let lost = s
            .mark_lost(nj.id, &format!("w{round}"), now())
            .await
            .unwrap();
        if round < 3 {
            assert_eq!(lost, Lost::Requeued);
        } else {
            assert_eq!(lost, Lost::Dead);
        }
    }
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Dead);
    assert_eq!(j.crashes, 3);
    assert_eq!(j.attempts, 0, "crashes must not spend the retry budget");
    assert!(
        j.error.as_deref().unwrap_or("").contains('3'),
        "reason names the count: {:?}",
        j.error
    );
    let page = s
        .list(
            &JobFilter {
                queue: Some(q),
                task: Some("t.alert".into()),
                ..Default::default()
            },
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        page.jobs.len(),
        1,
        "a dead job's on_failure follow-up is enqueued"
    );
}

pub async fn mark_lost_is_conditional_on_owner(s: Arc<dyn Store>) {
    let q = unique_queue("lost");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    assert_eq!(
        s.mark_lost(nj.id, "w1", now()).await.unwrap(),
        Lost::NotOwned(JobState::Queued)
    );
    run_one(&*s, nj.id, "w1").await;
    assert_eq!(
        s.mark_lost(nj.id, "other", now()).await.unwrap(),
        Lost::NotOwned(JobState::Running)
    );
    let mut handles = Vec::new();
    for _ in 0..8 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            s.mark_lost(nj.id, "w1", now()).await.unwrap()
        }));
    }
    let mut requeued = 0;
    for h in handles {
        if h.await.unwrap() == Lost::Requeued {
            requeued += 1;
        }
    }
    assert_eq!(requeued, 1, "concurrent rescuers must count one crash");
    assert_eq!(s.get(nj.id).await.unwrap().unwrap().crashes, 1);
    assert_eq!(
        s.mark_lost(crate::job::new_job_id(), "w1", now())
            .await
            .unwrap(),
        Lost::Missing
    );
}

pub async fn retry_outcome_schedules(s: Arc<dyn Store>) {
    let q = unique_queue("retry");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let j = run_one(&*s, nj.id, "w").await;
    let at = now() + micros(Duration::from_secs(30));
    let c = Completion {
        id: nj.id,
        epoch: j.epoch,
        outcome: Outcome::Retry {
            error: "boom".into(),
            at,
        },
    };
    assert!(matches!(
        s.complete(&[c], now()).await.unwrap()[0],
        Committed::Applied {
            state: JobState::Scheduled,
            ..
        }
    ));
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.attempts, j.scheduled_at),
        (JobState::Scheduled, 1, Some(at))
    );
    assert_eq!(j.error.as_deref(), Some("boom"));
    assert_eq!(
        s.start(&[nj.id], "w", now()).await.unwrap(),
        vec![StartOutcome::Defer(at)]
    );
    assert!(s
        .claim_due(at, 10)
        .await
        .unwrap()
        .iter()
        .any(|d| d.id == nj.id));
    let j = run_one(&*s, nj.id, "w").await;
    assert_eq!(j.epoch, 2);
    let c = Completion {
        id: nj.id,
        epoch: 2,
        outcome: Outcome::Failed {
            error: "again".into(),
        },
    };
    assert!(matches!(
        s.complete(&[c], now()).await.unwrap()[0],
        Committed::Applied {
            state: JobState::Failed,
            ..
        }
    ));
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Failed, 2));
}

pub async fn follow_up_in_same_transaction(s: Arc<dyn Store>) {
    let q = unique_queue("follow");
    let mut nj = new_job(&q, "t");
    nj.options.on_failure = Some(FollowUp {
        task: "notify".into(),
        queue: Some(q.clone()),
        args: serde_json::json!({"say": "SUCCESS"}),
    });
    nj.options.on_success = Some(FollowUp {
        task: "never".into(),
        queue: Some(q.clone()),
        args: serde_json::json!({}),
    });
    insert_one(&*s, nj.clone()).await;
    let j = run_one(&*s, nj.id, "w").await;
    let c = Completion {
        id: nj.id,
        epoch: j.epoch,
        outcome: Outcome::Failed {
            error: "ocr broke".into(),
        },
    };
    let r = s.complete(&[c], now()).await.unwrap();
    let Committed::Applied { state, dispatch } = &r[0] else {
        panic!("{r:?}")
    };
    assert_eq!(*state, JobState::Failed);
    assert_eq!(
        dispatch.len(),
        1,
        "the follow-up must be returned for publishing"
    );
    let f = s
        .get(dispatch[0].id)
        .await
        .unwrap()
        .expect("follow-up committed with the transition");
    assert_eq!(f.task, "notify");
    assert_eq!(f.state, JobState::Queued);
    assert_eq!(f.args["say"], "SUCCESS");
    assert_eq!(f.args["parent"]["id"], serde_json::json!(nj.id));
    assert_eq!(f.args["parent"]["state"], "failed");
    assert_eq!(f.args["parent"]["error"], "ocr broke");
    let page = s
        .list(
            &JobFilter {
                queue: Some(q),
                task: Some("never".into()),
                ..Default::default()
            },
            None,
            10,
        )
        .await
        .unwrap();
    assert!(page.jobs.is_empty(), "on_success must not fire on failure");
}

/// The W3C trace context stored at enqueue comes back on every read, on the started run (so a
/// run in any process joins the trace), and on a follow-up, which continues its parent's trace.
pub async fn traceparent_goes_with_the_job_and_its_follow_ups(s: Arc<dyn Store>) {
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let q = unique_queue("trace");
    let mut nj = new_job(&q, "t");
    nj.options.traceparent = Some(tp.into());
    nj.options.on_failure = Some(FollowUp {
        task: "notify".into(),
        queue: Some(q.clone()),
        args: serde_json::json!({}),
    });
    let plain = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    insert_one(&*s, plain.clone()).await;
    let got = s.get(nj.id).await.unwrap().expect("job");
    assert_eq!(got.traceparent.as_deref(), Some(tp));
    let none = s.get(plain.id).await.unwrap().expect("job");
    assert_eq!(none.traceparent, None);
    let page = s
        .list(
            &JobFilter {
                queue: Some(q.clone()),
                ..Default::default()
            },
            None,
            10,
        )
        .await
        .unwrap();
    let listed = page.jobs.iter().find(|j| j.id == nj.id).expect("listed");
    assert_eq!(listed.traceparent.as_deref(), Some(tp));
    let j = run_one(&*s, nj.id, "w").await;
    assert_eq!(
        j.traceparent.as_deref(),
        Some(tp),
        "the started run carries it"
    );
    let c = Completion {
        id: nj.id,
        epoch: j.epoch,
        outcome: Outcome::Failed {
            error: "broke".into(),
        },
    };
    let r = s.complete(&[c], now()).await.unwrap();
    let Committed::Applied { dispatch, .. } = &r[0] else {
        panic!("{r:?}")
    };
    let f = s.get(dispatch[0].id).await.unwrap().expect("follow-up");
    assert_eq!(
        f.traceparent.as_deref(),
        Some(tp),
        "a follow-up continues the trace"
    );
}

pub async fn release_counts_nothing(s: Arc<dyn Store>) {
    let q = unique_queue("rel");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let j = run_one(&*s, nj.id, "w").await;
    let c = Completion {
        id: nj.id,
        epoch: j.epoch,
        outcome: Outcome::Released,
    };
    let r = s.complete(&[c], now()).await.unwrap();
    let Committed::Applied { state, dispatch } = &r[0] else {
        panic!("{r:?}")
    };
    assert_eq!(*state, JobState::Queued);
    assert_eq!(
        dispatch,
        &vec![ToPublish {
            id: nj.id,
            queue: q,
            priority: 0,
        }]
    );
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.crashes), (JobState::Queued, 0, 0));
    assert!(j.worker.is_none());
}

pub async fn outbox_tracks_dispatch(s: Arc<dyn Store>) {
    let q = unique_queue("outbox");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let far = now() + micros(Duration::from_secs(3600));
    let listed = |v: Vec<ToPublish>| v.iter().any(|d| d.id == nj.id);
    assert!(
        listed(s.undispatched(far, 10_000).await.unwrap()),
        "a new job is undispatched"
    );
    assert!(
        !listed(s.undispatched(nj.created_at - 1, 10_000).await.unwrap()),
        "respects `before`"
    );
    s.mark_dispatched(&[nj.id]).await.unwrap();
    assert!(!listed(s.undispatched(far, 10_000).await.unwrap()));
    assert!(s.redispatch_all().await.unwrap() >= 1);
    assert!(
        listed(s.undispatched(now() + 1, 10_000).await.unwrap()),
        "redispatch_all makes it due at once"
    );
    s.mark_dispatched(&[nj.id]).await.unwrap();
    run_one(&*s, nj.id, "w").await;
    s.redispatch_all().await.unwrap();
    assert!(
        !listed(s.undispatched(far, 10_000).await.unwrap()),
        "running jobs are not in the outbox"
    );
}

pub async fn cancel_rules(s: Arc<dyn Store>) {
    let q = unique_queue("cancel");
    let a = new_job(&q, "t");
    let b = new_job(&q, "t");
    insert_one(&*s, a.clone()).await;
    insert_one(&*s, b.clone()).await;
    let ca = s.cancel(a.id, now()).await.unwrap();
    assert_eq!(ca.state, JobState::Cancelled);
    assert_eq!(
        s.start(&[a.id], "w", now()).await.unwrap(),
        vec![StartOutcome::Skip(JobState::Cancelled)]
    );
    run_one(&*s, b.id, "w").await;
    let cb = s.cancel(b.id, now()).await.unwrap();
    assert_eq!(cb.state, JobState::Running);
    assert!(cb.cancel_requested);
    assert_eq!(s.cancel_requested(&[a.id, b.id]).await.unwrap(), vec![b.id]);
    assert_eq!(
        s.mark_lost(b.id, "w", now()).await.unwrap(),
        Lost::Cancelled
    );
    assert_eq!(
        s.get(b.id).await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    assert!(matches!(
        s.cancel(b.id, now()).await,
        Err(crate::Error::Conflict { .. })
    ));
    assert!(matches!(
        s.cancel(crate::job::new_job_id(), now()).await,
        Err(crate::Error::NotFound(_))
    ));
}

pub async fn operator_retry_rules(s: Arc<dyn Store>) {
    let q = unique_queue("opretry");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    assert!(matches!(
        s.retry(nj.id, now()).await,
        Err(crate::Error::Conflict { .. })
    ));
    let j = run_one(&*s, nj.id, "w").await;
    let c = Completion {
        id: nj.id,
        epoch: j.epoch,
        outcome: Outcome::Failed { error: "x".into() },
    };
    s.complete(&[c], now()).await.unwrap();
    let r = s.retry(nj.id, now()).await.unwrap();
    assert_eq!((r.state, r.attempts, r.crashes), (JobState::Queued, 0, 0));
    assert!(r.finished_at.is_none());
    assert!(s
        .undispatched(now() + 1, 10_000)
        .await
        .unwrap()
        .iter()
        .any(|d| d.id == nj.id));
    let j = run_one(&*s, nj.id, "w").await;
    assert_eq!(j.epoch, 2, "epochs keep growing across operator retries");
    assert!(matches!(
        s.retry(crate::job::new_job_id(), now()).await,
        Err(crate::Error::NotFound(_))
    ));
}

pub async fn list_filters_and_pages(s: Arc<dyn Store>) {
    let q1 = unique_queue("list");
    let q2 = unique_queue("list");
    let mut ids = Vec::new();
    for i in 0..25 {
        let nj = new_job(if i % 5 == 0 { &q2 } else { &q1 }, "t.list");
        ids.push((nj.id, i % 5 == 0));
        insert_one(&*s, nj).await;
    }
    let filter = JobFilter {
        queue: Some(q1.clone()),
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = s.list(&filter, cursor.as_deref(), 7).await.unwrap();
        assert!(page.jobs.len() <= 7);
        seen.extend(page.jobs.iter().map(|j| j.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 20);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.reverse();
    assert_eq!(seen, sorted, "newest first, no duplicates");
    sorted.dedup();
    assert_eq!(sorted.len(), 20);
    let (first_q1, _) = ids.iter().find(|(_, in_q2)| !in_q2).unwrap();
    run_one(&*s, *first_q1, "w").await;
    let running = s
        .list(
            &JobFilter {
                queue: Some(q1),
                state: Some(JobState::Running),
                ..Default::default()
            },
            None,
            100,
        )
        .await
        .unwrap();
    assert_eq!(
        running.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![*first_q1]
    );
    assert!(matches!(
        s.list(&filter, Some("not-a-cursor"), 5).await,
        Err(crate::Error::Invalid(_))
    ));
}

pub async fn concurrent_starts_have_one_winner(s: Arc<dyn Store>) {
    let q = unique_queue("race");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let mut handles = Vec::new();
    for w in 0..8 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            s.start(&[nj.id], &format!("w{w}"), now())
                .await
                .unwrap()
                .remove(0)
        }));
    }
    let mut runs = 0;
    for h in handles {
        if let StartOutcome::Run(_) = h.await.unwrap() {
            runs += 1;
        }
    }
    assert_eq!(runs, 1, "a job must never start twice at once");
    assert_eq!(s.get(nj.id).await.unwrap().unwrap().epoch, 1);
}

pub async fn concurrent_claims_are_exclusive(s: Arc<dyn Store>) {
    let q = unique_queue("claims");
    let t = now();
    let mut jobs = Vec::new();
    for _ in 0..60 {
        let mut nj = new_job(&q, "t");
        nj.run_at = Some(t + 1_000);
        jobs.push(nj);
    }
    let want: std::collections::HashSet<_> = jobs.iter().map(|j| j.id).collect();
    s.insert(jobs).await.unwrap();
    let mut handles = Vec::new();
    for _ in 0..6 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..20 {
                got.extend(s.claim_due(t + 2_000, 7).await.unwrap());
            }
            got
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.await
                .unwrap()
                .into_iter()
                .map(|d| d.id)
                .filter(|id| want.contains(id)),
        );
    }
    let unique: std::collections::HashSet<_> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "a due job was claimed twice");
    assert_eq!(unique, want, "every due job is claimed");
}

pub async fn progress_is_fenced(s: Arc<dyn Store>) {
    let q = unique_queue("progress");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let j = run_one(&*s, nj.id, "w").await;
    let p = serde_json::json!({"fraction": 0.5, "message": "half"});
    assert!(s.set_progress(nj.id, j.epoch, p.clone()).await.unwrap());
    assert!(!s
        .set_progress(nj.id, j.epoch + 1, serde_json::json!({}))
        .await
        .unwrap());
    assert_eq!(s.get(nj.id).await.unwrap().unwrap().progress, Some(p));
}

pub async fn workers_registry(s: Arc<dyn Store>) {
    let id = unique_queue("worker");
    // Whole milliseconds: timestamps travel as RFC 3339 with millisecond precision.
    let t = now() / 1000 * 1000;
    let info = WorkerInfo {
        id: id.clone(),
        hostname: "h".into(),
        pid: 42,
        queues: vec!["default".into()],
        concurrency: 4,
        tasks: vec![format!("{id}.task")],
        started_at: t,
        remote: None,
        version: None,
        heartbeat_ttl_ms: None,
    };
    s.register_worker(&info, t).await.unwrap();
    let q = unique_queue("wq");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    run_one(&*s, nj.id, &id).await;
    s.worker_seen(&id, t + 5).await.unwrap();
    let ws = s.workers(t - 1).await.unwrap();
    let w = ws
        .iter()
        .find(|w| w.info.id == id)
        .expect("registered worker listed");
    assert_eq!(w.status, WorkerStatus::Live);
    assert_eq!(w.last_seen, t + 5);
    assert_eq!(w.running, vec![nj.id]);
    assert_eq!(w.info, info);
    assert!(s
        .known_tasks()
        .await
        .unwrap()
        .contains(&format!("{id}.task")));
    assert!(s
        .worker_gone(&id, WorkerStatus::Lost, None, t + 6)
        .await
        .unwrap());
    let ws = s.workers(t - 1).await.unwrap();
    assert_eq!(
        ws.iter().find(|w| w.info.id == id).unwrap().status,
        WorkerStatus::Lost
    );
}

pub async fn queue_stats_count(s: Arc<dyn Store>) {
    let q = unique_queue("stats");
    let a = new_job(&q, "t");
    let mut b = new_job(&q, "t");
    b.run_at = Some(b.created_at + micros(Duration::from_secs(600)));
    let c = new_job(&q, "t");
    s.insert(vec![a.clone(), b, c.clone()]).await.unwrap();
    let j = run_one(&*s, a.id, "w").await;
    s.complete(
        &[Completion {
            id: a.id,
            epoch: j.epoch,
            outcome: Outcome::Succeeded(serde_json::json!(1)),
        }],
        now(),
    )
    .await
    .unwrap();
    let stats = s.queue_stats().await.unwrap();
    let st = stats.iter().find(|x| x.queue == q).expect("queue listed");
    assert_eq!(
        (st.succeeded, st.scheduled, st.queued, st.running),
        (1, 1, 1, 0)
    );
}

pub async fn start_defers_and_reports_missing(s: Arc<dyn Store>) {
    let q = unique_queue("defer");
    let mut nj = new_job(&q, "t");
    let due = nj.created_at + micros(Duration::from_secs(100));
    nj.run_at = Some(due);
    insert_one(&*s, nj.clone()).await;
    assert_eq!(
        s.start(&[nj.id], "w", now()).await.unwrap(),
        vec![StartOutcome::Defer(due)]
    );
    // Due but not yet claimed by a scheduler: a delivery may run it.
    assert!(matches!(
        s.start(&[nj.id], "w", due).await.unwrap()[0],
        StartOutcome::Run(_)
    ));
    assert_eq!(
        s.start(&[crate::job::new_job_id()], "w", now())
            .await
            .unwrap(),
        vec![StartOutcome::Missing]
    );
}

/// Stores take shortcuts for the common case of a batch (start what is startable, record
/// successes); whatever a batch mixes in, each item is decided as if it came alone, in order.
pub async fn batches_decide_as_one_by_one(s: Arc<dyn Store>) {
    let q = unique_queue("batch");
    let (a, b, c) = (new_job(&q, "t"), new_job(&q, "t"), new_job(&q, "t"));
    let mut later = new_job(&q, "t");
    let due = later.created_at + micros(Duration::from_secs(100));
    later.run_at = Some(due);
    s.insert(vec![a.clone(), b.clone(), c.clone(), later.clone()])
        .await
        .unwrap();
    let missing = crate::job::new_job_id();
    let started = s
        .start(&[a.id, a.id, b.id, later.id, missing], "w", now())
        .await
        .unwrap();
    assert!(matches!(&started[0], StartOutcome::Run(j) if j.id == a.id && j.epoch == 1));
    assert_eq!(started[1], StartOutcome::Skip(JobState::Running));
    assert!(matches!(&started[2], StartOutcome::Run(j) if j.id == b.id));
    assert_eq!(started[3], StartOutcome::Defer(due));
    assert_eq!(started[4], StartOutcome::Missing);
    let c_run = run_one(&*s, c.id, "w").await;

    let ok = |id, epoch, v: &str| Completion {
        id,
        epoch,
        outcome: Outcome::Succeeded(serde_json::json!(v)),
    };
    let r = s
        .complete(
            &[
                ok(a.id, 1, "first"),
                ok(a.id, 1, "second"),
                Completion {
                    id: b.id,
                    epoch: 1,
                    outcome: Outcome::Failed { error: "no".into() },
                },
                ok(c.id, c_run.epoch + 1, "zombie"),
                ok(missing, 1, "nobody"),
            ],
            now(),
        )
        .await
        .unwrap();
    assert!(matches!(
        r[0],
        Committed::Applied {
            state: JobState::Succeeded,
            ..
        }
    ));
    assert_eq!(r[1], Committed::Stale, "a second commit of one run: {r:?}");
    assert!(matches!(
        r[2],
        Committed::Applied {
            state: JobState::Failed,
            ..
        }
    ));
    assert_eq!(r[3], Committed::Stale, "a wrong epoch: {r:?}");
    assert_eq!(r[4], Committed::Stale, "an unknown job: {r:?}");
    let a = s.get(a.id).await.unwrap().unwrap();
    assert_eq!(
        (a.state, a.result),
        (JobState::Succeeded, Some(serde_json::json!("first")))
    );
    assert_eq!(s.get(b.id).await.unwrap().unwrap().state, JobState::Failed);
    let c = s.get(c.id).await.unwrap().unwrap();
    assert_eq!((c.state, c.result), (JobState::Running, None));
}

/// Retention deletes finished history before the cut and nothing else: not unfinished jobs, not
/// events still waiting for their fan-out, not live workers.
pub async fn purge_deletes_only_old_history(s: Arc<dyn Store>) {
    let q = unique_queue("purge");
    let jobs: Vec<_> = (0..5).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    let [done, failed, queued, running, late] = [0, 1, 2, 3, 4].map(|i| jobs[i].id);
    let finish = |id, outcome| {
        let s = s.clone();
        async move {
            let epoch = run_one(&*s, id, "w").await.epoch;
            let c = Completion { id, epoch, outcome };
            s.complete(&[c], now()).await.unwrap();
        }
    };
    finish(done, Outcome::Succeeded(serde_json::json!(1))).await;
    finish(failed, Outcome::Failed { error: "x".into() }).await;
    run_one(&*s, running, "w").await;
    let info = |id: &str| WorkerInfo {
        id: id.into(),
        hostname: "h".into(),
        pid: 1,
        queues: vec![q.clone()],
        concurrency: 1,
        tasks: vec![],
        started_at: now(),
        remote: None,
        version: None,
        heartbeat_ttl_ms: None,
    };
    s.register_worker(&info("gone"), now()).await.unwrap();
    s.register_worker(&info("alive"), now()).await.unwrap();
    assert!(s
        .worker_gone("gone", WorkerStatus::Stopped, None, now())
        .await
        .unwrap());
    let cut = now() + 1;
    std::thread::sleep(Duration::from_millis(2));
    finish(late, Outcome::Succeeded(serde_json::json!(2))).await;

    let p = s.purge(cut, 1).await.unwrap();
    assert_eq!(
        (p.jobs, p.workers),
        (1, 1),
        "one job per call with limit 1: {p:?}"
    );
    let p = s.purge(cut, 100).await.unwrap();
    assert_eq!(
        (p.jobs, p.events),
        (1, 0),
        "the failure's event is not fanned out yet"
    );
    for id in [done, failed] {
        assert!(
            s.get(id).await.unwrap().is_none(),
            "finished before the cut"
        );
    }
    for (id, state) in [
        (queued, JobState::Queued),
        (running, JobState::Running),
        (late, JobState::Succeeded),
    ] {
        assert_eq!(s.get(id).await.unwrap().map(|j| j.state), Some(state));
    }
    let live: Vec<String> = s
        .workers(0)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.info.id)
        .collect();
    assert_eq!(live, vec!["alive".to_string()]);
    let pending = s.events(0, 1000).await.unwrap();
    assert!(pending.iter().any(|e| e.job_id == Some(failed)));
    s.fan_out(&[], 1000, now()).await.unwrap();
    let p = s.purge(now() + 1, 100).await.unwrap();
    assert!(p.events >= 1, "a fanned-out event is history: {p:?}");
    assert!(s.events(0, 1000).await.unwrap().is_empty());
    assert_eq!(s.purge(cut, 100).await.unwrap(), Purged::default());
}

/// The pruner's paced pass, over more batches than one (whatever sizes its pacer picks),
/// deletes every job finished before the cut and no job that is queued or running.
pub async fn pruner_passes_delete_old_finished_jobs_and_nothing_unfinished(s: Arc<dyn Store>) {
    let q = unique_queue("prunepass");
    let jobs: Vec<_> = (0..1300).map(|_| new_job(&q, "t")).collect();
    for chunk in jobs.chunks(500) {
        s.insert(chunk.to_vec()).await.unwrap();
    }
    let ids: Vec<_> = jobs.iter().map(|j| j.id).collect();
    let (finished, rest) = ids.split_at(1200);
    for chunk in finished.chunks(200) {
        super::run_to_success(&*s, chunk, "w").await;
    }
    s.start(&rest[..50], "w", now()).await.unwrap();
    let cut = now() + 1;
    let stop = tokio_util::sync::CancellationToken::new();
    let p = crate::maintenance::pruner::purge_before(&*s, cut, &stop)
        .await
        .unwrap();
    assert!(p.jobs >= 1200, "{p:?}");
    let count = |state: Option<JobState>| {
        let s = s.clone();
        let filter = JobFilter {
            state,
            queue: Some(q.clone()),
            task: None,
        };
        async move { s.count(&filter).await.unwrap() }
    };
    assert_eq!(count(None).await, 100, "only the unfinished jobs are left");
    assert_eq!(count(Some(JobState::Running)).await, 50);
    assert_eq!(count(Some(JobState::Queued)).await, 50);
}

pub async fn mark_dead_is_final(s: Arc<dyn Store>) {
    let q = unique_queue("dead");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    assert!(s.mark_dead(nj.id, "undecodable", now()).await.unwrap());
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Dead);
    assert_eq!(j.error.as_deref(), Some("undecodable"));
    assert!(!s.mark_dead(nj.id, "again", now()).await.unwrap());
}

/// Every event of `job` recorded so far (cases may share a store, so always filter).
async fn job_events(s: &dyn Store, job: crate::job::JobId) -> Vec<crate::events::Event> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = s.events(after, 500).await.expect("events");
        let Some(last) = page.last() else {
            return out;
        };
        after = last.id;
        out.extend(page.into_iter().filter(|e| e.job_id == Some(job)));
    }
}

pub async fn failed_transition_writes_one_event(s: Arc<dyn Store>) {
    let q = unique_queue("evf");
    let nj = new_job(&q, "t.ev");
    insert_one(&*s, nj.clone()).await;
    let job = run_one(&*s, nj.id, "w-ev").await;
    // A retry and a success without a callback are not events.
    let ok = new_job(&q, "t.ev");
    insert_one(&*s, ok.clone()).await;
    let okj = run_one(&*s, ok.id, "w-ev").await;
    let done = [
        Completion {
            id: job.id,
            epoch: job.epoch,
            outcome: Outcome::Failed {
                error: "boom".into(),
            },
        },
        Completion {
            id: okj.id,
            epoch: okj.epoch,
            outcome: Outcome::Succeeded(serde_json::json!(1)),
        },
    ];
    let r = s.complete(&done, now()).await.unwrap();
    assert!(matches!(
        r[0],
        Committed::Applied {
            state: JobState::Failed,
            ..
        }
    ));
    let evs = job_events(&*s, job.id).await;
    assert_eq!(
        evs.len(),
        1,
        "exactly one event for one failed transition: {evs:?}"
    );
    assert_eq!(evs[0].kind, crate::events::JOB_FAILED);
    assert!(evs[0].dispatched_at.is_none(), "a new event is pending");
    let j = evs[0].to_json();
    assert_eq!(j["event"], "job.failed");
    assert_eq!(j["job"]["id"], serde_json::json!(job.id));
    assert_eq!(j["job"]["state"], "failed");
    assert_eq!(j["job"]["error"], "boom");
    assert!(job_events(&*s, okj.id).await.is_empty());
}

pub async fn stale_commit_writes_no_event(s: Arc<dyn Store>) {
    let q = unique_queue("evs");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let first = run_one(&*s, nj.id, "w-old").await;
    assert_eq!(
        s.mark_lost(nj.id, "w-old", now()).await.unwrap(),
        Lost::Requeued
    );
    let second = run_one(&*s, nj.id, "w-new").await;
    let stale = Completion {
        id: nj.id,
        epoch: first.epoch,
        outcome: Outcome::Failed {
            error: "zombie".into(),
        },
    };
    assert_eq!(
        s.complete(&[stale], now()).await.unwrap(),
        vec![Committed::Stale]
    );
    assert!(
        job_events(&*s, nj.id).await.is_empty(),
        "a rejected commit writes no event"
    );
    let ok = Completion {
        id: nj.id,
        epoch: second.epoch,
        outcome: Outcome::Succeeded(serde_json::json!(null)),
    };
    s.complete(&[ok], now()).await.unwrap();
    assert!(job_events(&*s, nj.id).await.is_empty());
}

pub async fn dead_transitions_write_events(s: Arc<dyn Store>) {
    let q = unique_queue("evd");
    // Crash budget spent in mark_lost.
    let mut a = new_job(&q, "t");
    a.options.max_crashes = Some(1);
    insert_one(&*s, a.clone()).await;
    run_one(&*s, a.id, "w-a").await;
    assert_eq!(s.mark_lost(a.id, "w-a", now()).await.unwrap(), Lost::Dead);
    // An undecodable delivery.
    let b = new_job(&q, "t");
    insert_one(&*s, b.clone()).await;
    assert!(s.mark_dead(b.id, "garbage", now()).await.unwrap());
    assert!(!s.mark_dead(b.id, "again", now()).await.unwrap());
    for id in [a.id, b.id] {
        let evs = job_events(&*s, id).await;
        assert_eq!(evs.len(), 1, "one job.dead event for {id}: {evs:?}");
        assert_eq!(evs[0].kind, crate::events::JOB_DEAD);
    }
}

pub async fn callback_jobs_get_terminal_events(s: Arc<dyn Store>) {
    let q = unique_queue("evc");
    let mut nj = new_job(&q, "t");
    nj.options.callback_url = Some("https://hooks.example/secret-token/x?k=v".into());
    insert_one(&*s, nj.clone()).await;
    let stored = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(
        stored.callback_url, nj.options.callback_url,
        "the store keeps the full URL"
    );
    let shown = serde_json::to_value(&stored).unwrap();
    assert_eq!(
        shown["callback_url"], "https://hooks.example/…",
        "views are redacted"
    );
    let job = run_one(&*s, nj.id, "w-cb").await;
    let c = Completion {
        id: job.id,
        epoch: job.epoch,
        outcome: Outcome::Succeeded(serde_json::json!("ok")),
    };
    s.complete(&[c], now()).await.unwrap();
    let evs = job_events(&*s, nj.id).await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].kind, "job.succeeded");
    assert!(!evs[0].to_json().to_string().contains("secret-token"));
    // A cancelled callback job reports too.
    let mut other = new_job(&q, "t");
    other.options.callback_url = Some("http://127.0.0.1:9/cb".into());
    insert_one(&*s, other.clone()).await;
    s.cancel(other.id, now()).await.unwrap();
    let evs2 = job_events(&*s, other.id).await;
    assert_eq!(evs2.len(), 1);
    assert_eq!(evs2[0].kind, "job.cancelled");
    // Fan-out sends it to the callback target even with no subscriptions.
    s.fan_out(&[], 10_000, now()).await.unwrap();
    let key = format!("{}:{}", evs[0].id, crate::events::CALLBACK_TARGET);
    let d = s
        .get_by_key(&key)
        .await
        .unwrap()
        .expect("callback delivery job");
    assert_eq!(d.task, crate::events::WEBHOOK_TASK);
    assert_eq!(d.queue, crate::events::WEBHOOK_QUEUE);
    assert_eq!(d.args["callback_job"], serde_json::json!(nj.id));
    assert!(d.args.get("subscription").is_none());
    assert!(
        !d.args.to_string().contains("secret-token"),
        "args never carry the URL"
    );
}

pub async fn fan_out_inserts_each_delivery_once(s: Arc<dyn Store>) {
    let worker = unique_queue("evw");
    let mut ids = Vec::new();
    for kind in [
        crate::events::WORKER_READY,
        crate::events::WORKER_SHUTDOWN,
        crate::events::WORKER_LOST,
    ] {
        let ev = crate::events::NewEvent::worker(kind, &worker, serde_json::json!({}));
        ids.push((s.record_event(ev, now()).await.unwrap(), kind));
    }
    let subs = vec![
        crate::events::Subscriber {
            name: "all".into(),
            events: vec!["*".into()],
        },
        crate::events::Subscriber {
            name: "lost-only".into(),
            events: vec![crate::events::WORKER_LOST.into()],
        },
    ];
    // Many dispatchers at once, each fanning out small batches.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (s, subs) = (s.clone(), subs.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..20 {
                let out = s.fan_out(&subs, 2, now()).await.expect("fan_out");
                got.extend(out.dispatch.into_iter().map(|d| d.id));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let mut expected = Vec::new();
    for (id, kind) in &ids {
        let mut targets = vec!["all"];
        if *kind == crate::events::WORKER_LOST {
            targets.push("lost-only");
        }
        for t in targets {
            let job = s
                .get_by_key(&format!("{id}:{t}"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("delivery {id}:{t}"));
            assert_eq!(job.args["subscription"], t);
            assert_eq!(job.args["event"]["id"], *id);
            assert_eq!(job.args["event"]["worker"]["id"], worker.as_str());
            expected.push(job.id);
        }
        assert!(
            s.get_by_key(&format!("{id}:lost-only"))
                .await
                .unwrap()
                .is_some()
                == (*kind == crate::events::WORKER_LOST)
        );
    }
    let mine: Vec<_> = all.iter().filter(|i| expected.contains(i)).collect();
    assert_eq!(
        mine.len(),
        expected.len(),
        "each delivery returned for publishing exactly once"
    );
    let evs = s.events(ids[0].0 - 1, 10_000).await.unwrap();
    for (id, _) in &ids {
        let e = evs.iter().find(|e| e.id == *id).expect("event kept");
        assert!(e.dispatched_at.is_some(), "event {id} marked dispatched");
    }
}

pub async fn worker_gone_reports_one_change(s: Arc<dyn Store>) {
    let id = unique_queue("gone");
    let info = WorkerInfo {
        id: id.clone(),
        hostname: "h".into(),
        pid: 1,
        queues: vec!["q".into()],
        concurrency: 1,
        tasks: vec![],
        started_at: now(),
        remote: None,
        version: None,
        heartbeat_ttl_ms: None,
    };
    s.register_worker(&info, now()).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (s, id) = (s.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let ev = crate::events::NewEvent::worker(
                crate::events::WORKER_LOST,
                &id,
                serde_json::json!({}),
            );
            s.worker_gone(&id, WorkerStatus::Lost, Some(ev), now())
                .await
                .unwrap()
        }));
    }
    let mut changed = 0;
    for t in tasks {
        changed += t.await.unwrap() as u32;
    }
    assert_eq!(changed, 1, "exactly one rescuer changes the row");
    let alerts = s
        .events(0, 100_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.worker.as_deref() == Some(id.as_str()))
        .map(|e| e.kind)
        .collect::<Vec<_>>();
    assert_eq!(
        alerts,
        vec![crate::events::WORKER_LOST.to_string()],
        "the alert is recorded with the change, once"
    );
    assert!(!s
        .worker_gone(&id, WorkerStatus::Stopped, None, now())
        .await
        .unwrap());
    assert!(!s
        .worker_gone("no-such-worker", WorkerStatus::Lost, None, now())
        .await
        .unwrap());
    assert!(matches!(
        s.worker_gone(&id, WorkerStatus::Live, None, now()).await,
        Err(crate::Error::Invalid(_))
    ));
}

pub async fn finished_between_counts(s: Arc<dyn Store>) {
    let q = unique_queue("fin");
    let t0 = now();
    for outcome in [
        Outcome::Succeeded(serde_json::json!(1)),
        Outcome::Succeeded(serde_json::json!(2)),
        Outcome::Failed { error: "x".into() },
    ] {
        let nj = new_job(&q, "t");
        insert_one(&*s, nj.clone()).await;
        let j = run_one(&*s, nj.id, "w-fin").await;
        s.complete(
            &[Completion {
                id: j.id,
                epoch: j.epoch,
                outcome,
            }],
            t0,
        )
        .await
        .unwrap();
    }
    let c = s.finished_between(t0, t0 + 1).await.unwrap();
    let mine = c.iter().find(|c| c.queue == q).expect("queue counted");
    assert_eq!((mine.succeeded, mine.failed, mine.dead), (2, 1, 0));
    let later = s.finished_between(t0 + 1, i64::MAX).await.unwrap();
    assert!(
        !later.iter().any(|c| c.queue == q),
        "older finishes are not counted"
    );
    let earlier = s.finished_between(t0 - 1, t0).await.unwrap();
    assert!(
        !earlier.iter().any(|c| c.queue == q),
        "the window's end is not counted"
    );
}

/// Every applied completion records its epoch (`last_completion`), a refused one does not, and
/// neither does a reclaim: what tells a retried remote completion from a zombie's
/// (docs/remote-workers.md).
pub async fn completions_record_their_epoch(s: Arc<dyn Store>) {
    let q = unique_queue("done-epoch");
    let nj = new_job(&q, "t");
    insert_one(&*s, nj.clone()).await;
    let fresh = s.last_completion(nj.id).await.unwrap().expect("job exists");
    assert_eq!(
        (fresh.state, fresh.epoch, fresh.completed_epoch),
        (JobState::Queued, 0, None)
    );
    assert!(s
        .last_completion(crate::job::new_job_id())
        .await
        .unwrap()
        .is_none());

    // Run 1 is lost with its worker: reclaimed, nothing completed.
    let j1 = run_one(&*s, nj.id, "w1").await;
    assert_eq!(
        s.mark_lost(nj.id, "w1", now()).await.unwrap(),
        Lost::Requeued
    );
    let after_lost = s.last_completion(nj.id).await.unwrap().unwrap();
    assert_eq!(after_lost.epoch, j1.epoch);
    assert_eq!(
        after_lost.completed_epoch, None,
        "a reclaim is not a completion"
    );

    // Run 2 ends in a retry, then run 3 succeeds.
    let j2 = run_one(&*s, nj.id, "w2").await;
    let retry = Completion {
        id: nj.id,
        epoch: j2.epoch,
        outcome: Outcome::Retry {
            error: "e".into(),
            at: 0,
        },
    };
    assert!(matches!(
        s.complete(&[retry], now()).await.unwrap()[0],
        Committed::Applied { .. }
    ));
    assert_eq!(
        s.last_completion(nj.id)
            .await
            .unwrap()
            .unwrap()
            .completed_epoch,
        Some(j2.epoch)
    );
    assert_eq!(
        s.claim_due(now(), 1000)
            .await
            .unwrap()
            .iter()
            .filter(|p| p.id == nj.id)
            .count(),
        1
    );
    let j3 = run_one(&*s, nj.id, "w3").await;
    let ok = |epoch| Completion {
        id: nj.id,
        epoch,
        outcome: Outcome::Succeeded(serde_json::json!(epoch)),
    };
    // The zombie of run 1 is refused and records nothing.
    assert_eq!(
        s.complete(&[ok(j1.epoch)], now()).await.unwrap(),
        vec![Committed::Stale]
    );
    assert_eq!(
        s.last_completion(nj.id)
            .await
            .unwrap()
            .unwrap()
            .completed_epoch,
        Some(j2.epoch)
    );
    assert!(matches!(
        s.complete(&[ok(j3.epoch)], now()).await.unwrap()[0],
        Committed::Applied { .. }
    ));
    let done = s.last_completion(nj.id).await.unwrap().unwrap();
    assert_eq!(
        (done.state, done.epoch, done.completed_epoch),
        (JobState::Succeeded, j3.epoch, Some(j3.epoch))
    );
    // Repeated, the same completion is refused, and the record still names its epoch.
    assert_eq!(
        s.complete(&[ok(j3.epoch)], now()).await.unwrap(),
        vec![Committed::Stale]
    );
    assert_eq!(
        s.last_completion(nj.id)
            .await
            .unwrap()
            .unwrap()
            .completed_epoch,
        Some(j3.epoch)
    );
}

/// `running_under` lists exactly the jobs running under one worker, with their epochs.
pub async fn running_under_lists_one_workers_jobs(s: Arc<dyn Store>) {
    let q = unique_queue("under");
    let w = unique_queue("remote-w");
    let other = unique_queue("other-w");
    let a = new_job(&q, "t");
    let b = new_job(&q, "t");
    let c = new_job(&q, "t");
    let d = new_job(&q, "t");
    for j in [&a, &b, &c, &d] {
        insert_one(&*s, j.clone()).await;
    }
    let ja = run_one(&*s, a.id, &w).await;
    let jb = run_one(&*s, b.id, &w).await;
    run_one(&*s, c.id, &other).await;
    assert!(s.running_under(&w, 10).await.unwrap().len() == 2);
    // A finished job is no longer running under it.
    let done = Completion {
        id: b.id,
        epoch: jb.epoch,
        outcome: Outcome::Succeeded(serde_json::json!(null)),
    };
    s.complete(&[done], now()).await.unwrap();
    let mine = s.running_under(&w, 10).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].id, mine[0].epoch), (a.id, ja.epoch));
    assert_eq!(Some(mine[0].started_at), ja.started_at);
    assert!(s
        .running_under(&unique_queue("nobody"), 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(s.running_under(&other, 10).await.unwrap().len(), 1);
}

/// A remote session's worker row keeps what the gateway needs (its declared task defaults).
pub async fn remote_worker_info_round_trips(s: Arc<dyn Store>) {
    let id = unique_queue("remote-info");
    let t = now() / 1000 * 1000;
    let info = WorkerInfo {
        id: id.clone(),
        hostname: "gpu-3".into(),
        pid: 7,
        queues: vec!["ocr".into()],
        concurrency: 1,
        tasks: vec!["ocr.extract".into()],
        started_at: t,
        remote: Some(crate::remote::RemoteWorker {
            heartbeat_interval_ms: 2000,
            version: "homing-python 0.1.0".into(),
            tasks: vec![crate::remote::TaskDeclaration {
                name: "ocr.extract".into(),
                max_retries: Some(2),
                retry_delay_ms: Some(30_000),
                time_limit_ms: None,
            }],
        }),
        version: Some("homing-python 0.1.0".into()),
        heartbeat_ttl_ms: Some(6000),
    };
    assert!(s.worker_info(&id).await.unwrap().is_none());
    s.register_worker(&info, t).await.unwrap();
    assert_eq!(s.worker_info(&id).await.unwrap(), Some(info));
}
