//! OpenTelemetry traces (`[tracing]`, docs/operations.md "Traces"): the proxy joins each
//! caller's W3C trace — one span per request, a child span per upstream attempt that carries
//! its own `traceparent` upstream — and every probe is a span of its own. Spans go out over
//! OTLP/HTTP (protobuf, `/v1/traces`) through the official `opentelemetry-otlp` exporter.
//!
//! - [`context`] (pure): `traceparent`/`tracestate`, head sampling, [`RequestTrace`].
//! - [`span`]: finished spans built from what was already recorded; probe spans.
//! - [`export`]: the bounded queue and its batching export task; drops are counted
//!   (`probeok_trace_spans_dropped_total`).
//!
//! A [`Tracer`] is off when the variable `otlp_endpoint_env` names is unset: then it is a
//! `None` and the request path only checks it (no ids, no headers, no spans, no queue).

pub(crate) mod context;
pub mod export;
pub mod span;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use axum::http::HeaderMap;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use crate::config::TracingConfig;
use crate::outcome::ProbeOutcome;

pub use context::RequestTrace;
pub use span::Span;

/// One export call (connect, send, answer) may take this long before its spans are dropped.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The variable's value is not an http(s) URL (the value is not echoed: it may hold a
    /// token).
    #[error("{var} must be an http:// or https:// URL of an OTLP/HTTP collector")]
    BadEndpoint { var: String },
    #[error("cannot build the OTLP exporter's HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// Where spans go, or nothing. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    on: Option<Arc<On>>,
}

struct On {
    queue: export::Queue,
    sample_ratio: f64,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("on", &self.on.is_some())
            .finish()
    }
}

/// `http://collector:4318` → `http://collector:4318/v1/traces` (a URL already ending in
/// `/v1/traces` is kept); `None` unless http(s) with a host.
pub fn traces_url(base: &str) -> Option<String> {
    let base = base.trim().trim_end_matches('/');
    let rest = (base.strip_prefix("http://")).or_else(|| base.strip_prefix("https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return None;
    }
    if base.ends_with("/v1/traces") {
        Some(base.to_owned())
    } else {
        Some(format!("{base}/v1/traces"))
    }
}

impl Tracer {
    /// No export: every call is a no-op.
    pub fn off() -> Self {
        Self::default()
    }

    /// From `[tracing]`: off when the variable `otlp_endpoint_env` names is unset or empty.
    /// Starts the export task: call it inside a Tokio runtime.
    pub fn from_env(config: &TracingConfig) -> Result<Self, TraceError> {
        let var = &config.otlp_endpoint_env;
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => {
                let url =
                    traces_url(&v).ok_or_else(|| TraceError::BadEndpoint { var: var.clone() })?;
                Self::to_url(&url, config)
            }
            _ => Ok(Self::off()),
        }
    }

    /// Exports to the collector at `base` (`http://host:4318`), whatever the environment says.
    pub fn to_collector(base: &str, config: &TracingConfig) -> Result<Self, TraceError> {
        let url = traces_url(base).ok_or_else(|| TraceError::BadEndpoint {
            var: config.otlp_endpoint_env.clone(),
        })?;
        Self::to_url(&url, config)
    }

    fn to_url(url: &str, config: &TracingConfig) -> Result<Self, TraceError> {
        let http = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(TraceError::Client)?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(http)
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(TraceError::Exporter)?;
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name(config.service_name.clone())
            .with_attributes([KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))])
            .build();
        exporter.set_resource(&resource);
        Ok(Self {
            on: Some(Arc::new(On {
                queue: export::Queue::spawn(exporter),
                sample_ratio: config.sample_ratio,
            })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// The trace of a request arriving with `headers`; `None` when tracing is off.
    pub fn begin(&self, headers: &HeaderMap) -> Option<RequestTrace> {
        let on = self.on.as_ref()?;
        Some(RequestTrace::begin(
            headers,
            on.sample_ratio,
            SystemTime::now(),
        ))
    }

    /// Queues finished spans for export.
    pub fn export(&self, spans: Vec<SpanData>) {
        if let Some(on) = &self.on {
            on.queue.send(spans);
        }
    }

    /// A probe's span (synthetic probes only; always exported: there are few of them).
    pub fn probe(&self, outcome: &ProbeOutcome) {
        if let Some(on) = &self.on {
            if let Some(s) = span::probe(outcome) {
                on.queue.send(vec![s]);
            }
        }
    }

    /// Spans dropped so far (0 when off).
    pub fn dropped(&self) -> u64 {
        self.on.as_ref().map_or(0, |on| on.queue.dropped())
    }
}

/// Where `/metrics` finds the tracer: `probeok_trace_spans_dropped_total` (0 until one is
/// attached, and while tracing is off).
#[derive(Debug, Clone, Default)]
pub struct TraceStats(Arc<OnceLock<Tracer>>);

impl TraceStats {
    /// The first call wins (one tracer per process).
    pub fn attach(&self, tracer: Tracer) {
        let _ = self.0.set(tracer);
    }
}

impl Collector for TraceStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dropped = self.0.get().map_or(0, Tracer::dropped);
        let family = encoder.encode_descriptor(
            "trace_spans_dropped",
            "Trace spans dropped: the export queue was full or the collector did not take them",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(dropped).encode(family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collector_urls_get_the_traces_path_once() {
        assert_eq!(
            traces_url("http://c:4318").as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(
            traces_url("https://c/otlp/").as_deref(),
            Some("https://c/otlp/v1/traces")
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces").as_deref(),
            Some("http://c:4318/v1/traces")
        );
        assert_eq!(traces_url("c:4318"), None);
        assert_eq!(traces_url("http://"), None);
        assert_eq!(traces_url("ftp://c"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_the_dropped_spans() {
        let mut registry = prometheus_client::registry::Registry::with_prefix("probeok");
        let stats = TraceStats::default();
        registry.register_collector(Box::new(stats.clone()));
        let text = |r: &prometheus_client::registry::Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).unwrap();
            out
        };
        assert!(text(&registry).contains("probeok_trace_spans_dropped_total 0\n"));
        let tracer = Tracer::to_collector("http://127.0.0.1:9", &TracingConfig::default()).unwrap();
        stats.attach(tracer.clone());
        let now = SystemTime::now();
        // Nothing runs the export task meanwhile: the queue fills and the rest is dropped.
        for _ in 0..export::QUEUE + 3 {
            let s = Span::new("x", opentelemetry::trace::SpanKind::Internal).at(now, now);
            tracer.export(vec![s.data(
                context::new_trace_id(),
                context::new_span_id(),
                None,
            )]);
        }
        assert_eq!(tracer.dropped(), 3);
        let out = text(&registry);
        assert!(
            out.contains("# TYPE probeok_trace_spans_dropped counter"),
            "{out}"
        );
        assert!(
            out.contains("probeok_trace_spans_dropped_total 3\n"),
            "{out}"
        );
    }

    #[test]
    fn off_is_a_no_op() {
        let t = Tracer::off();
        assert!(!t.is_on());
        assert!(t.begin(&HeaderMap::new()).is_none());
        assert_eq!(t.dropped(), 0);
        let config = TracingConfig {
            otlp_endpoint_env: "PROBEOK_TEST_SURELY_UNSET_OTLP_ENDPOINT".into(),
            ..TracingConfig::default()
        };
        assert!(!Tracer::from_env(&config).unwrap().is_on());
    }
}
