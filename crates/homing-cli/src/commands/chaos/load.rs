//! Responsible for the steady load: every 10 ms it enqueues as many `builtin.http` jobs as the
//! target rate says are due, each calling the counter, and remembers every id `enqueue` returned
//! — the accepted jobs that the checker will demand back, every one succeeded. Every two seconds
//! it also creates a workflow of [`FAN`] such steps feeding a final one (docs/workflows.md),
//! whose steps join the accepted jobs and whose final step the checker demands exactly once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use homing::workflow::{StepSpec, WorkflowSpec};
use homing::{Client, EnqueueRequest, JobId};

/// Parent steps of each load workflow.
pub const FAN: usize = 4;

/// One workflow of the load: its final step and that step's parents.
#[derive(Debug, Clone)]
pub struct FanIn {
    pub last: JobId,
    pub parents: Vec<JobId>,
}

#[derive(Debug, Default)]
pub struct Accepted {
    pub ids: Vec<JobId>,
    pub workflows: Vec<FanIn>,
    /// `enqueue` calls that returned an error: those jobs were never accepted.
    pub enqueue_errors: u64,
}

pub struct LoadPlan {
    /// `builtin.http` for Rust workers, its Python twin for Python ones: the same args.
    pub task: String,
    pub rate: f64,
    pub url: String,
    pub queue: String,
    pub max_crashes: u32,
}

fn request(p: &LoadPlan) -> EnqueueRequest {
    let mut r = EnqueueRequest::new(
        p.task.as_str(),
        serde_json::json!({ "url": p.url, "timeout": "10s" }),
    );
    r.options.queue = Some(p.queue.clone());
    r.options.max_crashes = Some(p.max_crashes);
    r
}

fn workflow(p: &LoadPlan) -> WorkflowSpec {
    let step = || {
        let mut s = StepSpec::new(
            p.task.as_str(),
            serde_json::json!({ "url": p.url, "timeout": "10s" }),
        );
        s.queue = Some(p.queue.clone());
        s.max_crashes = Some(p.max_crashes);
        s
    };
    let names: Vec<String> = (0..FAN).map(|i| format!("p{i}")).collect();
    let mut w = WorkflowSpec::new("chaos");
    for n in &names {
        w = w.with_step(n, step());
    }
    let mut last = step();
    last.after = names;
    w.with_step("last", last)
}

pub async fn run(
    client: Client,
    plan: LoadPlan,
    accepted: Arc<Mutex<Accepted>>,
    stop: CancellationToken,
) {
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut ticks = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        if ticks.is_multiple_of(200) {
            let r = tokio::time::timeout(
                Duration::from_secs(10),
                client.create_workflow(workflow(&plan)),
            )
            .await;
            let mut a = accepted.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(Ok(c)) => {
                    let parents: Vec<JobId> = c
                        .steps
                        .iter()
                        .filter(|(n, _)| n.as_str() != "last")
                        .map(|(_, id)| *id)
                        .collect();
                    a.ids.extend(c.steps.values().copied());
                    a.workflows.push(FanIn {
                        last: c.steps["last"],
                        parents,
                    });
                }
                _ => a.enqueue_errors += FAN as u64 + 1,
            }
        }
        ticks += 1;
        let due = (t0.elapsed().as_secs_f64() * plan.rate) as u64;
        // Never more than two seconds' worth at once: after a stall (a store restart) the
        // producer resumes its rate instead of dumping the backlog in one burst.
        let n = due.saturating_sub(sent).min((plan.rate * 2.0) as u64);
        sent = due;
        if n == 0 {
            continue;
        }
        let reqs = (0..n).map(|_| request(&plan)).collect();
        let r = tokio::time::timeout(Duration::from_secs(10), client.enqueue_many(reqs)).await;
        let mut a = accepted.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Ok(Ok(ins)) => a.ids.extend(ins.into_iter().map(|i| i.id)),
            _ => a.enqueue_errors += n,
        }
    }
}
