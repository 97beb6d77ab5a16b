//! The producer's side: enqueue jobs and look at them. Enqueue is one store transaction followed
//! by a publish; the job is accepted once the store has it, because the reconciler publishes any
//! job the store lists as undispatched (so a broker outage delays a job, never loses it).

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::error::{Error, Result};
use crate::job::{new_job_id, Job, JobId, JobOptions, NewJob};
use crate::store::{Inserted, JobFilter, JobPage, Store, ToPublish};
use crate::task::{Registry, Task};
use crate::time::{micros, now};

pub use crate::validate::{MAX_ARGS_BYTES, MAX_DELAY};

/// The most jobs one [`Client::enqueue_batch`] takes (`POST /v1/jobs/batch`, one chunk of
/// `homing enqueue --from-file`; docs/batch.md). It bounds what one store transaction holds and
/// what one request makes the server keep in memory, while leaving each batch large enough that
/// its commit's flush is a small part of its cost.
pub const MAX_BATCH: usize = 10_000;

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

/// Checks a task or queue name (see [`crate::validate::name`]).
pub fn validate_name(what: &str, name: &str) -> Result<()> {
    crate::validate::name(what, name).map_err(Error::Invalid)
}

/// Checks everything a producer hands over, with the rules of [`crate::validate`]: names (and
/// that neither the task nor the queue is homing's own), args, follow-ups, idempotency key,
/// callback URL, and every duration and count. Every enqueue runs it; the HTTP API and the CLI
/// call it first so their users see the same message.
pub fn validate_request(req: &EnqueueRequest) -> Result<()> {
    use crate::validate as v;
    let o = &req.options;
    let mut checks = vec![
        v::producer_task(&req.task),
        v::json("args", &req.args, v::MAX_ARGS_BYTES),
    ];
    if let Some(q) = &o.queue {
        checks.push(v::producer_queue(q));
    }
    for (what, f) in [("on_success", &o.on_success), ("on_failure", &o.on_failure)] {
        if let Some(f) = f {
            checks.push(v::producer_task(&f.task).map_err(|e| format!("{what}: {e}")));
            if let Some(q) = &f.queue {
                checks.push(v::producer_queue(q).map_err(|e| format!("{what}: {e}")));
            }
            checks.push(v::json(&format!("{what}.args"), &f.args, v::MAX_ARGS_BYTES));
        }
    }
    if let Some(k) = &o.idempotency_key {
        checks.push(v::idempotency_key(k));
        if k.starts_with(crate::schedule::KEY_PREFIX) {
            // Such a key names a schedule's tick (the job's `schedule`/`scheduled_tick`).
            checks.push(Err(format!(
                "idempotency_key may not start with '{}': it is reserved for periodic schedules' ticks",
                crate::schedule::KEY_PREFIX
            )));
        }
    }
    if let Some(u) = &o.callback_url {
        checks.push(crate::job::validate_callback_url(u));
    }
    if let Some(tp) = &o.traceparent {
        checks.push(crate::tracecontext::validate(tp));
    }
    if let Some(d) = o.countdown {
        checks.push(v::duration("countdown", d, Duration::ZERO, v::MAX_DELAY));
    }
    if let Some(d) = o.time_limit {
        checks.push(v::duration(
            "time_limit",
            d,
            v::MIN_TIME_LIMIT,
            v::MAX_DELAY,
        ));
    }
    if let Some(p) = &o.retry_policy {
        checks.push(p.validate(v::MAX_DELAY));
    }
    if let Some(n) = o.max_retries {
        checks.push(v::count("max_retries", n, 0, v::MAX_RETRIES));
    }
    if let Some(n) = o.max_crashes {
        checks.push(v::count("max_crashes", n, 1, v::MAX_CRASHES));
    }
    if let Some(p) = o.priority {
        checks.push(v::priority(p));
    }
    if let Some(d) = o.unique_for {
        checks.push(v::duration(
            "unique_for",
            d,
            v::MIN_UNIQUE_FOR,
            v::MAX_DELAY,
        ));
    }
    checks
        .into_iter()
        .collect::<std::result::Result<(), String>>()
        .map_err(Error::Invalid)
}

