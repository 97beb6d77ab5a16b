//! homing: crash-safe background jobs. No job accepted is lost, no job commits two results,
//! a lost worker's jobs run again within seconds, and poison jobs are quarantined.
//!
//! A service defines [`Task`]s, enqueues with a [`Client`], and runs a [`Worker`]; the
//! [`broker`] moves messages and the [`store`] keeps the truth about every job.
//!
//! ```no_run
//! use homing::{Backends, Client, Context, EnqueueRequest, Registry, Task, TaskError, Worker, WorkerConfig};
//! use serde::Deserialize;
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
//!     async fn run(&self, _ctx: Context, who: Who) -> Result<String, TaskError> {
//!         Ok(format!("hello, {}", who.name))
//!     }
//! }
//!
//! # async fn demo() -> homing::Result<()> {
//! let backends = Backends::open(homing::DEFAULT_URL, homing::DEFAULT_URL).await?;
//! let client = Client::new(backends.broker.clone(), backends.store.clone());
//! let job = client.enqueue(EnqueueRequest::new("greet", serde_json::json!({"name": "Ada"}))).await?;
//!
//! let mut tasks = Registry::new();
//! tasks.register(Greet);
//! let worker = Worker::new(backends.broker, backends.store, tasks, WorkerConfig::default());
//! let stop = tokio_util::sync::CancellationToken::new();
//! tokio::spawn(worker.run(stop.clone()));
//! let done = client.wait(job.id, std::time::Duration::from_secs(5)).await?;
//! assert_eq!(done.result, Some(serde_json::json!("hello, Ada")));
//! # Ok(()) }
//! ```

pub mod backend;
pub mod broker;
pub mod builtin;
pub mod client;
pub mod error;
pub mod job;
pub mod maintenance;
pub mod retry;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
pub mod task;
pub mod time;
pub mod worker;

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
