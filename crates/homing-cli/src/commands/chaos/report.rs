//! The chaos report: one JSON object for machines (`--json`), a short table for people. The
//! JSON keeps the field names the issue promised (`jobs`, `faults`, `lost`, `completed_twice`,
//! `zombie_writes_rejected`, `recovery_s`), so scripts and RELIABILITY.md can rely on them.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::output::{self, outln};

#[derive(Debug, Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub samples: usize,
}

pub fn summary(mut v: Vec<f64>) -> Summary {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        (v[i] * 1000.0).round() / 1000.0
    };
    Summary {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
        samples: v.len(),
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    pub seed: u64,
    pub duration_s: f64,
    pub broker: String,
    pub store: String,
    pub settings: BTreeMap<String, String>,
    pub workers: usize,
    /// `rust` (`homing worker`) or `python` (`python -m homing worker`).
    pub worker_kind: String,
    pub concurrency: usize,
    pub heartbeat_ms: u64,
    pub target_rate_per_s: f64,
    pub jobs: usize,
    pub accepted: usize,
    pub enqueue_errors: u64,
    /// Hostile `POST /v1/jobs` bodies sent beside the load (`--hostile-rate`).
    pub hostile_sent: u64,
    /// Their answers, by case and status (`"internal_task 400": 12`): each must be a 4xx.
    pub hostile_refused: BTreeMap<String, u64>,
    /// Hostile bodies not refused with a 4xx, or found stored (must be 0).
    pub hostile_violations: usize,
    pub succeeded_per_s: f64,
    pub faults: BTreeMap<String, usize>,
    pub lost: usize,
    pub lost_by_state: BTreeMap<String, usize>,
    pub completed_twice: usize,
    pub zombie_writes_rejected: u64,
    pub duplicate_calls: usize,
    pub duplicate_causes: BTreeMap<String, usize>,
    pub unexplained_duplicates: usize,
    pub counter_calls: usize,
    pub reclaimed: u64,
    pub broker_data_lost_events: u64,
    /// Messages a live worker held without knowing it (a reservation whose answer was lost)
    /// and its sweep put back; without the sweep they would keep the drain from finishing.
    pub strays_put_back: u64,
    pub presumed_dead_events: usize,
    pub recovery_s: Summary,
    pub drain_s: f64,
    /// The deployment's every-1s schedule: ticks, and ticks with two jobs or none (must be 0).
    pub schedule: super::invariants::Ticks,
    /// The limited queue: the most calls in flight at once (must not exceed its limit).
    pub limited: super::limited::Outcome,
    /// The most jobs running under one worker at once (must not exceed its prefetch).
    pub slots: super::slots::Outcome,
    /// Crashes counted, runs begun after their worker was presumed dead (the store refuses
    /// such starts: any is a violation), runs taken back without a crash, the most of one job;
    /// a crash counted for such a run is a violation too.
    pub crashes: super::crashes::Outcome,
    /// The charts' minute rollups against the jobs table (mismatched minutes must be 0).
    pub stats_rollups: super::rollups::Outcome,
    /// The counts the schema keeps by trigger against a recount (`counts.rs`).
    pub kept_counts: KeptCounts,
    pub violations: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_dir: Option<String>,
}

/// How many kept counts disagreed with a count of what they count, after the run (must be 0).
#[derive(Debug, Default, Serialize)]
pub struct KeptCounts {
    /// Queues whose job counts per state differ from the jobs (`Store::queue_stats`), plus 1
    /// if either could not be read.
    pub job_counts_drifted: usize,
    /// Problems with the broker's depths: differing from a count of its messages, a kept row
    /// below zero, or a read that failed (only the embedded broker keeps them on the side).
    pub broker_depths_drifted: usize,
}