/// How many schedule checks of [`Client::check_schedule_def`] (which [`Client::set_schedule`]
/// and the API's `PUT` run) run at once in this process: one. A
/// check of a cron that never fires holds a core for up to a second, and on the runtime's
/// blocking pool, whose threads the embedded store's calls share: a flood of such requests
/// (hundreds at once) filled the pool, and every enqueue, heartbeat and job of the process
/// waited minutes behind them. Queued here, they cost a waiting future each; a caller that gives
/// up before its turn (a request's timeout) leaves the queue and its check never runs. A check
/// of a spec that fires takes microseconds, so the queue only grows behind checks of specs that
/// do not.
static SCHEDULE_CHECKS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Checks a schedule's definition: the rules of an enqueue for its task, args, queue and job
/// options, and those of [`crate::schedule::check`] for its spec and policy.
pub fn check_schedule(def: &crate::schedule::ScheduleDef) -> Result<()> {
    crate::schedule::check(def).map_err(Error::Invalid)?;
    let mut options = def.options.clone();
    options.queue = Some(def.queue.clone());
    validate_request(&EnqueueRequest {
        task: def.task.clone(),
        args: def.args.clone(),
        options,
    })?;
    #[cfg(feature = "http")]
    if let Some(u) = &def.options.callback_url {
        crate::egress::check_callback_url(u).map_err(Error::Invalid)?;
    }
    // A builtin's args as an enqueue checks them: args its task refuses would make a job that
    // fails at every tick.
    if let Some(h) = crate::builtin::registry().get(&def.task) {
        h.check_args(&def.args).map_err(Error::Invalid)?;
    }
    Ok(())
}

