//! The workflow part of the store contract (docs/workflows.md): steps wait, become runnable
//! exactly once in the transaction of their last parent's end, failure propagates, and a
//! workflow's cancel reaches every unfinished step. Run by every store through
//! [`store_conformance!`](crate::store_conformance).

use std::collections::HashMap;
use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::job::{JobId, JobState};
use crate::store::*;
use crate::time::now;
use crate::workflow::{plan, RunOn, StepSpec, WorkflowSpec, WorkflowState};

/// Creates a workflow of `steps` (name, parents, run_on) on queue `q`; returns its id and each
/// step's job id.
async fn create(
    s: &dyn Store,
    q: &str,
    steps: &[(&str, &str, RunOn)],
) -> (crate::workflow::WorkflowId, HashMap<String, JobId>) {
    let mut spec = WorkflowSpec::new("conformance");
    for (name, after, run_on) in steps {
        let mut st = StepSpec::new(format!("t.{name}"), serde_json::json!({ "step": name }));
        st.after = after
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        st.run_on = *run_on;
        spec = spec.with_step(*name, st);
    }
    let wf = plan(spec, now(), |_, st| {
        let mut j = new_job(q, &st.task);
        j.args = st.args.clone();
        Ok(j)
    })
    .expect("a valid graph");
    let id = wf.id;
    let names: Vec<String> = wf.steps.iter().map(|(_, l)| l.step.clone()).collect();
    let ins = s.create_workflow(wf).await.expect("create_workflow");
    for (n, i) in names.iter().zip(&ins) {
        let parents = steps.iter().find(|(s, ..)| s == n).unwrap().1;
        let want = if parents.is_empty() {
            JobState::Queued
        } else {
            JobState::Waiting
        };
        assert_eq!(i.state, want, "{n}");
        assert_eq!(i.needs_dispatch(), parents.is_empty(), "{n}");
    }
    (
        id,
        names.into_iter().zip(ins.iter().map(|i| i.id)).collect(),
    )
}

/// Starts and completes one step; returns what the commit answered.
async fn finish(s: &dyn Store, id: JobId, outcome: Outcome) -> Committed {
    let StartOutcome::Run(j) = s.start(&[id], "w", now()).await.unwrap().remove(0) else {
        panic!("{id} did not start")
    };
    s.complete(
        &[Completion {
            id,
            epoch: j.epoch,
            outcome,
        }],
        now(),
    )
    .await
    .unwrap()
    .remove(0)
}

fn dispatched(c: &Committed) -> Vec<JobId> {
    match c {
        Committed::Applied { dispatch, .. } => dispatch.iter().map(|d| d.id).collect(),
        other => panic!("{other:?}"),
    }
}

async fn state(s: &dyn Store, id: JobId) -> JobState {
    s.get(id).await.unwrap().unwrap().state
}

pub async fn workflow_step_runs_once_after_its_parents(s: Arc<dyn Store>) {
    use RunOn::Success;
    let q = unique_queue("wf");
    let (wf, ids) = create(
        &*s,
        &q,
        &[
            ("a", "", Success),
            ("b", "", Success),
            ("c", "a,b", Success),
        ],
    )
    .await;
    let c = ids["c"];
    // A waiting step is neither published nor started by a stray message.
    assert!(matches!(
        s.start(&[c], "w", now()).await.unwrap()[0],
        StartOutcome::Skip(JobState::Waiting)
    ));
    let j = s.get(c).await.unwrap().unwrap();
    let link = j.workflow.expect("the job links to its workflow");
    assert_eq!((link.id, link.step.as_str()), (wf, "c"));
    assert_eq!(link.after.len(), 2);
    let r = finish(&*s, ids["a"], Outcome::Succeeded(serde_json::json!("A"))).await;
    assert!(dispatched(&r).is_empty());
    assert_eq!(state(&*s, c).await, JobState::Waiting);
    let r = finish(&*s, ids["b"], Outcome::Succeeded(serde_json::json!("B"))).await;
    assert_eq!(
        dispatched(&r),
        vec![c],
        "the last parent's commit makes it runnable"
    );
    let j = s.get(c).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Queued);
    let parents = j.parents.expect("parents fixed when it became runnable");
    assert_eq!(parents["a"].result, Some(serde_json::json!("A")));
    assert_eq!(parents["b"].result, Some(serde_json::json!("B")));
    assert_eq!(parents["b"].state, JobState::Succeeded);
    let w = s.workflow(wf).await.unwrap().unwrap();
    assert_eq!(w.state, WorkflowState::Running);
    assert_eq!(w.steps["c"].after, vec!["a", "b"]);
    finish(&*s, c, Outcome::Succeeded(serde_json::json!(1))).await;
    let w = s.workflow(wf).await.unwrap().unwrap();
    assert_eq!(w.state, WorkflowState::Succeeded);
    assert!(s
        .workflow(crate::job::new_job_id())
        .await
        .unwrap()
        .is_none());
    let page = s.workflows(None, 1000).await.unwrap();
    assert!(page.workflows.iter().any(|w| w.id == wf));
}

