//! Charts over time, from the store (docs/charts.md): the pure half of the rollups.
//!
//! Why rollups at all: the dashboard's charts must work without Prometheus and survive restarts,
//! yet reading a week of jobs on every page load would scan the whole history. So a background
//! loop ([`crate::maintenance::rollup`]) folds finished jobs into one row per (queue, minute)
//! and per (queue, hour), and the charts read those. This module holds what the stores and the
//! loop share and what must be the same everywhere: the latency histogram's buckets (so that
//! minutes can be merged into hours and queues into totals), the SQL expression that sorts a
//! duration into them, the percentiles read back from merged buckets, and the assembly of a
//! series from the stored rows. Nothing here touches a store.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::time::Micros;

pub const MINUTE: Micros = 60_000_000;
pub const HOUR: Micros = 60 * MINUTE;

/// Upper bounds (exclusive, in milliseconds) of the latency buckets: 1-2-5 steps from 1 ms to
/// 50 min. Bucket `i` holds durations in `[BOUNDS_MS[i-1], BOUNDS_MS[i])`; bucket 0 everything
/// under 1 ms (and negative durations from skewed clocks); the last bucket everything from
/// 50 min up. Fixed, so every minute's histogram can be added to any other's.
pub const BOUNDS_MS: [i64; 20] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
    200_000, 500_000, 1_000_000, 3_000_000,
];
/// How many buckets there are (one more than bounds).
pub const BUCKETS: usize = BOUNDS_MS.len() + 1;

/// The two latencies the rollup keeps a histogram of.
pub const WAIT: &str = "wait";
pub const RUN: &str = "run";

/// Which SQL dialect a fragment is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// An SQL expression giving the bucket index of `duration` (an expression in microseconds):
/// the number of bounds it reaches. Comparisons are integers in SQLite and cast in PostgreSQL.
pub fn bucket_sql(duration: &str, dialect: Dialect) -> String {
    let cast = match dialect {
        Dialect::Sqlite => "",
        Dialect::Postgres => "::int",
    };
    let terms: Vec<String> = BOUNDS_MS
        .iter()
        .map(|ms| format!("(({duration}) >= {}){cast}", ms * 1000))
        .collect();
    format!("({})", terms.join(" + "))
}

/// The bucket of a duration, as [`bucket_sql`] computes it (for tests and in-memory callers).
pub fn bucket_of(duration: Micros) -> usize {
    BOUNDS_MS
        .iter()
        .filter(|ms| duration >= **ms * 1000)
        .count()
}

/// The `q`-quantile (0 < q ≤ 1) of a histogram, in milliseconds: found by rank, then placed
/// linearly inside its bucket. `None` for an empty histogram. The first bucket reads as its
/// upper bound's lower half, the last as its lower bound (it has no upper one).
pub fn percentile(hist: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0);
    let mut seen = 0u64;
    for (i, n) in hist.iter().enumerate() {
        if *n == 0 {
            continue;
        }
        let before = seen as f64;
        seen += n;
        if seen as f64 >= rank {
            let lo = if i == 0 { 0.0 } else { BOUNDS_MS[i - 1] as f64 };
            let Some(hi) = BOUNDS_MS.get(i).map(|b| *b as f64) else {
                return Some(lo);
            };
            let within = (rank - before) / *n as f64;
            return Some(lo + (hi - lo) * within);
        }
    }
    Some(BOUNDS_MS[BOUNDS_MS.len() - 1] as f64)
}

/// The time ranges the charts offer, and the rollup each reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    Hour,
    Day,
    Week,
}

