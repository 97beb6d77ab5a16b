//! `ApiError`: every failure of homing's HTTP API — the binary's `/v1/jobs` routes and these
//! pipeline routes alike — as `{"error": {"code", "message"}}` with the right status, never a
//! 500 for a client's mistake, never internals in the message. It lives here, not in the
//! binary, because the binary already links this crate while this crate must not link the
//! binary: one type, so the two APIs cannot drift apart again.
//!
//! [`refuse_declared_over`] is the other half of an upload limit every route shares: it refuses
//! a body by its declared length before reading any of it.

use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", m)
    }
    pub fn too_large(m: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", m)
    }
    pub fn unsupported(m: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            m,
        )
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
    }
    /// A failure on our side: logged in full, answered without details.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the server log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the oversized body was never read, so this connection cannot carry
            // another request: tell the client not to reuse it.
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<homing::Error> for ApiError {
    fn from(e: homing::Error) -> Self {
        use homing::Error as E;
        match &e {
            E::NotFound(_) | E::WorkflowNotFound(_) => Self::not_found(e.to_string()),
            E::Invalid(m) => Self::bad_request(m.clone()),
            E::Conflict { .. } => Self::new(StatusCode::CONFLICT, "conflict", e.to_string()),
            E::Unavailable { backend, .. } => {
                tracing::warn!(error = %e, "request failed: backend unavailable");
                Self::unavailable(format!(
                    "the {backend} backend is unavailable; try again shortly"
                ))
            }
            E::Backend { .. } => Self::internal(e),
        }
    }
}

impl From<MultipartError> for ApiError {
    fn from(e: MultipartError) -> Self {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            Self::too_large(format!("the request body is too large: {}", e.body_text()))
        } else if status.is_client_error() {
            Self::new(status, "invalid_multipart", e.body_text())
        } else {
            Self::internal(e.body_text())
        }
    }
}

impl From<MultipartRejection> for ApiError {
    fn from(r: MultipartRejection) -> Self {
        Self::new(
            r.status(),
            "invalid_multipart",
            format!("{} (send multipart/form-data)", r.body_text()),
        )
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "payload_too_large"
        } else if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            "unsupported_media_type"
        } else {
            "invalid_json"
        };
        Self::new(status, code, r.body_text())
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        Self::bad_request(r.body_text())
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        Self::bad_request(r.body_text())
    }
}

impl From<crate::state::StateError> for ApiError {
    fn from(e: crate::state::StateError) -> Self {
        Self::internal(e)
    }
}

impl From<object_store::Error> for ApiError {
    fn from(e: object_store::Error) -> Self {
        Self::internal(e)
    }
}

/// Middleware: answers 413 to a request whose declared `Content-Length` is over `limit`, before
/// reading any of its body. Pair it with `DefaultBodyLimit::max(limit)` on the same routes, which
/// cuts off a body sent without a length (chunked) at the same size. Applied per route, so
/// each route's own limit is the one that holds.
pub async fn refuse_declared_over(
    State(limit): State<usize>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => ApiError::too_large(format!(
            "request body of {n} bytes is over the limit of {limit} bytes"
        ))
        .into_response(),
        _ => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_their_statuses() {
        let conflict = homing::Error::Conflict {
            id: homing::job::new_job_id(),
            state: homing::JobState::Running,
            message: "cannot retry a running job".into(),
        };
        assert_eq!(ApiError::from(conflict).status, StatusCode::CONFLICT);
        let missing = homing::Error::NotFound(homing::job::new_job_id());
        assert_eq!(ApiError::from(missing).status, StatusCode::NOT_FOUND);
        let invalid = homing::Error::Invalid("bad".into());
        assert_eq!(ApiError::from(invalid).status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn only_a_413_closes_the_connection() {
        let r = ApiError::too_large("big").into_response();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(r.headers()[header::CONNECTION], "close");
        let r = ApiError::bad_request("no").into_response();
        assert!(r.headers().get(header::CONNECTION).is_none());
    }
}
