//! What the proxy records of a request: its [`Outcome`], each attempt ([`Tried`], with its
//! [`AttemptOutcome`]) and the token [`Usage`] an answer reports. The strings of both outcome
//! enums are what metering stores (`GET /api/v1/requests`) and what the
//! `probeok_proxy_requests_total{outcome}` label shows (see `docs/http-api.md`).

use serde_json::Value;

use super::meter;
use crate::probe::ProbeOutcome;
use crate::route::{Price, RouteId};
use crate::store::AttemptRecord;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An upstream answered (or a committed stream ended properly).
    Ok,
    /// The request's own fault, returned as the upstream gave it.
    ClientError,
    /// No candidate answered.
    Failed,
    /// A committed stream broke.
    Interrupted,
    /// The client hung up during a committed stream.
    ClientGone,
    /// Refused before any upstream call (bad input, unknown model, all routes resting, a
    /// `reject` contract).
    Rejected,
    /// A `cached_response` contract answered.
    Cached,
    /// An `async_queue` contract queued it.
    Queued,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientError => "client_error",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::ClientGone => "client_gone",
            Self::Rejected => "rejected",
            Self::Cached => "cached",
            Self::Queued => "queued",
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    Ok,
    ClientError,
    /// Moved on to the next candidate.
    Failed,
    Interrupted,
    ClientGone,
    /// Never sent (breaker open, route or provider at its in-flight limit).
    Skipped,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientError => "client_error",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::ClientGone => "client_gone",
            Self::Skipped => "skipped",
        }
    }

    /// The attempt's tokens count for the request (its answer reached the client).
    pub(crate) fn answered(self) -> bool {
        matches!(self, Self::Ok | Self::Interrupted)
    }
}

/// Why a request left its first choice other than a failed attempt there (a failed attempt's
/// reason is its error's code, `http_503`, `timeout_before_first_byte`, …). Disclosed in
/// `x-probeok-fallback-reason`, stored as a skipped attempt's `reason`, counted in
/// `probeok_proxy_failovers_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detour {
    /// The route's circuit breaker is open: tried last, if at all.
    BreakerOpen,
    /// The route, or its provider, was at its in-flight limit (`max_in_flight`).
    InFlightLimit,
    /// Capable routes rest after a 429.
    RateLimited,
    /// A non-primary route serves although the model is not degraded.
    NoPrimaryUsable,
    /// A non-primary route was passed over: the extra-cost budget could not cover it.
    ExtraCostBudget,
}

impl Detour {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BreakerOpen => "breaker_open",
            Self::InFlightLimit => "in_flight_limit",
            Self::RateLimited => "rate_limited",
            Self::NoPrimaryUsable => "no_primary_usable",
            Self::ExtraCostBudget => "extra_cost_budget",
        }
    }
}

/// `usage.{prompt_tokens, completion_tokens}` as an answer or a stream chunk reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

impl From<crate::probe::answer::Tokens> for Usage {
    fn from(t: crate::probe::answer::Tokens) -> Self {
        Self {
            prompt_tokens: t.prompt,
            completion_tokens: t.completion,
        }
    }
}

impl Usage {
    /// The `usage` object of an answer body or of one stream chunk's JSON, read as the
    /// probes read it.
    pub fn of(v: &Value) -> Self {
        crate::probe::answer::Tokens::of(v).into()
    }

    /// The last usage with prompt tokens among a forwarded chunk's `data:` lines. Cheap on
    /// the chunks without one (most of them): they are not parsed.
    pub fn in_stream_chunk(chunk: &[u8]) -> Option<Self> {
        const NEEDLE: &[u8] = b"\"prompt_tokens\"";
        // Every chunk of every stream is looked at: a vectorised search, not a loop.
        memchr::memmem::find(chunk, NEEDLE)?;
        chunk
            .split(|b| *b == b'\n')
            .rev()
            .filter_map(|line| line.strip_prefix(b"data: "))
            .filter_map(|data| serde_json::from_slice::<Value>(data).ok())
            .map(|v| Self::of(&v))
            .find(|u| u.prompt_tokens.is_some())
    }

    /// Both counts, when the answer reported both.
    pub fn both(self) -> Option<(u64, u64)> {
        Some((self.prompt_tokens?, self.completion_tokens?))
    }
}

/// One attempt of a request as the proxy saw it; metered as an [`AttemptRecord`].
#[derive(Debug, Clone, PartialEq)]
pub struct Tried {
    pub route: RouteId,
    /// Why the request moved on from this attempt (`http_503`, `breaker_open`, …).
    pub reason: Option<String>,
    pub status: Option<u16>,
    pub ttfb_ms: Option<f64>,
    pub latency_ms: f64,
    pub usage: Usage,
    pub cost: Option<f64>,
    pub outcome: AttemptOutcome,
    /// First token, for the attempt's span.
    pub ttft_ms: Option<f64>,
    /// The model the upstream says answered.
    pub model: Option<String>,
    /// A content-policy refusal was the answer.
    pub refused: bool,
    /// Time per output token of a streamed answer, ms.
    pub tpot_ms: Option<f64>,
}

impl Tried {
    /// An attempt that was sent and ended with `outcome` (its completion tokens as the
    /// upstream's answer was read).
    pub fn sent(outcome: &ProbeOutcome, reason: Option<String>, result: AttemptOutcome) -> Self {
        Self {
            route: outcome.route.clone(),
            reason,
            status: outcome.http_status,
            ttfb_ms: outcome.ttfb_ms,
            latency_ms: outcome.total_ms,
            usage: Usage {
                prompt_tokens: None,
                completion_tokens: outcome.output_tokens.map(u64::from),
            },
            cost: None,
            outcome: result,
            ttft_ms: outcome.ttft_ms,
            model: outcome.model_reported.clone(),
            refused: is_refusal(outcome),
            tpot_ms: None,
        }
    }

