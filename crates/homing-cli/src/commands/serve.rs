//! The long-running commands: `homing up` (everything in one process), `homing server` (API and
//! maintenance) and `homing worker`. All stop gracefully on SIGTERM/SIGINT.
//!
//! `up` and `server` also run the outbox notifier and a small webhook worker (queue
//! `homing.webhooks`), so events reach their subscriptions; a `worker` does so only when it has
//! webhooks configured.

use anyhow::Context as _;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::open_to_serve;
use crate::api::{self, AppState};
use crate::cli::{Global, ServerArgs, UpArgs, WorkerArgs, WorkerTuning};
use crate::config::Config;
use crate::{signals, tasks};
use homing::builtin::webhook::Webhook;
use homing::events::WEBHOOK_QUEUE;
use homing::maintenance::{notifier, Maintenance, MaintenanceConfig};
use homing::{Backends, Registry, Worker, WorkerConfig};
use homing_pipelines::Pipelines;

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
        maintenance_config: Some(MaintenanceConfig {
            retention: t.retention.0,
            ..MaintenanceConfig::for_heartbeat(t.heartbeat_interval)
        }),
        name: None,
    })
}

/// How often the outbox notifier looks for new events.
const NOTIFY_INTERVAL: Duration = Duration::from_millis(250);

/// The small worker that delivers webhooks, on its own queue and slots so that a slow receiver
/// never holds up the user's jobs.
fn webhook_worker(backends: &Backends, config: &Config, heartbeat: Duration) -> Worker {
    let mut registry = Registry::new();
    registry.register(Webhook::new(config.webhooks.clone()));
    let wc = WorkerConfig {
        queues: vec![WEBHOOK_QUEUE.to_string()],
        concurrency: 4,
        heartbeat_interval: heartbeat,
        maintenance: false,
        name: Some("webhooks".into()),
        ..WorkerConfig::default()
    };
    Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        registry,
        wc,
    )
}

/// Event fan-out plus webhook delivery, stopped together.
struct Notifier {
    stop: CancellationToken,
    fan_out: tokio::task::JoinHandle<()>,
    worker: tokio::task::JoinHandle<homing::Result<()>>,
}

impl Notifier {
    fn start(backends: &Backends, config: &Config, heartbeat: Duration) -> Notifier {
        let stop = CancellationToken::new();
        if !config.webhooks.is_empty() {
            let names: Vec<&str> = config.webhooks.iter().map(|w| w.name.as_str()).collect();
            tracing::info!(webhooks = ?names, "delivering events to webhooks");
        }
        let fan_out = notifier::spawn(
            backends.broker.clone(),
            backends.store.clone(),
            config.subscribers(),
            NOTIFY_INTERVAL,
            stop.clone(),
        );
        let worker = tokio::spawn(webhook_worker(backends, config, heartbeat).run(stop.clone()));
        Notifier {
            stop,
            fan_out,
            worker,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.fan_out.await;
        match self.worker.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "webhook worker failed"),
            Err(e) => tracing::warn!(error = %e, "webhook worker panicked"),
            Ok(Ok(())) => {}
        }
    }
}

async fn serve_api(
    backends: Backends,
    pipelines: &Pipelines,
    config: &Config,
    listen: std::net::SocketAddr,
    http: &crate::cli::HttpArgs,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let limits = http.limits();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let mut state = AppState::new(
        backends,
        tasks::registry(pipelines),
        config.api_tokens.clone(),
    );
    state.metrics = api::install_recorder();
    state.unhealthy_after = http.unhealthy_after;
    state.bulk_budget = api::bulk_budget(limits.request_timeout, http.bulk_part);
    state.event_streams = api::event_streams_for(limits.max_connections);
    let auth = if state.tokens.is_empty() {
        ""
    } else {
        " (API token required)"
    };
    // Not `println!`, which panics when standard output is closed (`homing up | head -1`): the
    // server runs on without it.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stdout(),
        format_args!("homing is up: http://{addr}/  (API under http://{addr}/v1){auth}\n"),
    );
    tracing::info!(%addr, "HTTP API and dashboard listening");
    crate::http_server::serve(listener, api::router(state, pipelines), limits, stop).await;
    Ok(())
}

