//! `ApiError`: every failure as `{"error": {"code", "message"}}` with the right status. Backend
//! details are logged, not sent.

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

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl From<homing::Error> for ApiError {
    fn from(e: homing::Error) -> Self {
        use homing::Error as E;
        match &e {
            E::NotFound(_) => Self::not_found(e.to_string()),
            E::Invalid(m) => Self::bad_request(m.clone()),
            E::Conflict { .. } => Self::new(StatusCode::CONFLICT, "conflict", e.to_string()),
            E::Unavailable { backend, .. } => {
                tracing::warn!(error = %e, "request failed: backend unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("the {backend} backend is unavailable; try again shortly"),
                )
            }
            E::Backend { .. } => {
                tracing::error!(error = %e, "request failed: backend error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; see the server log",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the oversized body was never read, so this connection cannot carry
            // another request: tell the client not to reuse it.
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        resp
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
