//! The charts' rollups after chaos (docs/charts.md): the per-minute counts the server rolled up
//! while its workers (and, in the distributed modes, its stores) were killed must say what the
//! jobs table says. A rollup is derived data, so its only way to be wrong is to disagree with
//! its source: a minute rolled up and closed before a completion it holds committed, a pass
//! killed half-way, two passes racing, or a job whose record changed after its minute closed.
//!
//! After the run, with every homing process stopped, this runs one rollup pass as a restarted
//! server would (it recomputes only the last few closed minutes and the open one; older minutes
//! keep what the server wrote during the chaos), then compares every minute before the pass's
//! closed boundary with the counts of the finished jobs still in the store, per queue; then
//! runs a second pass and checks it changed no row. Last, the queue list's "last hour"
//! (docs/counts.md), which adds the rollups up to the pass's live point and the jobs after it,
//! must equal the jobs of its window: a finish counted in both, or in neither, shows here.

use std::collections::BTreeMap;

use homing::stats::{floor, CountRow, HOUR, MINUTE};
use homing::time::Micros;
use homing::{Job, JobState};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// Must match the rollup loop's grace (crates/homing/src/maintenance/rollup.rs): a minute is
/// closed this long after its end.
const GRACE: Micros = 5_000_000;

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    /// (queue, minute) pairs compared.
    pub minutes: usize,
    /// Finished jobs those minutes count.
    pub jobs: usize,
    /// Minutes whose rollup differs from the jobs table (must be 0).
    pub mismatched: usize,
    /// Whether a second pass changed any stored row (must be false).
    pub second_pass_changed: bool,
    /// Queues whose last-hour figures in the queue list differ from their jobs (must be 0).
    pub list_mismatched: usize,
    pub violations: Vec<String>,
}

/// `[succeeded, failed, dead, cancelled]` per (queue, minute).
type Counts = BTreeMap<(String, Micros), [u64; 4]>;

/// The counts the jobs table gives for minutes before `closed`.
fn from_jobs(jobs: &[Job], closed: Micros) -> (Counts, usize) {
    let mut out = Counts::new();
    let mut n = 0;
    for j in jobs {
        let slot = match j.state {
            JobState::Succeeded => 0,
            JobState::Failed => 1,
            JobState::Dead => 2,
            JobState::Cancelled => 3,
            _ => continue,
        };
        let Some(at) = j.finished_at else { continue };
        if at >= closed {
            continue;
        }
        out.entry((j.queue.clone(), floor(at, MINUTE))).or_default()[slot] += 1;
        n += 1;
    }
    (out, n)
}

fn from_rows(rows: &[CountRow], closed: Micros) -> Counts {
    let mut out = Counts::new();
    for r in rows.iter().filter(|r| r.at < closed) {
        let c = out.entry((r.queue.clone(), r.at)).or_default();
        for (i, v) in [r.succeeded, r.failed, r.dead, r.cancelled]
            .into_iter()
            .enumerate()
        {
            c[i] += v;
        }
    }
    // A stored row of zeros says the same as no row.
    out.retain(|_, c| c.iter().any(|v| *v > 0));
    out
}

/// Compares the two maps; one violation line per differing (queue, minute), at most 20 kept.
fn compare(rolled: &Counts, table: &Counts, out: &mut Outcome) {
    let keys: std::collections::BTreeSet<_> = rolled.keys().chain(table.keys()).collect();
    out.minutes = keys.len();
    for k in keys {
        let (r, t) = (
            rolled.get(k).copied().unwrap_or_default(),
            table.get(k).copied().unwrap_or_default(),
        );
        if r != t {
            out.mismatched += 1;
            if out.violations.len() < 20 {
                out.violations.push(format!(
                    "stats rollup of queue {} minute {}: [succeeded, failed, dead, cancelled] \
                     rolled up {r:?}, jobs table {t:?}",
                    k.0,
                    homing::time::rfc3339(k.1)
                ));
            }
        }
    }
}

