//! Responsible for checking docs/design.md section 1 after the run, from three independent sources:
//! the store (every job's final record), the counter (every handler call, per idempotency key)
//! and the workers' logs (every commit the store applied, every zombie write it rejected).
//!
//! - No loss: every accepted job — and every job the store holds for the run's queue — ended
//!   `succeeded`.
//! - No duplicate completion: each job has at most one applied terminal commit in the logs, at
//!   the job's final epoch, and its stored result answers a call made after its final start.
//! - Duplicate handler calls are allowed only where a fault (or a worker presumed dead) falls
//!   between the two calls; each is attributed to its cause.
//! - Periodic schedules ([`check_ticks`]): the deployment's every-1s schedule, run by every
//!   worker and the server while they are killed, paused and cut off, has exactly one job per
//!   tick, and no tick is missing from its first to the end of the load.

use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use super::faults::{Injected, Kind};
use homing::history::{History, Kind as HistoryKind};
use homing::time::{parse_rfc3339, Micros};
use homing::{Job, JobId, JobState};

/// What the logs say.
#[derive(Debug, Default)]
pub struct LogFacts {
    /// Applied terminal commits per job: (epoch, state).
    pub applied: HashMap<String, Vec<(u64, String)>>,
    pub zombie_rejected: u64,
    pub reclaimed: u64,
    pub broker_data_lost: u64,
    /// Messages workers found reserved under their names without holding them, put back.
    pub strays_put_back: u64,
    pub presumed_dead: Vec<Micros>,
}

pub fn read_logs(paths: &[impl AsRef<Path>]) -> LogFacts {
    let mut f = LogFacts::default();
    for p in paths {
        let Ok(text) = std::fs::read_to_string(p.as_ref()) else {
            continue;
        };
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
            let job = s("job").to_string();
            match (s("event"), s("message")) {
                // A Rust worker's committer, or the server committing a remote worker's report.
                (_, "job committed" | "remote outcome committed") | ("job.failed", _) => {
                    let state = if s("event") == "job.failed" {
                        "failed".to_string()
                    } else {
                        s("state").to_string()
                    };
                    if matches!(
                        state.as_str(),
                        "succeeded" | "failed" | "dead" | "cancelled"
                    ) {
                        let epoch = v.get("epoch").and_then(|e| e.as_u64()).unwrap_or(0);
                        f.applied.entry(job).or_default().push((epoch, state));
                    }
                }
                ("job.zombie_write_rejected", _) => f.zombie_rejected += 1,
                ("job.reclaimed", _) => f.reclaimed += 1,
                ("broker.data_lost", _) => f.broker_data_lost += 1,
                ("worker.strays_put_back", _) => {
                    f.strays_put_back += v.get("count").and_then(|c| c.as_u64()).unwrap_or(0)
                }
                ("worker.presumed_dead", _) => {
                    if let Some(t) = parse_rfc3339(s("timestamp")) {
                        f.presumed_dead.push(t);
                    }
                }
                _ => {}
            }
        }
    }
    f
}

#[derive(Debug, Default, Serialize)]
pub struct Findings {
    pub jobs: usize,
    pub lost: usize,
    pub lost_by_state: BTreeMap<String, usize>,
    pub completed_twice: usize,
    pub duplicate_calls: usize,
    pub duplicate_causes: BTreeMap<String, usize>,
    pub unexplained_duplicates: usize,
    /// Seconds from a kill to each of the killed worker's jobs calling the counter again.
    #[serde(skip)]
    pub recovery: Vec<(String, f64)>,
    /// Each violation, precisely: job, what, and the fault before it.
    pub violations: Vec<String>,
}

pub(super) const MAX_LISTED: usize = 50;

impl Findings {
    fn violation(&mut self, v: String) {
        if self.violations.len() < MAX_LISTED {
            self.violations.push(v);
        }
    }
}

fn last_fault_before(faults: &[Injected], t: Micros) -> String {
    faults
        .iter()
        .rev()
        .find(|f| f.at <= t)
        .map(|f| {
            format!(
                "last fault before: {} slot {:?} at {} ({})",
                f.kind.name(),
                f.slot,
                homing::time::rfc3339(f.at),
                f.note
            )
        })
        .unwrap_or_else(|| "no fault before it".into())
}

