//! Tasks: the user's code. A [`Task`] is a named handler with typed, serde-decoded input; the
//! worker looks it up by name in a [`Registry`] and runs it with a [`Context`] that carries what
//! a handler needs to be safe under redelivery (the idempotency key and fencing epoch) and to be
//! stopped (cancellation token, time limit).

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::job::{Job, JobId};
use crate::retry::{RetryPolicy, DEFAULT_MAX_RETRIES};
use crate::store::Store;

/// How a handler asks the worker to treat a failure.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskError {
    /// Try again after the retry policy's delay, if retries are left (the default for errors).
    Retry(String),
    /// Do not try again: the job fails now.
    Fatal(String),
    /// Not a failure: run again after this long, without spending a retry.
    Snooze(Duration),
    /// Try again after exactly this long (e.g. an upstream's `Retry-After`), if retries are left.
    RetryIn(String, Duration),
}

impl TaskError {
    pub fn retry(msg: impl fmt::Display) -> Self {
        TaskError::Retry(msg.to_string())
    }
    pub fn fatal(msg: impl fmt::Display) -> Self {
        TaskError::Fatal(msg.to_string())
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Retry(m) | TaskError::RetryIn(m, _) => f.write_str(m),
            TaskError::Fatal(m) => write!(f, "fatal: {m}"),
            TaskError::Snooze(d) => write!(f, "snoozed for {}", humantime::format_duration(*d)),
        }
    }
}

/// Any ordinary error is retryable, so `?` works in handlers.
impl<E: std::error::Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(e: E) -> Self {
        TaskError::Retry(e.to_string())
    }
}

/// The defaults a task gives its jobs; a job's own options override them.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskDefaults {
    pub queue: String,
    pub max_retries: u32,
    pub retry_policy: RetryPolicy,
    pub time_limit: Duration,
}

