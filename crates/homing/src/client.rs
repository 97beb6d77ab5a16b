//! The producer's side: enqueue jobs and look at them. Enqueue is one store transaction followed
//! by a publish; the job is accepted once the store has it, because the reconciler publishes any
//! job the store lists as undispatched (so a broker outage delays a job, never loses it).

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::error::{Error, Result};
use crate::job::{new_job_id, Job, JobId, JobOptions, NewJob};
use crate::store::{Dispatch, Inserted, JobFilter, JobPage, Store};
use crate::task::{Registry, Task};
use crate::time::{micros, now};

/// The largest `args` a job may carry, serialised. Big inputs belong in an object store, with
/// their address in the args.
pub const MAX_ARGS_BYTES: usize = 1024 * 1024;

/// The longest countdown, time limit or retry delay a job may ask for; beyond it a due date
/// would be meaningless (and arithmetic on it could overflow).
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

/// One job to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRequest {
    pub task: String,
    pub args: serde_json::Value,
    pub options: JobOptions,
}

impl EnqueueRequest {
    pub fn new(task: impl Into<String>, args: serde_json::Value) -> Self {
        Self {
            task: task.into(),
            args,
            options: JobOptions::default(),
        }
    }
}

/// Enqueues jobs and reads them back.
#[derive(Clone)]
pub struct Client {
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    registry: Registry,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("broker", &self.broker.kind())
            .field("store", &self.store.kind())
            .finish()
    }
}

/// Checks a task or queue name: non-empty, printable, no spaces, at most 200 bytes.
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "invalid {what} name {name:?}: use 1-200 characters of letters, digits, '.', '_', '-', ':', '/'"
        )))
    }
}

impl Client {
    pub fn new(broker: Arc<dyn Broker>, store: Arc<dyn Store>) -> Self {
        Self {
            broker,
            store,
            registry: Registry::new(),
        }
    }

    /// Lets the client route a task to its default queue when the caller names none.
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.broker
    }

    fn prepare(&self, req: EnqueueRequest, at: i64) -> Result<NewJob> {
        validate_name("task", &req.task)?;
        let size = serde_json::to_vec(&req.args)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_ARGS_BYTES {
            return Err(Error::Invalid(format!(
                "args are {size} bytes; the limit is {MAX_ARGS_BYTES} (store large inputs elsewhere and pass their address)"
            )));
        }
        let queue = match &req.options.queue {
            Some(q) => q.clone(),
            None => self
                .registry
                .get(&req.task)
                .map(|h| h.defaults().queue)
                .unwrap_or_else(|| "default".into()),
        };
        validate_name("queue", &queue)?;
        if let Some(u) = &req.options.callback_url {
            crate::job::validate_callback_url(u).map_err(Error::Invalid)?;
            #[cfg(feature = "http")]
            crate::egress::check_callback_url(u).map_err(Error::Invalid)?;
        }
        for (what, d) in [
            ("countdown", req.options.countdown),
            ("time_limit", req.options.time_limit),
        ] {
            if d.is_some_and(|d| d > MAX_DELAY) {
                return Err(Error::Invalid(format!("{what} may be at most 366 days")));
            }
        }
        if let Some(p) = &req.options.retry_policy {
            p.validate(MAX_DELAY).map_err(Error::Invalid)?;
        }
        if let Some(k) = &req.options.idempotency_key {
            if k.is_empty() || k.len() > 512 {
                return Err(Error::Invalid("idempotency_key must be 1-512 bytes".into()));
            }
        }
        let run_at = req.options.countdown.map(|d| at + micros(d));
        Ok(NewJob {
            id: new_job_id(),
            task: req.task,
            queue,
            args: req.args,
            options: req.options,
            created_at: at,
            run_at,
        })
    }

    /// Enqueues one job. Returns the new job (or, for a known idempotency key, the existing one).
    pub async fn enqueue(&self, req: EnqueueRequest) -> Result<Inserted> {
        let mut v = self.enqueue_many(vec![req]).await?;
        Ok(v.remove(0))
    }

    /// Enqueues a typed task's job with default options.
    pub async fn enqueue_task<T: Task>(
        &self,
        task: &T,
        args: &impl serde::Serialize,
    ) -> Result<Inserted> {
        let args = serde_json::to_value(args).map_err(|e| Error::Invalid(e.to_string()))?;
        let mut req = EnqueueRequest::new(T::NAME, args);
        req.options.queue = Some(task.queue().to_string());
        self.enqueue(req).await
    }

    /// Enqueues many jobs in one store transaction and one publish.
    pub async fn enqueue_many(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Inserted>> {
        let at = now();
        let jobs = reqs
            .into_iter()
            .map(|r| self.prepare(r, at))
            .collect::<Result<Vec<_>>>()?;
        let tasks: Vec<String> = jobs.iter().map(|j| j.task.clone()).collect();
        let inserted = self.store.insert(jobs).await?;
        for (i, task) in inserted.iter().zip(&tasks) {
            if !i.existed {
                crate::metrics::count(crate::metrics::JOBS_ENQUEUED, &i.queue, task);
            }
        }
        let to_send: Vec<Dispatch> = inserted
            .iter()
            .filter(|i| i.needs_dispatch())
            .map(|i| Dispatch {
                id: i.id,
                queue: i.queue.clone(),
            })
            .collect();
        // The jobs are accepted: a failed publish leaves them undispatched in the store, and the
        // reconciler publishes them once the broker answers again.
        if let Err(e) = dispatch(&*self.broker, &*self.store, &to_send).await {
            tracing::warn!(error = %e, jobs = to_send.len(), "publish failed; the reconciler will publish these jobs later");
        }
        Ok(inserted)
    }

    pub async fn get(&self, id: JobId) -> Result<Job> {
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    pub async fn list(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        self.store.list(filter, cursor, limit).await
    }

    /// Puts a failed, dead or cancelled job back in its queue.
    pub async fn retry(&self, id: JobId) -> Result<Job> {
        let job = self.store.retry(id, now()).await?;
        let d = [Dispatch {
            id: job.id,
            queue: job.queue.clone(),
        }];
        if let Err(e) = dispatch(&*self.broker, &*self.store, &d).await {
            tracing::warn!(error = %e, job = %id, "publish failed; the reconciler will publish the job later");
        }
        Ok(job)
    }

    /// Cancels a job (a running one is stopped by its worker).
    pub async fn cancel(&self, id: JobId) -> Result<Job> {
        self.store.cancel(id, now()).await
    }

    /// Waits until the job is terminal or `timeout` passes, and returns it as it is then.
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut nap = Duration::from_millis(5);
        loop {
            let job = self.get(id).await?;
            if job.state.is_terminal() || tokio::time::Instant::now() >= deadline {
                return Ok(job);
            }
            tokio::time::sleep(nap).await;
            nap = (nap * 2).min(Duration::from_millis(200));
        }
    }
}

/// Publishes jobs and then records them as dispatched: the one way a job reaches the broker.
pub async fn dispatch(broker: &dyn Broker, store: &dyn Store, jobs: &[Dispatch]) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    broker.publish(jobs).await?;
    let ids: Vec<JobId> = jobs.iter().map(|d| d.id).collect();
    store.mark_dispatched(&ids).await
}
