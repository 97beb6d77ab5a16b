//! The HTTP server under the API and dashboard: hyper's HTTP/1 connection driver, with the limits
//! that keep a few slow or idle clients from starving everyone else. Without them, sockets that
//! send half a header, trickle a body one byte at a time or sit idle on keep-alive each hold a
//! file descriptor forever, and a thousand of them leave no descriptor for `/healthz`, the store
//! or the broker.
//!
//! - **Header timeout**: hyper closes a connection whose request headers have not fully arrived
//!   within this time of connecting or of the previous answer, so it also bounds an idle
//!   keep-alive connection.
//! - **Request timeout**: a request whose body has not arrived and whose answer is not ready within
//!   this time of its headers gets `408` and its connection is closed. Streaming answers (the job
//!   event stream) are not cut: the time limit covers producing the answer, not sending it.
//! - **Connection cap**: at most this many connections are served at once; further clients wait
//!   in the kernel's accept queue until one closes, and the process keeps descriptors to spare.

use axum::extract::{Request, State};
use axum::http::header::{HeaderValue, CONNECTION};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::api::ApiError;

/// The server's limits; the defaults are the command-line flags' defaults.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub max_connections: usize,
}

/// How long open connections get to finish once the server is told to stop; an event stream
/// left open by a dashboard tab would otherwise hold the shutdown forever.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long the accept loop pauses after a failed accept (out of descriptors, most likely), so
/// that it waits for connections to close instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `stop` is cancelled, then lets open connections finish (up
/// to [`SHUTDOWN_GRACE`]).
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, stop: CancellationToken) {
    let app = app.layer(middleware::from_fn_with_state(
        limits.request_timeout,
        request_deadline,
    ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        // The permit is taken before accepting, so that over the cap clients queue in the kernel
        // rather than as open descriptors here.
        let permit = tokio::select! {
            _ = stop.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Timeouts and clients going away end connections with an error: routine here.
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "open connections did not finish within {SHUTDOWN_GRACE:?} of shutdown; closing them"
        );
    }
}

/// Answers `408` and closes the connection when a request's body has not arrived, or its answer
/// is not ready, within `limit` of its headers.
async fn request_deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            let mut resp = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request was not received and answered within {}",
                    humantime::format_duration(limit)
                ),
            )
            .into_response();
            // The rest of the body may still be on its way: this connection is done.
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}