/// `settle`: how long after a fault ended it may still cause a rerun (a heartbeat TTL and a
/// reconciler pass).
pub fn check(
    accepted: &[JobId],
    jobs: &[Job],
    calls: &HashMap<String, Vec<Micros>>,
    logs: &LogFacts,
    faults: &[Injected],
    settle: Micros,
) -> Findings {
    let mut f = Findings::default();
    let by_id: HashMap<JobId, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut all: Vec<JobId> = accepted.to_vec();
    let accepted_set: HashSet<JobId> = accepted.iter().copied().collect();
    all.extend(
        jobs.iter()
            .map(|j| j.id)
            .filter(|id| !accepted_set.contains(id)),
    );
    f.jobs = all.len();

    for id in &all {
        let key = id.to_string();
        let Some(job) = by_id.get(id) else {
            f.lost += 1;
            *f.lost_by_state.entry("missing".into()).or_default() += 1;
            f.violation(format!("job {id}: accepted but not in the store"));
            continue;
        };
        if job.state != JobState::Succeeded {
            f.lost += 1;
            *f.lost_by_state.entry(job.state.to_string()).or_default() += 1;
            let at = job.finished_at.or(job.started_at).unwrap_or(job.created_at);
            f.violation(format!(
                "job {id}: ended {} (error {:?}, crashes {}, epoch {}, worker {:?}); {}",
                job.state,
                job.error,
                job.crashes,
                job.epoch,
                job.worker,
                last_fault_before(faults, at)
            ));
        }
        let job_calls = calls.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let mut twice: Vec<String> = Vec::new();
        if let Some(commits) = logs.applied.get(&key) {
            if commits.len() > 1 {
                twice.push(format!(
                    "{} applied terminal commits {commits:?}",
                    commits.len()
                ));
            }
            for (epoch, state) in commits {
                if *epoch != job.epoch {
                    twice.push(format!(
                        "a {state} commit at epoch {epoch} was applied, but the job's epoch is {}",
                        job.epoch
                    ));
                }
            }
        }
        if job.state == JobState::Succeeded {
            let result = job.result.clone().unwrap_or_default();
            let body = &result["body"];
            if body["key"].as_str() != Some(key.as_str()) {
                twice.push(format!("its result is not its own call: {result}"));
            } else if let Some(n) = body["call"].as_u64() {
                let started = job.started_at.unwrap_or(0);
                match job_calls.get((n as usize).wrapping_sub(1)) {
                    Some(t) if *t >= started => {}
                    Some(t) => twice.push(format!(
                        "its result answers call {n} made at {}, before its final start at {}: an earlier run's result",
                        homing::time::rfc3339(*t),
                        homing::time::rfc3339(started)
                    )),
                    None => twice.push(format!("its result names call {n}, which the counter never saw")),
                }
            }
        }
        if !twice.is_empty() {
            f.completed_twice += 1;
            let at = job.finished_at.unwrap_or(job.created_at);
            f.violation(format!(
                "job {id}: completed twice: {}; {}",
                twice.join("; "),
                last_fault_before(faults, at)
            ));
        }
        for pair in job_calls.windows(2) {
            f.duplicate_calls += 1;
            let (c1, c2) = (pair[0], pair[1]);
            // The fault that struck this very job, else the latest one whose window overlaps.
            // A held write lock never explains a second call: it is looked for only when
            // nothing else does, and then it is a violation.
            let explains = |x: &&Injected| x.kind != Kind::LockHold;
            let held = faults
                .iter()
                .any(|x| x.kind == Kind::LockHold && x.at <= c2 && x.end + settle >= c1);
            let cause = faults
                .iter()
                .rev()
                .filter(explains)
                .find(|x| x.at <= c2 && x.at + settle >= c1 && x.running.contains(id))
                .or_else(|| {
                    faults
                        .iter()
                        .rev()
                        .filter(explains)
                        .find(|x| x.at <= c2 && x.end + settle >= c1)
                })
                .map(|x| x.kind.name().to_string())
                .or_else(|| {
                    // A presumption during a held lock is what the lock must not cause.
                    (!held
                        && logs
                            .presumed_dead
                            .iter()
                            .any(|t| *t >= c1 - settle && *t <= c2 + settle))
                    .then(|| "presumed_dead_without_fault".to_string())
                });
            match cause {
                Some(c) => *f.duplicate_causes.entry(c).or_default() += 1,
                None if held => {
                    f.unexplained_duplicates += 1;
                    f.violation(format!(
                        "job {id}: called at {} and again at {} with only a held write lock \
                         (lock_hold) in between: the time nobody could write was taken for a crash",
                        homing::time::rfc3339(c1),
                        homing::time::rfc3339(c2)
                    ));
                }
                None => {
                    f.unexplained_duplicates += 1;
                    f.violation(format!(
                        "job {id}: called at {} and again at {} with no fault in between",
                        homing::time::rfc3339(c1),
                        homing::time::rfc3339(c2)
                    ));
                }
            }
        }
    }
    let known: HashSet<String> = all.iter().map(|i| i.to_string()).collect();
    let stray: usize = calls
        .iter()
        .filter(|(k, _)| !known.contains(*k))
        .map(|(_, v)| v.len())
        .sum();
    if stray > 0 {
        f.violation(format!(
            "{stray} counter calls carry a key that names no job"
        ));
    }

    // Only kills: a killed worker makes no further call, so any later call is the rerun.
    let kills = faults
        .iter()
        .filter(|x| matches!(x.kind, Kind::Kill9 | Kind::Kill9MidCommit));
    for fault in kills {
        for id in &fault.running {
            let key = id.to_string();
            let Some(next) = calls
                .get(&key)
                .and_then(|v| v.iter().find(|t| **t > fault.at))
            else {
                continue;
            };
            f.recovery.push((
                fault.kind.name().to_string(),
                (next - fault.at) as f64 / 1e6,
            ));
        }
    }
    f
}

