//! The external witness: an HTTP server inside the chaos process that every job calls (through
//! `builtin.http`, with `Idempotency-Key: <job id>`). It records each call per key with the time
//! it arrived and answers `{"key", "call": n}`, so a job's committed result names the exact call
//! it came from. It can also tell the fault injector the moment it answers a given job: the
//! trigger for a `kill -9` while that answer is being committed.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use homing::time::{now, Micros};

#[derive(Default)]
struct Inner {
    calls: HashMap<String, Vec<Micros>>,
    /// Keys whose next answer fires the one trap (a mid-commit kill).
    trap_keys: Vec<String>,
    trap: Option<oneshot::Sender<String>>,
    /// (start, end) of every call to the limited queue's path ([`super::limited`]).
    limited: Vec<(Micros, Micros)>,
}

/// Records a limited call's end however it ends, a dropped connection included.
struct LimitedCall(Arc<Mutex<Inner>>, Micros);

impl Drop for LimitedCall {
    fn drop(&mut self) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.limited.push((self.1, now()));
    }
}

#[derive(Clone)]
pub struct Counter {
    pub addr: std::net::SocketAddr,
    inner: Arc<Mutex<Inner>>,
    stop: CancellationToken,
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_string();
    let n = {
        let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
        let v = g.calls.entry(key.clone()).or_default();
        v.push(now());
        v.len()
    };
    let _limited = (uri.path() == super::limited::PATH).then(|| LimitedCall(inner.clone(), now()));
    if let Some(ms) = q.get("delay_ms").and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    {
        let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.trap.is_some() && g.trap_keys.contains(&key) {
            if let Some(tx) = g.trap.take() {
                let _ = tx.send(key.clone());
            }
        }
    }
    (
        StatusCode::OK,
        format!("{{\"key\": \"{key}\", \"call\": {n}}}"),
    )
}

impl Counter {
    pub async fn start() -> anyhow::Result<Counter> {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { s2.cancelled().await })
                .await;
        });
        Ok(Counter { addr, inner, stop })
    }

    pub fn url(&self, delay_ms: u64) -> String {
        format!("http://{}/call?delay_ms={delay_ms}", self.addr)
    }

    /// The same counter on the limited queue's path.
    pub fn limited_url(&self, delay_ms: u64) -> String {
        format!(
            "http://{}{}?delay_ms={delay_ms}",
            self.addr,
            super::limited::PATH
        )
    }

    /// (start, end) of every limited call that has ended.
    pub fn limited_calls(&self) -> Vec<(Micros, Micros)> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .limited
            .clone()
    }

    pub fn snapshot(&self) -> HashMap<String, Vec<Micros>> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .calls
            .clone()
    }

    pub fn total(&self) -> usize {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.calls.values().map(Vec::len).sum()
    }

    /// Fires once, right before the counter answers any of `keys`.
    pub fn trap(&self, keys: Vec<String>) -> oneshot::Receiver<String> {
        let (tx, rx) = oneshot::channel();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.trap_keys = keys;
        g.trap = Some(tx);
        rx
    }

    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    pub fn clear_trap(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.trap_keys.clear();
        g.trap = None;
    }
}
