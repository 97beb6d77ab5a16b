//! `builtin.http {url, method, headers, body, timeout}`: calls an HTTP endpoint with
//! `Idempotency-Key: <job id>`, so the endpoint can recognise a redelivered job. 2xx → the
//! result; 5xx, 429 or a transport error/time-out → retry (429 honours `Retry-After`); other
//! 4xx → fail.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use crate::task::{Context, Task, TaskError};

/// The most response body kept on the job record.
const MAX_BODY: usize = 1024 * 1024;

#[derive(Debug, Clone, Default)]
pub struct Http;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpArgs {
    pub url: String,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: Option<serde_json::Value>,
    /// A duration such as `"30s"`, or milliseconds.
    #[serde(default, with = "crate::job::opt_duration")]
    pub timeout: Option<Duration>,
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        crate::tls::install_crypto_provider();
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("an HTTP client with default settings")
    })
}

/// The URL without its query string and credentials, safe to put in an error message or a log.
fn redacted(url: &reqwest::Url) -> String {
    format!(
        "{}://{}{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.path()
    )
}

#[async_trait::async_trait]
impl Task for Http {
    const NAME: &'static str = "builtin.http";
    type Args = HttpArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, args: HttpArgs) -> Result<serde_json::Value, TaskError> {
        let url = reqwest::Url::parse(&args.url)
            .map_err(|e| TaskError::fatal(format!("invalid url: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(TaskError::fatal(format!(
                "unsupported url scheme '{}'",
                url.scheme()
            )));
        }
        let method_name = args.method.clone().unwrap_or_else(|| {
            if args.body.is_some() {
                "POST".into()
            } else {
                "GET".into()
            }
        });
        let method = reqwest::Method::from_bytes(method_name.to_ascii_uppercase().as_bytes())
            .map_err(|_| TaskError::fatal(format!("invalid method '{method_name}'")))?;
        let shown = redacted(&url);
        let mut req = client()
            .request(method, url)
            .header("Idempotency-Key", ctx.idempotency_key())
            .timeout(args.timeout.unwrap_or(Duration::from_secs(30)));
        for (k, v) in &args.headers {
            req = req.header(k, v);
        }
        req = match &args.body {
            Some(serde_json::Value::String(s)) => req.body(s.clone()),
            Some(v) => req.json(v),
            None => req,
        };
        let resp = tokio::select! {
            r = req.send() => r.map_err(|e| TaskError::retry(format!("request to {shown} failed: {}", without_url(&e))))?,
            _ = ctx.cancelled() => return Err(TaskError::retry("cancelled")),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut body = resp
            .bytes()
            .await
            .map_err(|e| {
                TaskError::retry(format!(
                    "reading the response of {shown} failed: {}",
                    without_url(&e)
                ))
            })?
            .to_vec();
        let truncated = body.len() > MAX_BODY;
        body.truncate(MAX_BODY);
        let body_value = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
        });
        let code = status.as_u16();
        if status.is_success() {
            return Ok(
                serde_json::json!({ "status": code, "body": body_value, "truncated": truncated }),
            );
        }
        let snippet: String = String::from_utf8_lossy(&body).chars().take(200).collect();
        let msg = format!("{shown} answered {code}: {snippet}");
        if code == 429 {
            return Err(match retry_after {
                Some(d) => TaskError::RetryIn(msg, d),
                None => TaskError::Retry(msg),
            });
        }
        if status.is_server_error() || code == 408 {
            return Err(TaskError::Retry(msg));
        }
        Err(TaskError::Fatal(msg))
    }
}

/// reqwest errors print the full URL, which may carry secrets; keep only the cause.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = String::new();
    if e.is_timeout() {
        s.push_str("timed out");
    } else if e.is_connect() {
        s.push_str("could not connect");
    } else {
        s.push_str("transport error");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
