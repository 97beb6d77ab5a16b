//! What this process's background loops last achieved, for `/healthz`. A loop that keeps failing
//! (the store or broker gone, a bad migration) used to show only as warnings in a log while the
//! health check said 200; each loop now records every pass here, and the check turns 503, naming
//! the loop, once one has failed without a success for longer than a threshold.
//!
//! A leaf: it knows loop names and outcomes, nothing of stores or brokers. One registry per
//! process ([`global`]), since the loops and the API that reports them run in the same process.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
struct Record {
    last_success: Option<Instant>,
    /// When the current run of failures began; `None` while the loop succeeds.
    failing_since: Option<Instant>,
    consecutive_failures: u64,
}

/// The loops' records, by name.
#[derive(Debug, Default)]
pub struct Registry {
    loops: Mutex<BTreeMap<&'static str, Record>>,
}

/// One loop as `/healthz` reports it. No error text: the check is open to anyone, and errors
/// can name hosts; the log has them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopHealth {
    pub name: &'static str,
    /// Failed for longer than the threshold with no success since.
    pub failing: bool,
    pub consecutive_failures: u64,
    /// Seconds since the loop's last successful pass; `None` before the first one.
    pub last_success_age_s: Option<f64>,
    /// Seconds since the current run of failures began; `None` while it succeeds.
    pub failing_for_s: Option<f64>,
}

impl Registry {
    pub fn success(&self, name: &'static str) {
        let mut loops = self.loops.lock().unwrap_or_else(|p| p.into_inner());
        let r = loops.entry(name).or_default();
        r.last_success = Some(Instant::now());
        r.failing_since = None;
        r.consecutive_failures = 0;
    }

    pub fn failure(&self, name: &'static str) {
        let mut loops = self.loops.lock().unwrap_or_else(|p| p.into_inner());
        let r = loops.entry(name).or_default();
        r.failing_since.get_or_insert_with(Instant::now);
        r.consecutive_failures = r.consecutive_failures.saturating_add(1);
    }

    /// Every loop heard of, each marked failing when its failures have lasted over `threshold`.
    pub fn report(&self, threshold: Duration) -> Vec<LoopHealth> {
        let now = Instant::now();
        let loops = self.loops.lock().unwrap_or_else(|p| p.into_inner());
        loops
            .iter()
            .map(|(name, r)| {
                let failing_for = r.failing_since.map(|t| now.saturating_duration_since(t));
                LoopHealth {
                    name,
                    failing: failing_for.is_some_and(|d| d > threshold),
                    consecutive_failures: r.consecutive_failures,
                    last_success_age_s: r
                        .last_success
                        .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                    failing_for_s: failing_for.map(|d| d.as_secs_f64()),
                }
            })
            .collect()
    }
}

/// This process's registry.
pub fn global() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(Registry::default)
}

/// The longest a failing loop waits between passes.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The wait before the next pass of a loop that runs every `interval`, after `failures` failed
/// passes in a row: the interval itself while it succeeds, doubling with each failure up to
/// [`MAX_BACKOFF`] (or the interval, if longer), so an outage is not met with a tight loop of
/// errors and log lines.
pub fn backoff(interval: Duration, failures: u64) -> Duration {
    let doublings = failures.min(20) as u32;
    interval
        .saturating_mul(1u32 << doublings)
        .min(MAX_BACKOFF.max(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let i = Duration::from_millis(100);
        assert_eq!(backoff(i, 0), i);
        assert_eq!(backoff(i, 1), Duration::from_millis(200));
        assert_eq!(backoff(i, 3), Duration::from_millis(800));
        assert_eq!(backoff(i, 10), MAX_BACKOFF);
        assert_eq!(backoff(i, u64::MAX), MAX_BACKOFF);
        let long = Duration::from_secs(60);
        assert_eq!(backoff(long, 5), long, "never faster than the interval");
    }

    #[test]
    fn a_loop_is_failing_only_past_the_threshold_and_until_a_success() {
        let r = Registry::default();
        r.success("scheduler");
        r.failure("rescuer");
        r.failure("rescuer");
        let rep = r.report(Duration::from_secs(3600));
        assert_eq!(rep.len(), 2);
        let rescuer = rep.iter().find(|l| l.name == "rescuer").unwrap();
        assert_eq!((rescuer.failing, rescuer.consecutive_failures), (false, 2));
        assert!(rescuer.last_success_age_s.is_none());
        let rep = r.report(Duration::ZERO);
        assert!(rep.iter().find(|l| l.name == "rescuer").unwrap().failing);
        assert!(!rep.iter().find(|l| l.name == "scheduler").unwrap().failing);
        r.success("rescuer");
        let rep = r.report(Duration::ZERO);
        assert!(rep
            .iter()
            .all(|l| !l.failing && l.consecutive_failures == 0));
    }
}
