//! homing: crash-safe background jobs. No job accepted is lost, no job commits two results,
//! a lost worker's jobs run again within seconds, and poison jobs are quarantined.
//!
//! A service defines [`Task`]s, enqueues with a [`Client`], and runs a [`Worker`]; the
//! [`broker`] moves messages and the [`store`] keeps the truth about every job.
//!
//! ```
//! use homing::{Backends, Client, Context, EnqueueRequest, Registry, Task, TaskError, Worker, WorkerConfig};
//! use serde::Deserialize;
//! use std::time::Duration;
//!
//! struct Greet;
//!
//! #[derive(Deserialize)]
//! struct Who { name: String }
//!
//! #[homing::async_trait]
//! impl Task for Greet {
//!     const NAME: &'static str = "greet";
//!     type Args = Who;
//!     type Output = String;
//!     async fn run(&self, ctx: Context, who: Who) -> Result<String, TaskError> {
//!         // ctx.idempotency_key() is stable across redeliveries: pass it to external services.
//!         Ok(format!("hello, {} (job {})", who.name, ctx.idempotency_key()))
//!     }
//!     fn queue(&self) -> &str { "greetings" }
//! }
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> homing::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("homing-doc-{}", homing::job::new_job_id()));
//! # let url = format!("sqlite://{}/homing.db", dir.display());
//! // The embedded default is `homing::DEFAULT_URL` (./homing-data/homing.db).
//! let backends = Backends::open(&url, &url).await?;
//! let client = Client::new(backends.broker.clone(), backends.store.clone());
//! let job = client.enqueue_task(&Greet, &serde_json::json!({"name": "Ada"})).await?;
//!
//! let mut tasks = Registry::new();
//! tasks.register(Greet);
//! let config = WorkerConfig { queues: vec!["greetings".into()], ..WorkerConfig::default() };
//! let worker = Worker::new(backends.broker, backends.store, tasks, config);
//! let stop = homing::CancellationToken::new();
//! let running = tokio::spawn(worker.run(stop.clone()));
//!
//! let done = client.wait(job.id, Duration::from_secs(10)).await?;
//! assert_eq!(done.state, homing::JobState::Succeeded);
//! assert_eq!(done.result, Some(serde_json::json!(format!("hello, Ada (job {})", job.id))));
//! stop.cancel(); // what SIGTERM does in `homing worker`: a graceful shutdown
//! running.await.unwrap()?;
//! # std::fs::remove_dir_all(dir).ok();
//! # Ok(()) }
//! ```

// A build without a broker or without a store could open no backends at all: said at build
// time, not as an error from `Backends::open` (and a page of dead-code warnings) later.
#[cfg(not(any(feature = "sqlite", feature = "redis")))]
compile_error!("homing needs a broker: enable the `sqlite` (embedded) or `redis` feature");
#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("homing needs a store: enable the `sqlite` (embedded) or `postgres` feature");

pub mod backend;
pub mod broker;
pub mod builtin;
pub mod bulk;
#[cfg(feature = "celery")]
pub mod celery;
pub mod client;
#[cfg(feature = "http")]
pub mod egress;
pub mod error;
pub mod events;
pub mod health;
pub mod history;
pub mod job;
pub mod limit;
pub mod maintenance;
pub mod metrics;
pub mod otel;
pub mod reclaim;
pub mod redact;
pub mod remote;
pub mod requests;
pub mod retry;
pub mod schedule;
pub mod schema;
pub mod search;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod stats;
pub mod store;
pub mod task;
pub mod time;
#[cfg(any(feature = "http", feature = "redis"))]
pub mod tls;
pub mod tracecontext;
pub mod transition;
pub mod unique;
pub mod validate;
pub mod worker;
pub mod workflow;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use async_trait::async_trait;
pub use backend::{Backends, DEFAULT_URL};
pub use client::{Client, EnqueueRequest};
pub use error::{Error, Result};
pub use job::{FollowUp, Job, JobId, JobOptions, JobState};
pub use retry::RetryPolicy;
pub use task::{Context, Registry, Task, TaskDefaults, TaskError};
pub use tokio_util::sync::CancellationToken;
pub use worker::{Worker, WorkerConfig};
