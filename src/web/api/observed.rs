//! `observed` in `/api/v1/status`: what the proxies' real traffic showed of a route over the
//! last hour (minute rollups) and the last 24 h (hour rollups, the current hour included),
//! from `store::observed`. A window without traffic is `null`.

use std::collections::HashMap;

use chrono::{DateTime, Duration as TimeDelta, Utc};
use rustc_hash::FxBuildHasher;
use serde::Serialize;

use crate::store::{ObservedBucket, Reader, Span, StoreError};

/// Both windows' figures per route id, as read from the store (FxHash: see
/// [`super::RouteMap`]).
#[derive(Debug, Default)]
pub struct ObservedFigures {
    pub h1: HashMap<String, ObservedBucket, FxBuildHasher>,
    pub h24: HashMap<String, ObservedBucket, FxBuildHasher>,
}

impl ObservedFigures {
    pub fn load(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let until = crate::store::observed::to_ms_pub(now) + 1;
        let h1_since = Span::Minute.start(now - TimeDelta::hours(1)) + 60_000;
        let h24_since = Span::Hour.start(now) - 23 * 3_600_000;
        Ok(Self {
            h1: reader
                .observed(Span::Minute, h1_since, until)?
                .into_iter()
                .collect(),
            h24: reader
                .observed(Span::Hour, h24_since, until)?
                .into_iter()
                .collect(),
        })
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Pair {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct StructuredView {
    /// Answers judged (requests with `response_format` `json_object`/`json_schema`, or
    /// answered by tool calls).
    pub checked: u64,
    pub valid: u64,
    /// Over a bound (answer or schema too large, schema unusable): not judged.
    pub not_checked: u64,
    /// `valid / checked`.
    pub validity_ratio: Option<f64>,
    /// A few of the latest window's errors (no answer text).
    pub errors: Vec<String>,
}

/// One window of a route's observables.
#[derive(Debug, Serialize, PartialEq)]
pub struct ObservedView {
    /// Attempts sent to the route.
    pub requests: u64,
    pub success_ratio: Option<f64>,
    pub rate_limited_ratio: Option<f64>,
    pub server_error_ratio: Option<f64>,
    /// Content-policy refusals among the attempts.
    pub refusal_ratio: Option<f64>,
    /// Streams only.
    pub ttft_ms: Pair,
    /// Time per output token, streams only.
    pub tpot_ms: Pair,
    pub structured: StructuredView,
    /// Mean cost of a successful answer with a known price (the route's currency).
    pub cost_per_success: Option<f64>,
}

fn round(v: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (v * f).round() / f
}

fn ratio(n: u64, of: u64) -> Option<f64> {
    (of > 0).then(|| round(n as f64 / of as f64, 6))
}

impl ObservedView {
    pub fn of(b: &ObservedBucket) -> Option<Self> {
        if b.requests == 0 && b.checked == 0 {
            return None;
        }
        let ms = |v: Option<f64>| v.map(|v| round(v, 1));
        Some(Self {
            requests: b.requests,
            success_ratio: ratio(b.ok, b.requests),
            rate_limited_ratio: ratio(b.rate_limited, b.requests),
            server_error_ratio: ratio(b.server_error, b.requests),
            refusal_ratio: ratio(b.refused, b.requests),
            ttft_ms: Pair {
                p50: ms(b.ttft.quantile(0.5)),
                p95: ms(b.ttft.quantile(0.95)),
            },
            tpot_ms: Pair {
                p50: b.tpot_ms(0.5).map(|v| round(v, 2)),
                p95: b.tpot_ms(0.95).map(|v| round(v, 2)),
            },
            structured: StructuredView {
                checked: b.checked,
                valid: b.valid,
                not_checked: b.not_checked,
                validity_ratio: ratio(b.valid, b.checked),
                errors: b.errors.clone(),
            },
            cost_per_success: (b.cost_n > 0).then(|| round(b.cost_sum / b.cost_n as f64, 8)),
        })
    }
}

/// `observed: {"1h": …, "24h": …}` of one route.
#[derive(Debug, Serialize, PartialEq)]
pub struct Observed {
    #[serde(rename = "1h")]
    pub h1: Option<ObservedView>,
    #[serde(rename = "24h")]
    pub h24: Option<ObservedView>,
    /// The currency of `cost_per_success` (the route's price).
    pub currency: Option<String>,
}

impl Observed {
    pub fn of(route: &crate::route::Route, f: &ObservedFigures) -> Self {
        let id = route.id.as_str();
        Self {
            h1: f.h1.get(id).and_then(ObservedView::of),
            h24: f.h24.get(id).and_then(ObservedView::of),
            currency: route.price.as_ref().map(|p| p.currency.clone()),
        }
    }
}