impl Range {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "hour" => Some(Range::Hour),
            "day" => Some(Range::Day),
            "week" => Some(Range::Week),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
        }
    }

    /// The width of one point: minutes for the last hour, hours for a day or a week.
    pub fn step(self) -> Micros {
        match self {
            Range::Hour => MINUTE,
            Range::Day | Range::Week => HOUR,
        }
    }

    /// How many points the range has (the last one is the step `now` falls in, still open).
    pub fn points(self) -> i64 {
        match self {
            Range::Hour => 60,
            Range::Day => 24,
            Range::Week => 7 * 24,
        }
    }

    /// `[from, to)` of the range ending with the step that holds `now`.
    pub fn bounds(self, now: Micros) -> (Micros, Micros) {
        let to = floor(now, self.step()) + self.step();
        (to - self.step() * self.points(), to)
    }
}

/// `t` rounded down to a multiple of `step` (`t` is never negative in practice; a negative one
/// rounds towards minus infinity all the same).
pub fn floor(t: Micros, step: Micros) -> Micros {
    t.div_euclid(step) * step
}

/// Where the rollup stands: what [`crate::store::Store::stats_cursor`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Every minute before this one is closed and rolled up (where the next pass starts).
    pub closed: Micros,
    /// The last pass counted every finish before this time (its own clock, usually mid-minute)
    /// into the minute rollups, the open minute included, and none after it.
    pub live: Micros,
}

/// How the queue list answers "finished in the last hour" and "per second lately" (docs/counts.md)
/// without reading an hour of jobs. Both windows start on a minute, so everything before the
/// rollup's live point comes from the minute rollups and only the finishes after it (a pass
/// interval's worth) are counted from the jobs, once for both windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListWindows {
    /// Start of the hour window: the current minute and the 59 before it.
    pub hour_from: Micros,
    /// Start of the throughput window: the current minute and the one before it (60–120 s).
    pub minute_from: Micros,
    /// Count from the jobs, in both windows: finishes at or after this.
    pub tail: Micros,
    /// Count from the jobs, in the hour window only: `[from, to)`, when the rollup is behind
    /// the throughput window.
    pub mid: Option<(Micros, Micros)>,
    /// Sum from the minute rollups, for the hour and for the throughput window: `[from, to)`.
    pub hour_rolled: Option<(Micros, Micros)>,
    pub minute_rolled: Option<(Micros, Micros)>,
}

pub fn list_windows(now: Micros, live: Option<Micros>) -> ListWindows {
    let minute_from = floor(now, MINUTE) - MINUTE;
    let hour_from = floor(now, MINUTE) - 59 * MINUTE;
    // Without a rollup, every finish is counted from the jobs.
    let live = live.unwrap_or(Micros::MIN);
    let tail = live.max(minute_from);
    let mid_from = live.max(hour_from);
    let rolled = |from: Micros| (from < live).then_some((from, live));
    ListWindows {
        hour_from,
        minute_from,
        tail,
        mid: (mid_from < tail).then_some((mid_from, tail)),
        hour_rolled: rolled(hour_from),
        minute_rolled: rolled(minute_from),
    }
}

/// The hours `[from, to)` of minutes touch: `[from, to)` widened to whole hours.
pub fn hours_of(from: Micros, to: Micros) -> (Micros, Micros) {
    (floor(from, HOUR), floor(to + HOUR - 1, HOUR))
}

/// The minute rollups of a range of finished jobs, added up in memory one job at a time: what
/// the counting queries of the rollup (`store/stats_sql.rs`) compute, for a store that reads the
/// jobs in `finished_at` order and would otherwise sort them for each `GROUP BY` (SQLite: three
/// sorts of every job of the range, each in memory). Groups are few (minutes × queues), so a
/// job costs two map updates and no allocation once its queue has been seen.
#[derive(Debug, Default)]
pub struct MinuteTally {
    queues: Vec<String>,
    ids: std::collections::HashMap<String, usize>,
    /// (minute, queue id) → succeeded, failed, dead, cancelled, retried.
    counts: BTreeMap<(Micros, usize), [u64; 5]>,
    /// (minute, queue id, 0 for wait or 1 for run, bucket) → jobs.
    latency: BTreeMap<(Micros, usize, u8, usize), u64>,
}