pub async fn workflow_failure_cancels_dependents_but_not_finalisers(s: Arc<dyn Store>) {
    use RunOn::{Any, Success};
    let q = unique_queue("wffail");
    let (wf, ids) = create(
        &*s,
        &q,
        &[
            ("a", "", Success),
            ("b", "a", Success),
            ("c", "b", Success),
            ("fin", "c", Any),
        ],
    )
    .await;
    let r = finish(
        &*s,
        ids["a"],
        Outcome::Failed {
            error: "boom".into(),
        },
    )
    .await;
    assert_eq!(dispatched(&r), vec![ids["fin"]]);
    let b = s.get(ids["b"]).await.unwrap().unwrap();
    assert_eq!(b.state, JobState::Cancelled);
    assert_eq!(
        b.error.as_deref(),
        Some("cancelled: its parent step 'a' is failed")
    );
    assert_eq!(state(&*s, ids["c"]).await, JobState::Cancelled);
    let fin = s.get(ids["fin"]).await.unwrap().unwrap();
    assert_eq!(fin.state, JobState::Queued);
    let parents = fin.parents.unwrap();
    assert_eq!(parents["c"].state, JobState::Cancelled);
    // Cancelled in the same transaction, after the steps were read: the reason is given too.
    assert_eq!(
        parents["c"].error.as_deref(),
        Some("cancelled: its parent step 'b' is cancelled")
    );
    finish(&*s, ids["fin"], Outcome::Succeeded(serde_json::json!(0))).await;
    assert_eq!(
        s.workflow(wf).await.unwrap().unwrap().state,
        WorkflowState::Failed
    );
    // A dead parent (a lost worker's last crash) propagates the same way.
    let (_, ids) = create(&*s, &q, &[("a", "", Success), ("b", "a", Success)]).await;
    let mut crashes = 0;
    loop {
        s.start(&[ids["a"]], "w", now()).await.unwrap();
        crashes += 1;
        if s.mark_lost(ids["a"], "w", now()).await.unwrap() == Lost::Dead {
            break;
        }
        assert!(crashes < 10);
    }
    assert_eq!(state(&*s, ids["b"]).await, JobState::Cancelled);
}

/// A step is given at most [`crate::workflow::MAX_PARENTS_BYTES`] of its parents' results: a
/// fan-in whose parents' results come to more is cancelled saying so, and that reaches its own
/// dependents as a failure would; a fan-out of one large result gives it to every child.
pub async fn workflow_parents_results_given_to_a_step_are_bounded(s: Arc<dyn Store>) {
    use RunOn::{Any, Success};
    let q = unique_queue("wfbig");
    let (_, ids) = create(
        &*s,
        &q,
        &[
            ("a", "", Success),
            ("b", "", Success),
            ("x", "b", Success),
            ("y", "b", Success),
            ("c", "a,b", Success),
            ("d", "c", Success),
            ("fin", "c", Any),
        ],
    )
    .await;
    let big = |c: char| serde_json::Value::String(c.to_string().repeat(9 * 1024 * 1024));
    // 'é' is two bytes: 4.5 Mi of them count 9 MiB, so sizes are bytes, not characters.
    let wide = serde_json::Value::String("é".repeat(9 * 1024 * 1024 / 2));
    let r = finish(&*s, ids["a"], Outcome::Succeeded(wide)).await;
    assert!(dispatched(&r).is_empty());
    let r = finish(&*s, ids["b"], Outcome::Succeeded(big('b'))).await;
    let mut made = dispatched(&r);
    made.sort();
    let mut want = vec![ids["x"], ids["y"], ids["fin"]];
    want.sort();
    assert_eq!(made, want, "the fan-out and the finaliser, not the fan-in");
    for child in ["x", "y"] {
        let j = s.get(ids[child]).await.unwrap().unwrap();
        assert_eq!(j.parents.unwrap()["b"].result, Some(big('b')), "{child}");
    }
    let c = s.get(ids["c"]).await.unwrap().unwrap();
    assert_eq!(c.state, JobState::Cancelled);
    let given = 2 * (9 * 1024 * 1024 + 2);
    assert_eq!(
        c.error,
        Some(crate::workflow::too_large_reason(given)),
        "the reason names the bytes"
    );
    let d = s.get(ids["d"]).await.unwrap().unwrap();
    assert_eq!(d.state, JobState::Cancelled);
    assert_eq!(
        d.error.as_deref(),
        Some("cancelled: its parent step 'c' is cancelled")
    );
    let fin = s.get(ids["fin"]).await.unwrap().unwrap();
    let parents = fin.parents.unwrap();
    assert_eq!(parents["c"].state, JobState::Cancelled);
    assert_eq!(
        parents["c"].error,
        Some(crate::workflow::too_large_reason(given)),
        "the finaliser sees why"
    );
}