    /// A route passed over without a call.
    pub fn skipped(route: &RouteId, why: Detour) -> Self {
        Self {
            route: route.clone(),
            reason: Some(why.as_str().to_owned()),
            status: None,
            ttfb_ms: None,
            latency_ms: 0.0,
            usage: Usage::default(),
            cost: None,
            outcome: AttemptOutcome::Skipped,
            ttft_ms: None,
            model: None,
            refused: false,
            tpot_ms: None,
        }
    }

    /// A stream past its commit point; times, tokens and outcome are filled in at its end.
    pub fn committed(route: &RouteId) -> Self {
        Self {
            route: route.clone(),
            reason: None,
            status: Some(200),
            ttfb_ms: None,
            latency_ms: 0.0,
            usage: Usage::default(),
            cost: None,
            outcome: AttemptOutcome::Ok,
            ttft_ms: None,
            model: None,
            refused: false,
            tpot_ms: None,
        }
    }

    /// The cost of the attempt's tokens at `price`.
    pub fn price(&mut self, price: Option<&Price>) {
        self.cost = meter::cost(
            price,
            self.usage.prompt_tokens,
            self.usage.completion_tokens,
        );
    }

    /// The metered row of the `n`th attempt (1-based).
    pub fn record(&self, n: usize) -> AttemptRecord {
        let status_class = match self.status {
            Some(s) => format!("{}xx", s / 100),
            None => "none".to_owned(),
        };
        AttemptRecord {
            n: u32::try_from(n).unwrap_or(u32::MAX),
            route: self.route.as_str().to_owned(),
            reason: self.reason.clone(),
            status_class,
            status: self.status,
            ttfb_ms: self.ttfb_ms,
            latency_ms: self.latency_ms,
            prompt_tokens: self.usage.prompt_tokens,
            completion_tokens: self.usage.completion_tokens,
            cost: self.cost,
            outcome: self.outcome.as_str().to_owned(),
        }
    }
}

/// The outcome's error is a content-policy refusal (`finish_reason: "content_filter"`, a
/// `refusal` field, Anthropic's `stop_reason: "refusal"`, a provider's content-policy 400).
pub fn is_refusal(outcome: &ProbeOutcome) -> bool {
    matches!(
        outcome.error,
        Some(crate::probe::ProbeError::Refused { .. })
    )
}

/// The request's tokens and cost: those of the last attempt sent, when its answer reached the
/// client.
pub fn answered_usage(attempts: &[Tried]) -> (Usage, Option<f64>) {
    attempts
        .iter()
        .rev()
        .find(|a| a.outcome != AttemptOutcome::Skipped)
        .filter(|a| a.outcome.answered())
        .map_or((Usage::default(), None), |a| (a.usage, a.cost))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_reads_answers_and_stream_chunks_alike() {
        let body = json!({"usage": {"prompt_tokens": 12, "completion_tokens": 3}});
        assert_eq!(Usage::of(&body).both(), Some((12, 3)));
        assert_eq!(Usage::of(&json!("not an answer")), Usage::default());
        assert_eq!(
            Usage::of(&json!({"usage": {"prompt_tokens": 5}})).both(),
            None
        );

        let chunk = b"data: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n";
        let u = Usage::in_stream_chunk(chunk).unwrap();
        assert_eq!(u.prompt_tokens, Some(7));
        assert_eq!(u.completion_tokens, Some(2));
        assert_eq!(Usage::in_stream_chunk(b"data: {\"choices\":[]}\n\n"), None);
        assert_eq!(Usage::in_stream_chunk(b"data: [DONE]\n\n"), None);
    }

    #[test]
    fn attempt_rows_keep_their_stored_strings() {
        let id = RouteId::new("p", "r", "m");
        let row = Tried::skipped(&id, Detour::BreakerOpen).record(2);
        assert_eq!(row.n, 2);
        assert_eq!(row.outcome, "skipped");
        assert_eq!(row.status_class, "none");
        assert_eq!(row.reason.as_deref(), Some("breaker_open"));
        let row = Tried::committed(&id).record(1);
        assert_eq!(row.outcome, "ok");
        assert_eq!(row.status_class, "2xx");
        assert_eq!(row.status, Some(200));
        assert_eq!(row.reason, None);
        for (o, s) in [
            (AttemptOutcome::ClientError, "client_error"),
            (AttemptOutcome::Failed, "failed"),
            (AttemptOutcome::Interrupted, "interrupted"),
            (AttemptOutcome::ClientGone, "client_gone"),
        ] {
            assert_eq!(o.as_str(), s);
        }
        assert_eq!(Outcome::Cached.as_str(), "cached");
        assert_eq!(Outcome::Queued.as_str(), "queued");
        assert_eq!(Outcome::Rejected.as_str(), "rejected");
    }

    #[test]
    fn the_request_counts_the_last_sent_attempt_when_it_answered() {
        let id = RouteId::new("p", "r", "m");
        let mut ok = Tried::committed(&id);
        ok.usage = Usage {
            prompt_tokens: Some(10),
            completion_tokens: Some(4),
        };
        ok.cost = Some(1.5);
        let attempts = vec![ok.clone(), Tried::skipped(&id, Detour::InFlightLimit)];
        assert_eq!(answered_usage(&attempts), (ok.usage, Some(1.5)));
        let mut failed = ok.clone();
        failed.outcome = AttemptOutcome::Failed;
        assert_eq!(answered_usage(&[failed]), (Usage::default(), None));
    }
}
