//! OpenTelemetry traces (docs/traces.md), end to end: real `homing` processes export over
//! OTLP/HTTP to a receiver this test starts, and an HTTP endpoint in the test sees what
//! `builtin.http` and webhooks send onward.
//!
//! The receiver is a small HTTP server here that decodes each `POST /v1/traces` with the
//! official OTLP messages (`opentelemetry-proto`): no OpenTelemetry Collector or Jaeger is
//! installable from the package registries this project may use.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use serde_json::json;
use support::{eventually, http_client, start_up, Env};

/// One exported span, flattened: ids as lowercase hex, attributes as strings.
#[derive(Debug, Clone)]
struct Exported {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
    service: String,
}

impl Exported {
    fn attr(&self, k: &str) -> &str {
        self.attrs.get(k).map(String::as_str).unwrap_or("")
    }
}

type Spans = Arc<Mutex<Vec<Exported>>>;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The OTLP/HTTP receiver: answers `POST /v1/traces` (binary protobuf) and keeps every span.
async fn start_receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    async fn traces(
        axum::extract::State(spans): axum::extract::State<Spans>,
        headers: axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> axum::http::StatusCode {
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/x-protobuf")
        );
        let req = match ExportTraceServiceRequest::decode(body) {
            Ok(r) => r,
            Err(_) => return axum::http::StatusCode::BAD_REQUEST,
        };
        let mut out = spans.lock().unwrap();
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| text(&a.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(Exported {
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        attrs: s
                            .attributes
                            .iter()
                            .map(|a| (a.key.clone(), text(&a.value)))
                            .collect(),
                        service: service.clone(),
                    });
                }
            }
        }
        axum::http::StatusCode::OK
    }
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(traces))
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), spans)
}

/// An endpoint standing in for the systems a job calls: keeps each request's path and
/// `traceparent`, and answers 500 to the first `?fail=N` calls of a path.
async fn start_witness() -> (String, Arc<Mutex<Vec<(String, String)>>>) {
    type Seen = Arc<Mutex<Vec<(String, String)>>>;
    let seen: Seen = Arc::default();
    async fn handle(
        axum::extract::State(seen): axum::extract::State<Seen>,
        uri: axum::http::Uri,
        headers: axum::http::HeaderMap,
        axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
    ) -> axum::http::StatusCode {
        let tp = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let path = uri.path().to_string();
        let n = {
            let mut s = seen.lock().unwrap();
            s.push((path.clone(), tp));
            s.iter().filter(|(p, _)| *p == path).count()
        };
        let fail: usize = q.get("fail").and_then(|v| v.parse().ok()).unwrap_or(0);
        if n <= fail {
            axum::http::StatusCode::INTERNAL_SERVER_ERROR
        } else {
            axum::http::StatusCode::OK
        }
    }
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

fn trace_id_of(tp: &str) -> &str {
    tp.split('-').nth(1).unwrap_or("")
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The exporter's variables: export within 100 ms of a span ending.
fn otel_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ("OTEL_SERVICE_NAME", "homing-under-test".into()),
    ]
}