impl MinuteTally {
    /// Adds one job that finished at `finished_at` in `state` after `attempts` handler errors,
    /// with its last start and the time it was due (`scheduled_at`, else `created_at`). Jobs
    /// in a state that is not an end are left out, as the queries leave them out.
    pub fn add(
        &mut self,
        finished_at: Micros,
        queue: &str,
        state: &str,
        attempts: i64,
        started_at: Option<Micros>,
        due_at: Micros,
    ) {
        let slot = match state {
            "succeeded" => 0,
            "failed" => 1,
            "dead" => 2,
            "cancelled" => 3,
            _ => return,
        };
        let q = match self.ids.get(queue) {
            Some(q) => *q,
            None => {
                self.queues.push(queue.to_string());
                self.ids.insert(queue.to_string(), self.queues.len() - 1);
                self.queues.len() - 1
            }
        };
        // Integer division, as the SQL's `(finished_at / MINUTE) * MINUTE`.
        let minute = (finished_at / MINUTE) * MINUTE;
        let c = self.counts.entry((minute, q)).or_default();
        c[slot] += 1;
        // A handler error is retried unless it was the last one of a failed job.
        let retried = if slot == 1 && attempts > 0 {
            attempts - 1
        } else {
            attempts
        };
        c[4] = c[4].wrapping_add_signed(retried);
        if let (Some(started), 0 | 1) = (started_at, slot) {
            for (kind, d) in [
                (0, started.saturating_sub(due_at)),
                (1, finished_at.saturating_sub(started)),
            ] {
                *self
                    .latency
                    .entry((minute, q, kind, bucket_of(d)))
                    .or_default() += 1;
            }
        }
    }

    /// The rows, counts and latency, as the queries would give them (in no particular order).
    pub fn rows(self) -> (Vec<CountRow>, Vec<LatencyRow>) {
        let q = &self.queues;
        let counts = self
            .counts
            .into_iter()
            .map(|((at, i), c)| CountRow {
                at,
                queue: q[i].clone(),
                succeeded: c[0],
                failed: c[1],
                dead: c[2],
                cancelled: c[3],
                retried: c[4],
            })
            .collect();
        let latency = self
            .latency
            .into_iter()
            .map(|((at, i, kind, bucket), n)| LatencyRow {
                at,
                queue: q[i].clone(),
                kind: [WAIT, RUN][kind as usize].to_string(),
                bucket: bucket as i64,
                n,
            })
            .collect();
        (counts, latency)
    }
}

/// One stored rollup row of counts: jobs that finished in `[at, at + span)` on `queue`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CountRow {
    pub at: Micros,
    pub queue: String,
    pub succeeded: u64,
    pub failed: u64,
    pub dead: u64,
    pub cancelled: u64,
    /// Handler errors that were followed by another attempt (docs/charts.md).
    pub retried: u64,
}

/// One stored histogram bucket: `n` durations of `kind` ([`WAIT`] or [`RUN`]) in bucket `bucket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyRow {
    pub at: Micros,
    pub queue: String,
    pub kind: String,
    pub bucket: i64,
    pub n: u64,
}

/// One stored depth sample: the most jobs seen queued on `queue` during `[at, at + span)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepthRow {
    pub at: Micros,
    pub queue: String,
    pub depth: u64,
}

/// Everything a store returns for one series request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    pub counts: Vec<CountRow>,
    pub latency: Vec<LatencyRow>,
    pub depth: Vec<DepthRow>,
}

