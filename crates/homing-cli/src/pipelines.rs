//! The seeds' pipelines (crate `homing-pipelines`) wired into this binary: their tasks join the
//! registry, their routes join the API, and `homing up` runs a worker for each of their queues
//! with the limits the seeds chose (`ocr`: one at a time, prefetch 1).
//!
//! Only the commands that run the pipelines' tasks or serve their routes (`up`, `server`,
//! `worker`) read their settings, with [`configured`], and pass the handle on; a mistake there
//! (a bad `HOMING_BGM_SECONDS`) stops those commands at start with a one-line reason and leaves
//! `homing jobs`, `homing enqueue` and the other read-and-steer commands working.

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::{Global, WorkerTuning};
use homing::{Backends, Registry, Worker, WorkerConfig};
use homing_pipelines::{Pipelines, Settings, QUEUES};

/// The pipelines as the environment configures them, for a process that runs their tasks or
/// serves their routes: the same `--store` and variables give a server and its workers the same
/// files.
pub fn configured(g: &Global) -> anyhow::Result<Pipelines> {
    let settings = Settings::from_env(&g.store).context("invalid pipeline settings")?;
    Ok(Pipelines::new(settings))
}

/// The pipelines for a command that only names or routes their tasks (`homing enqueue`,
/// `homing jobs`): their handlers never run there, so their settings are not read.
pub fn for_routing() -> Pipelines {
    Pipelines::new(Settings::in_dir("homing-data"))
}

/// Starts a worker running `registry` for every pipeline queue not already in `taken`; the
/// caller's worker runs the maintenance loops, these do not.
pub fn spawn_workers(
    backends: &Backends,
    registry: &Registry,
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
                registry.clone(),
                config,
            );
            tokio::spawn(worker.run(stop.clone()))
        })
        .collect()
}
