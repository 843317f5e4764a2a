//! Finished spans, built after the fact from what a request or a probe already recorded
//! (times, outcomes, tokens): nothing is kept open while a call runs, so tracing adds no work
//! to the call itself. [`probe`] is a probe's span (`probeok.kind = probe`).
//!
//! Attribute names follow the OpenTelemetry GenAI conventions where they exist
//! (`gen_ai.system`, `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.response.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`); probeok's own are `probeok.*`.
//! No prompt or answer text is ever an attribute.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

use crate::outcome::{OutcomeKind, ProbeOutcome};

/// The name of the time-to-first-token event on attempt and probe spans.
pub const TTFT_EVENT: &str = "gen_ai.first_token";

/// A span's content before its ids are known.
#[derive(Debug, Clone)]
pub struct Span {
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
    events: Vec<opentelemetry::trace::Event>,
    error: Option<String>,
}

impl Span {
    pub fn new(name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Self {
        let now = SystemTime::now();
        Self {
            name: name.into(),
            kind,
            start: now,
            end: now,
            attributes: Vec::new(),
            events: Vec::new(),
            error: None,
        }
    }

    /// Started at `start`, ended at `end` (never before its start).
    pub fn at(mut self, start: SystemTime, end: SystemTime) -> Self {
        self.start = start;
        self.end = end.max(start);
        self
    }

    /// Started at `start`, lasted `ms` milliseconds.
    pub fn lasting(self, start: SystemTime, ms: f64) -> Self {
        self.at(start, start + millis(ms))
    }

    pub fn attr(mut self, kv: KeyValue) -> Self {
        self.attributes.push(kv);
        self
    }

    /// Adds the attribute when there is a value.
    pub fn attr_opt(self, kv: Option<KeyValue>) -> Self {
        match kv {
            Some(kv) => self.attr(kv),
            None => self,
        }
    }

    /// An event `ms` milliseconds after the span's start.
    pub fn event(mut self, name: &'static str, ms: f64, attributes: Vec<KeyValue>) -> Self {
        let at = self.start + millis(ms);
        self.events
            .push(opentelemetry::trace::Event::new(name, at, attributes, 0));
        self
    }

    /// The time-to-first-token event, when there was a first token.
    pub fn ttft(self, ttft_ms: Option<f64>) -> Self {
        match ttft_ms {
            Some(ms) => {
                let attrs = vec![KeyValue::new("probeok.ttft_ms", ms)];
                self.event(TTFT_EVENT, ms, attrs)
            }
            None => self,
        }
    }

    /// Marks the span failed with a short code (an error kind, never upstream text).
    pub fn error(mut self, code: impl Into<String>) -> Self {
        self.error = Some(code.into());
        self
    }

    /// The exportable span of `trace` with id `span`, under `parent` (`(id, remote)`).
    pub fn data(self, trace: TraceId, span: SpanId, parent: Option<(SpanId, bool)>) -> SpanData {
        let status = match self.error {
            Some(code) => Status::Error {
                description: code.into(),
            },
            None => Status::Unset,
        };
        let (parent_span_id, parent_span_is_remote) = parent.unwrap_or((SpanId::INVALID, false));
        let mut events = SpanEvents::default();
        events.events = self.events;
        SpanData {
            span_context: SpanContext::new(
                trace,
                span,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id,
            parent_span_is_remote,
            span_kind: self.kind,
            name: self.name,
            start_time: self.start,
            end_time: self.end,
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope(),
        }
    }
}

/// The instrumentation scope of every span probeok writes.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("probeok")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

fn millis(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::from_secs_f64(ms / 1000.0)
    } else {
        Duration::ZERO
    }
}

fn int(key: &'static str, v: Option<u64>) -> Option<KeyValue> {
    v.map(|v| KeyValue::new(key, i64::try_from(v).unwrap_or(i64::MAX)))
}

/// A probe's span: a trace of its own, so the probe that found an outage sits beside the
/// users' requests that hit it. Passive outcomes are not probes (the proxy writes those).
pub fn probe(o: &ProbeOutcome) -> Option<SpanData> {
    if o.kind == OutcomeKind::Passive {
        return None;
    }
    let (provider, _, model) = o.route.split();
    let start = SystemTime::from(o.started_at);
    let outcome = match &o.error {
        None => "ok",
        Some(e) => e.kind(),
    };
    let mut span = Span::new(format!("probe {}", o.route.as_str()), SpanKind::Client)
        .lasting(start, o.total_ms)
        .attr(KeyValue::new("probeok.kind", "probe"))
        .attr(KeyValue::new("probeok.probe", o.kind.as_str()))
        .attr(KeyValue::new("probeok.route", o.route.as_str().to_owned()))
        .attr(KeyValue::new("probeok.outcome", outcome))
        .attr(KeyValue::new("gen_ai.system", provider.to_owned()))
        .attr(KeyValue::new("gen_ai.operation.name", "chat"))
        .attr(KeyValue::new("gen_ai.request.model", model.to_owned()))
        .attr_opt((o.model_reported.clone()).map(|m| KeyValue::new("gen_ai.response.model", m)))
        .attr_opt(int(
            "gen_ai.usage.output_tokens",
            o.output_tokens.map(u64::from),
        ))
        .attr_opt(
            o.http_status
                .map(|s| KeyValue::new("http.response.status_code", i64::from(s))),
        )
        .ttft(o.ttft_ms);
    if let Some(e) = &o.error {
        span = span.error(e.kind());
    }
    let trace = super::context::new_trace_id();
    Some(span.data(trace, super::context::new_span_id(), None))
}

/// `gen_ai.usage.*` of a call, when the upstream reported them.
pub fn usage(input: Option<u64>, output: Option<u64>) -> [Option<KeyValue>; 2] {
    [
        int("gen_ai.usage.input_tokens", input),
        int("gen_ai.usage.output_tokens", output),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ProbeError;
    use crate::route::RouteId;

    fn outcome(error: Option<ProbeError>) -> ProbeOutcome {
        ProbeOutcome {
            route: RouteId::new("acme", "us", "m-1"),
            kind: OutcomeKind::Probe,
            started_at: chrono::Utc::now(),
            success: error.is_none(),
            attributed_to: None,
            verified: None,
            ttfb_ms: Some(50.0),
            ttft_ms: error.is_none().then_some(80.0),
            first_answer_ms: None,
            total_ms: 120.0,
            output_tokens: error.is_none().then_some(7),
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: None,
            system_fingerprint: None,
            http_status: Some(200),
            error,
            answer: Some("the secret answer".into()),
            max_tokens_exhausted: false,
            ratelimit: None,
        }
    }

    fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a opentelemetry::Value> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    #[test]
    fn a_probe_is_a_span_of_its_own_without_its_answer() {
        let s = probe(&outcome(None)).unwrap();
        assert_eq!(attr(&s, "probeok.kind").unwrap().as_str(), "probe");
        assert_eq!(attr(&s, "probeok.outcome").unwrap().as_str(), "ok");
        assert_eq!(attr(&s, "gen_ai.system").unwrap().as_str(), "acme");
        assert_eq!(attr(&s, "gen_ai.request.model").unwrap().as_str(), "m-1");
        assert_eq!(s.events.events[0].name, TTFT_EVENT);
        assert_eq!(s.status, Status::Unset);
        assert_eq!(
            s.end_time.duration_since(s.start_time).unwrap(),
            Duration::from_millis(120)
        );
        assert!(!format!("{s:?}").contains("secret answer"));
        assert_eq!(s.parent_span_id, SpanId::INVALID);
    }

    #[test]
    fn a_failed_probe_says_its_error_kind() {
        let s = probe(&outcome(Some(ProbeError::Stalled))).unwrap();
        assert_eq!(attr(&s, "probeok.outcome").unwrap().as_str(), "stalled");
        assert!(matches!(s.status, Status::Error { .. }));
        let mut passive = outcome(None);
        passive.kind = OutcomeKind::Passive;
        assert!(probe(&passive).is_none());
    }
}
