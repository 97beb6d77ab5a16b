//! OpenTelemetry traces (docs/traces.md): an enqueue span and one span per run of a job, in the
//! trace whose context the job carries in the store (`traceparent`), exported over OTLP/HTTP
//! when the standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables are set.
//!
//! The OpenTelemetry API is used directly rather than through a `tracing` layer: spans exist
//! only where a job is enqueued or run, and with no exporter configured the job path pays one
//! check of a `OnceLock` and nothing else. Without the `otel` feature every function here is a
//! no-op that says "off".

use crate::job::{Job, NewJob};
use crate::transition::Outcome;

/// The name of a run's outcome, as recorded on its span (`homing.outcome`).
pub fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Succeeded(_) => "succeeded",
        Outcome::Retry { .. } => "retry",
        Outcome::Failed { .. } => "failed",
        Outcome::Snooze { .. } => "snoozed",
        Outcome::Cancelled => "cancelled",
        Outcome::Released => "released",
        Outcome::Dead { .. } => "dead",
    }
}

/// Whether `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` asks for
/// traces (and `OTEL_SDK_DISABLED` does not forbid them).
pub fn requested() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

#[cfg(feature = "otel")]
mod imp {
    use super::*;
    use opentelemetry::trace::{
        Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
        TraceState, Tracer as _, TracerProvider as _,
    };
    use opentelemetry::{Context, KeyValue};
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};
    use std::sync::OnceLock;
    use std::time::{Duration, SystemTime};

    static TRACER: OnceLock<SdkTracer> = OnceLock::new();
    /// The provider again, for [`flush`]: a process that must end at once (`std::process::exit`
    /// skips the [`Guard`]'s drop) still exports what it buffered.
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    /// Keeps the exporter alive; dropping it exports what is still buffered. Drop it outside
    /// any async runtime (the exporter's HTTP client is a blocking one).
    pub struct Guard(SdkTracerProvider);

    impl std::fmt::Debug for Guard {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("otel::Guard")
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            if let Err(e) = self.0.shutdown() {
                tracing::warn!(error = %e, "could not export the last spans");
            }
        }
    }

    /// Starts exporting spans if the standard variables ask for it (see [`requested`]);
    /// `service` names this process unless `OTEL_SERVICE_NAME` does. Call it once, before
    /// starting an async runtime. `Ok(None)`: traces are off.
    pub fn init_from_env(service: &str) -> Result<Option<Guard>, String> {
        if !requested() || TRACER.get().is_some() {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()
            .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(service.to_string());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let _ = TRACER.set(provider.tracer("homing"));
        let _ = PROVIDER.set(provider.clone());
        Ok(Some(Guard(provider)))
    }

    pub fn enabled() -> bool {
        TRACER.get().is_some()
    }

    /// Exports the spans still buffered, waiting for the exporter; for a process about to call
    /// `std::process::exit`. Blocks the calling thread (the export runs on the exporter's own
    /// thread, so a runtime's thread may call it). Does nothing when traces are off.
    pub fn flush() {
        if let Some(p) = PROVIDER.get() {
            if let Err(e) = p.force_flush() {
                tracing::warn!(error = %e, "could not export the last spans");
            }
        }
    }

    fn format(sc: &SpanContext) -> String {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    }

    fn parse(tp: &str) -> Option<SpanContext> {
        crate::tracecontext::validate(tp).ok()?;
        let mut f = tp.split('-').skip(1);
        let trace = TraceId::from_hex(f.next()?).ok()?;
        let span = SpanId::from_hex(f.next()?).ok()?;
        let flags = u8::from_str_radix(f.next()?, 16).ok()?;
        Some(SpanContext::new(
            trace,
            span,
            TraceFlags::new(flags & 1),
            true,
            TraceState::NONE,
        ))
    }

    /// The context a span continues: the stored/received `traceparent` if any, else the
    /// caller's current OpenTelemetry context (a root when it has none).
    fn parent(tp: Option<&str>) -> Context {
        match tp.and_then(parse) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::current(),
        }
    }

    fn job_attributes(task: &str, queue: &str, id: &crate::job::JobId) -> Vec<KeyValue> {
        vec![
            KeyValue::new("messaging.system", "homing"),
            KeyValue::new("messaging.destination.name", queue.to_string()),
            KeyValue::new("homing.task", task.to_string()),
            KeyValue::new("homing.queue", queue.to_string()),
            KeyValue::new("homing.job_id", id.to_string()),
        ]
    }

    /// An enqueue in progress.
    pub struct EnqueueSpan(Span);

    /// Opens the enqueue span of `job` (when traces are on) and makes its context the one
    /// the job stores, so the job's runs become its children.
    pub fn start_enqueue(job: &mut NewJob) -> Option<EnqueueSpan> {
        let tracer = TRACER.get()?;
        let cx = parent(job.options.traceparent.as_deref());
        let span = tracer
            .span_builder(format!("enqueue {}", job.task))
            .with_kind(SpanKind::Producer)
            .with_attributes(job_attributes(&job.task, &job.queue, &job.id))
            .start_with_context(tracer, &cx);
        job.options.traceparent = Some(format(span.span_context()));
        Some(EnqueueSpan(span))
    }

    impl EnqueueSpan {
        /// `existed`: an idempotency key or uniqueness returned an earlier job instead.
        pub fn end(mut self, result: Result<bool, &str>) {
            match result {
                Ok(existed) => self
                    .0
                    .set_attribute(KeyValue::new("homing.existed", existed)),
                Err(e) => self.0.set_status(Status::error(e.to_string())),
            }
            self.0.end();
        }
    }

    /// A run in progress.
    pub struct RunSpan {
        span: Span,
        traceparent: String,
    }

    fn run_builder(tracer: &SdkTracer, job: &Job) -> opentelemetry::trace::SpanBuilder {
        let mut attrs = job_attributes(&job.task, &job.queue, &job.id);
        attrs.push(KeyValue::new("homing.attempt", i64::from(job.attempts)));
        attrs.push(KeyValue::new(
            "homing.epoch",
            i64::try_from(job.epoch).unwrap_or(i64::MAX),
        ));
        attrs.push(KeyValue::new("homing.crashes", i64::from(job.crashes)));
        if let Some(w) = &job.worker {
            attrs.push(KeyValue::new("homing.worker", w.clone()));
        }
        tracer
            .span_builder(format!("run {}", job.task))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attrs)
    }

    /// Opens the span of the run `job` is starting (when traces are on), a child of the
    /// context stored with the job.
    pub fn start_run(job: &Job) -> Option<RunSpan> {
        let tracer = TRACER.get()?;
        let span = run_builder(tracer, job).start_with_context(tracer, &parent_of_run(job));
        let traceparent = format(span.span_context());
        Some(RunSpan { span, traceparent })
    }

    /// A run continues the job's stored context only: a worker's own current context (if its
    /// embedder has one) is not the job's trace.
    fn parent_of_run(job: &Job) -> Context {
        match job.traceparent.as_deref().and_then(parse) {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        }
    }

    impl RunSpan {
        /// This run's own context, handed on by outgoing calls (`builtin.http`, webhooks).
        pub fn traceparent(&self) -> &str {
            &self.traceparent
        }

        pub fn end(mut self, outcome: &str) {
            end_run(&mut self.span, outcome);
        }
    }

    fn end_run(span: &mut Span, outcome: &str) {
        span.set_attribute(KeyValue::new("homing.outcome", outcome.to_string()));
        if matches!(outcome, "retry" | "failed" | "dead" | "lost") {
            span.set_status(Status::error(outcome.to_string()));
        }
        span.end();
    }

    /// Records a run that already ended, from what the server saw of it (a remote worker's
    /// reserve and completion): `job` as it was before the completion was committed.
    pub fn record_run(job: &Job, outcome: &str) {
        let Some(tracer) = TRACER.get() else { return };
        let mut b = run_builder(tracer, job);
        if let Some(started) = job.started_at {
            let since_epoch = Duration::from_micros(u64::try_from(started).unwrap_or(0));
            b = b.with_start_time(SystemTime::UNIX_EPOCH + since_epoch);
        }
        let mut span = b.start_with_context(tracer, &parent_of_run(job));
        end_run(&mut span, outcome);
    }
}

#[cfg(not(feature = "otel"))]
mod imp {
    use super::*;

    /// Built without the `otel` feature: traces are always off.
    #[derive(Debug)]
    pub struct Guard;

    pub fn init_from_env(_service: &str) -> Result<Option<Guard>, String> {
        if requested() {
            tracing::warn!("OTEL_EXPORTER_OTLP_ENDPOINT is set but homing was built without the `otel` feature: no spans are exported");
        }
        Ok(None)
    }

    pub fn enabled() -> bool {
        false
    }

    pub fn flush() {}

    pub enum EnqueueSpan {}

    pub fn start_enqueue(_job: &mut NewJob) -> Option<EnqueueSpan> {
        None
    }

    impl EnqueueSpan {
        pub fn end(self, _result: Result<bool, &str>) {
            match self {}
        }
    }

    pub enum RunSpan {}

    pub fn start_run(_job: &Job) -> Option<RunSpan> {
        None
    }

    impl RunSpan {
        pub fn traceparent(&self) -> &str {
            match *self {}
        }

        pub fn end(self, _outcome: &str) {
            match self {}
        }
    }

    pub fn record_run(_job: &Job, _outcome: &str) {}
}

pub use imp::*;
