//! The long-running commands: `homing up` (everything in one process), `homing server` (API and
//! maintenance) and `homing worker`. All stop gracefully on SIGTERM/SIGINT.

use anyhow::Context as _;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::open;
use crate::api::{self, AppState};
use crate::cli::{Global, ServerArgs, UpArgs, WorkerArgs, WorkerTuning};
use crate::{signals, tasks};
use homing::maintenance::{Maintenance, MaintenanceConfig};
use homing::{Backends, Worker, WorkerConfig};

fn worker_config(
    queues: Vec<String>,
    t: &WorkerTuning,
    maintenance: bool,
) -> anyhow::Result<WorkerConfig> {
    for q in &queues {
        homing::client::validate_name("queue", q)?;
    }
    if t.heartbeat_interval < Duration::from_millis(10) {
        anyhow::bail!("--heartbeat-interval must be at least 10ms");
    }
    Ok(WorkerConfig {
        queues,
        concurrency: t.concurrency,
        prefetch: t.prefetch,
        heartbeat_interval: t.heartbeat_interval,
        shutdown_grace: t.shutdown_grace,
        maintenance,
        maintenance_config: None,
        name: None,
    })
}

async fn serve_api(
    backends: Backends,
    listen: std::net::SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let state = AppState::new(backends, tasks::registry());
    let auth = if state.token.is_some() {
        " (API token required)"
    } else {
        ""
    };
    println!("homing is up: http://{addr}/  (API under http://{addr}/v1){auth}");
    tracing::info!(%addr, "HTTP API listening");
    axum::serve(listener, api::router(state))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
        .context("HTTP server failed")
}

pub async fn up(g: &Global, a: UpArgs) -> anyhow::Result<ExitCode> {
    let backends = open(g, true).await?;
    let stop = signals::shutdown_token();
    let config = worker_config(a.queues.clone(), &a.tuning, true)?;
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        tasks::registry(),
        config,
    );
    let worker_stop = CancellationToken::new();
    let worker_task = tokio::spawn(worker.run(worker_stop.clone()));
    let pipeline_workers =
        crate::pipelines::spawn_workers(&backends, &a.tuning, &a.queues, &worker_stop);
    let api = serve_api(backends, a.listen, stop.clone()).await;
    // The API is down (signal or error): let the workers finish gracefully.
    worker_stop.cancel();
    let worker_result = worker_task.await.context("worker task failed")?;
    for w in pipeline_workers {
        w.await.context("worker task failed")??;
    }
    api?;
    worker_result?;
    Ok(ExitCode::SUCCESS)
}

pub async fn server(g: &Global, a: ServerArgs) -> anyhow::Result<ExitCode> {
    let backends = open(g, true).await?;
    let stop = signals::shutdown_token();
    let mc = MaintenanceConfig {
        rescue_interval: a.rescue_interval,
        ..Default::default()
    };
    let maintenance = Maintenance::spawn(
        backends.broker.clone(),
        backends.store.clone(),
        mc,
        stop.child_token(),
    );
    let api = serve_api(backends, a.listen, stop.clone()).await;
    stop.cancel();
    maintenance.stop().await;
    api?;
    Ok(ExitCode::SUCCESS)
}

pub async fn worker(g: &Global, a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let backends = open(g, true).await?;
    let stop = signals::shutdown_token();
    let mut bridge = super::celery::Bridge::new(
        g,
        &a.celery,
        &backends,
        tasks::registry(),
        a.tuning.heartbeat_interval,
    )?;
    let mut queues = a.queues;
    for q in &a.celery.celery_queues {
        if !queues.contains(q) {
            queues.push(q.clone());
        }
    }
    let config = worker_config(queues, &a.tuning, !a.no_maintenance)?;
    let ingress = bridge.spawn(&stop);
    let worker = Worker::new(
        backends.broker,
        backends.store,
        bridge.registry.clone(),
        config,
    );
    let result = worker.run(stop).await;
    if let Some(i) = ingress {
        i.await.context("Celery ingress failed")??;
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
