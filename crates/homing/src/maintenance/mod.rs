//! The loops that keep the system whole whatever crashed: they run in every worker and in the
//! server, and each is safe to run many times at once (every step is conditional in the store or
//! the broker, so at most one caller wins each reclaim or dispatch).
//!
//! - [`rescuer`]: puts back the messages of workers whose heartbeat expired, counting the crash.
//! - [`scheduler`]: turns scheduled jobs whose time has come into queued ones.
//! - [`periodic`]: enqueues periodic schedules' ticks, exactly one job per tick.
//! - [`reconciler`]: publishes what the store lists as undispatched, notices a broker that lost
//!   its data, and recovers running jobs whose worker and message are both gone.
//! - [`pruner`]: deletes finished jobs, delivered events, departed workers and dead letters
//!   older than the retention period.
//! - [`listener`]: publishes at once the jobs other parties enqueued straight into the store
//!   (transactional enqueue, `homing_enqueue`), when the store can signal them (PostgreSQL).
//! - [`rollup`]: folds finished jobs and queue depths into the charts' per-minute and per-hour
//!   rollups (docs/charts.md); only where `stats_interval` is set (the API server).
//! - [`notifier`]: fans pending events out into webhook deliveries (started separately, by
//!   the processes that hold the webhook configuration).

pub mod listener;
pub mod notifier;
pub mod periodic;
pub mod pruner;
pub mod reconciler;
pub mod rescuer;
pub mod rollup;
pub mod scheduler;

use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::store::Store;

/// Intervals of the maintenance loops.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceConfig {
    pub rescue_interval: Duration,
    pub schedule_interval: Duration,
    pub reconcile_interval: Duration,
    /// An undispatched queued job older than this is published by the reconciler.
    pub dispatch_grace: Duration,
    /// How long finished jobs, delivered events, departed workers and dead letters are kept;
    /// `None` keeps them forever. The pruner looks every minute, or every quarter of a shorter
    /// retention.
    pub retention: Option<Duration>,
    /// How often the charts' rollups are brought up to date; `None` leaves them to other
    /// processes (workers: the API server serves the charts and rolls them up).
    pub stats_interval: Option<Duration>,
}

/// The default pace of the charts' rollup where it runs.
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(15);

/// The default retention: a week of history.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl MaintenanceConfig {
    /// Sweeps as often as heartbeats are sent, so recovery takes about `TTL + interval`.
    pub fn for_heartbeat(interval: Duration) -> Self {
        Self {
            rescue_interval: interval,
            schedule_interval: Duration::from_millis(100),
            reconcile_interval: Duration::from_secs(2),
            dispatch_grace: Duration::from_secs(2),
            retention: Some(DEFAULT_RETENTION),
            stats_interval: None,
        }
    }
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self::for_heartbeat(Duration::from_secs(2))
    }
}

/// The running maintenance loops.
#[derive(Debug)]
pub struct Maintenance {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Maintenance {
    pub fn spawn(
        broker: Arc<dyn Broker>,
        store: Arc<dyn Store>,
        config: MaintenanceConfig,
        stop: CancellationToken,
    ) -> Self {
        let stats = config
            .stats_interval
            .map(|every| (store.clone(), config.retention, every));
        let pruner = config.retention.map(|retention| {
            let every = (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
            tokio::spawn(pruner::run(
                broker.clone(),
                store.clone(),
                retention,
                every,
                stop.clone(),
            ))
        });
        let mut tasks = vec![
            tokio::spawn(rescuer::run(
                broker.clone(),
                store.clone(),
                config.rescue_interval,
                stop.clone(),
            )),
            tokio::spawn(scheduler::run(
                broker.clone(),
                store.clone(),
                config.schedule_interval,
                stop.clone(),
            )),
            tokio::spawn(periodic::run(
                broker.clone(),
                store.clone(),
                // Ticks are whole seconds: four looks a second keep them under 250 ms late.
                config.schedule_interval.max(Duration::from_millis(250)),
                stop.clone(),
            )),
            tokio::spawn(listener::run(broker.clone(), store.clone(), stop.clone())),
            tokio::spawn(reconciler::run(broker, store, config, stop.clone())),
        ];
        tasks.extend(pruner);
        if let Some((store, retention, every)) = stats {
            tasks.push(tokio::spawn(rollup::run(
                store,
                retention,
                every,
                stop.clone(),
            )));
        }
        Self { stop, tasks }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// A loop's pace and health record: each pass's outcome goes to [`crate::health::global`], and
/// the wait before the next pass grows while passes keep failing (see [`crate::health::backoff`]).
pub(crate) struct Pace {
    name: &'static str,
    interval: Duration,
    failures: u64,
}

impl Pace {
    pub(crate) fn new(name: &'static str, interval: Duration) -> Self {
        Self {
            name,
            interval,
            failures: 0,
        }
    }

    /// Records a pass; returns how long to wait before the next one.
    pub(crate) fn after<T>(&mut self, outcome: &crate::error::Result<T>) -> Duration {
        match outcome {
            Ok(_) => {
                self.failures = 0;
                crate::health::global().success(self.name);
            }
            Err(_) => {
                self.failures = self.failures.saturating_add(1);
                crate::health::global().failure(self.name);
            }
        }
        crate::health::backoff(self.interval, self.failures)
    }
}

/// Sleeps `d` or until `stop`; returns `false` when stopped.
pub(crate) async fn tick(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.cancelled() => false,
    }
}
