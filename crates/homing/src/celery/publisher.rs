//! The other direction: a homing application hands tasks to existing Python Celery workers. A
//! message is written exactly as a Celery producer writes it (`LPUSH` of a protocol 2 envelope
//! onto the queue's kombu list for its priority), so a stock worker runs it and stores its result
//! in its own result backend, which [`CeleryClient::result`] reads.
//!
//! The message is the record: homing keeps no job for it, because once a Python worker takes it
//! Celery's own delivery rules apply (see the README's notes on sharing a Redis with Python).

use serde_json::{Map, Value};
use std::time::Duration;

use super::conn::Conn;
use super::{keys, wire};
use crate::error::{Error, Result};
use crate::time::{micros, now};

/// One Celery task to send.
#[derive(Debug, Clone, PartialEq)]
pub struct CelerySend {
    pub task: String,
    pub queue: String,
    pub args: Vec<Value>,
    pub kwargs: Map<String, Value>,
    pub countdown: Option<Duration>,
    pub expires: Option<Duration>,
    /// 0–9; kombu's Redis transport serves lower numbers first.
    pub priority: u8,
    /// Defaults to a fresh UUID.
    pub task_id: Option<String>,
}

impl CelerySend {
    pub fn new(task: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            task: task.into(),
            queue: queue.into(),
            args: Vec::new(),
            kwargs: Map::new(),
            countdown: None,
            expires: None,
            priority: 0,
            task_id: None,
        }
    }

    /// Takes the arguments from JSON: an array is the positional args, an object the kwargs.
    pub fn with_json_args(mut self, v: Value) -> Result<Self> {
        match v {
            Value::Array(a) => self.args = a,
            Value::Object(o) => self.kwargs = o,
            Value::Null => {}
            other => {
                return Err(Error::Invalid(format!(
                    "Celery arguments must be a JSON array (positional) or object (keyword), not {other}"
                )))
            }
        }
        Ok(self)
    }
}

/// Publishes Celery messages and reads Celery results.
#[derive(Debug, Clone)]
pub struct CeleryClient {
    broker: Conn,
    backend: Option<Conn>,
}

impl CeleryClient {
    /// `broker`: the Celery broker URL (`redis://…`, `rediss://…`, `redis+socket://…`);
    /// `backend`: the Celery result backend URL, for [`CeleryClient::result`].
    pub fn open(broker: &str, backend: Option<&str>) -> Result<Self> {
        Ok(Self {
            broker: Conn::open(broker)?,
            backend: backend.map(Conn::open).transpose()?,
        })
    }

    /// Sends one task; returns its Celery task id.
    pub async fn send(&self, s: CelerySend) -> Result<String> {
        let mut ids = self.send_many(vec![s]).await?;
        Ok(ids.remove(0))
    }

    /// Sends tasks in one round trip; returns their Celery task ids in order.
    pub async fn send_many(&self, sends: Vec<CelerySend>) -> Result<Vec<String>> {
        let origin = format!(
            "homing@{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into())
        );
        let at = now();
        let mut pipe = ::redis::pipe();
        let mut ids = Vec::with_capacity(sends.len());
        let mut queues = std::collections::BTreeSet::new();
        for s in sends {
            crate::client::validate_name("task", &s.task)?;
            crate::client::validate_name("queue", &s.queue)?;
            let id = s.task_id.unwrap_or_else(wire::new_task_id);
            let out = wire::Outgoing {
                id: id.clone(),
                task: s.task,
                queue: s.queue.clone(),
                args: s.args,
                kwargs: s.kwargs,
                eta: s.countdown.map(|d| at + micros(d)),
                expires: s.expires.map(|d| at + micros(d)),
                priority: s.priority,
            };
            pipe.cmd("LPUSH")
                .arg(keys::queue_list(&s.queue, s.priority))
                .arg(wire::encode(&out, &origin))
                .ignore();
            queues.insert(s.queue);
            ids.push(id);
        }
        // The binding a Celery app declares for its queue, so producers that route through the
        // queue's exchange (rather than straight to the list) find it too.
        for q in &queues {
            pipe.cmd("SADD")
                .arg(keys::binding(q))
                .arg(keys::binding_entry(q))
                .ignore();
        }
        let mut c = self.broker.get().await?;
        pipe.query_async::<()>(&mut c)
            .await
            .map_err(crate::broker::redis::err)?;
        Ok(ids)
    }

    /// The result backend's record of a task (`{"status", "result", ...}`), if any yet.
    pub async fn result(&self, task_id: &str) -> Result<Option<Value>> {
        let Some(b) = &self.backend else {
            return Err(Error::Invalid("no Celery result backend configured".into()));
        };
        let mut c = b.get().await?;
        let raw: Option<String> = ::redis::cmd("GET")
            .arg(keys::result(task_id))
            .query_async(&mut c)
            .await
            .map_err(crate::broker::redis::err)?;
        raw.map(|r| {
            serde_json::from_str(&r)
                .map_err(|e| Error::backend_from("celery", e).context("unreadable result"))
        })
        .transpose()
    }
}
