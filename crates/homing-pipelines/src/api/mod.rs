//! The pipelines' HTTP routes. Uploads are multipart and bounded twice: the whole body by the
//! route's own body limit (by its declared length before any of it is read, or cut off as it
//! streams in without one), each file while it streams in, so a client learns which limit it
//! hit (413) and the server never buffers more than one file's limit. The limits are set on the
//! routes themselves: the binary's smaller limit for JSON routes does not apply here.

mod documents;
mod error;
mod exhibitions;

use axum::extract::multipart::Field;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post, MethodRouter};
use axum::Router;

pub use error::{refuse_declared_over, ApiError};

use crate::Pipelines;

/// The largest PDF accepted.
pub const PDF_LIMIT: usize = 20 * 1024 * 1024;
/// The largest image accepted.
pub const IMAGE_LIMIT: usize = 10 * 1024 * 1024;
/// Room for multipart headers and small text parts beside the files.
const OVERHEAD: usize = 64 * 1024;
/// The largest request body `POST /v1/documents` reads: one PDF and its multipart framing.
pub const DOCUMENT_BODY_LIMIT: usize = PDF_LIMIT + OVERHEAD;
/// The largest request body `POST /v1/exhibitions` reads: three images and their framing.
pub const EXHIBITION_BODY_LIMIT: usize = 3 * IMAGE_LIMIT + OVERHEAD;

#[derive(Debug, Clone)]
pub struct ApiState {
    pub pipelines: Pipelines,
    pub client: homing::Client,
}

impl ApiState {
    async fn services(&self) -> Result<std::sync::Arc<crate::Services>, ApiError> {
        self.pipelines.services().await.map_err(|e| {
            tracing::error!(error = %format!("{e:#}"), "cannot open the pipelines' storage");
            ApiError::unavailable("the pipelines' storage is unavailable; see the server log")
        })
    }
}

pub fn router<S: Clone + Send + Sync + 'static>(state: ApiState) -> Router<S> {
    Router::new()
        .route(
            "/v1/documents",
            upload(post(documents::create), DOCUMENT_BODY_LIMIT),
        )
        .route("/v1/documents/{id}", get(documents::get))
        .route("/v1/documents/{id}/file", get(documents::file))
        .route(
            "/v1/exhibitions",
            upload(post(exhibitions::create), EXHIBITION_BODY_LIMIT),
        )
        .route("/v1/exhibitions/{id}", get(exhibitions::get))
        .route(
            "/v1/exhibitions/{id}/tracks/{index}",
            get(exhibitions::track),
        )
        .with_state(state)
}

/// Bounds an upload route's body at `limit`, whether its length is declared or not.
fn upload<S: Clone + Send + Sync + 'static>(
    route: MethodRouter<S>,
    limit: usize,
) -> MethodRouter<S> {
    route
        .layer::<_, std::convert::Infallible>(middleware::from_fn_with_state(
            limit,
            refuse_declared_over,
        ))
        .layer(DefaultBodyLimit::max(limit))
}

/// Reads one multipart field whole, refusing it once it passes `limit` bytes.
async fn read_field(field: &mut Field<'_>, limit: usize, what: &str) -> Result<Vec<u8>, ApiError> {
    let mut buf = Vec::new();
    while let Some(chunk) = field.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::too_large(format!(
                "{what} is larger than the limit of {}",
                shown_size(limit)
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// A size as a person would say it: whole MiB when it is that, bytes otherwise.
fn shown_size(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// A client-given file name, kept for display only: no directories, no control characters.
fn display_name(field: &Field<'_>) -> Option<String> {
    let raw = field.file_name()?;
    let base = raw.rsplit(['/', '\\']).next().unwrap_or(raw);
    let clean: String = base.chars().filter(|c| !c.is_control()).take(200).collect();
    (!clean.is_empty()).then_some(clean)
}

/// Parses a path id as a UUID, so nothing else reaches the database or an object key.
fn parse_id(raw: &str, what: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(raw)
        .map_err(|_| ApiError::bad_request(format!("invalid {what} id {raw:?}")))
}