impl Default for TaskDefaults {
    fn default() -> Self {
        Self {
            queue: "default".into(),
            max_retries: DEFAULT_MAX_RETRIES,
            retry_policy: RetryPolicy::default(),
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// A named handler with typed input.
///
/// ```
/// use homing::{Context, Task, TaskError};
/// use serde::Deserialize;
///
/// struct Resize;
///
/// #[derive(Deserialize)]
/// struct ResizeArgs { url: String, width: u32 }
///
/// #[homing::async_trait]
/// impl Task for Resize {
///     const NAME: &'static str = "images.resize";
///     type Args = ResizeArgs;
///     type Output = String;
///     async fn run(&self, ctx: Context, args: ResizeArgs) -> Result<String, TaskError> {
///         // Pass ctx.idempotency_key() to external services so a redelivery is recognised.
///         Ok(format!("{} at {}px (key {})", args.url, args.width, ctx.idempotency_key()))
///     }
///     fn queue(&self) -> &str { "images" }
/// }
/// ```
#[async_trait]
pub trait Task: Send + Sync + 'static {
    /// The name producers enqueue by, e.g. `ocr.extract`.
    const NAME: &'static str;
    type Args: DeserializeOwned + Send + 'static;
    type Output: Serialize + Send + 'static;

    async fn run(&self, ctx: Context, args: Self::Args) -> Result<Self::Output, TaskError>;

    fn queue(&self) -> &str {
        "default"
    }
    fn max_retries(&self) -> u32 {
        DEFAULT_MAX_RETRIES
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }
    /// A run longer than this is cancelled and counts as an error.
    fn time_limit(&self) -> Duration {
        Duration::from_secs(3600)
    }
    /// Rules on the args beyond their type (a range, a URL's form), checked when a job is
    /// enqueued through a [`crate::Client`] that knows this task, so the producer hears at once
    /// about input every run would refuse. The run checks again: it gets whatever was stored.
    fn check(&self, _args: &Self::Args) -> Result<(), String> {
        Ok(())
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A task with its input and output types erased, as the worker holds it.
pub trait Handler: Send + Sync + 'static {
    fn name(&self) -> &str;
    fn defaults(&self) -> TaskDefaults;
    fn call(
        &self,
        ctx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<serde_json::Value, TaskError>>;
    /// Whether `args` can be run at all: they decode into the task's input and pass its
    /// [`Task::check`]. Untyped handlers accept anything.
    fn check_args(&self, _args: &serde_json::Value) -> Result<(), String> {
        Ok(())
    }
}

struct Typed<T>(Arc<T>);

impl<T: Task> Handler for Typed<T> {
    fn name(&self) -> &str {
        T::NAME
    }
    fn check_args(&self, args: &serde_json::Value) -> Result<(), String> {
        let args =
            T::Args::deserialize(args).map_err(|e| format!("invalid args for {}: {e}", T::NAME))?;
        self.0
            .check(&args)
            .map_err(|e| format!("invalid args for {}: {e}", T::NAME))
    }
    fn defaults(&self) -> TaskDefaults {
        TaskDefaults {
            queue: self.0.queue().to_string(),
            max_retries: self.0.max_retries(),
            retry_policy: self.0.retry_policy(),
            time_limit: self.0.time_limit(),
        }
    }
    fn call(
        &self,
        ctx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<serde_json::Value, TaskError>> {
        let task = self.0.clone();
        Box::pin(async move {
            let args: T::Args = serde_json::from_value(args)
                .map_err(|e| TaskError::Fatal(format!("invalid args for {}: {e}", T::NAME)))?;
            let out = task.run(ctx, args).await?;
            serde_json::to_value(out)
                .map_err(|e| TaskError::Fatal(format!("result of {} is not JSON: {e}", T::NAME)))
        })
    }
}

/// A handler made from a closure over raw JSON; for small tasks that need no type.
struct FnHandler<F> {
    name: String,
    defaults: TaskDefaults,
    f: F,
}

impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Context, serde_json::Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<serde_json::Value, TaskError>> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn defaults(&self) -> TaskDefaults {
        self.defaults.clone()
    }
    fn call(
        &self,
        ctx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<serde_json::Value, TaskError>> {
        Box::pin((self.f)(ctx, args))
    }
}

/// The tasks a worker can run, by name.
#[derive(Clone, Default)]
pub struct Registry {
    tasks: BTreeMap<String, Arc<dyn Handler>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tasks.keys()).finish()
    }
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a typed task (replacing one of the same name).
    pub fn register<T: Task>(&mut self, task: T) -> &mut Self {
        self.tasks
            .insert(T::NAME.to_string(), Arc::new(Typed(Arc::new(task))));
        self
    }

    /// Registers a closure over raw JSON as task `name`.
    pub fn register_fn<F, Fut>(&mut self, name: &str, defaults: TaskDefaults, f: F) -> &mut Self
    where
        F: Fn(Context, serde_json::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<serde_json::Value, TaskError>> + Send + 'static,
    {
        self.tasks.insert(
            name.to_string(),
            Arc::new(FnHandler {
                name: name.to_string(),
                defaults,
                f,
            }),
        );
        self
    }

    /// Registers every task of another registry.
    pub fn merge(&mut self, other: &Registry) -> &mut Self {
        for (k, v) in &other.tasks {
            self.tasks.insert(k.clone(), v.clone());
        }
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Handler>> {
        self.tasks.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        self.tasks.keys().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// What a running handler knows about its job, and how it reports back.
#[derive(Clone)]
pub struct Context {
    job: Arc<Job>,
    cancel: CancellationToken,
    store: Arc<dyn Store>,
    time_limit: Duration,
    traceparent: Option<Arc<str>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("job_id", &self.job.id)
            .field("epoch", &self.job.epoch)
            .finish()
    }
}

impl Context {
    pub(crate) fn new(
        job: Arc<Job>,
        cancel: CancellationToken,
        store: Arc<dyn Store>,
        time_limit: Duration,
    ) -> Self {
        Self {
            job,
            cancel,
            store,
            time_limit,
            traceparent: None,
        }
    }

    /// Sets the context outgoing calls hand on (this run's span, see [`Self::traceparent`]).
    pub(crate) fn with_traceparent(mut self, tp: Option<Arc<str>>) -> Self {
        self.traceparent = tp;
        self
    }

    /// The W3C `traceparent` to send with calls this run makes (docs/traces.md): this run's
    /// span when traces are exported, else the context stored with the job, if any.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent
            .as_deref()
            .or(self.job.traceparent.as_deref())
    }

    pub fn job_id(&self) -> JobId {
        self.job.id
    }

    /// A workflow step's parents by step name (id, task, state, result, error), as committed
    /// when this step became runnable; empty for a job that is not a workflow step.
    pub fn parents(&self) -> std::collections::BTreeMap<String, crate::workflow::ParentRun> {
        self.job.parents.clone().unwrap_or_default()
    }

    /// The workflow this job is a step of, with its step name and parents' job ids.
    pub fn workflow(&self) -> Option<&crate::workflow::StepLink> {
        self.job.workflow.as_ref()
    }

    /// The key to hand to external systems (e.g. an `Idempotency-Key` header): the job id, the
    /// same on every delivery and every retry of this job.
    pub fn idempotency_key(&self) -> String {
        self.job.id.to_string()
    }

    /// The fencing epoch of this run: higher than any earlier run of the job. Use it to fence
    /// your own writes (`... WHERE epoch < $1`), so a stale run cannot overwrite a newer one.
    pub fn epoch(&self) -> u64 {
        self.job.epoch
    }

    /// How many earlier runs ended in an error (0 on the first run).
    pub fn attempt(&self) -> u32 {
        self.job.attempts
    }

    /// How many earlier deliveries were lost with their worker.
    pub fn crashes(&self) -> u32 {
        self.job.crashes
    }

    pub fn job(&self) -> &Job {
        &self.job
    }

    pub fn time_limit(&self) -> Duration {
        self.time_limit
    }

    /// Whether the job was cancelled, timed out, or the worker is stopping.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the handler should stop.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The store, for built-in tasks that read other jobs (a webhook resolving a callback URL).
    #[cfg(feature = "http")]
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Records progress (`fraction` in 0..=1, a short message) on the job record. Returns
    /// `false` when this run is no longer current (a newer epoch took over). The message is cut
    /// to [`crate::validate::MAX_PROGRESS_MESSAGE_BYTES`]; a fraction that is not a number
    /// counts as 0.
    pub async fn progress(&self, fraction: f64, message: impl Into<String>) -> bool {
        let p = progress_value(fraction, &message.into());
        self.store
            .set_progress(self.job.id, self.job.epoch, p)
            .await
            .unwrap_or(false)
    }
}

/// The progress document as stored: always within [`crate::validate`]'s rules.
fn progress_value(fraction: f64, message: &str) -> serde_json::Value {
    let fraction = if fraction.is_nan() {
        0.0
    } else {
        fraction.clamp(0.0, 1.0)
    };
    serde_json::json!({
        "fraction": fraction,
        "message": crate::validate::text(message, crate::validate::MAX_PROGRESS_MESSAGE_BYTES),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn progress_is_always_storable() {
        let p = super::progress_value(f64::NAN, &"\u{0}x".repeat(10_000));
        assert_eq!(p["fraction"], 0.0);
        assert!(crate::validate::json("progress", &p, 2048).is_ok(), "{p}");
        assert_eq!(super::progress_value(7.0, "ok")["fraction"], 1.0);
    }
}