fn vars<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, x)| (*k, x.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_traceparent_parents_the_enqueue_and_every_run_joins_it() {
    let (endpoint, spans) = start_receiver().await;
    let (witness, seen) = start_witness().await;
    let env = Env::sqlite();
    let o = otel_env(&endpoint);
    let (_up, base) = start_up(&env, &vars(&o)).await;
    let http = http_client();

    // A malformed traceparent is the caller's mistake: a clear 400, nothing enqueued.
    let bad = http
        .post(format!("{base}/v1/jobs"))
        .header("traceparent", "00-nothex-00f067aa0ba902b7-01")
        .json(&json!({"task": "builtin.noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: serde_json::Value = bad.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("traceparent"),
        "{body}"
    );

    // Fails once (retried after 100 ms), then succeeds; its callback is a webhook delivery.
    let resp = http
        .post(format!("{base}/v1/jobs"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({
            "task": "builtin.http",
            "args": {"url": format!("{witness}/call?fail=1"), "timeout": "30s"},
            "max_retries": 3,
            "retry_policy": {"kind": "fixed", "delay": 100},
            "callback_url": format!("{witness}/callback"),
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let job: serde_json::Value = resp.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let stored = job["traceparent"].as_str().unwrap().to_string();
    assert_eq!(
        trace_id_of(&stored),
        CALLER_TRACE,
        "the job stores a context in the caller's trace"
    );

    // builtin.http sent each attempt's traceparent, and the webhook the job's, all in the trace.
    let calls = eventually(Duration::from_secs(30), "two calls and a callback", || {
        let seen = seen.clone();
        async move {
            let s = seen.lock().unwrap().clone();
            let calls = s.iter().filter(|(p, _)| p == "/call").count();
            let cb = s.iter().filter(|(p, _)| p == "/callback").count();
            (calls >= 2 && cb >= 1).then_some(s)
        }
    })
    .await;
    for (path, tp) in &calls {
        assert_eq!(
            trace_id_of(tp),
            CALLER_TRACE,
            "{path} got traceparent {tp:?}"
        );
    }

    // The receiver has the enqueue span (child of the caller's span) and both runs under it.
    let all = eventually(Duration::from_secs(30), "the job's spans", || {
        let spans = spans.clone();
        let id = id.clone();
        async move {
            let s = spans.lock().unwrap().clone();
            let runs = s
                .iter()
                .filter(|x| x.attr("homing.job_id") == id && x.name.starts_with("run "))
                .count();
            let enqueued = s
                .iter()
                .any(|x| x.attr("homing.job_id") == id && x.name.starts_with("enqueue "));
            (runs >= 2 && enqueued).then_some(s)
        }
    })
    .await;
    let mine: Vec<&Exported> = all
        .iter()
        .filter(|x| x.attr("homing.job_id") == id)
        .collect();
    let enqueue = mine
        .iter()
        .find(|x| x.name == "enqueue builtin.http")
        .expect("an enqueue span");
    assert_eq!(enqueue.trace_id, CALLER_TRACE);
    assert_eq!(
        enqueue.parent, CALLER_SPAN,
        "the header's span is the parent"
    );
    assert_eq!(enqueue.service, "homing-under-test");
    assert_eq!(
        stored,
        format!("00-{CALLER_TRACE}-{}-01", enqueue.span_id),
        "the job stores its enqueue span's context"
    );
    let mut runs: Vec<&&Exported> = mine
        .iter()
        .filter(|x| x.name == "run builtin.http")
        .collect();
    runs.sort_by_key(|x| x.attr("homing.attempt").to_string());
    assert_eq!(runs.len(), 2, "{runs:#?}");
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run.trace_id, CALLER_TRACE);
        assert_eq!(
            run.parent, enqueue.span_id,
            "a run is a child of the enqueue"
        );
        assert_eq!(run.attr("homing.task"), "builtin.http");
        assert_eq!(run.attr("homing.queue"), "default");
        assert_eq!(run.attr("homing.attempt"), n.to_string());
        assert_eq!(run.attr("homing.epoch"), (n + 1).to_string());
    }
    assert_eq!(runs[0].attr("homing.outcome"), "retry");
    assert_eq!(runs[1].attr("homing.outcome"), "succeeded");
    // What builtin.http sent is the calling run's own span.
    let sent: Vec<&str> = calls
        .iter()
        .filter(|(p, _)| p == "/call")
        .map(|(_, tp)| tp.split('-').nth(2).unwrap_or(""))
        .collect();
    assert_eq!(sent, [runs[0].span_id.as_str(), runs[1].span_id.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_after_a_crash_joins_the_enqueue_trace_from_another_process() {
    let (endpoint, spans) = start_receiver().await;
    let env = Env::sqlite();
    let o = otel_env(&endpoint);
    let listen = format!("127.0.0.1:{}", support::free_port());
    let _server = env.spawn_with_env("server", &["server", "--listen", &listen], &vars(&o));
    let base = format!("http://{listen}");
    let http = http_client();
    eventually(Duration::from_secs(30), "the server to answer", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let job: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"task": "builtin.sleep", "args": {"ms": 1500}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: homing::JobId = job["id"].as_str().unwrap().parse().unwrap();
    let client = env.client().await;

    // The first worker dies mid-run: its span is never exported.
    let wv = vars(&o);
    let mut first = env.spawn_with_env(
        "worker1",
        &[
            "worker",
            "--queue",
            "default",
            "--heartbeat-interval",
            "200ms",
        ],
        &wv,
    );
    eventually(Duration::from_secs(30), "the job to start", || async {
        let j = client.get(id).await.ok()?;
        (j.state == homing::JobState::Running).then_some(())
    })
    .await;
    first.kill9();
    let _second = env.spawn_with_env(
        "worker2",
        &[
            "worker",
            "--queue",
            "default",
            "--heartbeat-interval",
            "200ms",
        ],
        &wv,
    );
    let done = support::wait_state(
        &client,
        id,
        homing::JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(done.crashes, 1, "the first run was lost with its worker");

    let idt = id.to_string();
    let all = eventually(Duration::from_secs(30), "the reclaimed run's span", || {
        let spans = spans.clone();
        let idt = idt.clone();
        async move {
            let s = spans.lock().unwrap().clone();
            s.iter()
                .any(|x| x.attr("homing.job_id") == idt && x.name.starts_with("run "))
                .then_some(s)
        }
    })
    .await;
    let enqueue = all
        .iter()
        .find(|x| x.attr("homing.job_id") == idt && x.name == "enqueue builtin.sleep")
        .expect("the server exported the enqueue span");
    assert_eq!(
        enqueue.parent, "",
        "no caller context: the enqueue is the root"
    );
    let runs: Vec<&Exported> = all
        .iter()
        .filter(|x| x.attr("homing.job_id") == idt && x.name == "run builtin.sleep")
        .collect();
    assert_eq!(
        runs.len(),
        1,
        "only the surviving run is exported: {runs:#?}"
    );
    assert_eq!(runs[0].trace_id, enqueue.trace_id);
    assert_eq!(runs[0].parent, enqueue.span_id);
    assert_eq!(runs[0].attr("homing.epoch"), "2");
    assert_eq!(runs[0].attr("homing.crashes"), "1");
    assert_eq!(runs[0].attr("homing.outcome"), "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_the_callers_context_is_kept_and_sent_on_as_it_is() {
    let (witness, seen) = start_witness().await;
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let http = http_client();
    let tp = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let job: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .header("traceparent", &tp)
        .json(&json!({
            "task": "builtin.http",
            "args": {"url": format!("{witness}/call"), "timeout": "30s"},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["traceparent"], tp.as_str(), "{job}");
    let calls = eventually(Duration::from_secs(30), "the call", || {
        let seen = seen.clone();
        async move {
            let s = seen.lock().unwrap().clone();
            (!s.is_empty()).then_some(s)
        }
    })
    .await;
    assert_eq!(calls[0].1, tp);
}

/// A remote worker exports nothing: the server records each run from the completion it
/// commits, under the enqueue, and hands the job's context to the worker with the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_records_a_remote_workers_runs_in_the_jobs_trace() {
    let (endpoint, spans) = start_receiver().await;
    let env = Env::sqlite();
    let o = otel_env(&endpoint);
    let (_up, base) = start_up(&env, &vars(&o)).await;
    let http = http_client();
    let post = |path: &str, body: serde_json::Value| {
        let req = http.post(format!("{base}{path}")).json(&body);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status();
            let v: serde_json::Value = r.json().await.unwrap();
            assert!(status.is_success(), "{status} {v}");
            v
        }
    };
    let session = post(
        "/v1/remote/sessions",
        json!({"queues": ["py"], "concurrency": 1, "heartbeat_interval_ms": 1000,
               "tasks": [{"name": "py.work", "max_retries": 1, "retry_delay_ms": 100}]}),
    )
    .await["session"]
        .as_str()
        .unwrap()
        .to_string();
    let job: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({"task": "py.work", "queue": "py", "allow_unknown_task": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let reserve = format!("/v1/remote/sessions/{session}/reserve");
    let complete = format!("/v1/remote/sessions/{session}/complete");
    for outcome in ["error", "succeeded"] {
        let got = eventually(Duration::from_secs(30), "a reserved job", || {
            let f = post(&reserve, json!({"max": 1, "wait_ms": 1000}));
            async move {
                let v = f.await;
                v["jobs"].as_array().and_then(|j| j.first().cloned())
            }
        })
        .await;
        assert_eq!(got["job_id"], id.as_str());
        assert_eq!(
            got["traceparent"], job["traceparent"],
            "the worker gets the job's context"
        );
        let done = post(
            &complete,
            json!({"results": [{"job_id": id, "epoch": got["epoch"], "lease": got["lease"],
                                "outcome": outcome, "error": "first try fails",
                                "result": {"ok": true}}]}),
        )
        .await;
        assert_eq!(done["results"][0]["status"], "applied", "{done}");
    }
    let all = eventually(Duration::from_secs(30), "two run spans", || {
        let spans = spans.clone();
        let id = id.clone();
        async move {
            let s = spans.lock().unwrap().clone();
            let n = s
                .iter()
                .filter(|x| x.attr("homing.job_id") == id && x.name == "run py.work")
                .count();
            (n >= 2).then_some(s)
        }
    })
    .await;
    let enqueue = all
        .iter()
        .find(|x| x.attr("homing.job_id") == id && x.name == "enqueue py.work")
        .expect("an enqueue span");
    assert_eq!(enqueue.parent, CALLER_SPAN);
    let mut runs: Vec<&Exported> = all
        .iter()
        .filter(|x| x.attr("homing.job_id") == id && x.name == "run py.work")
        .collect();
    runs.sort_by_key(|x| x.attr("homing.attempt").to_string());
    assert_eq!(runs.len(), 2);
    for (n, (run, outcome)) in runs.iter().zip(["retry", "succeeded"]).enumerate() {
        assert_eq!(run.trace_id, CALLER_TRACE);
        assert_eq!(run.parent, enqueue.span_id);
        assert_eq!(run.attr("homing.attempt"), n.to_string());
        assert_eq!(run.attr("homing.epoch"), (n + 1).to_string());
        assert_eq!(run.attr("homing.outcome"), outcome);
        assert_eq!(run.attr("homing.queue"), "py");
    }
}

/// `homing enqueue | head -c0`: the job is stored, the output's reader is gone, and the command
/// ends with 141 at once (`std::process::exit`, which skips the drop that exports buffered
/// spans). The enqueue span is still exported: with a batch delay of a minute here, only the
/// flush before that exit can have sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_whose_reader_went_away_still_exports_its_span() {
    let (endpoint, spans) = start_receiver().await;
    let env = Env::sqlite();
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let mut o = otel_env(&endpoint);
    o.retain(|(k, _)| *k != "OTEL_BSP_SCHEDULE_DELAY");
    o.push(("OTEL_BSP_SCHEDULE_DELAY", "60000".into()));
    let mut cmd = env.command(&["enqueue", "builtin.noop"]);
    cmd.envs(o.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().expect("run homing");
        drop(child.stdout.take());
        child.wait_with_output().expect("wait for homing")
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    let (code, listed, err) = env.run(&["jobs", "list", "--task", "builtin.noop"]);
    assert_eq!(code, 0, "{err}");
    let id = listed
        .split_whitespace()
        .find(|w| w.len() == 36 && w.matches('-').count() == 4)
        .unwrap_or_else(|| panic!("the job was stored: {listed}"))
        .to_string();
    // The process has exited: whatever reached the receiver is all there will be.
    let s = spans.lock().unwrap().clone();
    let enqueue = s
        .iter()
        .find(|x| x.name == "enqueue builtin.noop")
        .unwrap_or_else(|| panic!("no enqueue span was exported: {s:#?}"));
    assert_eq!(enqueue.attr("homing.job_id"), id);
    assert_eq!(enqueue.service, "homing-under-test");
}
