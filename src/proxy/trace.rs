//! The proxy's spans: one server span per request and one client span per attempt sent, built
//! when the request is finished from what it recorded anyway ([`RequestCtx`]: its attempts,
//! their times, reasons, tokens) and queued for export ([`crate::trace`]). The attempt spans'
//! ids are the ones their `traceparent` carried upstream; a route passed over without a call
//! (breaker open, at its limit) is an attempt span too, of no duration and `probeok.outcome =
//! skipped`, so every failover decision is one span with its route and reason.
//!
//! Attributes: `probeok.kind` (`request`/`attempt`), `probeok.route`, `probeok.attempt`,
//! `probeok.outcome`, `probeok.failover_reason`, `probeok.mode`, and the GenAI conventions'
//! `gen_ai.*` names; time to first token is an event on the attempt span. Never any prompt or
//! answer text.

use std::time::SystemTime;

use axum::http::HeaderValue;
use axum::response::Response;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::SpanData;

use super::record::{self, AttemptOutcome, Outcome, Tried};
use super::request::RequestCtx;
use crate::trace::{span, RequestTrace, Span};

/// Adds `traceresponse` to the answer of a traced request.
pub(crate) fn respond(ctx: &RequestCtx, response: &mut Response) {
    if let Some(t) = &ctx.trace {
        response
            .headers_mut()
            .insert("traceresponse", t.traceresponse());
    }
}

/// The `traceparent` (and the caller's `tracestate`) for the next attempt of a traced
/// request; `None` when tracing is off.
pub(crate) fn next_attempt(ctx: &mut RequestCtx) -> Option<(HeaderValue, Option<HeaderValue>)> {
    let t = ctx.trace.as_mut()?;
    Some((t.attempt(SystemTime::now()), t.tracestate.clone()))
}

/// Queues the request's spans, when its trace is sampled.
pub(crate) fn finish(
    tracer: &crate::trace::Tracer,
    ctx: &RequestCtx,
    status: u16,
    outcome: Outcome,
) {
    let Some(t) = &ctx.trace else {
        return;
    };
    if t.sampled {
        tracer.export(spans(t, ctx, status, outcome, SystemTime::now()));
    }
}

/// The request span and its attempt spans.
fn spans(
    t: &RequestTrace,
    ctx: &RequestCtx,
    status: u16,
    outcome: Outcome,
    end: SystemTime,
) -> Vec<SpanData> {
    let mut out = Vec::with_capacity(ctx.attempts.len() + 1);
    let parent = t.parent.map(|p| (p, true));
    out.push(
        request_span(ctx, status, outcome)
            .at(t.start, end)
            .data(t.trace_id, t.span_id, parent),
    );
    let under = Some((t.span_id, false));
    let mut sent = t.attempts.iter();
    // A skip is placed where it happened: after the attempt before it.
    let mut last_end = t.start;
    for (i, tried) in ctx.attempts.iter().enumerate() {
        if tried.outcome == AttemptOutcome::Skipped {
            let s = attempt_span(tried, i + 1).at(last_end, last_end);
            out.push(s.data(t.trace_id, crate::trace::context::new_span_id(), under));
            continue;
        }
        let Some(a) = sent.next() else {
            continue;
        };
        let s = attempt_span(tried, i + 1).lasting(a.start, tried.latency_ms);
        let data = s.data(t.trace_id, a.span_id, under);
        last_end = data.end_time;
        out.push(data);
    }
    out
}