/// A chart-ready series: one array per measure, aligned with `t` (unix seconds of each
/// point's start), as the charting library takes them. Percentiles are `null` where nothing
/// finished.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    pub range: &'static str,
    pub step_seconds: i64,
    /// The queue the series is for; `None` means every queue added together.
    pub queue: Option<String>,
    /// Every queue that has a row in the range (for the dashboard's selector).
    pub queues: Vec<String>,
    pub t: Vec<i64>,
    pub succeeded: Vec<u64>,
    pub failed: Vec<u64>,
    pub dead: Vec<u64>,
    pub cancelled: Vec<u64>,
    pub retried: Vec<u64>,
    pub depth: Vec<u64>,
    pub wait_p50_ms: Vec<Option<f64>>,
    pub wait_p95_ms: Vec<Option<f64>>,
    pub wait_p99_ms: Vec<Option<f64>>,
    pub run_p50_ms: Vec<Option<f64>>,
    pub run_p95_ms: Vec<Option<f64>>,
    pub run_p99_ms: Vec<Option<f64>>,
}

/// Builds the series of `range` ending at `now` from the stored rows, keeping `queue`'s rows
/// (or all, added together, when `None`). Rows outside the range are ignored; missing points
/// are zero.
pub fn series(range: Range, now: Micros, queue: Option<&str>, rows: &Rows) -> Series {
    let (from, _) = range.bounds(now);
    let step = range.step();
    let n = range.points() as usize;
    let slot = |at: Micros| -> Option<usize> {
        let i = (at - from).div_euclid(step);
        (0..n as i64).contains(&i).then_some(i as usize)
    };
    let keep = |q: &str| queue.is_none_or(|want| want == q);
    let mut queues = std::collections::BTreeSet::new();
    let mut s = Series {
        range: range.as_str(),
        step_seconds: step / 1_000_000,
        queue: queue.map(str::to_string),
        queues: Vec::new(),
        t: (0..n as i64)
            .map(|i| (from + i * step) / 1_000_000)
            .collect(),
        succeeded: vec![0; n],
        failed: vec![0; n],
        dead: vec![0; n],
        cancelled: vec![0; n],
        retried: vec![0; n],
        depth: vec![0; n],
        wait_p50_ms: vec![None; n],
        wait_p95_ms: vec![None; n],
        wait_p99_ms: vec![None; n],
        run_p50_ms: vec![None; n],
        run_p95_ms: vec![None; n],
        run_p99_ms: vec![None; n],
    };
    for r in &rows.counts {
        queues.insert(r.queue.clone());
        if let (true, Some(i)) = (keep(&r.queue), slot(r.at)) {
            s.succeeded[i] += r.succeeded;
            s.failed[i] += r.failed;
            s.dead[i] += r.dead;
            s.cancelled[i] += r.cancelled;
            s.retried[i] += r.retried;
        }
    }
    for r in &rows.depth {
        queues.insert(r.queue.clone());
        if let (true, Some(i)) = (keep(&r.queue), slot(r.at)) {
            s.depth[i] += r.depth;
        }
    }
    let mut hists: BTreeMap<(usize, bool), [u64; BUCKETS]> = BTreeMap::new();
    for r in &rows.latency {
        let b = usize::try_from(r.bucket).unwrap_or(0).min(BUCKETS - 1);
        if let (true, Some(i)) = (keep(&r.queue), slot(r.at)) {
            hists.entry((i, r.kind == WAIT)).or_insert([0; BUCKETS])[b] += r.n;
        }
    }
    for ((i, wait), h) in &hists {
        let (p50, p95, p99) = (
            percentile(h, 0.50),
            percentile(h, 0.95),
            percentile(h, 0.99),
        );
        if *wait {
            (s.wait_p50_ms[*i], s.wait_p95_ms[*i], s.wait_p99_ms[*i]) = (p50, p95, p99);
        } else {
            (s.run_p50_ms[*i], s.run_p95_ms[*i], s.run_p99_ms[*i]) = (p50, p95, p99);
        }
    }
    s.queues = queues.into_iter().collect();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_windows_take_what_the_rollup_holds_and_count_the_rest_once() {
        let m = MINUTE;
        let now = 100 * m + 5;
        // A live rollup: both windows from the rollups up to it, one shared tail after it.
        assert_eq!(
            list_windows(now, Some(100 * m + 1)),
            ListWindows {
                hour_from: 41 * m,
                minute_from: 99 * m,
                tail: 100 * m + 1,
                mid: None,
                hour_rolled: Some((41 * m, 100 * m + 1)),
                minute_rolled: Some((99 * m, 100 * m + 1)),
            }
        );
        // A rollup behind the throughput window: the hour counts the gap from the jobs too.
        let w = list_windows(now, Some(90 * m));
        assert_eq!((w.tail, w.mid), (99 * m, Some((90 * m, 99 * m))));
        assert_eq!(
            (w.hour_rolled, w.minute_rolled),
            (Some((41 * m, 90 * m)), None)
        );
        // None yet, or one older than the hour: everything from the jobs.
        for live in [None, Some(10 * m)] {
            let w = list_windows(now, live);
            assert_eq!((w.tail, w.mid), (99 * m, Some((41 * m, 99 * m))));
            assert_eq!((w.hour_rolled, w.minute_rolled), (None, None));
        }
    }

    #[test]
    fn buckets_follow_the_bounds() {
        assert_eq!(bucket_of(-5), 0);
        assert_eq!(bucket_of(999), 0);
        assert_eq!(bucket_of(1_000), 1);
        assert_eq!(bucket_of(1_999_999), 10);
        assert_eq!(bucket_of(i64::MAX), BUCKETS - 1);
        let sql = bucket_sql("d", Dialect::Postgres);
        assert!(sql.contains("((d) >= 1000)::int") && sql.contains("3000000000"));
    }

    #[test]
    fn percentiles_come_from_merged_buckets() {
        let mut h = [0u64; BUCKETS];
        assert_eq!(percentile(&h, 0.5), None);
        // 90 durations of ~3 ms (bucket [2, 5)) and 10 of ~1.5 s (bucket [1000, 2000)).
        h[bucket_of(3_000)] += 90;
        h[bucket_of(1_500_000)] += 10;
        let p50 = percentile(&h, 0.5).unwrap();
        assert!((2.0..5.0).contains(&p50), "{p50}");
        let p95 = percentile(&h, 0.95).unwrap();
        assert!((1000.0..=2000.0).contains(&p95), "{p95}");
        let p99 = percentile(&h, 0.99).unwrap();
        assert!(p99 >= p95, "{p99} {p95}");
        h = [0; BUCKETS];
        h[BUCKETS - 1] = 1;
        assert_eq!(percentile(&h, 0.99), Some(3_000_000.0));
    }

    #[test]
    fn a_series_adds_queues_and_zero_fills() {
        let now = 10 * HOUR + 30 * MINUTE + 5;
        let (from, to) = Range::Hour.bounds(now);
        assert_eq!((to - from, to), (HOUR, 10 * HOUR + 31 * MINUTE));
        let row = |at, q: &str, s| CountRow {
            at,
            queue: q.into(),
            succeeded: s,
            ..Default::default()
        };
        let rows = Rows {
            counts: vec![
                row(to - MINUTE, "a", 2),
                row(to - MINUTE, "b", 3),
                row(from - MINUTE, "a", 100),
            ],
            latency: vec![LatencyRow {
                at: from,
                queue: "b".into(),
                kind: RUN.into(),
                bucket: 3,
                n: 4,
            }],
            depth: vec![DepthRow {
                at: from,
                queue: "a".into(),
                depth: 7,
            }],
        };
        let all = series(Range::Hour, now, None, &rows);
        assert_eq!(all.t.len(), 60);
        assert_eq!(all.t[0], from / 1_000_000);
        assert_eq!((all.succeeded[59], all.succeeded[0]), (5, 0));
        assert_eq!(all.queues, vec!["a".to_string(), "b".to_string()]);
        assert!(all.run_p50_ms[0].is_some() && all.run_p50_ms[1].is_none());
        assert_eq!(all.depth[0], 7);
        let a = series(Range::Hour, now, Some("a"), &rows);
        assert_eq!((a.succeeded[59], a.run_p50_ms[0], a.depth[0]), (2, None, 7));
    }
}