/// The schedule every chaos deployment runs: every second, on a queue no worker takes (the
/// jobs are counted, not run), catching up every missed tick so that a store outage skips none.
pub const TICK_SCHEDULE: &str = "chaos-tick";
pub const TICK_QUEUE: &str = "chaos-ticks";

/// What the tick check found.
#[derive(Debug, Default, Serialize)]
pub struct Ticks {
    /// Distinct ticks that got a job.
    pub ticks: usize,
    /// Ticks with more than one job (must be 0).
    pub duplicated: usize,
    /// Ticks between the first and `until` with no job (must be 0).
    pub missing: usize,
    #[serde(skip)]
    pub violations: Vec<String>,
}

/// Exactly one job per tick of [`TICK_SCHEDULE`], and every whole second from its first tick to
/// `until` (the end of the load, less a pass) has one: a server lived throughout.
pub fn check_ticks(jobs: &[Job], until: Micros) -> Ticks {
    const SECOND: Micros = 1_000_000;
    let mut per_tick: BTreeMap<Micros, usize> = BTreeMap::new();
    for j in jobs {
        if j.schedule.as_deref() == Some(TICK_SCHEDULE) {
            if let Some(t) = j.scheduled_tick {
                *per_tick.entry(t).or_default() += 1;
            }
        }
    }
    let mut out = Ticks {
        ticks: per_tick.len(),
        ..Ticks::default()
    };
    for (t, n) in &per_tick {
        if *n > 1 {
            out.duplicated += 1;
            if out.violations.len() < MAX_LISTED {
                out.violations.push(format!(
                    "schedule tick {} has {n} jobs",
                    homing::time::rfc3339(*t)
                ));
            }
        }
    }
    let Some(first) = per_tick.keys().next().copied() else {
        out.violations
            .push("the schedule enqueued no tick: the periodic loop never ran".into());
        return out;
    };
    let mut t = first;
    while t <= until {
        if !per_tick.contains_key(&t) {
            out.missing += 1;
            if out.violations.len() < MAX_LISTED {
                out.violations.push(format!(
                    "schedule tick {} has no job although the server lived",
                    homing::time::rfc3339(t)
                ));
            }
        }
        t += SECOND;
    }
    out
}