fn request_span(ctx: &RequestCtx, status: u16, outcome: Outcome) -> Span {
    let model = if ctx.serves.is_empty() {
        "unknown"
    } else {
        &ctx.serves
    };
    let answered = ctx
        .attempts
        .iter()
        .rev()
        .find(|a| a.outcome != AttemptOutcome::Skipped);
    let (usage, _) = record::answered_usage(&ctx.attempts);
    let [input, output] = span::usage(usage.prompt_tokens, usage.completion_tokens);
    let mut s = Span::new(format!("chat {model}"), SpanKind::Server)
        .attr(KeyValue::new("probeok.kind", "request"))
        .attr(KeyValue::new("probeok.outcome", outcome.as_str()))
        .attr(KeyValue::new("probeok.mode", ctx.d.mode().as_str()))
        .attr(KeyValue::new("probeok.attempt", ctx.d.attempts as i64))
        .attr(KeyValue::new(
            "probeok.request_id",
            ctx.d.request_id.clone(),
        ))
        .attr(KeyValue::new("probeok.stream", ctx.stream))
        .attr(KeyValue::new("gen_ai.operation.name", "chat"))
        .attr(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ))
        .attr_opt(
            (!ctx.serves.is_empty())
                .then(|| KeyValue::new("gen_ai.request.model", ctx.serves.clone())),
        )
        .attr_opt(
            (ctx.d.route.as_ref()).map(|r| KeyValue::new("probeok.route", r.as_str().to_owned())),
        )
        .attr_opt(
            (ctx.d.route.as_ref()).map(|r| KeyValue::new("gen_ai.system", r.split().0.to_owned())),
        )
        .attr_opt(
            (ctx.d.fallback_reason.clone()).map(|r| KeyValue::new("probeok.failover_reason", r)),
        )
        .attr_opt(ctx.contract.map(|c| KeyValue::new("probeok.contract", c)))
        .attr_opt(
            (answered.and_then(|a| a.model.clone()))
                .map(|m| KeyValue::new("gen_ai.response.model", m)),
        )
        .attr_opt(input)
        .attr_opt(output);
    if matches!(outcome, Outcome::Failed | Outcome::Interrupted) || status >= 500 {
        s = s.error(outcome.as_str());
    }
    s
}

