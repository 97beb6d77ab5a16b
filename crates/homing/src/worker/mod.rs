//! The worker runtime: runs registered tasks from one or more queues with a concurrency limit,
//! and carries out docs/design.md section 4 for every delivery.
//!
//! A worker lives as a series of *sessions*, each under a fresh identity. A session ends when the
//! worker is asked to stop (graceful shutdown) or when it finds it was presumed dead (its
//! heartbeat expired, e.g. after a long pause): then it cancels its running handlers, whose
//! commits the fencing epoch would reject anyway, and starts a new session under a new name.
//!
//! One file per agent: [`fetcher`] reserves messages, [`executor`] runs one delivery,
//! [`committer`] commits outcomes and acknowledges in batches, [`heartbeater`] keeps the worker
//! alive and relays cancel requests. The maintenance loops (rescuer, scheduler, reconciler) run
//! beside it, see [`crate::maintenance`].

mod committer;
mod executor;
mod fetcher;
mod heartbeater;
mod strays;

/// The retry rule of a handler error, shared with remote workers ([`crate::remote`]).
pub(crate) use executor::outcome_for_error;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::{Broker, Delivery};
use crate::error::Result;
use crate::events::{NewEvent, WORKER_READY, WORKER_SHUTDOWN};
use crate::job::JobId;
use crate::maintenance::{Maintenance, MaintenanceConfig};
use crate::store::{Store, WorkerInfo, WorkerStatus};
use crate::task::Registry;
use crate::time::now;

/// How a worker runs. `Default` gives homing's defaults (docs/design.md section 6).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub queues: Vec<String>,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Messages reserved at once (running or waiting for a slot); defaults to `concurrency`.
    pub prefetch: Option<usize>,
    /// How often the heartbeat is refreshed; it expires after three intervals.
    pub heartbeat_interval: Duration,
    /// On SIGTERM, how long running jobs may take to finish before they are released.
    pub shutdown_grace: Duration,
    /// Run the rescuer, scheduler and reconciler in this process too.
    pub maintenance: bool,
    /// Intervals of the maintenance loops; `None` derives them from the heartbeat interval.
    pub maintenance_config: Option<MaintenanceConfig>,
    /// A prefix for the worker's identity (defaults to the host name).
    pub name: Option<String>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            queues: vec!["default".into()],
            concurrency: 8,
            prefetch: None,
            heartbeat_interval: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(25),
            maintenance: true,
            maintenance_config: None,
            name: None,
        }
    }
}

impl WorkerConfig {
    pub fn heartbeat_ttl(&self) -> Duration {
        self.heartbeat_interval * 3
    }

    pub fn prefetch(&self) -> usize {
        self.prefetch.unwrap_or(self.concurrency).max(1)
    }
}

/// Why a running handler is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// An operator cancelled the job: commit `cancelled`.
    Cancelled,
    /// Graceful shutdown ran out of grace: release the job, count nothing.
    Shutdown,
    /// This worker was presumed dead: commit nothing; the rescuer owns the job now.
    Lost,
}

pub(crate) struct RunningJob {
    pub token: CancellationToken,
    pub reason: Mutex<Option<StopReason>>,
}

