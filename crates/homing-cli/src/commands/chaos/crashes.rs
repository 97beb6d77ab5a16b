//! The crash budget (docs/design.md, "A zombie wakes"): a reclaim counts a crash only for a run
//! its worker had when a rescuer first found it without a heartbeat (the store records those
//! runs; it compares no clocks). A worker whose heartbeat went with Redis's data, or that was
//! paused past its TTL, keeps reserving until its next beat and takes back what the rescuers
//! put back; every process runs a rescuer, and if each counted a crash for those runs a healthy
//! job could spend its budget and go `dead` (at the default of 3, after one Redis restart).
//!
//! The store also refuses to start anything for a worker presumed dead, so such a worker does
//! not run again what the rescuers put back.
//!
//! Checked from the timelines and the workers' records after the drain: each `crashed` entry's
//! run (the `started` entry of its epoch) must have begun before its worker's
//! `presumed_dead_at`. Every process of a chaos deployment shares one clock, so the times
//! compare here (a run recorded at the presumption began before it). No run may begin at or
//! after its worker's presumption: both stores order a worker's starts and its presumption (the
//! embedded file's one writer; PostgreSQL's start fence, an advisory lock), and a start's time
//! is read before its write, a presumption's inside it. Runs taken back without a crash
//! (`released`) are counted for the report; with the fence only a run that escaped the record
//! would be one.

use std::collections::HashMap;

use homing::history::{History, Kind};
use homing::time::Micros;

use super::invariants::MAX_LISTED;

/// What the crash entries showed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// Crashes counted, in all timelines.
    pub counted: usize,
    /// Runs begun after their worker was presumed dead, taken back without a crash.
    pub not_counted: usize,
    /// Runs begun at or after their worker was presumed dead (the store refuses such starts).
    pub begun_after: usize,
    /// The most crashes of any one job.
    pub most_of_one_job: u32,
    pub violations: Vec<String>,
}

/// `presumed_dead`: each worker's `presumed_dead_at`, for those that have one.
pub fn check<'a>(
    histories: impl IntoIterator<Item = (&'a homing::JobId, &'a History)>,
    presumed_dead: &HashMap<String, Micros>,
) -> Outcome {
    let mut out = Outcome::default();
    for (id, h) in histories {
        let mut started: HashMap<u64, Micros> = HashMap::new();
        for e in &h.entries {
            out.most_of_one_job = out.most_of_one_job.max(e.crashes);
            let Some(epoch) = e.epoch else { continue };
            if e.kind == Kind::Started {
                started.insert(epoch, e.at);
                let since = e.worker.as_ref().and_then(|w| presumed_dead.get(w));
                if let Some(since) = since.filter(|since| e.at >= **since) {
                    out.begun_after += 1;
                    if out.violations.len() < MAX_LISTED {
                        out.violations.push(format!(
                            "job {id}: run {epoch} began under {} {} ms after the worker was presumed dead",
                            e.worker.as_deref().unwrap_or_default(),
                            (e.at - *since) / 1000
                        ));
                    }
                }
                continue;
            }
            if !matches!(e.kind, Kind::Crashed | Kind::Released) {
                continue;
            }
            let (Some(worker), Some(begun)) = (&e.worker, started.get(&epoch)) else {
                // A trimmed timeline may have lost the start: nothing to compare.
                continue;
            };
            let after = presumed_dead.get(worker).filter(|since| *begun >= **since);
            match (e.kind, after) {
                (Kind::Crashed, Some(since)) => {
                    if out.violations.len() < MAX_LISTED {
                        out.violations.push(format!(
                            "job {id}: a crash was counted for run {epoch} under {worker}, \
                             begun {} ms after the worker was presumed dead",
                            (*begun - *since) / 1000
                        ));
                    }
                    out.counted += 1;
                }
                (Kind::Crashed, None) => out.counted += 1,
                (Kind::Released, Some(_)) => out.not_counted += 1,
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing::history::Entry;
    use homing::JobState;

    fn entry(kind: Kind, at: Micros, epoch: u64, crashes: u32) -> Entry {
        crate::commands::chaos::test_entry(kind, JobState::Queued, at, epoch, crashes)
    }

    #[test]
    fn a_crash_of_a_run_begun_after_its_worker_was_presumed_dead_is_a_violation() {
        let id = homing::job::new_job_id();
        let h = History {
            entries: vec![
                entry(Kind::Started, 100, 1, 0),
                entry(Kind::Crashed, 300, 1, 1),
                entry(Kind::Started, 400, 2, 1),
                entry(Kind::Released, 450, 2, 1),
                entry(Kind::Started, 500, 3, 1),
                entry(Kind::Crashed, 600, 3, 2),
            ],
            truncated: false,
        };
        let presumed: HashMap<String, Micros> = [("w".to_string(), 200)].into();
        let o = check([(&id, &h)], &presumed);
        assert_eq!(
            (o.counted, o.not_counted, o.begun_after, o.most_of_one_job),
            (2, 1, 2, 2)
        );
        // Runs 2 and 3 should never have begun, and run 3's crash should not have counted.
        assert_eq!(o.violations.len(), 3, "{:?}", o.violations);
        assert!(
            o.violations[0].contains("run 2 began under w"),
            "{:?}",
            o.violations
        );
        assert!(
            o.violations[2].contains("crash was counted for run 3"),
            "{:?}",
            o.violations
        );
        // A worker never presumed dead: every crash is its own.
        let o = check([(&id, &h)], &HashMap::new());
        assert_eq!((o.counted, o.not_counted, o.begun_after), (2, 0, 0));
        assert!(o.violations.is_empty());
    }
}
