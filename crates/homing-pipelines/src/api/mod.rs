//! The pipelines' HTTP routes. Uploads are multipart and bounded twice: the whole body by a
//! body limit, each file while it streams in, so a client learns which limit it hit (413) and
//! the server never buffers more than one file's limit.

mod documents;
mod error;
mod exhibitions;

use axum::extract::multipart::Field;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;

use crate::Pipelines;

/// The largest PDF accepted.
pub const PDF_LIMIT: usize = 20 * 1024 * 1024;
/// The largest image accepted.
pub const IMAGE_LIMIT: usize = 10 * 1024 * 1024;
/// Room for multipart headers and small text parts beside the files.
const OVERHEAD: usize = 64 * 1024;

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
            post(documents::create).layer(DefaultBodyLimit::max(PDF_LIMIT + OVERHEAD)),
        )
        .route("/v1/documents/{id}", get(documents::get))
        .route("/v1/documents/{id}/file", get(documents::file))
        .route(
            "/v1/exhibitions",
            post(exhibitions::create).layer(DefaultBodyLimit::max(3 * IMAGE_LIMIT + OVERHEAD)),
        )
        .route("/v1/exhibitions/{id}", get(exhibitions::get))
        .route(
            "/v1/exhibitions/{id}/tracks/{index}",
            get(exhibitions::track),
        )
        .with_state(state)
}

/// Reads one multipart field whole, refusing it once it passes `limit` bytes.
async fn read_field(field: &mut Field<'_>, limit: usize, what: &str) -> Result<Vec<u8>, ApiError> {
    let mut buf = Vec::new();
    while let Some(chunk) = field.chunk().await? {
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::too_large(format!(
                "{what} is larger than the limit of {} MiB",
                limit / (1024 * 1024)
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
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
