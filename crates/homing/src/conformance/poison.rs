//! Rows that cannot be decoded or committed stay confined to their own job (docs/design.md section
//! 12, bad input): the store's second line of defence, for data already stored (by an older
//! version, or by hand) that the checks at the door would refuse today. Each case writes a
//! poisoned row with raw SQL through [`Tamper`] next to good jobs and checks that the good ones
//! start, commit, list and alert normally while the bad one is made `dead` with its reason.

use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::events::{NewEvent, Subscriber, WORKER_LOST, WORKER_READY, WORKER_SHUTDOWN};
use crate::job::{FollowUp, JobId, JobState};
use crate::store::*;
use crate::time::now;

/// Raw access to a store's rows, bypassing the store: how a test plants what no current code
/// path would write. Each backend's test file implements it with its own SQL.
#[crate::async_trait]
pub trait Tamper: Send + Sync {
    /// Overwrites a text column (`args`, `result`, `on_success`, …) of job `id` with `text`.
    async fn set_job_text(&self, id: JobId, column: &str, text: &str);
    /// Overwrites the data of event `id` with `text`.
    async fn set_event_data(&self, id: i64, text: &str);
    /// A queue name that the database refuses to store a job under (PostgreSQL: one with a NUL
    /// character; SQLite, which stores anything: one a trigger refuses).
    async fn unstorable_queue(&self) -> String;
    /// Makes the database refuse to insert a job with idempotency key `key` (a trigger).
    async fn refuse_job_key(&self, key: &str);
    /// Overwrites an integer column (`crashes`, `attempts`, …) of job `id` with `value`.
    async fn set_job_int(&self, id: JobId, column: &str, value: i64);
    /// Makes the database refuse every update of job `id` (a trigger): a job on which every
    /// write fails, even making it `dead`.
    async fn refuse_job_updates(&self, id: JobId);
    /// Overwrites the stored status of worker `id` with `text`.
    async fn set_worker_status(&self, id: &str, text: &str);
}

/// A store and raw access to its rows.
pub type Poisonable = (Arc<dyn Store>, Arc<dyn Tamper>);

/// Generates one `#[tokio::test]` per poisoned-row case; `$make` is an expression whose value
/// is a future of [`Poisonable`], evaluated afresh for each case.
#[macro_export]
macro_rules! store_poison_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(poison, $make;
            unreadable_jobs_die_at_start_and_neighbours_run, unreadable_rows_still_read,
            unreadable_event_does_not_block_the_others, undeliverable_event_does_not_block_the_others,
            uncommittable_outcome_is_isolated,
            uncommittable_dead_transition_at_start_is_isolated,
            unwritable_job_fails_neither_its_start_batch_nor_its_neighbours,
            unwritable_completion_fails_neither_its_batch_nor_its_neighbours,
            out_of_range_counters_read_and_die_at_start,
            counters_past_the_timelines_integer_still_start_claim_and_report,
            poisoned_running_row_is_reclaimed_by_mark_lost,
            unreclaimable_lost_job_is_made_dead,
            dead_at_start_is_not_marked_as_started,
            unknown_worker_status_does_not_fail_the_workers_view
        );
    };
}

/// JSON nested deeper than the decoder reads (it stops at 128 levels).
fn too_deep() -> String {
    format!("{}{}", "[".repeat(200), "]".repeat(200))
}

fn queue_filter(q: &str) -> JobFilter {
    JobFilter {
        queue: Some(q.to_string()),
        ..Default::default()
    }
}

