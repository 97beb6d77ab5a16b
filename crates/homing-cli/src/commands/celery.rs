//! The CLI's Celery bridge: `homing worker --celery-queue` (ingress beside the worker) and
//! `homing enqueue --celery` (a message for Python workers).

use anyhow::Context as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::cli::{CeleryWorkerArgs, EnqueueArgs, Global};
use crate::output::outln;
use homing::celery::{CeleryClient, CelerySend, Conn, Ingress, IngressConfig};
use homing::redact::redact_url;
use homing::{Backends, Registry};

/// The Celery broker: the explicit URL, else homing's own broker when it is a Redis server (its
/// `?prefix=` is homing's key namespace, meaningless to kombu, so it is dropped).
pub fn broker_url(g: &Global, explicit: Option<&str>) -> anyhow::Result<String> {
    if let Some(u) = explicit {
        return Ok(u.to_string());
    }
    let b = &g.broker;
    if ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|s| b.starts_with(s))
    {
        let (base, query) = b.split_once('?').unwrap_or((b, ""));
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("prefix="))
            .collect();
        return Ok(if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        });
    }
    anyhow::bail!(
        "--celery-broker is required: the homing broker {} is not a Redis server",
        redact_url(b)
    )
}

/// What a worker with `--celery-queue` runs: the wrapped registry and the homing queues to add.
pub struct Bridge {
    pub registry: Registry,
    ingress: Option<Ingress>,
}

impl Bridge {
    pub fn new(
        g: &Global,
        a: &CeleryWorkerArgs,
        backends: &Backends,
        registry: Registry,
        heartbeat_interval: Duration,
    ) -> anyhow::Result<Self> {
        if a.celery_queues.is_empty() {
            return Ok(Self {
                registry,
                ingress: None,
            });
        }
        for q in &a.celery_queues {
            // Its messages become jobs on the homing queue of the same name: a producer's queue.
            homing::validate::producer_queue(q)
                .map_err(|e| anyhow::anyhow!("--celery-queue: {e}"))?;
        }
        let url = broker_url(g, a.celery_broker.as_deref())?;
        let conn = Conn::open(&url).context("Celery broker")?;
        let wrapped = homing::celery::registry(&registry, a.celery_result_backend.as_deref())
            .context("Celery result backend")?;
        let config = IngressConfig {
            queues: a.celery_queues.clone(),
            heartbeat_interval,
            results: a.celery_result_backend.is_some(),
            ..IngressConfig::default()
        };
        let ingress = Ingress::new(
            conn,
            backends.broker.clone(),
            backends.store.clone(),
            registry,
            config,
        );
        Ok(Self {
            registry: wrapped,
            ingress: Some(ingress),
        })
    }

    /// Starts the ingress, if any; it stops with `stop`.
    pub fn spawn(
        &mut self,
        stop: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<homing::Result<()>>> {
        let ingress = self.ingress.take()?;
        Some(tokio::spawn(ingress.run(stop.clone())))
    }
}

pub async fn enqueue(g: &Global, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let task = a.task.clone().unwrap_or_default();
    homing::validate::name("Celery task", &task).map_err(anyhow::Error::msg)?;
    let queue = a.queue.unwrap_or_else(|| "celery".into());
    homing::validate::name("Celery queue", &queue).map_err(anyhow::Error::msg)?;
    let args = super::input::read_args(&a.args)?;
    homing::validate::json("--args", &args, homing::validate::MAX_ARGS_BYTES)
        .map_err(anyhow::Error::msg)?;
    let url = broker_url(g, a.celery_broker.as_deref())?;
    let client = Arc::new(CeleryClient::open(&url, None)?);
    let mut send = CelerySend::new(task, queue).with_json_args(args)?;
    send.countdown = a.countdown;
    send.priority = match a.priority {
        None => 0,
        Some(p) => u8::try_from(p)
            .ok()
            .filter(|p| *p <= 9)
            .ok_or_else(|| anyhow::anyhow!("with --celery, --priority must be from 0 to 9"))?,
    };
    let id = client
        .send(send)
        .await
        .with_context(|| format!("cannot publish to the Celery broker {}", redact_url(&url)))?;
    outln!("{id}");
    Ok(ExitCode::SUCCESS)
}