/// Runs the check against `b`'s store, whose finished jobs are `jobs` (every queue), and its
/// queue list. No homing process may be running (the jobs must not change under the comparison).
pub async fn check(b: &homing::Backends, jobs: &[Job]) -> anyhow::Result<Outcome> {
    let store = &*b.store;
    let stop = CancellationToken::new();
    let at = homing::time::now();
    homing::maintenance::rollup::pass(store, None, at, &stop).await?;
    let closed = floor(at - GRACE, MINUTE);
    let first = jobs
        .iter()
        .filter_map(|j| j.finished_at)
        .min()
        .unwrap_or(closed);
    let from = floor(first, MINUTE) - MINUTE;
    // Every stored row the pass wrote: minutes and hours, counts and latency histograms
    // (depth samples are a maximum over time, not derived from the jobs, so left out).
    // The reads have no order: sorted, so only a changed row counts as a change.
    let snapshot = || async {
        let (m, h) = (
            store.stats_rows(60, from, at + MINUTE).await?,
            store.stats_rows(3600, floor(from, HOUR), at + HOUR).await?,
        );
        let counts = |mut v: Vec<CountRow>| {
            v.sort_by(|a, b| (a.at, &a.queue).cmp(&(b.at, &b.queue)));
            v
        };
        let latency = |mut v: Vec<homing::stats::LatencyRow>| {
            v.sort_by(|a, b| {
                (a.at, &a.queue, &a.kind, a.bucket).cmp(&(b.at, &b.queue, &b.kind, b.bucket))
            });
            v
        };
        anyhow::Ok((
            counts(m.counts),
            latency(m.latency),
            counts(h.counts),
            latency(h.latency),
        ))
    };
    let before = snapshot().await?;
    let mut out = Outcome::default();
    let (table, n) = from_jobs(jobs, closed);
    out.jobs = n;
    compare(&from_rows(&before.0, closed), &table, &mut out);

    homing::maintenance::rollup::pass(store, None, at, &stop).await?;
    out.second_pass_changed = snapshot().await? != before;
    if out.second_pass_changed {
        out.violations
            .push("a second stats rollup pass at the same time changed stored rows".into());
    }
    check_list(b, jobs, at, &mut out).await?;
    Ok(out)
}

/// The queue list at the pass's time against the jobs finished since its hour window began.
async fn check_list(
    b: &homing::Backends,
    jobs: &[Job],
    at: Micros,
    out: &mut Outcome,
) -> anyhow::Result<()> {
    let from = homing::stats::list_windows(at, None).hour_from;
    let mut want: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for (key, n) in from_jobs(jobs, Micros::MAX).0 {
        if key.1 >= from {
            for (w, v) in want.entry(key.0).or_default().iter_mut().zip(n) {
                *w += v;
            }
        }
    }
    let mut got: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for v in crate::views::queues_at(b, at, None, usize::MAX)
        .await?
        .queues
    {
        let h = v.last_hour;
        if h.succeeded + h.failed + h.dead + h.cancelled > 0 {
            got.insert(v.jobs.queue, [h.succeeded, h.failed, h.dead, h.cancelled]);
        }
    }
    let names: std::collections::BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    for q in names {
        let (w, g) = (want.get(q), got.get(q));
        if w != g {
            out.list_mismatched += 1;
            out.violations.push(format!(
                "queue list of {q}: last hour [succeeded, failed, dead, cancelled] {g:?}, \
                 jobs table {w:?}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(queue: &str, state: JobState, finished: Option<Micros>) -> Job {
        let mut j: Job = serde_json::from_value(serde_json::json!({
            "id": homing::job::new_job_id(), "task": "t", "queue": queue, "state": "queued",
            "args": {}, "attempts": 0, "crashes": 0, "epoch": 1, "max_crashes": 3,
            "priority": 0, "created_at": "2026-01-01T00:00:00Z", "scheduled_at": null,
            "started_at": null, "finished_at": null, "cancel_requested": false,
        }))
        .expect("a job");
        j.state = state;
        j.finished_at = finished;
        j
    }

    #[test]
    fn counts_closed_minutes_per_queue_and_flags_a_difference() {
        let m = 1000 * MINUTE;
        let jobs = vec![
            job("a", JobState::Succeeded, Some(m + 1)),
            job("a", JobState::Dead, Some(m + 2)),
            job("b", JobState::Cancelled, Some(m + MINUTE)),
            job("a", JobState::Succeeded, Some(m + 3 * MINUTE)), // open: not compared
            job("a", JobState::Queued, None),
        ];
        let closed = m + 2 * MINUTE;
        let (table, n) = from_jobs(&jobs, closed);
        assert_eq!(n, 3);
        let row = |at, q: &str, s, d, c| CountRow {
            at,
            queue: q.into(),
            succeeded: s,
            dead: d,
            cancelled: c,
            ..Default::default()
        };
        let good = vec![
            row(m, "a", 1, 1, 0),
            row(m + MINUTE, "b", 0, 0, 1),
            row(m + MINUTE, "a", 0, 0, 0),
        ];
        let mut out = Outcome::default();
        compare(&from_rows(&good, closed), &table, &mut out);
        assert_eq!(
            (out.minutes, out.mismatched),
            (2, 0),
            "{:?}",
            out.violations
        );
        let bad = vec![row(m, "a", 2, 1, 0), row(m + MINUTE, "b", 0, 0, 1)];
        let mut out = Outcome::default();
        compare(&from_rows(&bad, closed), &table, &mut out);
        assert_eq!(out.mismatched, 1);
        assert!(
            out.violations[0].contains("queue a"),
            "{:?}",
            out.violations
        );
    }
}
