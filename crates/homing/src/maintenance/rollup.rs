//! Keeps the charts' rollups (docs/charts.md) up to date, off the job path: every pass
//! recomputes, from the finished jobs in the store, the minutes since the cursor (the first
//! pass, the retention period before it), the last few closed minutes again (a completion may
//! commit a little after the time it records), and the open minute (so the charts are live);
//! then samples each queue's depth. Recomputing a minute replaces its rows with the same ones,
//! so a crash mid-pass, a repeated pass or several servers rolling up at once cannot double
//! count; the cursor only says where the next pass may start.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::stats::{floor, MINUTE};
use crate::store::Store;
use crate::time::{micros, now, Micros};

/// A minute is closed this long after its end: completions carry their worker's clock and
/// commit a moment after it.
const GRACE: Micros = 5_000_000;
/// Closed minutes recomputed on every pass anyway, for completions that committed late.
const RECHECK: Micros = 2 * MINUTE;
/// Minutes per transaction while catching up, so a long backlog never holds the write lock long.
const CHUNK: Micros = 60 * MINUTE;
/// How far back the first pass looks when the history is kept forever.
const FIRST_PASS: Micros = 7 * 24 * 60 * MINUTE;

pub(crate) async fn run(
    store: Arc<dyn Store>,
    retention: Option<Duration>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut pace = super::Pace::new("rollup", interval);
    // The first pass at once: a restarted server's charts should not wait a whole interval.
    let mut wait = Duration::ZERO;
    while super::tick(wait, &stop).await {
        let outcome = pass(&*store, retention, now(), &stop).await;
        if let Err(e) = &outcome {
            tracing::warn!(error = %e, "stats rollup failed; will try again");
        }
        wait = pace.after(&outcome);
    }
}

/// One pass at time `at`: rolls up everything from the cursor (or the start of the history)
/// to the open minute, then samples the depths.
pub async fn pass(
    store: &dyn Store,
    retention: Option<Duration>,
    at: Micros,
    stop: &CancellationToken,
) -> Result<()> {
    let closed = floor(at - GRACE, MINUTE);
    let first = closed - retention.map(micros).unwrap_or(FIRST_PASS).min(FIRST_PASS);
    let cursor = match store.stats_cursor().await? {
        Some(c) => c.closed,
        None => floor(first, MINUTE),
    };
    let mut from = cursor.min(closed - RECHECK).max(floor(first, MINUTE));
    // Up to `at` and not to the end of the open minute: the minute rows then hold exactly the
    // finishes before the live point the store records, and the queue list counts only the
    // ones after it from the jobs without counting any twice (docs/counts.md).
    while from < at && !stop.is_cancelled() {
        let to = (from + CHUNK).min(at);
        // The closed cursor moves over closed minutes only; the open one is recomputed next pass.
        store.roll_up(from, to, to.min(closed)).await?;
        from = to;
    }
    store.sample_depth(at).await
}
