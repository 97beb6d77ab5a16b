//! Periodic schedules' loop (docs/schedules.md): every pass looks at the schedules' heads (read
//! again only when the store's count of their changes moved, [`Known`]), asks
//! [`crate::schedule::due`] which ticks are due for each, and applies the answer with
//! [`Store::fire_schedule`], which moves the schedule's cursor and inserts the ticks' jobs in one
//! transaction, only if no other scheduler moved the cursor first. Every worker and server runs
//! this loop; however many run it at once and whichever of them dies, each tick gets exactly one
//! job (the compare-and-set on the cursor, and behind it each tick's idempotency key), and a tick
//! is late by at most one pass while any of them lives.
//!
//! The same pass unparks jobs that cluster-wide limits held back once their queue has room
//! ([`unpark_ready`]): a rate limit's window rolls with time, not with any commit.
//!
//! Not to be confused with [`super::scheduler`], which publishes delayed jobs when they fall due.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::client::publish;
use crate::error::Result;
use crate::job::{new_job_id, JobOptions, NewJob};
use crate::schedule::{self, Firing, Schedule, ScheduleHead, Spec};
use crate::store::{Store, ToPublish};
use crate::time::{now, Micros};

pub(crate) async fn run(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut pace = super::Pace::new("periodic", interval);
    let mut wait = interval;
    let mut known = Known::default();
    while super::tick(wait, &stop).await {
        let mut outcome = fire_due(&*broker, &*store, now(), &mut known).await;
        if outcome.is_ok() {
            outcome = unpark_ready(&*broker, &*store, now()).await;
        }
        wait = pace.after(&outcome);
        if let Err(e) = outcome {
            tracing::warn!(error = %e, retry_in = ?wait, "periodic schedules pass failed; will try again");
        }
    }
}

/// How many parked jobs one pass unparks at most.
const UNPARK_BATCH: usize = 1000;

/// Unparks what limited queues have room for now (a rate's window rolled, or a wake-up was lost
/// to a crash between a commit and its publish) and publishes it; docs/limits.md. Returns how
/// many were unparked. A failed publish leaves them undispatched for the reconciler.
pub async fn unpark_ready(broker: &dyn Broker, store: &dyn Store, now: Micros) -> Result<usize> {
    let ready = store.unpark_ready(now, UNPARK_BATCH).await?;
    if let Err(e) = publish(broker, store, &ready).await {
        tracing::warn!(error = %e, jobs = ready.len(), "publishing unparked jobs failed; the reconciler will publish them");
    }
    Ok(ready.len())
}

/// The job of one tick: the schedule's task, args, queue and options, with the tick's key.
fn tick_job(s: &Schedule, tick: Micros, now: Micros) -> NewJob {
    let options = JobOptions {
        queue: Some(s.def.queue.clone()),
        idempotency_key: Some(schedule::tick_key(&s.def.name, tick)),
        countdown: None,
        ..s.def.options.clone()
    };
    NewJob {
        id: new_job_id(),
        task: s.def.task.clone(),
        queue: s.def.queue.clone(),
        args: s.def.args.clone(),
        options,
        created_at: now,
        run_at: None,
    }
}

/// What a loop knows of the schedules between its passes: their heads as it last read them,
/// each with its next tick, and the store's count of changes ([`Store::schedule_changes`]) they
/// are good for. Reading 20,000 heads took about 40 ms of every pass, four passes a second in
/// every process; a pass now reads one count, and the heads only when it moved by more than
/// this loop's own firings (each moves it by exactly one, and the cursor it wrote, with the
/// next tick after it, is put in the head kept here). Whatever else happened (another process
/// fired or set a schedule), the count has moved by more and the heads are read again next
/// time, as they are after a pass that failed.
#[derive(Debug, Default)]
pub struct Known {
    heads: Vec<Kept>,
    /// The count the heads are good for; `None`: read them again (also every pass on a store
    /// that keeps no count).
    changes: Option<u64>,
    ticks: NextTicks,
}

/// A schedule's head as a loop keeps it, with its next tick.
#[derive(Debug)]
struct Kept {
    head: ScheduleHead,
    next: Option<Micros>,
}

