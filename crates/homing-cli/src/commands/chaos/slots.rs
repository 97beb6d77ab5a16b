//! The at-risk bound (docs/fastpath.md): a worker's slots are a promise about how many jobs its
//! crash can put at risk, so no worker ever has more jobs running under its name than its
//! prefetch (its concurrency unless set apart; chaos gives every worker the same). The faster
//! paths (rounds that acknowledge and reserve in one call, reservations carried over, the
//! one-write round) must keep it under every fault.
//!
//! Checked from the store's timelines, the record the guarantee is about: each `started` entry
//! opens a run under its worker at its time, the job's next entry that is not progress or a
//! cancel request closes it (a completion, a crash the rescuer counted, a release). Ends sort
//! before starts at the same instant. A truncated timeline may miss a run's end, so it is left
//! out (the count can only come out lower, never raise a false alarm).
//!
//! One excess is explained rather than counted: a remote (Python) session whose `reserve` started
//! jobs but whose answer never came (its server was killed, or PostgreSQL restarted after the
//! start's commit, so the gateway saw an error and handed the messages back) holds fewer jobs
//! than run under its name, and reserves more, until its heartbeat's housekeeping reclaims the
//! unheld ones (a TTL later). With remote workers an excess within a server kill or a
//! PostgreSQL restart, plus the window the caller gives (the settle time and one more TTL: the
//! housekeeping needs a heartbeat, late on a loaded machine, after the run is a TTL old), is
//! counted apart.

use std::collections::HashMap;

use homing::history::{History, Kind};
use homing::time::Micros;

use super::faults::{Injected, Kind as Fault};
use super::invariants::MAX_LISTED;

/// A run as the timeline shows it: its worker, start and end.
pub struct Run {
    pub worker: String,
    pub start: Micros,
    pub end: Micros,
}

/// What the runs showed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// The most jobs ever running under one worker's name at once.
    pub max_running: usize,
    /// The bound: each worker's prefetch.
    pub bound: usize,
    pub runs: usize,
    /// Timelines left out because they were trimmed.
    pub truncated: usize,
    /// Moments above the bound explained by a remote session's unanswered reserve.
    pub explained_excess: usize,
    pub violations: Vec<String>,
}

/// Every run the timelines show, and how many timelines were trimmed (left out).
pub fn runs<'a>(histories: impl IntoIterator<Item = &'a History>) -> (Vec<Run>, usize) {
    let mut out = Vec::new();
    let mut truncated = 0;
    for h in histories {
        if h.truncated {
            truncated += 1;
            continue;
        }
        let mut open: Option<(String, Micros)> = None;
        for e in &h.entries {
            if matches!(e.kind, Kind::Progress | Kind::CancelRequested) {
                continue;
            }
            if let Some((worker, start)) = open.take() {
                out.push(Run {
                    worker,
                    start,
                    end: e.at,
                });
            }
            if e.kind == Kind::Started {
                open = Some((e.worker.clone().unwrap_or_default(), e.at));
            }
        }
        if let Some((worker, start)) = open {
            out.push(Run {
                worker,
                start,
                end: Micros::MAX,
            });
        }
    }
    (out, truncated)
}

/// Checks that no worker had more than `bound` runs at once; `remote` when the workers are
/// remote sessions.
pub fn check(
    runs: &[Run],
    truncated: usize,
    bound: usize,
    remote: bool,
    injected: &[Injected],
    window: Micros,
) -> Outcome {
    let mut out = Outcome {
        bound,
        runs: runs.len(),
        truncated,
        ..Default::default()
    };
    let kills: Vec<(Micros, Micros)> = injected
        .iter()
        .filter(|f| remote && matches!(f.kind, Fault::ServerKill | Fault::PostgresRestart))
        .map(|f| (f.at, f.end + window))
        .collect();
    let mut by_worker: HashMap<&str, Vec<(Micros, i32)>> = HashMap::new();
    for r in runs {
        let edges = by_worker.entry(r.worker.as_str()).or_default();
        edges.push((r.start, 1));
        edges.push((r.end, -1));
    }
    let mut workers: Vec<_> = by_worker.into_iter().collect();
    workers.sort_by(|a, b| a.0.cmp(b.0));
    for (worker, mut edges) in workers {
        // -1 sorts before +1: a run that ended as another began did not overlap it.
        edges.sort();
        let mut now = 0i32;
        for (t, d) in edges {
            now += d;
            let running = now.max(0) as usize;
            out.max_running = out.max_running.max(running);
            if d > 0 && running > bound {
                if kills.iter().any(|(a, b)| *a <= t && t <= *b) {
                    out.explained_excess += 1;
                } else if out.violations.len() < MAX_LISTED {
                    out.violations.push(format!(
                        "{running} jobs running under worker {worker} at {t} (its prefetch is {bound})"
                    ));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(worker: &str, start: Micros, end: Micros) -> Run {
        Run {
            worker: worker.into(),
            start,
            end,
        }
    }

    #[test]
    fn runs_are_counted_per_worker_and_back_to_back_runs_do_not_overlap() {
        let runs = [
            run("a", 0, 10),
            run("a", 10, 20),
            run("b", 5, 15),
            run("b", 6, 7),
        ];
        let o = check(&runs, 0, 2, false, &[], 0);
        assert_eq!((o.max_running, o.violations.len()), (2, 0), "{o:?}");
        let o = check(&runs, 0, 1, false, &[], 0);
        assert_eq!(o.max_running, 2);
        assert_eq!(o.violations.len(), 1, "only b overlaps: {o:?}");
        assert!(o.violations[0].contains("worker b"), "{o:?}");
    }

    #[test]
    fn only_remote_sessions_are_excused_around_a_postgres_restart() {
        let runs = [run("a", 0, 10), run("a", 5, 15)];
        let restart = Injected {
            kind: Fault::PostgresRestart,
            slot: None,
            at: 4,
            end: 6,
            running: Vec::new(),
            note: String::new(),
        };
        let rust = check(&runs, 0, 1, false, std::slice::from_ref(&restart), 0);
        assert_eq!((rust.violations.len(), rust.explained_excess), (1, 0));
        let remote = check(&runs, 0, 1, true, std::slice::from_ref(&restart), 0);
        assert_eq!((remote.violations.len(), remote.explained_excess), (0, 1));
        let later = check(
            &runs,
            0,
            1,
            true,
            &[Injected {
                at: 7,
                end: 9,
                ..restart
            }],
            0,
        );
        assert_eq!(later.violations.len(), 1, "outside the window: {later:?}");
    }
}