/// Whether schedule `def.name` exists with `def.task` already: setting it again (a new time,
/// new args) is not refused for a task whose workers have not registered on this store yet.
pub async fn keeps_task(store: &dyn Store, def: &crate::schedule::ScheduleDef) -> Result<bool> {
    Ok(store
        .schedule(&def.name)
        .await?
        .is_some_and(|s| s.def.task == def.task))
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
        validate_request(&req)?;
        let handler = self.registry.get(&req.task);
        if let Some(h) = handler {
            h.check_args(&req.args).map_err(Error::Invalid)?;
        }
        let queue = match &req.options.queue {
            Some(q) => q.clone(),
            None => handler
                .map(|h| h.defaults().queue)
                .unwrap_or_else(|| "default".into()),
        };
        // A task's own default queue comes from code, but still must be a name homing can store.
        validate_name("queue", &queue)?;
        #[cfg(feature = "http")]
        if let Some(u) = &req.options.callback_url {
            crate::egress::check_callback_url(u).map_err(Error::Invalid)?;
        }
        let run_at = req.options.countdown.map(|d| at.saturating_add(micros(d)));
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
        self.insert_and_publish(jobs).await
    }

    /// A producer's bulk enqueue (docs/batch.md): between 1 and [`MAX_BATCH`] jobs, all or
    /// nothing. Every job is checked first, and the first one refused refuses the batch with
    /// [`Error::Invalid`] naming its index (`job 9999: ...`) before anything is written; the
    /// jobs are then inserted in one store transaction, each as its own enqueue would be (an
    /// existing idempotency key or unique job is returned with `existed`, a key repeated in the
    /// batch resolves to its first job, as two enqueues one after the other would), and
    /// published after the commit (a publish that fails is left to the reconciler). The
    /// answers are in the order of `reqs`.
    pub async fn enqueue_batch(&self, reqs: Vec<EnqueueRequest>) -> Result<Vec<Inserted>> {
        check_batch_len(reqs.len())?;
        let at = now();
        let jobs = reqs
            .into_iter()
            .enumerate()
            .map(|(i, r)| self.prepare(r, at).map_err(|e| at_index(i, e)))
            .collect::<Result<Vec<_>>>()?;
        self.insert_and_publish(jobs).await
    }

    /// Whether the broker keeps its messages in the store's own embedded file.
    #[cfg(feature = "sqlite")]
    fn shares_file(&self) -> bool {
        matches!(
            (self.store.embedded_db(), self.broker.embedded_db()),
            (Some(a), Some(b)) if Arc::ptr_eq(a, b)
        )
    }

    #[cfg(not(feature = "sqlite"))]
    fn shares_file(&self) -> bool {
        false
    }

    #[cfg(feature = "sqlite")]
    async fn insert_and_publish_here(
        &self,
        jobs: Vec<NewJob>,
        priorities: Vec<i32>,
    ) -> Result<Vec<Inserted>> {
        self.store.insert_and_publish(jobs, priorities).await
    }

    #[cfg(not(feature = "sqlite"))]
    async fn insert_and_publish_here(
        &self,
        jobs: Vec<NewJob>,
        _: Vec<i32>,
    ) -> Result<Vec<Inserted>> {
        self.store.insert(jobs).await
    }

    async fn insert_and_publish(&self, mut jobs: Vec<NewJob>) -> Result<Vec<Inserted>> {
        // Traces on: each job stores its enqueue span's context instead of the caller's.
        let spans: Vec<crate::otel::EnqueueSpan> = if crate::otel::enabled() {
            jobs.iter_mut()
                .filter_map(crate::otel::start_enqueue)
                .collect()
        } else {
            Vec::new()
        };
        let tasks: Vec<String> = jobs.iter().map(|j| j.task.clone()).collect();
        let priorities: Vec<i32> = jobs
            .iter()
            .map(|j| j.options.priority.unwrap_or(0))
            .collect();
        // Broker and store in one embedded file: the jobs, their messages and the dispatched
        // mark in one write, published before this returns.
        let shared = self.shares_file();
        let result = if shared {
            self.insert_and_publish_here(jobs, priorities.clone()).await
        } else {
            self.store.insert(jobs).await
        };
        let inserted = match result {
            Ok(i) => i,
            Err(e) => {
                let why = e.to_string();
                spans.into_iter().for_each(|s| s.end(Err(&why)));
                return Err(e);
            }
        };
        for (s, i) in spans.into_iter().zip(&inserted) {
            s.end(Ok(i.existed));
        }
        for (i, task) in inserted.iter().zip(&tasks) {
            if !i.existed {
                crate::metrics::count(crate::metrics::JOBS_ENQUEUED, &i.queue, task);
            }
        }
        if shared {
            return Ok(inserted);
        }
        let to_send = crate::store::to_dispatch(&inserted, &priorities);
        // The jobs are accepted: a failed publish leaves them undispatched in the store, and the
        // reconciler publishes them once the broker answers again.
        if let Err(e) = publish(&*self.broker, &*self.store, &to_send).await {
            tracing::warn!(error = %e, jobs = to_send.len(), "publish failed; the reconciler will publish these jobs later");
        }
        Ok(inserted)
    }

    /// Creates or replaces a periodic schedule after checking it as an enqueue is checked
    /// (names, args, options) plus its spec ([`crate::schedule::check`]); see
    /// [`Client::check_schedule_def`].
    pub async fn set_schedule(
        &self,
        def: &crate::schedule::ScheduleDef,
    ) -> Result<crate::schedule::Schedule> {
        self.check_schedule_def(def).await?;
        self.store.put_schedule(def, now()).await
    }

    /// The free function [`check_schedule`] as a serving process runs it: off the runtime and
    /// one at a time ([`SCHEDULE_CHECKS`]). The API runs it before it looks for the task.
    pub async fn check_schedule_def(&self, def: &crate::schedule::ScheduleDef) -> Result<()> {
        // Refusing a cron that never fires can take a second of searching (every time it
        // names falls in a daylight-saving gap): off the runtime, so an API server's other
        // requests go on meanwhile, and one check at a time (SCHEDULE_CHECKS).
        let checking = SCHEDULE_CHECKS
            .acquire()
            .await
            .map_err(|e| Error::backend_from("schedule check", e))?;
        let d = def.clone();
        // The permit goes with the check, so a caller that gives up meanwhile does not let the
        // next check start beside it.
        tokio::task::spawn_blocking(move || {
            let _checking = checking;
            check_schedule(&d)
        })
        .await
        .map_err(|e| Error::backend_from("schedule check", e))?
    }

    pub async fn get(&self, id: JobId) -> Result<Job> {
        self.store.get(id).await?.ok_or(Error::NotFound(id))
    }

    /// Job `id` with its timeline (docs/timeline.md). The job is read after its timeline, so
    /// every entry shown happened no later than the row shown; `NotFound` when it does not exist.
    pub async fn history(&self, id: JobId) -> Result<(Job, crate::history::History)> {
        let history = self.store.history(id).await?;
        let job = self.get(id).await?;
        Ok((job, history))
    }

    pub async fn list(
        &self,
        filter: &JobFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        self.store.list(filter, cursor, limit).await
    }

    /// Jobs matching a checked search, newest first, paged by `cursor` (docs/operate.md).
    pub async fn search(
        &self,
        search: &crate::search::JobSearch,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        self.store.search(search, cursor, limit).await
    }

    /// Puts a failed, dead or cancelled job back in its queue.
    pub async fn retry(&self, id: JobId) -> Result<Job> {
        let job = self.store.retry(id, now()).await?;
        let d = [ToPublish {
            id: job.id,
            queue: job.queue.clone(),
            priority: job.priority,
        }];
        if let Err(e) = publish(&*self.broker, &*self.store, &d).await {
            tracing::warn!(error = %e, job = %id, "publish failed; the reconciler will publish the job later");
        }
        Ok(job)
    }

    /// Runs a bulk action on every job matching `filter` (docs/access.md): each job through the
    /// same transition as a single retry, cancel or delete, in bounded steps.
    pub async fn bulk(
        &self,
        action: crate::bulk::Action,
        filter: &crate::store::JobFilter,
    ) -> Result<crate::bulk::Outcome> {
        crate::bulk::run(&*self.store, &*self.broker, action, filter).await
    }

    /// Runs a bulk action from `cursor` on until it is over or, after a step, `budget` is spent
    /// (docs/bulk.md): what it did (every step of it committed) and where to go on.
    pub async fn bulk_part(
        &self,
        action: crate::bulk::Action,
        filter: &crate::store::JobFilter,
        cursor: Option<&str>,
        budget: std::time::Duration,
    ) -> Result<crate::bulk::Part> {
        crate::bulk::run_for(
            &*self.store,
            &*self.broker,
            action,
            filter,
            cursor,
            Some(budget),
        )
        .await
    }

    /// How many jobs match `filter`: what a bulk action on it would meet.
    pub async fn count(&self, filter: &crate::store::JobFilter) -> Result<u64> {
        self.store.count(filter).await
    }

    /// Cancels a job (a running one is stopped by its worker).
    pub async fn cancel(&self, id: JobId) -> Result<Job> {
        self.store.cancel(id, now()).await
    }

    /// Transactional enqueue (docs/workflows.md): inserts the job through the application's own
    /// PostgreSQL connection or transaction (`client.enqueue_in(&mut tx, req)`), when homing's
    /// PostgreSQL store lives in the same database. The job exists if and only if the
    /// application's transaction commits; it is published after the commit (at once by the
    /// listener of a running homing process, by the reconciler's sweep at the latest). Checked
    /// like [`Client::enqueue`]; queue names are admitted against the default bound.
    #[cfg(feature = "postgres")]
    pub async fn enqueue_in(
        &self,
        conn: &mut sqlx::PgConnection,
        req: EnqueueRequest,
    ) -> Result<Inserted> {
        let job = self.prepare(req, now())?;
        let task = job.task.clone();
        let mut v = crate::store::postgres::insert_in(
            conn,
            vec![job],
            crate::store::queues::DEFAULT_MAX_QUEUES,
        )
        .await?;
        let ins = v.remove(0);
        if !ins.existed {
            crate::metrics::count(crate::metrics::JOBS_ENQUEUED, &ins.queue, &task);
        }
        Ok(ins)
    }

    /// Checks a workflow as [`Client::create_workflow`] would, without creating it.
    pub fn check_workflow(&self, spec: &crate::workflow::WorkflowSpec) -> Result<()> {
        self.plan_workflow(spec.clone(), now()).map(|_| ())
    }

    fn plan_workflow(
        &self,
        spec: crate::workflow::WorkflowSpec,
        at: i64,
    ) -> Result<crate::workflow::NewWorkflow> {
        crate::workflow::plan(spec, at, |_, step| {
            let mut req = EnqueueRequest::new(step.task.clone(), step.args.clone());
            req.options = step.options();
            self.prepare(req, at).map_err(|e| match e {
                Error::Invalid(m) => m,
                other => other.to_string(),
            })
        })
        .map_err(Error::Invalid)
    }

    /// Creates a workflow (docs/workflows.md) in one store transaction: every step's job exists
    /// from now on, those without parents are published, the others wait for their parents.
    /// A bad graph or step is [`Error::Invalid`] with the reason, and nothing is created.
    pub async fn create_workflow(
        &self,
        spec: crate::workflow::WorkflowSpec,
    ) -> Result<CreatedWorkflow> {
        let wf = self.plan_workflow(spec, now())?;
        let id = wf.id;
        let names: Vec<(String, String)> = wf
            .steps
            .iter()
            .map(|(j, l)| (l.step.clone(), j.task.clone()))
            .collect();
        let inserted = self.store.create_workflow(wf).await?;
        for (i, (_, task)) in inserted.iter().zip(&names) {
            crate::metrics::count(crate::metrics::JOBS_ENQUEUED, &i.queue, task);
        }
        let to_send: Vec<ToPublish> = inserted
            .iter()
            .filter(|i| i.needs_dispatch())
            .map(|i| ToPublish {
                id: i.id,
                queue: i.queue.clone(),
                // Steps take no priority option (docs/workflows.md).
                priority: 0,
            })
            .collect();
        if let Err(e) = publish(&*self.broker, &*self.store, &to_send).await {
            tracing::warn!(error = %e, jobs = to_send.len(), "publish failed; the reconciler will publish these jobs later");
        }
        Ok(CreatedWorkflow {
            id,
            steps: names
                .into_iter()
                .zip(&inserted)
                .map(|((step, _), i)| (step, i.id))
                .collect(),
        })
    }

    /// A workflow with each step's state.
    pub async fn workflow(
        &self,
        id: crate::workflow::WorkflowId,
    ) -> Result<crate::workflow::Workflow> {
        self.store
            .workflow(id)
            .await?
            .ok_or(Error::WorkflowNotFound(id))
    }

    /// Workflows, newest first.
    pub async fn workflows(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::workflow::WorkflowPage> {
        self.store.workflows(cursor, limit).await
    }

    /// Cancels a workflow's unfinished steps (running ones are stopped by their workers).
    pub async fn cancel_workflow(
        &self,
        id: crate::workflow::WorkflowId,
    ) -> Result<crate::workflow::Workflow> {
        self.store
            .cancel_workflow(id, now())
            .await?
            .ok_or(Error::WorkflowNotFound(id))
    }

    /// Pauses a queue: it still accepts jobs, but no worker starts one from it until it is
    /// resumed; running jobs finish (docs/limits.md).
    pub async fn pause_queue(&self, queue: &str) -> Result<()> {
        crate::validate::producer_queue(queue).map_err(Error::Invalid)?;
        self.store.set_paused(queue, true, now()).await?;
        Ok(())
    }

    /// Resumes a paused queue and publishes the jobs it held back (the reconciler publishes any
    /// this call does not).
    pub async fn resume_queue(&self, queue: &str) -> Result<()> {
        crate::validate::producer_queue(queue).map_err(Error::Invalid)?;
        let held = self.store.set_paused(queue, false, now()).await?;
        if let Err(e) = publish(&*self.broker, &*self.store, &held).await {
            tracing::warn!(error = %e, %queue, jobs = held.len(), "publish failed; the reconciler will publish the resumed queue's jobs later");
        }
        Ok(())
    }

    /// Sets (replaces) a queue's cluster-wide limits (docs/limits.md); `QueueLimits::default()`
    /// clears them. Jobs the old limits held back are published again, to be admitted or held
    /// under the new ones.
    pub async fn set_queue_limits(
        &self,
        queue: &str,
        limits: &crate::limit::QueueLimits,
    ) -> Result<()> {
        crate::validate::producer_queue(queue).map_err(Error::Invalid)?;
        limits.check().map_err(Error::Invalid)?;
        let held = self.store.set_limits(queue, limits, now()).await?;
        if let Err(e) = publish(&*self.broker, &*self.store, &held).await {
            tracing::warn!(error = %e, %queue, jobs = held.len(), "publish failed; the reconciler will publish the queue's unparked jobs later");
        }
        Ok(())
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

/// Refuses a batch of `n` jobs that [`Client::enqueue_batch`] does not take: none, or more than
/// [`MAX_BATCH`].
pub fn check_batch_len(n: usize) -> Result<()> {
    if n == 0 {
        return Err(Error::Invalid("a batch needs at least one job".into()));
    }
    if n > MAX_BATCH {
        return Err(Error::Invalid(format!(
            "a batch takes at most {MAX_BATCH} jobs, not {n}; split it"
        )));
    }
    Ok(())
}

/// Names the job of a batch an error is about (`job 3: ...`); errors not about its input pass
/// unchanged.
pub fn at_index(i: usize, e: Error) -> Error {
    match e {
        Error::Invalid(m) => Error::Invalid(format!("job {i}: {m}")),
        other => other,
    }
}

/// What [`Client::create_workflow`] created: the workflow's id and each step's job id.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CreatedWorkflow {
    pub id: crate::workflow::WorkflowId,
    pub steps: std::collections::BTreeMap<String, JobId>,
}

/// Publishes jobs and then records them as dispatched: the one way a job reaches the broker.
pub async fn publish(broker: &dyn Broker, store: &dyn Store, jobs: &[ToPublish]) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    broker.publish(jobs).await?;
    let ids: Vec<JobId> = jobs.iter().map(|d| d.id).collect();
    store.mark_dispatched(&ids).await
}
