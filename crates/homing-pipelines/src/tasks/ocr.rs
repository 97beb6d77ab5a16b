//! `ocr.extract` turns an issued PDF into text on queue `ocr`; `ocr.notify` tells the user the
//! document was issued. The notification is a follow-up of the extraction's terminal transition
//! — enqueued in the same store transaction as `succeeded` or `failed` — so it is sent exactly
//! once whatever crashes, and it says SUCCESS either way: the seed's rule is that an OCR failure
//! does not undo issuance (the PDF is stored; only automatic analysis is missing).

use serde::Deserialize;
use std::time::Duration;

use super::services;
use crate::ocr::{self, ExtractError};
use crate::state::{ExtractedText, Notification};
use crate::Pipelines;
use homing::{Context, JobState, RetryPolicy, Task, TaskError};

pub const EXTRACT: &str = "ocr.extract";
pub const NOTIFY: &str = "ocr.notify";

#[derive(Debug, Clone)]
pub struct Extract(pub Pipelines);

#[derive(Debug, Deserialize)]
pub struct DocumentArgs {
    pub document: String,
}

#[homing::async_trait]
impl Task for Extract {
    const NAME: &'static str = EXTRACT;
    type Args = DocumentArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, a: DocumentArgs) -> Result<serde_json::Value, TaskError> {
        let s = services(&self.0).await?;
        let doc = s
            .state
            .document(&a.document)
            .await?
            .ok_or_else(|| TaskError::fatal(format!("no document {}", a.document)))?;
        let pdf = s
            .objects
            .get(&doc.object_key)
            .await?
            .ok_or_else(|| TaskError::fatal("the document's file is missing from the store"))?;
        let work = tempfile::tempdir()?;
        let path = work.path().join("document.pdf");
        tokio::fs::write(&path, &pdf).await?;
        let out = ocr::extract(&path, work.path(), &ctx.cancellation_token())
            .await
            .map_err(classify)?;
        let pages = out.pages.len() as u32;
        let methods: Vec<String> = out
            .methods()
            .iter()
            .map(|m| {
                serde_json::to_value(m)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
            })
            .map(Option::unwrap_or_default)
            .collect();
        let chars = out.text.chars().count();
        let low = out.low_confidence_pages();
        if !low.is_empty() {
            tracing::warn!(document = %doc.id, pages = ?low, threshold = ocr::LOW_CONFIDENCE, "pages recognised with low confidence");
        }
        let current = s
            .state
            .save_text(
                &doc.id,
                ctx.epoch(),
                ExtractedText {
                    text: out.text.clone(),
                    pages,
                    methods: methods.clone(),
                    confidences: out.confidences(),
                    low_confidence_pages: low.clone(),
                },
            )
            .await?;
        if !current {
            tracing::warn!(document = %doc.id, epoch = ctx.epoch(), "a newer OCR run saved its text first; discarding this one");
        }
        Ok(serde_json::json!({
            "pages": pages,
            "chars": chars,
            "methods": methods,
            "low_confidence_pages": low,
        }))
    }

    fn queue(&self) -> &str {
        "ocr"
    }
    fn max_retries(&self) -> u32 {
        self.0.settings().ocr_max_retries
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::fixed(self.0.settings().ocr_retry_delay)
    }
    fn time_limit(&self) -> Duration {
        Duration::from_secs(30 * 60)
    }
}

/// Whether running the extraction again can give another answer. The same bytes make the same
/// tools fail the same way: a file poppler refuses (it exits with an error), a crash on the
/// input, a page count it cannot give, too many pages — those fail the job at once with the
/// reason, rather than after every retry. A tool that ran out of time, was stopped, is not
/// installed yet or could not be started, and local I/O are about this machine, not the file:
/// they are retried; so is a tool killed outright (SIGKILL: the kernel's out-of-memory killer or
/// an operator), which says more about the machine's load than about the file.
fn classify(e: ExtractError) -> TaskError {
    if e.is_permanent() {
        TaskError::fatal(e)
    } else {
        TaskError::retry(e)
    }
}

#[derive(Debug, Clone)]
pub struct Notify(pub Pipelines);

