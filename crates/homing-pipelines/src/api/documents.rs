//! `POST /v1/documents` issues a document (stores the PDF, enqueues its OCR);
//! `GET /v1/documents/{id}` shows it with its OCR state and text; `GET …/file` returns the PDF.

use axum::extract::rejection::PathRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{display_name, parse_id, read_field, ApiError, ApiState, PDF_LIMIT};
use crate::objects::keys;
use crate::state::Document;
use crate::tasks::ocr::{EXTRACT, NOTIFY};
use homing::{EnqueueRequest, FollowUp, JobOptions, RetryPolicy};

fn ocr_key(document: &str) -> String {
    format!("{EXTRACT}:{document}")
}

fn check_callback(raw: &str) -> Result<String, ApiError> {
    let raw = raw.trim();
    if raw.len() > 2048 {
        return Err(ApiError::bad_request(
            "callback_url is longer than 2048 bytes",
        ));
    }
    let url = reqwest::Url::parse(raw)
        .map_err(|e| ApiError::bad_request(format!("callback_url is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ApiError::bad_request(
            "callback_url must be an http:// or https:// URL with a host",
        ));
    }
    Ok(url.to_string())
}

pub async fn create(
    State(st): State<ApiState>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let mut multipart = multipart?;
    let mut file: Option<(Vec<u8>, Option<String>)> = None;
    let mut callback = None;
    while let Some(mut field) = multipart.next_field().await? {
        match field.name().unwrap_or("") {
            "file" if file.is_none() => {
                let name = display_name(&field);
                let bytes = read_field(&mut field, PDF_LIMIT, "the PDF").await?;
                file = Some((bytes, name));
            }
            "file" => return Err(ApiError::bad_request("send exactly one part named `file`")),
            "callback_url" => {
                let bytes = read_field(&mut field, 4096, "callback_url").await?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| ApiError::bad_request("callback_url is not UTF-8"))?;
                callback = Some(check_callback(&text)?);
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unexpected part {other:?}: send a part `file` (the PDF) and optionally `callback_url`"
                )))
            }
        }
    }
    let (pdf, filename) =
        file.ok_or_else(|| ApiError::bad_request("missing the part `file` (the PDF)"))?;
    if !pdf.starts_with(b"%PDF-") {
        return Err(ApiError::unsupported(
            "`file` is not a PDF (it must start with %PDF-)",
        ));
    }

    let s = st.services().await?;
    let id = homing::job::new_job_id().to_string();
    let object_key = keys::document(&id);
    let size = pdf.len() as u64;
    s.objects.put(&object_key, pdf).await?;
    s.state
        .insert_document(Document {
            id: id.clone(),
            filename,
            size,
            object_key,
            callback_url: callback,
            ocr_job: None,
            text: None,
            pages: None,
            methods: None,
            confidences: None,
            low_confidence_pages: None,
            created_at: homing::time::now(),
            extracted_at: None,
        })
        .await?;

    let settings = st.pipelines.settings();
    let notify = FollowUp {
        task: NOTIFY.into(),
        queue: Some("default".into()),
        args: json!({ "document": id }),
    };
    let req = EnqueueRequest {
        task: EXTRACT.into(),
        args: json!({ "document": id }),
        options: JobOptions {
            queue: Some("ocr".into()),
            // The key ties the job to the document: the document page finds it even if the
            // server stopped before recording the job's id.
            idempotency_key: Some(ocr_key(&id)),
            max_retries: Some(settings.ocr_max_retries),
            retry_policy: Some(RetryPolicy::fixed(settings.ocr_retry_delay)),
            on_success: Some(notify.clone()),
            on_failure: Some(notify),
            ..JobOptions::default()
        },
    };
    let job = st.client.enqueue(req).await?;
    s.state.set_ocr_job(&id, &job.id.to_string()).await?;
    tracing::info!(document = %id, job = %job.id, bytes = size, "document issued");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/documents/{id}"))],
        Json(json!({ "id": id, "ocr_state": job.state, "ocr_job": job.id })),
    )
        .into_response())
}

pub async fn get(
    State(st): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(raw) = path?;
    let id = parse_id(&raw, "document")?.to_string();
    let s = st.services().await?;
    let doc = s
        .state
        .document(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no document {id}")))?;
    let job = match &doc.ocr_job {
        Some(j) => match j.parse() {
            Ok(jid) => st.client.store().get(jid).await?,
            Err(_) => None,
        },
        None => st.client.store().get_by_key(&ocr_key(&id)).await?,
    };
    // Read the document again after its job: the OCR handler stores the text before the job's
    // success is recorded, so text read now is at least as new as the state shown; from the
    // first read alone a view could say "succeeded" with no text.
    let doc = s
        .state
        .document(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no document {id}")))?;
    let notifications: Vec<_> = s
        .state
        .notifications(&id)
        .await?
        .into_iter()
        .map(|n| {
            json!({
                "status": n.status,
                "ocr_state": n.ocr_state,
                "channel": n.channel,
                "at": homing::time::rfc3339(n.at),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": doc.id,
        // The document is issued from the moment it is stored; OCR cannot undo that.
        "state": "issued",
        "ocr_state": job.as_ref().map(|j| j.state.as_str()).unwrap_or("unknown"),
        "ocr_job": job.as_ref().map(|j| j.id),
        "ocr_attempts": job.as_ref().map(|j| j.attempts),
        "ocr_error": job.as_ref().and_then(|j| j.error.clone()),
        "text": doc.text,
        "pages": doc.pages,
        "methods": doc.methods,
        // Per page: the OCR's mean word confidence (null for a text layer), and the pages
        // below ocr::LOW_CONFIDENCE, which a person should check.
        "page_confidence": doc.confidences,
        "low_confidence_pages": doc.low_confidence_pages,
        "filename": doc.filename,
        "size": doc.size,
        "file_url": format!("/v1/documents/{id}/file"),
        "created_at": homing::time::rfc3339(doc.created_at),
        "extracted_at": doc.extracted_at.map(homing::time::rfc3339),
        "notifications": notifications,
    })))
}

pub async fn file(
    State(st): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(raw) = path?;
    let id = parse_id(&raw, "document")?.to_string();
    let s = st.services().await?;
    let doc = s
        .state
        .document(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no document {id}")))?;
    let pdf = s
        .objects
        .get(&doc.object_key)
        .await?
        .ok_or_else(|| ApiError::not_found("the document's file is missing"))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/pdf".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"document-{id}.pdf\""),
            ),
        ],
        pdf,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn callback_urls_must_be_http_with_a_host() {
        assert!(super::check_callback("https://example.test/hook?t=1").is_ok());
        assert!(super::check_callback("file:///etc/passwd").is_err());
        assert!(super::check_callback("not a url").is_err());
    }
}
