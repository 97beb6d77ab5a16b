//! `ExactJson`: the JSON body of a route that stores what it is sent (a job's args, a workflow,
//! a schedule, a progress value), read as axum's `Json` reads it and then refused if it
//! holds an integer beyond 64 bits. The JSON reader keeps such a number as a double without a
//! word, so the job would run with a value other than the one its producer sent; every other
//! way a body can break a rule is refused, and so is this one (`homing::validate::exact_integers`).
//!
//! Bodies whose numbers are typed fields (a session's heartbeat, a reservation's count) need no
//! such check: their reader already refuses a number that does not fit. A worker's completion
//! checks each result apart (`homing::remote::Reported`), so that one job's result cannot have
//! every job of the call refused, and a batch each item, so that the refusal names it.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Json;
use serde::de::DeserializeOwned;

use super::ApiError;

/// A JSON body, as `axum::Json` reads it, with its integers exact.
pub struct ExactJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ExactJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Expected request with `Content-Type: application/json`",
            ));
        }
        // Within the route's body limit, as `Json` would read it.
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            let code = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "payload_too_large"
            } else {
                "invalid_json"
            };
            ApiError::new(r.status(), code, r.body_text())
        })?;
        let Json(value) = Json::<T>::from_bytes(&bytes)?;
        homing::validate::exact_integers(&bytes)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", e))?;
        Ok(ExactJson(value))
    }
}

/// `application/json`, or a `+json` type, whatever its parameters: what `axum::Json` accepts.
fn json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_are_those_json_takes() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::CONTENT_TYPE, v.parse().unwrap());
            json_content_type(&m)
        };
        assert!(h("application/json"));
        assert!(h("Application/JSON; charset=utf-8"));
        assert!(h("application/problem+json"));
        assert!(!h("text/plain"));
        assert!(!h("application/jsonx"));
        assert!(!json_content_type(&HeaderMap::new()));
    }
}