impl Report {
    pub fn print_human(&self) {
        outln!(
            "homing chaos: {} s, seed {}, {} {} workers × concurrency {}, heartbeat {} ms",
            self.duration_s,
            self.seed,
            self.workers,
            self.worker_kind,
            self.concurrency,
            self.heartbeat_ms
        );
        outln!("  broker {}  store {}", self.broker, self.store);
        for (k, v) in &self.settings {
            outln!("  {k}: {v}");
        }
        let faults = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let causes = self
            .duplicate_causes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        output::table(
            &["measure", "value"],
            vec![
                vec![
                    "jobs (accepted)".into(),
                    format!("{} ({})", self.jobs, self.accepted),
                ],
                vec![
                    "enqueue errors (not accepted)".into(),
                    self.enqueue_errors.to_string(),
                ],
                vec![
                    "hostile requests (not refused or stored: must be 0)".into(),
                    format!("{} ({})", self.hostile_sent, self.hostile_violations),
                ],
                vec![
                    "succeeded per second".into(),
                    self.succeeded_per_s.to_string(),
                ],
                vec!["faults injected".into(), faults],
                vec![
                    "lost (must be 0)".into(),
                    format!("{} {:?}", self.lost, self.lost_by_state),
                ],
                vec![
                    "completed twice (must be 0)".into(),
                    self.completed_twice.to_string(),
                ],
                vec![
                    "schedule ticks (duplicated, missing: must be 0)".into(),
                    format!(
                        "{} ({}, {})",
                        self.schedule.ticks, self.schedule.duplicated, self.schedule.missing
                    ),
                ],
                vec![
                    "limited queue: jobs, max in flight (must be <= limit), zombie overlaps".into(),
                    format!(
                        "{}, {} (limit {}), {}",
                        self.limited.jobs,
                        self.limited.max_in_flight,
                        self.limited.limit,
                        self.limited.explained_excess
                    ),
                ],
                vec![
                    "most jobs running under one worker (must be <= its prefetch), \
                     runs, remote overlaps"
                        .into(),
                    format!(
                        "{} (prefetch {}), {}, {}",
                        self.slots.max_running,
                        self.slots.bound,
                        self.slots.runs,
                        self.slots.explained_excess
                    ),
                ],
                vec![
                    "crashes counted, runs begun once presumed dead (must be 0), \
                     taken back uncounted, most of one job"
                        .into(),
                    format!(
                        "{}, {}, {}, {}",
                        self.crashes.counted,
                        self.crashes.begun_after,
                        self.crashes.not_counted,
                        self.crashes.most_of_one_job
                    ),
                ],
                vec![
                    "stats rollups: minutes, jobs, mismatched (must be 0), 2nd pass changed, \
                     queue list mismatched (must be 0)"
                        .into(),
                    format!(
                        "{}, {}, {}, {}, {}",
                        self.stats_rollups.minutes,
                        self.stats_rollups.jobs,
                        self.stats_rollups.mismatched,
                        self.stats_rollups.second_pass_changed,
                        self.stats_rollups.list_mismatched
                    ),
                ],
                vec![
                    "kept counts drifted: job counts, broker depths (must be 0)".into(),
                    format!(
                        "{}, {}",
                        self.kept_counts.job_counts_drifted, self.kept_counts.broker_depths_drifted
                    ),
                ],
                vec![
                    "zombie writes rejected".into(),
                    self.zombie_writes_rejected.to_string(),
                ],
                vec![
                    "duplicate handler calls".into(),
                    format!("{} ({causes})", self.duplicate_calls),
                ],
                vec![
                    "unexplained duplicates (must be 0)".into(),
                    self.unexplained_duplicates.to_string(),
                ],
                vec![
                    "recovery after kill -9 p50/p99/max".into(),
                    format!(
                        "{} / {} / {} s ({} jobs)",
                        self.recovery_s.p50,
                        self.recovery_s.p99,
                        self.recovery_s.max,
                        self.recovery_s.samples
                    ),
                ],
                vec![
                    "jobs reclaimed (log events)".into(),
                    self.reclaimed.to_string(),
                ],
                vec![
                    "broker data loss detected".into(),
                    self.broker_data_lost_events.to_string(),
                ],
                vec![
                    "stray messages put back by their worker".into(),
                    self.strays_put_back.to_string(),
                ],
                vec![
                    "workers presumed dead".into(),
                    self.presumed_dead_events.to_string(),
                ],
            ],
        );
        for v in &self.violations {
            outln!("VIOLATION: {v}");
        }
        outln!(
            "{}",
            if self.ok {
                "OK: every invariant held"
            } else {
                "FAILED"
            }
        );
    }
}