/// Workflows (docs/workflows.md): each step has at most one applied terminal commit (checked
/// above with every job, from the logs), and each final step exactly one, made after every
/// parent's: it started after each parent finished, and its handler was first called after the
/// parent's call whose answer the parent stored. Not after the parent's last call: an
/// at-least-once duplicate of the parent (a handler still running under a worker presumed
/// dead, a session cut from a killed server) may come after the final step ran; [`check`]
/// judges those calls.
///
/// "Exactly one" is counted in the final step's timeline, not in the logs: an entry is written
/// in its commit's transaction, where a log line is written after the commit and can be missing
/// although the commit stands (its process killed in between; a commit whose answer was lost,
/// sent again and found applied already, which logs nothing the second time).
pub fn check_workflows(
    workflows: &[super::load::FanIn],
    jobs: &[Job],
    calls: &HashMap<String, Vec<Micros>>,
    histories: &HashMap<JobId, History>,
) -> Vec<String> {
    let by_id: HashMap<JobId, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut out = Vec::new();
    for w in workflows {
        let key = w.last.to_string();
        let Some(last) = by_id.get(&w.last) else {
            out.push(format!("workflow final step {key}: not in the store"));
            continue;
        };
        // A timeline at its bound may have dropped entries: then the logs' at-most-one stands.
        let history = histories.get(&w.last).filter(|h| !h.truncated);
        if let (JobState::Succeeded, Some(h)) = (last.state, history) {
            let commits = h
                .entries
                .iter()
                .filter(|e| e.kind == HistoryKind::Succeeded)
                .count();
            if commits != 1 {
                out.push(format!(
                    "workflow final step {key}: {commits} succeeded entries in its timeline, not exactly one"
                ));
            }
        }
        let first_call = calls.get(&key).and_then(|v| v.first()).copied();
        // Each final step exactly once: made runnable when every parent succeeded (then it
        // ends like any job: succeeded, or failed or dead under the faults, never still waiting
        // or cancelled); otherwise cancelled, never called.
        let parents: Vec<Option<JobState>> = w
            .parents
            .iter()
            .map(|p| by_id.get(p).map(|j| j.state))
            .collect();
        if parents.iter().all(|s| *s == Some(JobState::Succeeded)) {
            if !last.state.is_terminal() || last.state == JobState::Cancelled {
                out.push(format!(
                    "workflow final step {key} is {} although every parent succeeded",
                    last.state
                ));
            }
        } else if parents.iter().all(|s| s.is_some_and(|s| s.is_terminal())) && first_call.is_some()
        {
            out.push(format!(
                "workflow final step {key} was called although a parent did not succeed"
            ));
        }
        for p in &w.parents {
            let Some(parent) = by_id.get(p) else { continue };
            if let (Some(fin), Some(started)) = (parent.finished_at, last.started_at) {
                if started < fin {
                    out.push(format!(
                        "workflow final step {key} started before its parent {p} finished"
                    ));
                }
            }
            if let (Some(pc), Some(fc)) = (answering_call(parent, calls), first_call) {
                if fc < pc {
                    out.push(format!(
                        "workflow final step {key} was called before the call of its parent {p} that produced the parent's result"
                    ));
                }
            }
        }
        if out.len() >= MAX_LISTED {
            break;
        }
    }
    out
}

