//! `builtin.http {url, method, headers, body, timeout}`: calls an HTTP endpoint with
//! `Idempotency-Key: <job id>`, so the endpoint can recognise a redelivered job. 2xx → the
//! result; 5xx, 429 or a transport error/time-out → retry (429 honours `Retry-After`); other
//! 4xx → fail.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use crate::egress;
use crate::task::{Context, Task, TaskError};

/// The most response body kept on the job record.
const MAX_BODY: usize = 1024 * 1024;
/// The longest `timeout` a call may ask for (the job's time limit still applies).
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The longest `Retry-After` honoured; a server asking for more is retried after this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

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

/// One client per process, bound to the process's egress policy (`crate::egress`).
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        crate::tls::install_crypto_provider();
        egress::client(
            egress::policy(),
            reqwest::Client::builder().connect_timeout(egress::CONNECT_TIMEOUT),
        )
    })
}

/// The URL without its query string and credentials, safe to put in an error message or a log.
fn redacted(url: &reqwest::Url) -> String {
    // The port stays: it often tells which of a host's services failed.
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "{}://{}{port}{}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.path()
    )
}

/// The call's URL, method and timeout, or why the args can never make a call. The same rules at
/// enqueue (`Task::check`, so a producer hears at once) and at run time.
fn checked(args: &HttpArgs) -> Result<(reqwest::Url, reqwest::Method, Duration), String> {
    let url = reqwest::Url::parse(&args.url).map_err(|e| format!("invalid url: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("unsupported url scheme '{}'", url.scheme()));
    }
    let method_name = args.method.clone().unwrap_or_else(|| {
        if args.body.is_some() {
            "POST".into()
        } else {
            "GET".into()
        }
    });
    let method = reqwest::Method::from_bytes(method_name.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("invalid method '{method_name}'"))?;
    // A header the request cannot carry would fail every attempt as a transport error, retried
    // as if the endpoint were down.
    for (name, value) in &args.headers {
        let shown_name: String = name.chars().take(64).collect();
        reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name {shown_name:?}"))?;
        reqwest::header::HeaderValue::from_str(value).map_err(|_| {
            format!("invalid value for header {shown_name:?}: control characters such as a newline are not allowed")
        })?;
    }
    let timeout = args.timeout.unwrap_or(Duration::from_secs(30));
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(format!(
            "timeout must be between 1ms and {}",
            humantime::format_duration(MAX_TIMEOUT)
        ));
    }
    Ok((url, method, timeout))
}

#[async_trait::async_trait]
impl Task for Http {
    const NAME: &'static str = "builtin.http";
    type Args = HttpArgs;
    type Output = serde_json::Value;

    fn check(&self, args: &HttpArgs) -> Result<(), String> {
        checked(args).map(|_| ())
    }

    async fn run(&self, ctx: Context, args: HttpArgs) -> Result<serde_json::Value, TaskError> {
        let (url, method, timeout) = checked(&args).map_err(TaskError::fatal)?;
        // Refused destinations are the producer's mistake: retrying cannot help. Checked at run
        // time, not only at enqueue: the policy is the worker's, and names resolve differently
        // over time.
        egress::policy()
            .check_url(&url)
            .map_err(|d| TaskError::fatal(d.to_string()))?;
        let shown = redacted(&url);
        let mut req = client()
            .request(method, url)
            .header("Idempotency-Key", ctx.idempotency_key())
            .timeout(timeout);
        // The job's trace goes on to the endpoint (docs/traces.md), unless the producer put a
        // `traceparent` of its own in `headers`.
        if let Some(tp) = ctx.traceparent() {
            if !args
                .headers
                .keys()
                .any(|k| k.eq_ignore_ascii_case("traceparent"))
            {
                req = req.header("traceparent", tp);
            }
        }
        for (k, v) in &args.headers {
            req = req.header(k, v);
        }
        req = match &args.body {
            Some(serde_json::Value::String(s)) => req.body(s.clone()),
            Some(v) => req.json(v),
            None => req,
        };
        let resp = tokio::select! {
            r = req.send() => r.map_err(|e| match egress::denial(&e) {
                Some(d) => TaskError::fatal(format!("request to {shown} refused: {d}")),
                None => TaskError::retry(format!("request to {shown} failed: {}", without_url(&e))),
            })?,
            _ = ctx.cancelled() => return Err(TaskError::retry("cancelled")),
        };
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER));
        // Read only as far as is kept: the whole of a multi-gigabyte answer once took the
        // worker's memory with it. Dropping the response then closes the connection.
        let mut resp = resp;
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = resp.chunk().await.map_err(|e| {
            TaskError::retry(format!(
                "reading the response of {shown} failed: {}",
                without_url(&e)
            ))
        })? {
            let room = MAX_BODY - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        drop(resp);
        let body_value = response_body(&body);
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

/// The response body as the result holds it: its JSON when that can be stored as it is
/// (see [`crate::validate`]: not too deep, no U+0000, no integer beyond 64 bits, which would be
/// kept changed), else its text.
fn response_body(body: &[u8]) -> serde_json::Value {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v)
            if crate::validate::json("body", &v, usize::MAX).is_ok()
                && crate::validate::exact_integers(body).is_ok() =>
        {
            v
        }
        _ => serde_json::Value::String(crate::validate::text(
            &String::from_utf8_lossy(body),
            usize::MAX,
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_the_request_cannot_carry_are_refused_at_the_check() {
        let args = |name: &str, value: &str| -> HttpArgs {
            serde_json::from_value(serde_json::json!({
                "url": "http://example.com/",
                "headers": { name: value },
            }))
            .unwrap()
        };
        assert_eq!(Http.check(&args("x-ok", "fine")), Ok(()));
        let e = Http.check(&args("bad header", "x")).unwrap_err();
        assert!(e.contains("invalid header name \"bad header\""), "{e}");
        let e = Http.check(&args("x-split", "a\nb")).unwrap_err();
        assert!(e.contains("invalid value for header \"x-split\""), "{e}");
    }

    #[test]
    fn unstorable_responses_are_kept_as_text() {
        assert_eq!(
            response_body(br#"{"a": [1]}"#),
            serde_json::json!({"a": [1]})
        );
        let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let v = response_body(deep.as_bytes());
        assert_eq!(v, serde_json::Value::String(deep));
        assert!(crate::validate::result(&serde_json::json!({ "body": v })).is_ok());
        // An integer the reader would round: the body is kept as its text, exactly.
        let wide = br#"{"id": 123456789012345678901234567890}"#;
        assert_eq!(
            response_body(wide),
            serde_json::Value::String(String::from_utf8(wide.to_vec()).unwrap())
        );
        let v = response_body(b"a\0b");
        assert_eq!(v, serde_json::json!("a\u{FFFD}b"));
        let v = response_body(br#"{"x": "\u0000"}"#);
        assert!(v.is_string() && crate::validate::result(&v).is_ok());
    }

    #[test]
    fn errors_show_the_port_but_never_credentials_or_query() {
        let url = reqwest::Url::parse("http://user:secret@127.0.0.1:8080/hook?token=t").unwrap();
        assert_eq!(redacted(&url), "http://127.0.0.1:8080/hook");
        let url = reqwest::Url::parse("https://example.test/x").unwrap();
        assert_eq!(redacted(&url), "https://example.test/x");
    }
}
