//! The seeds' pipelines (crate `homing-pipelines`) wired into this binary: their tasks join the
//! registry, their routes join the API, and `homing up` runs a worker for each of their queues
//! with the limits the seeds chose (`ocr`: one at a time, prefetch 1).
//!
//! One handle per process, set up from the command's `--store` before anything else runs, so a
//! server and its workers started with the same flags find the same pipeline files.

use std::sync::OnceLock;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::{Global, WorkerTuning};
use homing::{Backends, Worker, WorkerConfig};
use homing_pipelines::{Pipelines, Settings, QUEUES};

static PIPELINES: OnceLock<Pipelines> = OnceLock::new();

pub fn init(g: &Global) -> anyhow::Result<()> {
    let settings = Settings::from_env(&g.store)?;
    let _ = PIPELINES.set(Pipelines::new(settings));
    Ok(())
}

fn get() -> &'static Pipelines {
    PIPELINES.get_or_init(|| Pipelines::new(Settings::in_dir("homing-data")))
}

pub fn registry() -> homing::Registry {
    get().registry()
}

pub fn router<S: Clone + Send + Sync + 'static>(client: homing::Client) -> axum::Router<S> {
    get().router(client)
}

/// Starts a worker for every pipeline queue not already in `taken`; the caller's worker runs
/// the maintenance loops, these do not.
pub fn spawn_workers(
    backends: &Backends,
    tuning: &WorkerTuning,
    taken: &[String],
    stop: &CancellationToken,
) -> Vec<JoinHandle<homing::Result<()>>> {
    QUEUES
        .iter()
        .filter(|q| !taken.iter().any(|t| t == q.name))
        .map(|q| {
            let config = WorkerConfig {
                queues: vec![q.name.to_string()],
                concurrency: q.concurrency,
                prefetch: Some(q.prefetch),
                heartbeat_interval: tuning.heartbeat_interval,
                shutdown_grace: tuning.shutdown_grace,
                maintenance: false,
                maintenance_config: None,
                name: None,
            };
            let worker = Worker::new(
                backends.broker.clone(),
                backends.store.clone(),
                crate::tasks::registry(),
                config,
            );
            tokio::spawn(worker.run(stop.clone()))
        })
        .collect()
}