/// When the counter saw the call whose answer `job` stored as its result (the result names the
/// call's number); `None` when it stored none or names a call the counter never saw, which
/// [`check`] reports.
fn answering_call(job: &Job, calls: &HashMap<String, Vec<Micros>>) -> Option<Micros> {
    let n = job.result.as_ref()?["body"]["call"].as_u64()?;
    let at = calls.get(&job.id.to_string())?;
    at.get(usize::try_from(n).ok()?.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::chaos::load::FanIn;
    use crate::commands::chaos::test_entry;

    fn job(id: JobId, state: JobState, started: Option<Micros>, finished: Option<Micros>) -> Job {
        let mut j = crate::commands::chaos::test_job(id, "builtin.http", "chaos", state);
        j.started_at = started;
        j.finished_at = finished;
        j
    }

    /// The final step must run exactly once when its parents succeeded, after them; a final
    /// step left waiting (or cancelled) although every parent succeeded is a violation, and so
    /// is one that ran although a parent failed.
    #[test]
    fn a_final_step_runs_once_after_its_parents_or_not_at_all() {
        let (p1, p2, last) = (
            homing::job::new_job_id(),
            homing::job::new_job_id(),
            homing::job::new_job_id(),
        );
        let w = vec![FanIn {
            last,
            parents: vec![p1, p2],
        }];
        // The final step's timeline: started, then succeeded once. No log line is needed: the
        // line of a commit can be missing although the commit stands.
        let timeline = |succeeded: usize| {
            let mut entries = vec![test_entry(
                HistoryKind::Started,
                JobState::Running,
                30,
                1,
                0,
            )];
            for i in 0..succeeded {
                entries.push(test_entry(
                    HistoryKind::Succeeded,
                    JobState::Succeeded,
                    45 + i as Micros,
                    1,
                    0,
                ));
            }
            History::from_entries(entries)
        };
        let mut timelines = HashMap::new();
        timelines.insert(last, timeline(1));
        let mut calls: HashMap<String, Vec<Micros>> = HashMap::new();
        calls.insert(p1.to_string(), vec![10]);
        calls.insert(p2.to_string(), vec![20]);
        calls.insert(last.to_string(), vec![40]);
        let answered = |id: JobId, call: u64, finished: Micros| {
            let mut j = job(id, JobState::Succeeded, Some(5), Some(finished));
            j.result = Some(serde_json::json!({"body": {"key": id.to_string(), "call": call}}));
            j
        };
        let ok = [
            answered(p1, 1, 15),
            answered(p2, 1, 25),
            job(last, JobState::Succeeded, Some(30), Some(45)),
        ];
        assert_eq!(
            check_workflows(&w, &ok, &calls, &timelines),
            Vec::<String>::new()
        );

        let mut stuck = ok.clone();
        stuck[2] = job(last, JobState::Waiting, None, None);
        let v = check_workflows(&w, &stuck, &HashMap::new(), &HashMap::new());
        assert!(
            v.iter()
                .any(|m| m.contains("although every parent succeeded")),
            "{v:?}"
        );

        let mut early = ok.clone();
        early[2] = job(last, JobState::Succeeded, Some(20), Some(45));
        let v = check_workflows(&w, &early, &calls, &timelines);
        assert!(
            v.iter().any(|m| m.contains("started before its parent")),
            "{v:?}"
        );

        // A duplicate call of a parent after the final step ran (at-least-once under a fault)
        // is no ordering violation; a final step called before the parent's answering call is.
        calls.insert(p1.to_string(), vec![10, 50]);
        assert_eq!(
            check_workflows(&w, &ok, &calls, &timelines),
            Vec::<String>::new()
        );
        let mut answered_late = ok.clone();
        answered_late[0] = answered(p1, 2, 15);
        let v = check_workflows(&w, &answered_late, &calls, &timelines);
        assert!(
            v.iter()
                .any(|m| m.contains("before the call of its parent")),
            "{v:?}"
        );
        calls.insert(p1.to_string(), vec![10]);

        for (n, entries) in [(2, timeline(2)), (0, timeline(0))] {
            let v = check_workflows(&w, &ok, &calls, &HashMap::from([(last, entries)]));
            assert!(
                v.iter()
                    .any(|m| m.contains(&format!("{n} succeeded entries in its timeline"))),
                "{v:?}"
            );
        }
        // A timeline at its bound may have dropped entries: not counted.
        let mut bounded = timeline(0);
        bounded.truncated = true;
        assert_eq!(
            check_workflows(&w, &ok, &calls, &HashMap::from([(last, bounded)])),
            Vec::<String>::new()
        );

        let mut failed = ok.clone();
        failed[1] = job(p2, JobState::Failed, Some(5), Some(25));
        failed[2] = job(last, JobState::Cancelled, None, Some(26));
        let v = check_workflows(&w, &failed, &calls, &timelines);
        assert!(
            v.iter()
                .any(|m| m.contains("called although a parent did not succeed")),
            "{v:?}"
        );
        calls.remove(&last.to_string());
        assert_eq!(
            check_workflows(&w, &failed, &calls, &timelines),
            Vec::<String>::new()
        );
    }
}
