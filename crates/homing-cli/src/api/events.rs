//! `GET /v1/jobs/{id}/events`: a job's state changes and progress as server-sent events, until
//! it is terminal. It polls the store (the source of truth, shared by every process) rather than
//! listening in this process, so it sees transitions made by any worker anywhere.
//!
//! Events: `state` (the whole job, sent first and on every change of state, epoch, attempts,
//! crashes or worker) and `progress` (`{"id", "progress"}`). The stream ends after the `state`
//! event that shows a terminal state.

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use std::convert::Infallible;
use std::time::Duration;

use super::jobs::parse_id;
use super::{ApiError, AppState};
use homing::{Job, JobId};

const POLL: Duration = Duration::from_millis(200);

#[derive(Default, PartialEq)]
struct Seen {
    state: Option<(homing::JobState, u64, u32, u32, Option<String>, bool)>,
    progress: Option<serde_json::Value>,
}

fn key(j: &Job) -> (homing::JobState, u64, u32, u32, Option<String>, bool) {
    (
        j.state,
        j.epoch,
        j.attempts,
        j.crashes,
        j.worker.clone(),
        j.cancel_requested,
    )
}

struct Cursor {
    /// Held for as long as the stream is open (`AppState::event_streams`).
    _open: tokio::sync::OwnedSemaphorePermit,
    state: AppState,
    id: JobId,
    seen: Seen,
    pending: Vec<Event>,
    finished: bool,
    first: Option<Job>,
}

fn json_event(name: &str, v: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(v).unwrap_or_else(|_| "null".into()))
}

/// The events that `job` adds to what was already sent.
fn diff(seen: &mut Seen, job: &Job) -> Vec<Event> {
    let mut out = Vec::new();
    if job.progress.is_some() && seen.progress != job.progress {
        seen.progress = job.progress.clone();
        out.push(json_event(
            "progress",
            &serde_json::json!({ "id": job.id, "progress": job.progress }),
        ));
    }
    let k = key(job);
    if seen.state.as_ref() != Some(&k) {
        seen.state = Some(k);
        out.push(json_event("state", job));
    }
    out
}

fn events(c: Cursor) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(c, |mut c| async move {
        loop {
            if !c.pending.is_empty() {
                let ev = c.pending.remove(0);
                return Some((Ok(ev), c));
            }
            if c.finished {
                return None;
            }
            let job = match c.first.take() {
                Some(j) => j,
                None => {
                    tokio::time::sleep(POLL).await;
                    match c.state.backends.store.get(c.id).await {
                        Ok(Some(j)) => j,
                        // The job cannot disappear; a store error ends the stream and the
                        // client reconnects.
                        Ok(None) => return None,
                        Err(e) => {
                            tracing::warn!(error = %e, job = %c.id, "event stream: store read failed");
                            return None;
                        }
                    }
                }
            };
            c.pending = diff(&mut c.seen, &job);
            c.finished = job.state.is_terminal();
        }
    })
}

pub async fn stream(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let open = state
        .event_streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            "this server has as many job event streams open as it allows (half its connections); \
             poll GET /v1/jobs/{id} instead, or try again later",
        )
        })?;
    let job = state.client.get(id).await?;
    let cursor = Cursor {
        _open: open,
        state,
        id,
        seen: Seen::default(),
        pending: Vec::new(),
        finished: false,
        first: Some(job),
    };
    Ok(Sse::new(events(cursor))
        .keep_alive(KeepAlive::default())
        .into_response())
}