pub async fn up(g: &Global, a: UpArgs) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let pipelines = crate::pipelines::configured(g)?;
    let registry = tasks::registry(&pipelines);
    let backends = open_to_serve(g, false).await?;
    config.reconcile_schedules(&*backends.store).await?;
    config.reconcile_queues(&*backends.store).await?;
    let stop = signals::shutdown_token();
    let heartbeat = a.tuning.heartbeat_interval;
    let mut config_w = worker_config(a.queues.clone(), &a.tuning, true)?;
    // This process serves the charts, so it keeps their rollups up to date.
    if let Some(mc) = config_w.maintenance_config.as_mut() {
        mc.stats_interval = Some(a.http.stats_interval);
    }
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        registry.clone(),
        config_w,
    );
    let worker_stop = CancellationToken::new();
    let worker_task = tokio::spawn(worker.run(worker_stop.clone()));
    let pipeline_workers =
        crate::pipelines::spawn_workers(&backends, &registry, &a.tuning, &a.queues, &worker_stop);
    let notifier = Notifier::start(&backends, &config, heartbeat);
    let api = serve_api(
        backends,
        &pipelines,
        &config,
        a.listen,
        &a.http,
        stop.clone(),
    )
    .await;
    // The API is down (signal or error): let the workers finish gracefully.
    worker_stop.cancel();
    let worker_result = worker_task.await.context("worker task failed")?;
    for w in pipeline_workers {
        w.await.context("worker task failed")??;
    }
    notifier.stop().await;
    api?;
    worker_result?;
    Ok(ExitCode::SUCCESS)
}

pub async fn server(g: &Global, a: ServerArgs) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let pipelines = crate::pipelines::configured(g)?;
    let backends = open_to_serve(g, false).await?;
    config.reconcile_schedules(&*backends.store).await?;
    config.reconcile_queues(&*backends.store).await?;
    let stop = signals::shutdown_token();
    let mc = MaintenanceConfig {
        rescue_interval: a.rescue_interval,
        retention: a.retention.0,
        stats_interval: Some(a.http.stats_interval),
        ..Default::default()
    };
    let maintenance = Maintenance::spawn(
        backends.broker.clone(),
        backends.store.clone(),
        mc,
        stop.child_token(),
    );
    let notifier = Notifier::start(
        &backends,
        &config,
        a.rescue_interval.min(Duration::from_secs(2)),
    );
    let api = serve_api(
        backends,
        &pipelines,
        &config,
        a.listen,
        &a.http,
        stop.clone(),
    )
    .await;
    stop.cancel();
    notifier.stop().await;
    maintenance.stop().await;
    api?;
    Ok(ExitCode::SUCCESS)
}

pub async fn worker(g: &Global, a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let config = Config::from_env()?;
    let pipelines = crate::pipelines::configured(g)?;
    // One runtime thread: the file's calls run on it when they need not wait.
    let backends = open_to_serve(g, a.runtime_threads == 1).await?;
    config.reconcile_schedules(&*backends.store).await?;
    config.reconcile_queues(&*backends.store).await?;
    let stop = signals::shutdown_token();
    let heartbeat = a.tuning.heartbeat_interval;
    let mut bridge = super::celery::Bridge::new(
        g,
        &a.celery,
        &backends,
        tasks::registry(&pipelines),
        heartbeat,
    )?;
    let mut queues = a.queues;
    for q in &a.celery.celery_queues {
        if !queues.contains(q) {
            queues.push(q.clone());
        }
    }
    let config_w = worker_config(queues, &a.tuning, !a.no_maintenance)?;
    // Only a worker that knows the subscriptions may fan events out (see the notifier's docs).
    let notifier =
        (!config.webhooks.is_empty()).then(|| Notifier::start(&backends, &config, heartbeat));
    let ingress = bridge.spawn(&stop);
    let worker = Worker::new(
        backends.broker,
        backends.store,
        bridge.registry.clone(),
        config_w,
    );
    let result = worker.run(stop).await;
    if let Some(n) = notifier {
        n.stop().await;
    }
    if let Some(i) = ingress {
        i.await.context("Celery ingress failed")??;
    }
    result?;
    Ok(ExitCode::SUCCESS)
}