pub async fn unreadable_jobs_die_at_start_and_neighbours_run((s, t): Poisonable) {
    let q = unique_queue("poison-start");
    let jobs: Vec<_> = (0..4).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    let (good1, deep, good2, garbage) = (jobs[0].id, jobs[1].id, jobs[2].id, jobs[3].id);
    t.set_job_text(deep, "args", &too_deep()).await;
    t.set_job_text(garbage, "args", "{not json").await;

    let out = s
        .start(&[good1, deep, good2, garbage], "w", now())
        .await
        .expect("a batch with poisoned jobs still starts");
    assert!(
        matches!(&out[0], StartOutcome::Run(j) if j.id == good1),
        "{out:?}"
    );
    assert_eq!(out[1], StartOutcome::Dead);
    assert!(
        matches!(&out[2], StartOutcome::Run(j) if j.id == good2),
        "{out:?}"
    );
    assert_eq!(out[3], StartOutcome::Dead);

    for id in [deep, garbage] {
        let j = s.get(id).await.unwrap().expect("a dead job can be read");
        assert_eq!(j.state, JobState::Dead);
        let error = j.error.clone().unwrap_or_default();
        assert!(
            error.starts_with("stored args cannot be read: "),
            "the reason names the column: {error}"
        );
        assert_eq!(j.args, serde_json::Value::Null);
        assert_eq!(j.unreadable.len(), 1, "{:?}", j.unreadable);
        let events = s.events(0, 10_000).await.unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.job_id == Some(id) && e.kind == crate::events::JOB_DEAD),
            "the dead job alerts like any other"
        );
    }
    // A later start of the same poisoned job is a duplicate, not an error.
    assert_eq!(
        s.start(&[deep], "w2", now()).await.unwrap()[0],
        StartOutcome::Skip(JobState::Dead)
    );
}

pub async fn unreadable_rows_still_read((s, t): Poisonable) {
    let q = unique_queue("poison-read");
    let jobs: Vec<_> = (0..3).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    let bad = jobs[1].id;
    t.set_job_text(bad, "args", &too_deep()).await;
    t.set_job_text(bad, "result", "\"unterminated").await;
    t.set_job_text(bad, "on_failure", "[1, 2").await;

    let j = s.get(bad).await.expect("get of a poisoned job").unwrap();
    assert_eq!(j.args, serde_json::Value::Null);
    assert_eq!(j.result, None);
    assert_eq!(j.on_failure, None);
    let columns: Vec<&str> = j
        .unreadable
        .iter()
        .map(|n| n.split(' ').next().unwrap_or(""))
        .collect();
    assert_eq!(
        columns,
        ["args", "result", "on_failure"],
        "{:?}",
        j.unreadable
    );
    // The JSON a client sees says what is missing, and serialises fine.
    let shown = serde_json::to_value(&j).unwrap();
    assert_eq!(shown["unreadable"].as_array().map(Vec::len), Some(3));

    let page = s
        .list(&queue_filter(&q), None, 10)
        .await
        .expect("a page with a poisoned job");
    assert_eq!(page.jobs.len(), 3);
    let listed = page.jobs.iter().find(|j| j.id == bad).unwrap();
    assert_eq!(listed.unreadable.len(), 3);
    for good in [jobs[0].id, jobs[2].id] {
        let g = page.jobs.iter().find(|j| j.id == good).unwrap();
        assert!(g.unreadable.is_empty());
        assert_eq!(g.args, serde_json::json!({"n": 1}));
    }
}

