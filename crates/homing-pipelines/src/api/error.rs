//! Errors as the rest of homing's API shows them: `{"error": {"code", "message"}}` with the
//! right status, never a 500 for a client's mistake, never internals in the message.

use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::http::StatusCode;
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
        tracing::error!(error = %e, "pipeline request failed");
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
        (self.status, Json(body)).into_response()
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

impl From<homing::Error> for ApiError {
    fn from(e: homing::Error) -> Self {
        match &e {
            homing::Error::NotFound(_) => Self::not_found(e.to_string()),
            homing::Error::Invalid(m) => Self::bad_request(m.clone()),
            homing::Error::Unavailable { .. } => {
                tracing::warn!(error = %e, "pipeline request failed: backend unavailable");
                Self::unavailable("the job backend is unavailable; try again shortly")
            }
            _ => Self::internal(e),
        }
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