fn attempt_span(tried: &Tried, n: usize) -> Span {
    let (provider, _, model) = tried.route.split();
    let [input, output] = span::usage(tried.usage.prompt_tokens, tried.usage.completion_tokens);
    let kind = if tried.outcome == AttemptOutcome::Skipped {
        SpanKind::Internal
    } else {
        SpanKind::Client
    };
    let mut s = Span::new(format!("chat {model}"), kind)
        .attr(KeyValue::new("probeok.kind", "attempt"))
        .attr(KeyValue::new(
            "probeok.route",
            tried.route.as_str().to_owned(),
        ))
        .attr(KeyValue::new("probeok.attempt", n as i64))
        .attr(KeyValue::new("probeok.outcome", tried.outcome.as_str()))
        .attr(KeyValue::new("gen_ai.system", provider.to_owned()))
        .attr(KeyValue::new("gen_ai.operation.name", "chat"))
        .attr(KeyValue::new("gen_ai.request.model", model.to_owned()))
        .attr_opt((tried.reason.clone()).map(|r| KeyValue::new("probeok.failover_reason", r)))
        .attr_opt((tried.model.clone()).map(|m| KeyValue::new("gen_ai.response.model", m)))
        .attr_opt(
            tried
                .status
                .map(|c| KeyValue::new("http.response.status_code", i64::from(c))),
        )
        .attr_opt(input)
        .attr_opt(output)
        .ttft(tried.ttft_ms);
    if matches!(
        tried.outcome,
        AttemptOutcome::Failed | AttemptOutcome::Interrupted
    ) {
        s = s.error(
            tried
                .reason
                .clone()
                .unwrap_or_else(|| tried.outcome.as_str().to_owned()),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{OutcomeKind, ProbeOutcome};
    use crate::route::RouteId;
    use axum::http::HeaderMap;
    use opentelemetry::trace::{SpanId, Status};

    fn sent(route: &RouteId, status: u16, reason: Option<&str>, result: AttemptOutcome) -> Tried {
        let o = ProbeOutcome {
            route: route.clone(),
            kind: OutcomeKind::Passive,
            started_at: chrono::Utc::now(),
            success: status == 200,
            attributed_to: None,
            verified: None,
            ttfb_ms: Some(10.0),
            ttft_ms: (status == 200).then_some(15.0),
            first_answer_ms: None,
            total_ms: 30.0,
            output_tokens: None,
            tokens_estimated: false,
            tokens_per_second: None,
            model_reported: (status == 200).then(|| "m-2024".to_owned()),
            system_fingerprint: None,
            http_status: Some(status),
            error: None,
            answer: None,
            max_tokens_exhausted: false,
            ratelimit: None,
        };
        Tried::sent(&o, reason.map(str::to_owned), result)
    }

    fn attr(s: &SpanData, key: &str) -> Option<String> {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    }

    #[test]
    fn a_failover_is_one_request_span_over_its_attempts() {
        let a = RouteId::new("prim", "us", "m-a");
        let b = RouteId::new("back", "eu", "m-b");
        let c = RouteId::new("open", "eu", "m-c");
        let mut ctx = RequestCtx::new("req-1".into(), chrono::Utc::now());
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        ctx.trace = Some(Box::new(RequestTrace::begin(&h, 1.0, SystemTime::now())));
        ctx.serves("chat-main");
        ctx.attempts
            .push(Tried::skipped(&c, record::Detour::BreakerOpen));
        next_attempt(&mut ctx).unwrap();
        ctx.attempts
            .push(sent(&a, 503, Some("http_503"), AttemptOutcome::Failed));
        next_attempt(&mut ctx).unwrap();
        ctx.attempts.push(sent(&b, 200, None, AttemptOutcome::Ok));
        ctx.d.attempts = 2;
        ctx.d.route = Some(b.clone());
        ctx.d.fallback("http_503");
        let t = ctx.trace.as_deref().unwrap();
        let spans = spans(t, &ctx, 200, Outcome::Ok, SystemTime::now());
        assert_eq!(spans.len(), 4);
        let (req, skipped, first, second) = (&spans[0], &spans[1], &spans[2], &spans[3]);
        assert_eq!(attr(skipped, "probeok.outcome").as_deref(), Some("skipped"));
        assert_eq!(attr(skipped, "probeok.attempt").as_deref(), Some("1"));
        assert_eq!(
            attr(skipped, "probeok.failover_reason").as_deref(),
            Some("breaker_open")
        );
        assert_eq!(skipped.span_kind, SpanKind::Internal);
        assert_eq!(skipped.parent_span_id, req.span_context.span_id());
        assert!(spans
            .iter()
            .all(|s| s.span_context.trace_id() == t.trace_id));
        assert_eq!(
            req.parent_span_id,
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        );
        assert!(req.parent_span_is_remote);
        assert_eq!(first.parent_span_id, req.span_context.span_id());
        assert_eq!(first.span_context.span_id(), t.attempts[0].span_id);
        assert_eq!(attr(req, "probeok.mode").as_deref(), Some("fallback"));
        assert_eq!(
            attr(req, "probeok.failover_reason").as_deref(),
            Some("http_503")
        );
        assert_eq!(attr(req, "probeok.route").as_deref(), Some(b.as_str()));
        assert_eq!(attr(first, "probeok.attempt").as_deref(), Some("2"));
        assert_eq!(attr(first, "probeok.outcome").as_deref(), Some("failed"));
        assert!(matches!(first.status, Status::Error { .. }));
        assert_eq!(attr(second, "gen_ai.system").as_deref(), Some("back"));
        assert_eq!(attr(second, "gen_ai.request.model").as_deref(), Some("m-b"));
        assert_eq!(
            attr(second, "gen_ai.response.model").as_deref(),
            Some("m-2024")
        );
        assert_eq!(second.events.events[0].name, span::TTFT_EVENT);
    }

    #[test]
    fn untraced_and_unsampled_requests_export_nothing() {
        let tracer = crate::trace::Tracer::off();
        let mut ctx = RequestCtx::new("r".into(), chrono::Utc::now());
        assert!(next_attempt(&mut ctx).is_none());
        finish(&tracer, &ctx, 200, Outcome::Ok);
        let mut r = Response::new(axum::body::Body::empty());
        respond(&ctx, &mut r);
        assert!(!r.headers().contains_key("traceresponse"));
    }
}