impl RunningJob {
    pub fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        drop(r);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The SQLite file both the store and the broker live in, if they share one: then a round's
/// writes (commit, acknowledgement, the next reservation and start) can be one transaction.
#[cfg(feature = "sqlite")]
fn shared_db(s: &Session) -> Option<Arc<crate::sqlite::Db>> {
    match (s.store.embedded_db(), s.broker.embedded_db()) {
        (Some(a), Some(b)) if Arc::ptr_eq(a, b) => Some(a.clone()),
        _ => None,
    }
}

/// What one session shares between its agents.
pub(crate) struct Session {
    pub id: String,
    pub broker: Arc<dyn Broker>,
    pub store: Arc<dyn Store>,
    pub registry: Registry,
    pub config: WorkerConfig,
    pub running: Mutex<HashMap<JobId, Arc<RunningJob>>>,
    /// Jobs whose handler has ended and whose outcome is on its way to the store: still
    /// `running` there, but not to be run again by a duplicate delivery meanwhile.
    pub committing: Mutex<HashSet<JobId>>,
    /// Held shared by every start (the store call and the claiming of what it started, with no
    /// await between), and exclusively by the check for a start whose answer was lost: that
    /// check must never see a job another start of this session has just begun but not yet
    /// claimed, or it would run the job a second time under the same epoch.
    pub start_gate: Arc<tokio::sync::RwLock<()>>,
    /// Free handler slots.
    pub slots: Arc<Semaphore>,
    /// Free reservations (prefetch).
    pub reservations: Arc<Semaphore>,
    /// Reservations held by the committer until their messages are acknowledged
    /// (`committer::Returning`).
    pub returning: Arc<std::sync::atomic::AtomicUsize>,
    /// Cancelled when this session learns it was presumed dead.
    pub lost: CancellationToken,
    /// Cancelled when the worker should stop reserving (shutdown requested).
    pub stopping: CancellationToken,
    pub commits: mpsc::Sender<committer::Item>,
    pub executors: TaskTracker,
    /// Store `start` calls that failed in a row: how long the executor pauses before the next.
    pub start_failures: std::sync::atomic::AtomicU32,
    /// The deliveries this session holds, for the sweep for strays (`strays`).
    pub received: strays::Received,
}

impl Session {
    pub fn stop_all(&self, reason: StopReason) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for r in running.values() {
            r.stop(reason);
        }
    }

    /// Hands messages back to the broker. They stop being this session's before the call, so
    /// that should it fail, the stray sweep puts them back instead of leaving them reserved here
    /// until the worker is gone.
    pub async fn hand_back(&self, deliveries: &[Delivery]) -> crate::error::Result<usize> {
        self.received.forget(deliveries);
        self.broker.requeue(&self.id, deliveries).await
    }

    /// [`Session::hand_back`], with a failure logged: the messages are not lost, the stray sweep
    /// (or, once the worker is gone, the rescuer) puts them back.
    pub async fn hand_back_or_log(&self, deliveries: &[Delivery]) {
        if let Err(e) = self.hand_back(deliveries).await {
            tracing::warn!(error = %e, count = deliveries.len(), "could not hand back messages; the stray sweep or the rescuer will");
        }
    }

    pub fn running_ids(&self) -> Vec<JobId> {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }
}

enum SessionEnd {
    Shutdown,
    Lost,
}

/// A worker process's runtime.
pub struct Worker {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
    config: WorkerConfig,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("tasks", &self.registry)
            .finish()
    }
}

/// A unique identity for one worker session: host, pid and a random suffix.
fn new_identity(prefix: Option<&str>) -> String {
    let host = prefix
        .map(str::to_string)
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    format!(
        "{host}-{}-{:06x}",
        std::process::id(),
        fastrand::u32(..0xff_ffff)
    )
}

