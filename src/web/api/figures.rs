//! The store's figures behind the status answers ([`Figures`]), read in one go and shared
//! by requests ([`super::FiguresCache`]), and their percentiles.

use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::Serialize;

use super::{ObservedFigures, LATENCY_KINDS, RECENT, TPS_KINDS};
use crate::store::{quantile, Counts, Granularity, Reader, Rollup, StoreError};
use crate::web::windows::{self, KeptWindows, Span};

/// The windows [`Figures`] holds, in its fields' order.
const WINDOWS: &[Span] = &[Span::Day, Span::Week, Span::Days30, Span::Slo];

pub use crate::route::RouteMap;

/// What the store knows for the status view, read in one go.
#[derive(Debug, Default)]
pub struct Figures {
    /// Percentiles of the last [`RECENT`], computed once per read, not per request.
    pub latency: RouteMap<Percentiles>,
    /// Time to first byte and tokens/s over the last [`RECENT`], likewise computed once.
    pub ttfb: RouteMap<Percentiles>,
    pub tps: RouteMap<Percentiles>,
    pub uptime_24h: RouteMap<Counts>,
    pub uptime_7d: RouteMap<Counts>,
    pub uptime_30d: RouteMap<Counts>,
    /// Probe outcomes of the error budget's window ([`crate::slo::WINDOW`]).
    pub slo_30d: RouteMap<Counts>,
    /// What the proxies' real traffic showed (`observed`).
    pub observed: ObservedFigures,
    /// The capability probes' latest results and 7-day tallies.
    pub capabilities: super::capabilities::CapabilityFigures,
    /// The long windows (`uptime_*`, `slo_30d`) are not read yet: right after a start, until
    /// the keeper's first read ([`crate::web::windows`]) ends, they are empty.
    pub warming: bool,
    /// Nothing is read yet, not even the last hour's figures: right after a start, a page
    /// answers with the states alone until the first read ends ([`Self::pending`]).
    pub pending: bool,
}

impl Figures {
    /// Figures before the first read ended: none, and saying so.
    pub fn pending() -> Self {
        Self {
            warming: true,
            pending: true,
            ..Self::default()
        }
    }

    /// A handful of range scans over every route (see `store::stats`), the long windows read
    /// whole.
    pub fn load(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let counts = windows::direct(reader, now, WINDOWS)?;
        Ok(Self::load_short(reader, now)?.with_windows(counts))
    }

    /// As [`Self::load`], the long windows from `kept` and the hours since it was read
    /// ([`windows`]); without `kept` (its first read runs) none: the figures are `warming`.
    pub fn load_kept(
        reader: &Reader,
        now: DateTime<Utc>,
        kept: Option<&KeptWindows>,
    ) -> Result<Self, StoreError> {
        let short = Self::load_short(reader, now)?;
        Ok(match kept {
            Some(k) => short.with_windows(k.at(reader, now, WINDOWS)?),
            None => Self {
                warming: true,
                ..short
            },
        })
    }

    fn with_windows(self, counts: Vec<RouteMap<Counts>>) -> Self {
        let mut counts = counts.into_iter();
        let mut next = || counts.next().unwrap_or_default();
        let (uptime_24h, uptime_7d, uptime_30d, slo_30d) = (next(), next(), next(), next());
        Self {
            uptime_24h,
            uptime_7d,
            uptime_30d,
            slo_30d,
            warming: false,
            ..self
        }
    }

    /// The figures of the last hour (no window counts).
    fn load_short(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let until = now + TimeDelta::milliseconds(1);
        let (mut ttfb, mut tps) = (RouteMap::default(), RouteMap::default());
        for (id, s) in reader.recent_samples(now - RECENT, LATENCY_KINDS, TPS_KINDS)? {
            ttfb.insert(id.clone(), Percentiles::of_samples(s.ttfb_ms));
            tps.insert(id, Percentiles::of_samples(s.tokens_per_second));
        }
        Ok(Self {
            ttfb,
            tps,
            latency: reader
                .summaries_by_route(Granularity::FiveMinutes, now - RECENT, until, LATENCY_KINDS)?
                .into_iter()
                .map(|(id, r)| (id, Percentiles::of(&r)))
                .collect(),
            observed: ObservedFigures::load(reader, now)?,
            capabilities: super::capabilities::CapabilityFigures::load(reader, now)?,
            ..Self::default()
        })
    }
}

/// p50, p95 and p99; `None` without values. The figures keep them as computed, the answer
/// rounds them ([`Percentiles::rounded`]).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

pub(super) fn round(v: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (v * f).round() / f
}

impl Percentiles {
    /// A rollup's latency percentiles.
    pub fn of(r: &Rollup) -> Self {
        Self {
            p50: r.p50(),
            p95: r.p95(),
            p99: r.p99(),
        }
    }

    /// To 0.1, as answers show them.
    pub(super) fn rounded(self) -> Self {
        let q = |v: Option<f64>| v.map(|v| round(v, 1));
        Self {
            p50: q(self.p50),
            p95: q(self.p95),
            p99: q(self.p99),
        }
    }

    /// Exact percentiles of raw samples.
    pub fn of_samples(mut v: Vec<f64>) -> Self {
        let mut q = |q: f64| quantile(&mut v, q);
        Self {
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
        }
    }
}