#[cfg(test)]
thread_local! {
    /// How many times this thread's passes read the schedules' heads, for the tests.
    static HEAD_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Run once right after a pass of this thread has read the heads: where a test makes the
    /// change another process could make during a pass.
    #[allow(clippy::type_complexity)]
    static AFTER_HEADS: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Each schedule's next tick as a loop last worked it out, with the spec and cursor it was
/// worked out from. A pass runs four times a second in every process, and finding a cron's next
/// tick takes tens of microseconds: searched afresh each pass, 20,000 daily schedules kept an
/// idle `homing up` at 90 % of a core and another schedule's ticks up to 2 s late. The tick
/// depends on the spec and the cursor alone, so it is searched again only when one of them
/// changed (a tick fired, here or in another process; the schedule set anew), and for every
/// schedule once in [`NextTicks::KEPT`]: the time zone library reloads the system's zone rules
/// every few minutes, and a tick found under old rules would otherwise stay.
#[derive(Debug)]
struct NextTicks {
    by_name: HashMap<String, (Spec, Micros, Option<Micros>)>,
    since: std::time::Instant,
}

impl Default for NextTicks {
    fn default() -> Self {
        Self {
            by_name: HashMap::new(),
            since: std::time::Instant::now(),
        }
    }
}

impl NextTicks {
    /// How long a tick found is kept at most.
    const KEPT: Duration = Duration::from_secs(300);

    /// The head's next tick, and whether it had to be searched for.
    fn of(&mut self, head: &ScheduleHead) -> (Option<Micros>, bool) {
        if let Some((spec, cursor, next)) = self.by_name.get(&head.name) {
            if *cursor == head.cursor && *spec == head.spec {
                return (*next, false);
            }
        }
        let next = head.next_tick();
        self.by_name
            .insert(head.name.clone(), (head.spec.clone(), head.cursor, next));
        (next, true)
    }
}

/// Enqueues every schedule's due ticks at `now`; returns how many jobs this call inserted.
/// A pass reads the store's count of schedule changes, every unpaused schedule's head (name,
/// spec, cursor) only when that count says they changed ([`Known`]), and the whole schedule,
/// args and all, only when a tick is due. A schedule the store refuses for its own data (say,
/// its queue is over the queue bound) is logged and passed over; the others go on. The pass
/// fails only when the store is unavailable.
pub async fn fire_due(
    broker: &dyn Broker,
    store: &dyn Store,
    now: Micros,
    known: &mut Known,
) -> Result<usize> {
    let mut total = 0;
    // Read before the heads: a change committed in between is in the heads and counted later,
    // so at worst they are read once more; read after them, it could be counted and missing.
    let changes = store.schedule_changes().await?;
    if known.ticks.since.elapsed() > NextTicks::KEPT {
        // Every tick searched afresh, on heads read afresh.
        known.ticks = NextTicks::default();
        known.changes = None;
    }
    if changes.is_none() || known.changes != changes {
        let heads = store.schedule_heads().await?;
        #[cfg(test)]
        HEAD_READS.with(|n| n.set(n.get() + 1));
        #[cfg(test)]
        AFTER_HEADS.with(|f| f.borrow_mut().take().map(|f| f()));
        // Schedules deleted or paused since the last read are forgotten.
        let listed: HashSet<&str> = heads.iter().map(|h| h.name.as_str()).collect();
        known
            .ticks
            .by_name
            .retain(|name, _| listed.contains(name.as_str()));
        known.heads = Vec::with_capacity(heads.len());
        for (i, head) in heads.into_iter().enumerate() {
            let (next, searched) = known.ticks.of(&head);
            // Working out a schedule's ticks awaits nothing, and a worker's runtime may have one
            // thread (its default): without a yield here a long list, or a cron whose next tick
            // takes long to find, would hold up the process's heartbeat and jobs for the pass.
            if searched || i % 256 == 255 {
                tokio::task::yield_now().await;
            }
            known.heads.push(Kept { head, next });
        }
    }
    // A pass that fails reads the heads again next time.
    known.changes = None;
    let mut own = 0u64;
    let Known { heads, ticks, .. } = &mut *known;
    for kept in heads.iter_mut() {
        if kept.next.is_none_or(|t| t > now) {
            continue;
        }
        let head = &mut kept.head;
        // Read whole, and decided as it stands now. If it differs from the head kept (or is
        // gone, or another scheduler fires it first), a change was made after the count above
        // was read, so the count will have moved by more than this pass's own firings.
        let Some(s) = store.schedule(&head.name).await? else {
            continue;
        };
        if let Some((cursor, jobs)) = fire_one(broker, store, &s, now).await? {
            total += jobs;
            own += 1;
            head.cursor = cursor;
            kept.next = ticks.of(head).0;
        }
    }
    // The count as of the read above, the value it had before this pass's firings moved it:
    // read again now, it could include another process's change that the heads lack.
    known.changes = changes.map(|c| c + own);
    Ok(total)
}

/// Enqueues one schedule's due ticks: the cursor it moved to and how many jobs it inserted, or
/// `None` when it moved no cursor (nothing due, paused, another scheduler first, refused).
async fn fire_one(
    broker: &dyn Broker,
    store: &dyn Store,
    s: &Schedule,
    now: Micros,
) -> Result<Option<(Micros, usize)>> {
    if s.paused {
        return Ok(None);
    }
    // An interval counts from the cursor, which is always one of its ticks (or its anchor).
    let Some(due) = schedule::due(&s.def.spec, s.cursor, s.cursor, now, s.def.missed) else {
        return Ok(None);
    };
    let firing = Firing {
        name: s.def.name.clone(),
        expected_cursor: s.cursor,
        new_cursor: due.cursor,
        jobs: due
            .fire
            .iter()
            .map(|t| (*t, tick_job(s, *t, now)))
            .collect(),
    };
    let inserted = match store.fire_schedule(&firing, now).await {
        Ok(Some(i)) => i,
        // Another scheduler took these ticks first.
        Ok(None) => return Ok(None),
        Err(e) if e.is_transient() => return Err(e),
        Err(e) => {
            tracing::error!(schedule = %s.def.name, error = %e, "a schedule's ticks could not be enqueued; the other schedules go on");
            return Ok(None);
        }
    };
    let fresh: Vec<ToPublish> = inserted
        .iter()
        .filter(|i| i.needs_dispatch())
        .map(|i| ToPublish {
            id: i.id,
            queue: i.queue.clone(),
            priority: s.def.options.priority.unwrap_or(0),
        })
        .collect();
    for i in inserted.iter().filter(|i| !i.existed) {
        crate::metrics::count(crate::metrics::JOBS_ENQUEUED, &i.queue, &s.def.task);
    }
    // Committed: a failed publish leaves them undispatched for the reconciler.
    if let Err(e) = publish(broker, store, &fresh).await {
        tracing::warn!(error = %e, "publishing a schedule's ticks failed; the reconciler will publish them");
    }
    Ok(Some((firing.new_cursor, fresh.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An embedded file in a directory of its own, kept as long as the directory is.
    async fn embedded() -> (tempfile::TempDir, crate::backend::Backends) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("h.db").display());
        let b = crate::backend::Backends::open(&url, &url).await.unwrap();
        (dir, b)
    }

    /// On a one-thread runtime (a worker's default) a pass over schedules lets the process's
    /// other tasks run between them. Without the yield, a pass over schedules none of which is
    /// due awaits nothing, and the counting task below would not run once during it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_pass_over_many_schedules_lets_other_tasks_run_between_them() {
        let (_dir, b) = embedded().await;
        let t0 = now();
        for i in 0..50 {
            let def = crate::conformance::schedules::def(&format!("s{i}"), "periodic-q", 3600);
            b.store.put_schedule(&def, t0).await.unwrap();
        }
        let other = crate::conformance::OtherTask::start().await;
        let before = other.runs();
        let fired = fire_due(&*b.broker, &*b.store, t0 + 1_000_000, &mut Known::default())
            .await
            .unwrap();
        let during = other.runs() - before;
        drop(other);
        assert_eq!(fired, 0, "no schedule is due an hour early");
        assert!(
            during >= 25,
            "the other task ran {during} times during a pass over 50 schedules"
        );
    }
    /// A pass over schedules that have not changed searches for no tick; one set anew (another
    /// spec) or fired (another cursor) is searched again, and fires on time.
    #[tokio::test(flavor = "current_thread")]
    async fn only_schedules_that_changed_are_searched_again() {
        let (_dir, b) = embedded().await;
        let def = crate::conformance::schedules::def;
        let t0 = crate::schedule::whole_second(now());
        const S: Micros = 1_000_000;
        for i in 0..20 {
            let mut d = def(&format!("s{i}"), "periodic-q", 3600);
            if i % 2 == 0 {
                // Half a day from now, so that no tick of it falls in the seconds this test spans.
                let hour = (t0 / S / 3600 + 12) % 24;
                d.spec = Spec::Cron {
                    expr: format!("0 {hour} * * *"),
                    timezone: "UTC".into(),
                };
            }
            b.store.put_schedule(&d, t0).await.unwrap();
        }
        let searches = || schedule::SEARCHES.with(|n| n.get());
        let mut known = Known::default();
        let (broker, store) = (&*b.broker, &*b.store);

        let before = searches();
        let fired = fire_due(broker, store, t0 + S, &mut known).await.unwrap();
        assert_eq!(fired, 0, "nothing is due");
        assert!(searches() - before >= 20, "the first pass searches each");
        let before = searches();
        let fired = fire_due(broker, store, t0 + 2 * S, &mut known)
            .await
            .unwrap();
        assert_eq!(fired, 0);
        assert_eq!(searches() - before, 0, "nothing changed, nothing searched");

        // Set anew with another spec: searched again, and its ticks fire.
        store
            .put_schedule(&def("s1", "periodic-q", 1), t0 + 2 * S)
            .await
            .unwrap();
        let fired = fire_due(broker, store, t0 + 4 * S, &mut known)
            .await
            .unwrap();
        assert!(fired >= 1, "the schedule set to every second fired");
        // Its cursor moved with the firing, and its next tick was searched then: due no sooner
        // than that tick, and searched no more meanwhile.
        let before = searches();
        let fired = fire_due(broker, store, t0 + 4 * S, &mut known)
            .await
            .unwrap();
        assert_eq!(fired, 0);
        assert_eq!(searches() - before, 0, "searched when it fired, not again");
        let fired = fire_due(broker, store, t0 + 6 * S, &mut known)
            .await
            .unwrap();
        assert!(fired >= 1, "it fires at its next tick");
        // A deleted schedule is forgotten.
        assert!(store.delete_schedule("s2").await.unwrap());
        fire_due(broker, store, t0 + 6 * S, &mut known)
            .await
            .unwrap();
        assert!(!known.ticks.by_name.contains_key("s2"));
        assert_eq!(known.ticks.by_name.len(), 19);
        // Past its keeping time every tick is searched again (zone rules may have changed).
        let before = searches();
        fire_due(broker, store, t0 + 6 * S, &mut known)
            .await
            .unwrap();
        assert_eq!(searches() - before, 0);
        if let Some(long_ago) = known
            .ticks
            .since
            .checked_sub(NextTicks::KEPT + Duration::from_secs(1))
        {
            known.ticks.since = long_ago;
            let before = searches();
            fire_due(broker, store, t0 + 6 * S, &mut known)
                .await
                .unwrap();
            assert!(searches() - before >= 19, "searched afresh");
        }
    }

    /// The heads are read again only when the store counted a change that was not this loop's
    /// own firing: not while nothing changes, not after this loop fired (the cursor it wrote is
    /// kept), but after another loop fired, a schedule was set, paused or deleted; and whatever
    /// was read, each tick still gets one job.
    #[tokio::test(flavor = "current_thread")]
    async fn heads_are_read_again_only_after_changes_not_made_here() {
        let (_dir, b) = embedded().await;
        let def = crate::conformance::schedules::def;
        let t0 = crate::schedule::whole_second(now());
        const S: Micros = 1_000_000;
        let (broker, store) = (&*b.broker, &*b.store);
        for i in 0..10 {
            let d = def(&format!("h{i}"), "periodic-q", 3600);
            store.put_schedule(&d, t0).await.unwrap();
        }
        store
            .put_schedule(&def("every", "periodic-q", 1), t0)
            .await
            .unwrap();
        let reads = || HEAD_READS.with(|n| n.get());
        let (mut here, mut there) = (Known::default(), Known::default());

        let before = reads();
        assert_eq!(fire_due(broker, store, t0 + S, &mut here).await.unwrap(), 1);
        assert_eq!(reads() - before, 1, "the first pass reads the heads");
        let before = reads();
        let fired = fire_due(broker, store, t0 + S + S / 2, &mut here)
            .await
            .unwrap();
        assert_eq!(fired, 0);
        assert_eq!(
            reads() - before,
            0,
            "only this loop's own firing changed them"
        );
        assert_eq!(
            fire_due(broker, store, t0 + 2 * S, &mut here)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            fire_due(broker, store, t0 + 3 * S, &mut here)
                .await
                .unwrap(),
            1
        );
        assert_eq!(reads() - before, 0, "firing every second reads nothing");

        // Another loop (another process, as far as the store can tell) fires the next tick.
        assert_eq!(
            fire_due(broker, store, t0 + 4 * S, &mut there)
                .await
                .unwrap(),
            1
        );
        let before = reads();
        let fired = fire_due(broker, store, t0 + 4 * S, &mut here)
            .await
            .unwrap();
        assert_eq!(fired, 0, "the other loop took that tick");
        assert_eq!(reads() - before, 1, "its firing was counted: read again");
        assert_eq!(
            fire_due(broker, store, t0 + 5 * S, &mut here)
                .await
                .unwrap(),
            1
        );

        // Set anew, paused, deleted: each read again, and acted on.
        store
            .put_schedule(&def("h3", "periodic-q", 1), t0 + 5 * S)
            .await
            .unwrap();
        let before = reads();
        let fired = fire_due(broker, store, t0 + 6 * S, &mut here)
            .await
            .unwrap();
        assert_eq!(
            fired, 2,
            "the schedule set to every second fired with the other"
        );
        assert_eq!(reads() - before, 1);
        store
            .pause_schedule("every", true, t0 + 6 * S)
            .await
            .unwrap();
        let before = reads();
        let fired = fire_due(broker, store, t0 + 7 * S, &mut here)
            .await
            .unwrap();
        assert_eq!(fired, 1, "the paused one fires no more");
        assert_eq!(reads() - before, 1);
        assert!(store.delete_schedule("h3").await.unwrap());
        let before = reads();
        let fired = fire_due(broker, store, t0 + 8 * S, &mut here)
            .await
            .unwrap();
        assert_eq!(fired, 0, "the deleted one fires no more");
        assert_eq!(reads() - before, 1);
        assert!(!here
            .heads
            .iter()
            .any(|k| k.head.name == "h3" || k.head.name == "every"));
        assert!(!here.ticks.by_name.contains_key("h3"));

        // Each tick got one job, whichever loop fired it.
        let page = store
            .list(
                &crate::store::JobFilter {
                    queue: Some("periodic-q".into()),
                    ..Default::default()
                },
                None,
                100,
            )
            .await
            .unwrap();
        assert_eq!(
            page.jobs.len(),
            8,
            "ticks 1-6 of one schedule, 6 and 7 of the other"
        );
    }

    /// A change made elsewhere while a pass runs (right after it read the heads, so they lack
    /// it) is seen by the next pass. Fails if the count is read after the heads, or read again
    /// at the end of the pass: either would count the change as if the heads held it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_change_made_during_a_pass_is_seen_by_the_next() {
        let (dir, b) = embedded().await;
        let def = crate::conformance::schedules::def;
        let t0 = crate::schedule::whole_second(now());
        const S: Micros = 1_000_000;
        let (broker, store) = (&*b.broker, &*b.store);
        store
            .put_schedule(&def("hourly", "periodic-q", 3600), t0)
            .await
            .unwrap();
        store
            .put_schedule(&def("every", "periodic-q", 1), t0)
            .await
            .unwrap();
        // Another process on the same file sets `hourly` to every second.
        let url = format!("sqlite://{}", dir.path().join("h.db").display());
        AFTER_HEADS.with(|f| {
            *f.borrow_mut() = Some(Box::new(move || {
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let other = crate::backend::Backends::open(&url, &url).await.unwrap();
                        other
                            .store
                            .put_schedule(&def("hourly", "periodic-q", 1), t0)
                            .await
                            .unwrap();
                    });
                })
                .join()
                .unwrap();
            }));
        });
        let mut known = Known::default();
        let fired = fire_due(broker, store, t0 + S, &mut known).await.unwrap();
        assert_eq!(
            fired, 1,
            "`every` fired; `hourly` was hourly in the heads read"
        );
        assert!(
            AFTER_HEADS.with(|f| f.borrow().is_none()),
            "the change was made"
        );
        let fired = fire_due(broker, store, t0 + 2 * S, &mut known)
            .await
            .unwrap();
        assert_eq!(
            fired, 3,
            "`every`'s next tick, and `hourly`'s two under its new spec"
        );
    }
}
