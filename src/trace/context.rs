//! W3C Trace Context, pure: reading a caller's `traceparent`/`tracestate`, the head-sampling
//! decision, and the headers a request sends on (`traceparent` of each attempt upstream,
//! `traceresponse` to the caller).
//!
//! A malformed `traceparent` is ignored (a new trace starts), as the W3C recommendation asks;
//! a `tracestate` is forwarded only beside a valid `traceparent`, and only when it fits
//! [`MAX_TRACESTATE`] bytes of visible ASCII.

use std::time::SystemTime;

use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{SpanId, TraceId};

/// The longest `tracestate` forwarded (the W3C limit of 32 members fits in it).
pub const MAX_TRACESTATE: usize = 512;

/// A caller's span, as its `traceparent` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// Parses a `traceparent` header value (`00-<32 hex>-<16 hex>-<2 hex>`). Later versions are
/// read by their first four fields, as the recommendation asks; `ff`, upper-case hex and
/// all-zero ids are invalid.
pub fn parse_traceparent(value: &str) -> Option<Parent> {
    let value = value.trim();
    let mut parts = value.split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let flags = parts.next()?;
    let rest = parts.next();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    // Version 00 has exactly four fields; a later version may append more.
    if version == "00" && rest.is_some() {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` (or `traceresponse`) value naming `span` of `trace`.
pub fn format_traceparent(trace: TraceId, span: SpanId, sampled: bool) -> String {
    format!("00-{trace}-{span}-{:02x}", u8::from(sampled))
}

/// Head sampling of a new trace: the same trace id always gets the same answer (the low 63
/// bits against `ratio`, as OpenTelemetry's `TraceIdRatioBased` sampler decides).
pub fn sample(trace: TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 || ratio.is_nan() {
        return false;
    }
    let bytes = trace.to_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    // ratio < 1, so the product stays below 2^63.
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    x < bound
}

/// A random, valid trace id.
pub fn new_trace_id() -> TraceId {
    loop {
        let id = TraceId::from_bytes(rand::random::<u128>().to_be_bytes());
        if id != TraceId::INVALID {
            return id;
        }
    }
}

/// A random, valid span id.
pub fn new_span_id() -> SpanId {
    loop {
        let id = SpanId::from_bytes(rand::random::<u64>().to_be_bytes());
        if id != SpanId::INVALID {
            return id;
        }
    }
}

/// One attempt's span, named before its call so the upstream gets its `traceparent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSpan {
    pub span_id: SpanId,
    pub start: SystemTime,
}

/// The trace of one proxied request: its ids, whether it is exported, what the caller's
/// `tracestate` was, and the span ids of the attempts it made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The request's own (server) span.
    pub span_id: SpanId,
    /// The caller's span, when its `traceparent` was continued.
    pub parent: Option<SpanId>,
    pub sampled: bool,
    /// The caller's `tracestate`, passed on as it came.
    pub tracestate: Option<HeaderValue>,
    pub start: SystemTime,
    /// In attempt order (attempts that were sent; skipped routes have none).
    pub attempts: Vec<AttemptSpan>,
}

impl RequestTrace {
    /// Continues the caller's trace from `headers`, else starts one sampled by `ratio`.
    pub fn begin(headers: &HeaderMap, ratio: f64, start: SystemTime) -> Self {
        let parent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent);
        let (trace_id, parent_span, sampled) = match parent {
            Some(p) => (p.trace_id, Some(p.span_id), p.sampled),
            None => {
                let id = new_trace_id();
                (id, None, sample(id, ratio))
            }
        };
        let tracestate = parent
            .and_then(|_| headers.get("tracestate"))
            .filter(|v| v.len() <= MAX_TRACESTATE && v.to_str().is_ok())
            .cloned();
        Self {
            trace_id,
            span_id: new_span_id(),
            parent: parent_span,
            sampled,
            tracestate,
            start,
            attempts: Vec::new(),
        }
    }

    /// The trace id as metering stores it (32 lower-case hex digits).
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.to_string()
    }

    /// `traceresponse`: the trace and the proxy's own span, so a caller without a trace of
    /// its own can still find the request in the tracing backend.
    pub fn traceresponse(&self) -> HeaderValue {
        let v = format_traceparent(self.trace_id, self.span_id, self.sampled);
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// Names the next attempt's span (started at `start`) and returns the `traceparent` the
    /// upstream gets for it.
    pub fn attempt(&mut self, start: SystemTime) -> HeaderValue {
        let span_id = new_span_id();
        self.attempts.push(AttemptSpan { span_id, start });
        let v = format_traceparent(self.trace_id, span_id, self.sampled);
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_and_written_back_the_same() {
        let p = parse_traceparent(TP).unwrap();
        assert!(p.sampled);
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(format_traceparent(p.trace_id, p.span_id, p.sampled), TP);
        let unsampled = parse_traceparent(&TP.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        // A later version may carry more fields.
        assert!(parse_traceparent(&format!("01{}-more", &TP[2..])).is_some());
    }

    #[test]
    fn sampling_follows_the_ratio_and_is_stable_per_trace() {
        let ids: Vec<TraceId> = (0..4000).map(|_| new_trace_id()).collect();
        let kept = ids.iter().filter(|id| sample(**id, 0.25)).count();
        assert!((800..1200).contains(&kept), "{kept}");
        assert!(ids.iter().all(|id| sample(*id, 1.0)));
        assert!(ids.iter().all(|id| !sample(*id, 0.0)));
        assert!(ids.iter().all(|id| sample(*id, 0.25) == sample(*id, 0.25)));
    }

    #[test]
    fn a_request_continues_its_callers_trace_and_names_each_attempt() {
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_static(TP));
        h.insert("tracestate", HeaderValue::from_static("vendor=abc"));
        let now = SystemTime::now();
        let mut t = RequestTrace::begin(&h, 0.0, now);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert!(t.sampled, "the caller's decision wins over the ratio");
        assert_eq!(t.tracestate.as_ref().unwrap(), "vendor=abc");
        let first = t.attempt(now);
        let second = t.attempt(now);
        assert_ne!(first, second);
        let p = parse_traceparent(first.to_str().unwrap()).unwrap();
        assert_eq!(p.trace_id, t.trace_id);
        assert_eq!(p.span_id, t.attempts[0].span_id);
        let resp = parse_traceparent(t.traceresponse().to_str().unwrap()).unwrap();
        assert_eq!(resp.span_id, t.span_id);
    }

    #[test]
    fn without_a_caller_a_new_trace_starts_and_tracestate_is_dropped() {
        let mut h = HeaderMap::new();
        h.insert("tracestate", HeaderValue::from_static("vendor=abc"));
        let t = RequestTrace::begin(&h, 1.0, SystemTime::now());
        assert!(t.sampled && t.parent.is_none() && t.tracestate.is_none());
        let long = "k=".to_owned() + &"v".repeat(MAX_TRACESTATE);
        h.insert("traceparent", HeaderValue::from_static(TP));
        h.insert("tracestate", HeaderValue::from_str(&long).unwrap());
        assert!(RequestTrace::begin(&h, 1.0, SystemTime::now())
            .tracestate
            .is_none());
    }
}