pub async fn unreadable_event_does_not_block_the_others((s, t): Poisonable) {
    let worker = unique_queue("poison-ev");
    let mut ids = Vec::new();
    for kind in [WORKER_READY, WORKER_LOST, WORKER_SHUTDOWN] {
        let ev = NewEvent::worker(kind, &worker, serde_json::json!({}));
        ids.push(s.record_event(ev, now()).await.unwrap());
    }
    t.set_event_data(ids[1], &too_deep()).await;
    let subs = vec![Subscriber {
        name: "all".into(),
        events: vec!["*".into()],
    }];
    // Fan out until nothing is pending (other cases' events may share the store).
    // Other tests share the store and fan out at the same time (their batches may hold our
    // events' row locks for a moment), so run until our own events are no longer pending
    // rather than until one call finds nothing to do.
    for _ in 0..500 {
        s.fan_out(&subs, 10, now()).await.expect("fan_out");
        let events = s.events(ids[0] - 1, 10_000).await.unwrap();
        let pending = ids.iter().any(|id| {
            events
                .iter()
                .any(|e| e.id == *id && e.dispatched_at.is_none())
        });
        if !pending {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for (i, id) in ids.iter().enumerate() {
        let delivery = s.get_by_key(&format!("{id}:all")).await.unwrap();
        assert_eq!(
            delivery.is_some(),
            i != 1,
            "event {i}: only readable events are delivered"
        );
    }
    let events = s
        .events(ids[0] - 1, 10_000)
        .await
        .expect("events() reads a poisoned event");
    for id in &ids {
        let e = events.iter().find(|e| e.id == *id).unwrap();
        assert!(e.dispatched_at.is_some(), "event {id} is no longer pending");
    }
    let bad = events.iter().find(|e| e.id == ids[1]).unwrap();
    assert!(bad.data["unreadable"].is_string(), "{:?}", bad.data);
}

pub async fn undeliverable_event_does_not_block_the_others((s, t): Poisonable) {
    let worker = unique_queue("poison-del");
    let mut ids = Vec::new();
    for kind in [WORKER_READY, WORKER_LOST, WORKER_SHUTDOWN] {
        let ev = NewEvent::worker(kind, &worker, serde_json::json!({}));
        ids.push(s.record_event(ev, now()).await.unwrap());
    }
    let subs = vec![Subscriber {
        name: "all".into(),
        events: vec!["*".into()],
    }];
    // The middle event's delivery cannot be stored: the batch fails, and must be split.
    t.refuse_job_key(&format!("{}:all", ids[1])).await;
    // Other tests share the store and fan out at the same time (their batches may hold our
    // events' row locks for a moment), so run until our own events are no longer pending
    // rather than until one call finds nothing to do.
    for _ in 0..500 {
        s.fan_out(&subs, 10, now()).await.expect("fan_out");
        let events = s.events(ids[0] - 1, 10_000).await.unwrap();
        let pending = ids.iter().any(|id| {
            events
                .iter()
                .any(|e| e.id == *id && e.dispatched_at.is_none())
        });
        if !pending {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for (i, id) in ids.iter().enumerate() {
        let delivery = s.get_by_key(&format!("{id}:all")).await.unwrap();
        assert_eq!(
            delivery.is_some(),
            i != 1,
            "event {i}: the others are delivered"
        );
    }
    let events = s.events(ids[0] - 1, 10_000).await.unwrap();
    for id in &ids {
        let e = events.iter().find(|e| e.id == *id).unwrap();
        assert!(e.dispatched_at.is_some(), "event {id} is no longer pending");
    }
}

pub async fn uncommittable_outcome_is_isolated((s, t): Poisonable) {
    let q = unique_queue("poison-commit");
    let bad_queue = t.unstorable_queue().await;
    let good1 = new_job(&q, "t");
    let mut bad = new_job(&q, "t");
    bad.options.on_success = Some(FollowUp {
        task: "t.next".into(),
        queue: Some(bad_queue),
        args: serde_json::json!({}),
    });
    let mut good2 = new_job(&q, "t");
    good2.options.on_success = Some(FollowUp {
        task: "t.next".into(),
        queue: Some(q.clone()),
        args: serde_json::json!({}),
    });
    s.insert(vec![good1.clone(), bad.clone(), good2.clone()])
        .await
        .unwrap();
    let started = s
        .start(&[good1.id, bad.id, good2.id], "w", now())
        .await
        .unwrap();
    let epoch = |i: usize| match &started[i] {
        StartOutcome::Run(j) => j.epoch,
        other => panic!("expected Run, got {other:?}"),
    };
    let done = [
        Completion {
            id: good1.id,
            epoch: epoch(0),
            outcome: Outcome::Succeeded(serde_json::json!(1)),
        },
        Completion {
            id: bad.id,
            epoch: epoch(1),
            outcome: Outcome::Succeeded(serde_json::json!(2)),
        },
        Completion {
            id: good2.id,
            epoch: epoch(2),
            outcome: Outcome::Succeeded(serde_json::json!(3)),
        },
    ];
    let r = s.complete(&done, now()).await.expect("the batch commits");
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
    assert!(
        matches!(
            &r[1],
            Committed::Applied {
                state: JobState::Dead,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(
        matches!(&r[2], Committed::Applied { state: JobState::Succeeded, dispatch } if dispatch.len() == 1),
        "the good job's follow-up is committed and returned for publishing: {r:?}"
    );
    assert_eq!(
        s.get(good1.id).await.unwrap().unwrap().state,
        JobState::Succeeded
    );
    let g2 = s.get(good2.id).await.unwrap().unwrap();
    assert_eq!(
        (g2.state, g2.result),
        (JobState::Succeeded, Some(serde_json::json!(3)))
    );
    let b = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Dead);
    assert!(
        b.error
            .as_deref()
            .unwrap_or("")
            .starts_with("its outcome cannot be stored: "),
        "{:?}",
        b.error
    );
    // Committing the same run again is stale, not a second failure.
    assert_eq!(
        s.complete(&done[1..2], now()).await.unwrap()[0],
        Committed::Stale
    );
}

pub async fn uncommittable_dead_transition_at_start_is_isolated((s, t): Poisonable) {
    let q = unique_queue("poison-dead");
    let bad_queue = t.unstorable_queue().await;
    let good = new_job(&q, "t");
    // Out of crash budget from the start, with a follow-up the database refuses: the start
    // rule makes it dead, and writing that transition fails.
    let mut bad = new_job(&q, "t");
    bad.options.max_crashes = Some(0);
    bad.options.on_failure = Some(FollowUp {
        task: "t.alert".into(),
        queue: Some(bad_queue),
        args: serde_json::json!({}),
    });
    s.insert(vec![bad.clone(), good.clone()]).await.unwrap();
    let out = s
        .start(&[bad.id, good.id], "w", now())
        .await
        .expect("the batch starts");
    assert_eq!(out[0], StartOutcome::Dead);
    assert!(
        matches!(&out[1], StartOutcome::Run(j) if j.id == good.id),
        "{out:?}"
    );
    let b = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Dead);
    assert!(
        b.error
            .as_deref()
            .unwrap_or("")
            .starts_with("it cannot be started: "),
        "{:?}",
        b.error
    );
}

/// A job on which every write fails (even making it dead) in a batch with a good one: the good
/// one is started and committed one by one before the bad one fails. The call must not fail as
/// a whole then (its caller would hand back the good job's message, and the good job, already
/// `running` under this worker, would never run): the bad job gets its own outcome.
pub async fn unwritable_job_fails_neither_its_start_batch_nor_its_neighbours((s, t): Poisonable) {
    let q = unique_queue("poison-unwritable");
    let (good, bad, good2) = (new_job(&q, "t"), new_job(&q, "t"), new_job(&q, "t"));
    s.insert(vec![good.clone(), bad.clone(), good2.clone()])
        .await
        .unwrap();
    t.refuse_job_updates(bad.id).await;
    let out = s
        .start(&[good.id, bad.id, good2.id], "w", now())
        .await
        .expect("a start call with one unwritable job still answers for the others");
    assert!(
        matches!(&out[0], StartOutcome::Run(j) if j.id == good.id),
        "{out:?}"
    );
    assert!(matches!(&out[1], StartOutcome::Unstartable(_)), "{out:?}");
    assert!(
        matches!(&out[2], StartOutcome::Run(j) if j.id == good2.id),
        "{out:?}"
    );
    let b = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Queued, "nothing was written to it");
}

/// The same for completions: the good run commits, the unwritable one is reported alone.
pub async fn unwritable_completion_fails_neither_its_batch_nor_its_neighbours((s, t): Poisonable) {
    let q = unique_queue("poison-unstored");
    let (good, bad) = (new_job(&q, "t"), new_job(&q, "t"));
    s.insert(vec![good.clone(), bad.clone()]).await.unwrap();
    let started = s.start(&[good.id, bad.id], "w", now()).await.unwrap();
    let epoch = |i: usize| match &started[i] {
        StartOutcome::Run(j) => j.epoch,
        other => panic!("expected Run, got {other:?}"),
    };
    let done = [
        Completion {
            id: good.id,
            epoch: epoch(0),
            outcome: Outcome::Succeeded(serde_json::json!(1)),
        },
        Completion {
            id: bad.id,
            epoch: epoch(1),
            outcome: Outcome::Succeeded(serde_json::json!(2)),
        },
    ];
    t.refuse_job_updates(bad.id).await;
    let r = s
        .complete(&done, now())
        .await
        .expect("a commit with one unwritable completion still answers for the others");
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
    assert!(matches!(&r[1], Committed::Unstored(_)), "{r:?}");
    assert_eq!(
        s.get(good.id).await.unwrap().unwrap().state,
        JobState::Succeeded
    );
    assert_eq!(
        s.get(bad.id).await.unwrap().unwrap().state,
        JobState::Running
    );
}

/// Counters that no `u32` holds (written by hand or by an older version): the row still reads
/// (the column named in `unreadable`), and a start makes the job dead with that reason while
/// its neighbours run, like unreadable JSON.
pub async fn out_of_range_counters_read_and_die_at_start((s, t): Poisonable) {
    let q = unique_queue("poison-count");
    let jobs: Vec<_> = (0..4).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    let (good, neg, huge, budget) = (jobs[0].id, jobs[1].id, jobs[2].id, jobs[3].id);
    t.set_job_int(neg, "crashes", -1).await;
    t.set_job_int(huge, "attempts", 1 << 40).await;
    t.set_job_int(budget, "max_crashes", -5).await;

    let page = s
        .list(&queue_filter(&q), None, 10)
        .await
        .expect("a page with out-of-range counters");
    assert_eq!(page.jobs.len(), 4);
    for (id, column) in [
        (neg, "crashes"),
        (huge, "attempts"),
        (budget, "max_crashes"),
    ] {
        let j = s.get(id).await.expect("get").unwrap();
        assert!(
            j.unreadable
                .iter()
                .any(|n| n.starts_with(&format!("{column} "))),
            "{column}: {:?}",
            j.unreadable
        );
    }
    let out = s
        .start(&[neg, good, huge, budget], "w", now())
        .await
        .expect("the batch starts");
    assert_eq!(out[0], StartOutcome::Dead, "{out:?}");
    assert!(
        matches!(&out[1], StartOutcome::Run(j) if j.id == good),
        "{out:?}"
    );
    assert_eq!(out[2], StartOutcome::Dead, "{out:?}");
    assert_eq!(out[3], StartOutcome::Dead, "{out:?}");
    for (id, column) in [
        (neg, "crashes"),
        (huge, "attempts"),
        (budget, "max_crashes"),
    ] {
        let j = s.get(id).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Dead);
        assert!(
            j.error
                .as_deref()
                .unwrap_or("")
                .starts_with(&format!("stored {column} cannot be read: ")),
            "{:?}",
            j.error
        );
        assert_eq!((j.epoch, j.worker.as_deref()), (0, None), "never started");
    }
}

/// Counters a `u32` holds but a 32-bit signed column does not (above 2^31, reachable with huge
/// `max_retries`/`max_crashes`, or written by hand): the job is claimed when due, starts and
/// reports progress beside its neighbours, its timeline entries written with the counter at
/// least `i32::MAX` (capped where the column is 32-bit), never failing the batch. A due job
/// whose counter is far below zero (only by hand) is claimed with them too.
pub async fn counters_past_the_timelines_integer_still_start_claim_and_report((s, t): Poisonable) {
    const BIG: i64 = 3_000_000_000;
    let q = unique_queue("poison-wide");
    let mut big = new_job(&q, "t");
    big.run_at = Some(big.created_at + 1_000);
    let mut good = new_job(&q, "t");
    good.run_at = big.run_at;
    let mut negative = new_job(&q, "t");
    negative.run_at = big.run_at;
    s.insert(vec![big.clone(), good.clone(), negative.clone()])
        .await
        .unwrap();
    t.set_job_int(big.id, "max_crashes", 4_000_000_000).await;
    t.set_job_int(big.id, "attempts", BIG).await;
    t.set_job_int(big.id, "crashes", BIG).await;
    t.set_job_int(negative.id, "attempts", -(1 << 40)).await;

    let claimed = s
        .claim_due(big.created_at + 1_000_000, 10)
        .await
        .expect("a due batch holding wide counters is claimed");
    let mut ids: Vec<JobId> = claimed.iter().map(|c| c.id).collect();
    ids.sort();
    let mut want = vec![big.id, good.id, negative.id];
    want.sort();
    assert_eq!(ids, want);

    let out = s
        .start(&[big.id, good.id], "w", now())
        .await
        .expect("a start batch holding wide counters starts");
    assert!(
        matches!(&out[0], StartOutcome::Run(j) if j.id == big.id && j.attempts as i64 == BIG),
        "{out:?}"
    );
    assert!(
        matches!(&out[1], StartOutcome::Run(j) if j.id == good.id),
        "{out:?}"
    );
    assert!(s
        .set_progress(big.id, 1, serde_json::json!({"done": 1}))
        .await
        .expect("progress of a job with wide counters"));

    let h = s.history(big.id).await.unwrap();
    let kinds: Vec<_> = h.entries.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["enqueued", "due", "started", "progress"], "{h:?}");
    for e in &h.entries[1..] {
        assert!(
            e.attempts >= i32::MAX as u32 && e.crashes >= i32::MAX as u32,
            "{e:?}"
        );
    }
}

/// A running job whose row has an undecodable column: the rescuer's `mark_lost` must still
/// decide on it (here: dead, since its budget cannot be read), or every sweep would stop there.
pub async fn poisoned_running_row_is_reclaimed_by_mark_lost((s, t): Poisonable) {
    let q = unique_queue("poison-lost");
    let (bad, good) = (new_job(&q, "t"), new_job(&q, "t"));
    s.insert(vec![bad.clone(), good.clone()]).await.unwrap();
    s.start(&[bad.id, good.id], "w", now()).await.unwrap();
    t.set_job_int(bad.id, "attempts", -1).await;
    t.set_job_text(bad.id, "on_failure", "{oops").await;
    assert_eq!(
        s.mark_lost(bad.id, "w", now())
            .await
            .expect("mark_lost of a poisoned row"),
        Lost::Dead
    );
    let b = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Dead);
    let error = b.error.unwrap_or_default();
    assert!(
        error.starts_with("lost its worker w, and its stored attempts cannot be read"),
        "{error}"
    );
    assert_eq!(
        s.mark_lost(good.id, "w", now()).await.unwrap(),
        Lost::Requeued
    );
}

/// A job made dead at start for unreadable data looks the same in every store: never started
/// (epoch, worker and started_at unchanged), with its `job.dead` event naming no worker.
pub async fn dead_at_start_is_not_marked_as_started((s, t): Poisonable) {
    let q = unique_queue("poison-unstarted");
    let bad = new_job(&q, "t");
    s.insert(vec![bad.clone()]).await.unwrap();
    t.set_job_text(bad.id, "args", "{x").await;
    let out = s.start(&[bad.id], "w", now()).await.unwrap();
    assert_eq!(out[0], StartOutcome::Dead);
    let j = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(
        (j.state, j.epoch, j.worker.as_deref(), j.started_at),
        (JobState::Dead, 0, None, None),
        "{j:?}"
    );
    let events = s.events(0, 10_000).await.unwrap();
    let ev = events
        .iter()
        .find(|e| e.job_id == Some(bad.id) && e.kind == crate::events::JOB_DEAD)
        .expect("the dead job alerts");
    assert_eq!(ev.worker, None, "{ev:?}");
}

/// A worker status this version does not know shows the worker as lost instead of failing the
/// whole workers view.
pub async fn unknown_worker_status_does_not_fail_the_workers_view((s, t): Poisonable) {
    let (odd, fine) = (unique_queue("w-odd"), unique_queue("w-fine"));
    for id in [&odd, &fine] {
        let info = WorkerInfo {
            id: id.clone(),
            hostname: "h".into(),
            pid: 1,
            queues: vec!["q".into()],
            concurrency: 1,
            tasks: vec!["t".into()],
            started_at: now(),
            remote: None,
            version: None,
            heartbeat_ttl_ms: None,
        };
        s.register_worker(&info, now()).await.unwrap();
    }
    t.set_worker_status(&odd, "hibernating").await;
    let ws = s.workers(0).await.expect("the workers view");
    let status = |id: &str| ws.iter().find(|w| w.info.id == id).map(|w| w.status);
    assert_eq!(status(&odd), Some(WorkerStatus::Lost));
    assert_eq!(status(&fine), Some(WorkerStatus::Live));
}

/// A lost worker's job whose new state cannot be written (its crash budget is spent and its
/// `on_failure` follow-up is refused by the database): `mark_lost` makes it dead as a last
/// resort instead of failing, so the rescuer does not stop at it on every sweep.
pub async fn unreclaimable_lost_job_is_made_dead((s, t): Poisonable) {
    let q = unique_queue("poison-unreclaimable");
    let bad_queue = t.unstorable_queue().await;
    let mut bad = new_job(&q, "t");
    bad.options.max_crashes = Some(1);
    bad.options.on_failure = Some(FollowUp {
        task: "t.alert".into(),
        queue: Some(bad_queue),
        args: serde_json::json!({}),
    });
    s.insert(vec![bad.clone()]).await.unwrap();
    s.start(&[bad.id], "w", now()).await.unwrap();
    assert_eq!(
        s.mark_lost(bad.id, "w", now()).await.expect("mark_lost"),
        Lost::Dead
    );
    let b = s.get(bad.id).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Dead);
    let error = b.error.unwrap_or_default();
    assert!(
        error.starts_with("lost its worker w, and it cannot be reclaimed: "),
        "{error}"
    );
    // Asked again (a second rescuer), it is no longer running under that worker.
    assert_eq!(
        s.mark_lost(bad.id, "w", now()).await.unwrap(),
        Lost::NotOwned(JobState::Dead)
    );
}