impl Worker {
    pub fn new(
        broker: Arc<dyn Broker>,
        store: Arc<dyn Store>,
        registry: Registry,
        config: WorkerConfig,
    ) -> Self {
        Self {
            broker,
            store,
            registry,
            config,
        }
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully (docs/design.md section 4).
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let maintenance = if self.config.maintenance {
            let mc = self.config.maintenance_config.clone().unwrap_or_else(|| {
                MaintenanceConfig::for_heartbeat(self.config.heartbeat_interval)
            });
            Some(Maintenance::spawn(
                self.broker.clone(),
                self.store.clone(),
                mc,
                shutdown.child_token(),
            ))
        } else {
            None
        };
        let result = loop {
            match self.session(&shutdown).await {
                Ok(SessionEnd::Shutdown) => break Ok(()),
                Ok(SessionEnd::Lost) => {
                    if shutdown.is_cancelled() {
                        break Ok(());
                    }
                    continue;
                }
                Err(e) if e.is_transient() && !shutdown.is_cancelled() => {
                    tracing::warn!(error = %e, "cannot start a worker session; retrying in 1s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => break Err(e),
            }
        };
        if let Some(m) = maintenance {
            m.stop().await;
        }
        result
    }

    async fn session(&self, shutdown: &CancellationToken) -> Result<SessionEnd> {
        let id = new_identity(self.config.name.as_deref());
        let ttl = self.config.heartbeat_ttl();
        self.broker.register(&id, ttl).await?;
        let info = WorkerInfo {
            id: id.clone(),
            hostname: std::fs::read_to_string("/etc/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            pid: std::process::id(),
            queues: self.config.queues.clone(),
            concurrency: self.config.concurrency as u32,
            tasks: self.registry.names(),
            started_at: now(),
            remote: None,
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            heartbeat_ttl_ms: Some(ttl.as_millis().min(u64::MAX as u128) as u64),
        };
        self.store.register_worker(&info, now()).await?;
        // The seeds' worker_ready alert. Losing it to a store hiccup must not stop the worker.
        let ready = NewEvent::worker(
            WORKER_READY,
            &id,
            serde_json::json!({
                "hostname": info.hostname,
                "pid": info.pid,
                "queues": info.queues,
                "concurrency": info.concurrency,
            }),
        );
        if let Err(e) = self.store.record_event(ready, now()).await {
            tracing::warn!(error = %e, "could not record the worker.ready event");
        }
        tracing::info!(
            event = "worker.ready",
            worker = %id,
            queues = ?self.config.queues,
            concurrency = self.config.concurrency,
            prefetch = self.config.prefetch(),
            "worker ready"
        );

        let (tx, rx) = mpsc::channel(4096);
        let session = Arc::new(Session {
            id: id.clone(),
            broker: self.broker.clone(),
            store: self.store.clone(),
            registry: self.registry.clone(),
            config: self.config.clone(),
            running: Mutex::new(HashMap::new()),
            committing: Mutex::new(HashSet::new()),
            start_gate: Arc::default(),
            slots: Arc::new(Semaphore::new(self.config.concurrency.max(1))),
            reservations: Arc::new(Semaphore::new(self.config.prefetch())),
            returning: Arc::default(),
            lost: CancellationToken::new(),
            stopping: shutdown.child_token(),
            commits: tx,
            executors: TaskTracker::new(),
            start_failures: std::sync::atomic::AtomicU32::new(0),
            received: strays::Received::for_broker(self.broker.as_ref()),
        });
        let committer_done = CancellationToken::new();
        let committer = tokio::spawn(committer::run(session.clone(), rx, committer_done.clone()));
        let hb_stop = CancellationToken::new();
        let heartbeater = tokio::spawn(heartbeater::run(session.clone(), hb_stop.clone()));
        let sweeper = tokio::spawn(strays::run(session.clone(), hb_stop.clone()));

        fetcher::run(session.clone()).await;

        let end = if session.lost.is_cancelled() {
            tracing::warn!(
                event = "worker.presumed_dead",
                worker = %id,
                "this worker was presumed dead (its heartbeat expired, or the store refused a start); cancelling its handlers and rejoining under a new identity"
            );
            session.stop_all(StopReason::Lost);
            SessionEnd::Lost
        } else {
            let grace = self.config.shutdown_grace;
            let n = session.running_ids().len();
            if n > 0 {
                tracing::info!(worker = %id, running = n, grace = ?grace, "shutting down: waiting for running jobs");
            }
            session.executors.close();
            if tokio::time::timeout(grace, session.executors.wait())
                .await
                .is_err()
            {
                tracing::warn!(worker = %id, "shutdown grace over: releasing unfinished jobs");
                session.stop_all(StopReason::Shutdown);
            }
            SessionEnd::Shutdown
        };
        session.executors.close();
        session.executors.wait().await;
        hb_stop.cancel();
        committer_done.cancel();
        let _ = heartbeater.await;
        let _ = sweeper.await;
        let _ = committer.await;
        Ok(self.finish(end, &id).await)
    }

    async fn finish(&self, end: SessionEnd, id: &str) -> SessionEnd {
        if let SessionEnd::Shutdown = end {
            if let Err(e) = self.broker.unregister(id).await {
                tracing::warn!(error = %e, "could not remove the heartbeat");
            }
            let ev = NewEvent::worker(
                WORKER_SHUTDOWN,
                id,
                serde_json::json!({ "queues": self.config.queues }),
            );
            // Ok(false): a rescuer already declared this worker lost (it paused past its TTL).
            if let Err(e) = self
                .store
                .worker_gone(id, WorkerStatus::Stopped, Some(ev), now())
                .await
            {
                tracing::warn!(error = %e, "could not record the worker's stop");
            }
            tracing::info!(event = "worker.shutdown", worker = %id, "worker stopped gracefully");
        }
        end
    }
}