/// What the store tells a follow-up about the job it follows.
#[derive(Debug, Deserialize)]
pub struct Parent {
    pub id: String,
    pub state: JobState,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct NotifyArgs {
    pub document: String,
    pub parent: Parent,
}

/// The scheme and host of a URL: enough to tell where a notification went, without the path
/// or query that often carry a token.
fn shown(url: &reqwest::Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or("?"))
}

#[homing::async_trait]
impl Task for Notify {
    const NAME: &'static str = NOTIFY;
    type Args = NotifyArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, a: NotifyArgs) -> Result<serde_json::Value, TaskError> {
        let s = services(&self.0).await?;
        let doc = s
            .state
            .document(&a.document)
            .await?
            .ok_or_else(|| TaskError::fatal(format!("no document {}", a.document)))?;
        // Issuance succeeded when the document was stored; the OCR outcome rides along.
        let payload = serde_json::json!({
            "event": "document.issued",
            "status": "SUCCESS",
            "document": doc.id,
            "ocr_state": a.parent.state,
            "ocr_job": a.parent.id,
            "ocr_error": a.parent.error,
        });
        let channel = match &doc.callback_url {
            Some(raw) => {
                let url = reqwest::Url::parse(raw)
                    .map_err(|e| TaskError::fatal(format!("invalid callback_url: {e}")))?;
                let to = shown(&url);
                let resp = s
                    .http
                    .post(url)
                    .header("Idempotency-Key", ctx.idempotency_key())
                    .timeout(Duration::from_secs(15))
                    .json(&payload)
                    .send()
                    .await
                    .map_err(|e| {
                        TaskError::retry(format!("callback to {to} failed: {}", e.without_url()))
                    })?;
                let status = resp.status();
                if status.is_server_error() || status.as_u16() == 429 {
                    return Err(TaskError::retry(format!(
                        "callback to {to} answered {status}"
                    )));
                }
                if !status.is_success() {
                    return Err(TaskError::fatal(format!(
                        "callback to {to} answered {status}"
                    )));
                }
                tracing::info!(document = %doc.id, status = "SUCCESS", ocr_state = %a.parent.state, to = %to, "issuance notification delivered");
                "callback"
            }
            None => {
                tracing::info!(document = %doc.id, status = "SUCCESS", ocr_state = %a.parent.state, "document issued (no callback_url: notification logged)");
                "log"
            }
        };
        s.state
            .record_notification(
                &ctx.idempotency_key(),
                &doc.id,
                Notification {
                    status: "SUCCESS".into(),
                    ocr_state: a.parent.state.to_string(),
                    channel: channel.into(),
                    at: homing::time::now(),
                },
            )
            .await?;
        Ok(serde_json::json!({ "status": "SUCCESS", "channel": channel }))
    }

    fn max_retries(&self) -> u32 {
        5
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolError;

    fn failed(status: &str) -> ExtractError {
        ExtractError::Tool(ToolError::Failed {
            program: "pdfinfo".into(),
            status: status.into(),
            stderr: "Syntax Error: Couldn't read xref table".into(),
        })
    }

    #[test]
    fn what_the_file_decides_is_fatal_what_the_machine_decides_is_retried() {
        assert!(matches!(
            classify(failed("exit status: 1")),
            TaskError::Fatal(_)
        ));
        assert!(matches!(
            classify(failed("signal: 11 (SIGSEGV) (core dumped)")),
            TaskError::Fatal(_)
        ));
        assert!(matches!(
            classify(ExtractError::NoPageCount),
            TaskError::Fatal(_)
        ));
        assert!(matches!(
            classify(ExtractError::TooManyPages(1000)),
            TaskError::Fatal(_)
        ));
        assert!(matches!(
            classify(failed("signal: 9 (SIGKILL)")),
            TaskError::Retry(_)
        ));
        let timed_out = ExtractError::Tool(ToolError::TimedOut {
            program: "tesseract".into(),
            limit: Duration::from_secs(300),
        });
        assert!(matches!(classify(timed_out), TaskError::Retry(_)));
        let io = ExtractError::Io(std::io::Error::other("disk full"));
        assert!(matches!(classify(io), TaskError::Retry(_)));
    }
}