/// A step cancelled before it ran (its parent failed) had no parents written: an operator's
/// retry of it is refused while its parents are not as it requires, and once they are, it runs
/// with them as they are now, results and all (by a single retry and by a bulk step alike).
pub async fn workflow_step_cancelled_before_it_ran_is_retried_with_its_parents(s: Arc<dyn Store>) {
    use RunOn::Success;
    let q = unique_queue("wfrerun");
    for bulk in [false, true] {
        let (_, ids) = create(&*s, &q, &[("a", "", Success), ("b", "a", Success)]).await;
        let (a, b) = (ids["a"], ids["b"]);
        finish(&*s, a, Outcome::Failed { error: "no".into() }).await;
        assert_eq!(state(&*s, b).await, JobState::Cancelled);
        match s.retry(b, now()).await {
            Err(crate::Error::Conflict { message, .. }) => {
                assert!(message.contains("'a' is failed"), "{message}")
            }
            other => panic!("a step whose parent failed was retried: {other:?}"),
        }
        assert!(s.retry_many(&[b], now()).await.unwrap().is_empty());
        assert_eq!(state(&*s, b).await, JobState::Cancelled);
        s.retry(a, now()).await.unwrap();
        finish(&*s, a, Outcome::Succeeded(serde_json::json!("A"))).await;
        if bulk {
            let published = s.retry_many(&[b], now()).await.unwrap();
            assert_eq!(published.iter().map(|p| p.id).collect::<Vec<_>>(), vec![b]);
        } else {
            assert_eq!(s.retry(b, now()).await.unwrap().state, JobState::Queued);
        }
        let j = s.get(b).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Queued);
        let parents = j.parents.expect("given its parents");
        assert_eq!(parents["a"].state, JobState::Succeeded);
        assert_eq!(parents["a"].result, Some(serde_json::json!("A")));
        finish(&*s, b, Outcome::Succeeded(serde_json::json!(1))).await;
    }
}

pub async fn workflow_last_parents_racing_ready_the_step_once(s: Arc<dyn Store>) {
    let q = unique_queue("wfrace");
    let names: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
    let mut steps: Vec<(&str, &str, RunOn)> = names
        .iter()
        .map(|n| (n.as_str(), "", RunOn::Success))
        .collect();
    let parents = names.join(",");
    steps.push(("last", &parents, RunOn::Success));
    let (_, ids) = create(&*s, &q, &steps).await;
    let mut started = Vec::new();
    for n in &names {
        let StartOutcome::Run(j) = s.start(&[ids[n]], "w", now()).await.unwrap().remove(0) else {
            panic!()
        };
        started.push(j);
    }
    let tasks: Vec<_> = started
        .into_iter()
        .map(|j| {
            let s = s.clone();
            tokio::spawn(async move {
                s.complete(
                    &[Completion {
                        id: j.id,
                        epoch: j.epoch,
                        outcome: Outcome::Succeeded(serde_json::json!(j.id)),
                    }],
                    now(),
                )
                .await
                .unwrap()
                .remove(0)
            })
        })
        .collect();
    let mut readied = 0;
    for t in tasks {
        readied += dispatched(&t.await.unwrap())
            .iter()
            .filter(|d| **d == ids["last"])
            .count();
    }
    assert_eq!(readied, 1, "exactly one commit makes the step runnable");
    let last = s.get(ids["last"]).await.unwrap().unwrap();
    assert_eq!(last.state, JobState::Queued);
    assert_eq!(last.parents.unwrap().len(), names.len());
}

pub async fn workflow_cancel_reaches_every_unfinished_step(s: Arc<dyn Store>) {
    use RunOn::{Any, Success};
    let q = unique_queue("wfcancel");
    let (wf, ids) = create(
        &*s,
        &q,
        &[
            ("a", "", Success),
            ("q", "", Success),
            ("b", "a", Success),
            ("fin", "b,q", Any),
        ],
    )
    .await;
    let StartOutcome::Run(a) = s.start(&[ids["a"]], "w", now()).await.unwrap().remove(0) else {
        panic!()
    };
    let w = s.cancel_workflow(wf, now()).await.unwrap().unwrap();
    assert!(w.cancelled_at.is_some());
    assert_eq!(w.state, WorkflowState::Running, "a is still running");
    for n in ["q", "b", "fin"] {
        assert_eq!(state(&*s, ids[n]).await, JobState::Cancelled, "{n}");
    }
    assert!(s.get(ids["a"]).await.unwrap().unwrap().cancel_requested);
    let r = s
        .complete(
            &[Completion {
                id: a.id,
                epoch: a.epoch,
                outcome: Outcome::Cancelled,
            }],
            now(),
        )
        .await
        .unwrap();
    assert!(dispatched(&r[0]).is_empty(), "no finaliser runs");
    let w = s.workflow(wf).await.unwrap().unwrap();
    assert_eq!(w.state, WorkflowState::Cancelled);
    assert!(s
        .cancel_workflow(crate::job::new_job_id(), now())
        .await
        .unwrap()
        .is_none());
    // Cancelling one step cancels its dependents.
    let (_, ids) = create(&*s, &q, &[("a", "", Success), ("b", "a", Success)]).await;
    s.cancel(ids["a"], now()).await.unwrap();
    assert_eq!(state(&*s, ids["b"]).await, JobState::Cancelled);
}

/// Retention treats a workflow as a whole: one whose every step finished before the cut goes
/// with its steps' jobs; one with a live step, or a step finished after the cut, keeps its row
/// and every step (even a step finished long ago, which a waiting sibling's settling reads).
/// Waiting steps are counted per queue.
pub async fn workflow_rows_are_purged_with_their_steps(s: Arc<dyn Store>) {
    use RunOn::Success;
    let q = unique_queue("wfpurge");
    let chain = [("a", "", Success), ("b", "a", Success)];
    let (done, done_ids) = create(&*s, &q, &chain).await;
    let (live, live_ids) = create(&*s, &q, &chain).await;
    let (late, late_ids) = create(&*s, &q, &[("a", "", Success)]).await;
    let waiting = |s: Arc<dyn Store>, q: String| async move {
        s.queue_stats()
            .await
            .unwrap()
            .into_iter()
            .find(|st| st.queue == q)
            .map(|st| st.waiting)
            .unwrap_or(0)
    };
    assert_eq!(waiting(s.clone(), q.clone()).await, 2, "two `b` steps wait");
    for id in [done_ids["a"], done_ids["b"], live_ids["a"]] {
        finish(&*s, id, Outcome::Succeeded(serde_json::json!(1))).await;
    }
    assert_eq!(state(&*s, live_ids["b"]).await, JobState::Queued);
    assert_eq!(waiting(s.clone(), q.clone()).await, 0);
    let cut = now() + 1;
    std::thread::sleep(std::time::Duration::from_millis(2));
    finish(&*s, late_ids["a"], Outcome::Succeeded(serde_json::json!(1))).await;

    let p = s.purge(cut, 100).await.unwrap();
    assert!(p.workflows >= 1 && p.jobs >= 2, "{p:?}");
    assert!(
        s.workflow(done).await.unwrap().is_none(),
        "all finished: gone"
    );
    for id in done_ids.values() {
        assert!(s.get(*id).await.unwrap().is_none(), "its steps go with it");
    }
    let kept = s
        .workflow(live)
        .await
        .unwrap()
        .expect("a live step keeps it");
    assert_eq!(kept.steps.len(), 2);
    assert_eq!(
        state(&*s, live_ids["a"]).await,
        JobState::Succeeded,
        "a finished step of a live workflow is kept"
    );
    assert!(
        s.workflow(late).await.unwrap().is_some(),
        "a step finished after the cut keeps it"
    );

    finish(&*s, live_ids["b"], Outcome::Succeeded(serde_json::json!(2))).await;
    assert!(
        s.workflow(live).await.unwrap().is_some(),
        "its last step finished after the cut"
    );
    let p = s.purge(now() + 1, 100).await.unwrap();
    assert!(p.workflows >= 2, "{p:?}");
    for (wf, ids) in [(live, &live_ids), (late, &late_ids)] {
        assert!(s.workflow(wf).await.unwrap().is_none());
        for id in ids.values() {
            assert!(s.get(*id).await.unwrap().is_none());
        }
    }
}
