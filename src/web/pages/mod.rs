//! The public HTML pages (askama templates in `templates/`, rendered to `Html<String>` here):
//!
//! - `GET /`: the overall banner; active incidents, maintenance windows, network findings and
//!   the budget on top, with the count of routes per state; routes grouped by logical model
//!   (`serves`), models and routes worst first, one compact line per route (state, 90-day
//!   bar, uptime 24h/30d, latency p50, the reason when not normal; `lines`), the worst
//!   thousand routes at most, a link per model for the rest; `?q=` and `?serves=` filter.
//! - `GET /routes/{id}`: one route — a 24 h SVG latency chart from the 5-minute rollups with
//!   the baseline band behind, the state timeline with each transition's evidence, the route's
//!   incidents and its recent synthetic probe errors.
//! - `GET /incidents`: 90 days of incidents and where this calendar month's error budget went.
//! - `GET /static/style.css`: the one stylesheet (the CSP allows no inline style or script).
//!
//! One file per page (`status`, `route`, `incidents`), `/`'s route lines (`lines`) and the
//! SVG chart (`chart`); what they share (the layout's [`Chrome`], the error page, state
//! colours, the cached [`PageData`]) is here.
//!
//! **Figures.** The same store figures as `/api/v1/status` ([`super::api::Figures`], through
//! the shared [`FiguresCache`]), plus [`PageData`] (daily rollups of 90 days for every route in
//! one range scan, and the incidents of 90 days), cached the same way ([`super::refresh`]:
//! read again off the request path; past days' bars are kept for 10 minutes). Nothing scans
//! raw outcomes but the route page's last 50 probes.
//!
//! **A day bar's state** (UTC days, the daily rollups' buckets) is the worst of: from the day's
//! synthetic outcomes, `CRITICAL` when fewer than 95% succeeded (the detector's
//! `critical_error_rate` default), `DEGRADED` below 99%, `WARNING` when the good-outcome ratio
//! is below the route's SLO target (the day spent more than its share of the budget), else
//! `NORMAL`; and the peak of every incident open during that day. A day without outcomes nor
//! incidents has no state (grey).
//!
//! **Error budget** ([`crate::slo`], the same figures as `/api/v1/status` and the burn-rate
//! alerts): bad probe outcomes × the route's probe interval against `(1 − target)` of the
//! window. The card's window is the last 30 days; `/incidents` accounts the calendar month
//! (UTC) from the rollups, gives each incident the bad probes inside its span (raw outcomes,
//! while kept) and shows the rest as "outside incidents".
//!
//! **Safety.** Every text is escaped by askama (no `|safe` anywhere); provider-controlled
//! text (error messages, reported model names, reason details) is also scrubbed of key-like
//! strings ([`scrub`]). Only synthetic outcomes (probe, throughput) are shown, never real
//! traffic. Responses carry a CSP without inline script or style, `nosniff` and
//! `Referrer-Policy: no-referrer`.

mod capabilities;
mod chart;
mod declared;
mod incidents;
mod lines;
mod observed;
mod route;
mod shadow;
mod status;
mod vantages;

pub use chart::*;
pub use incidents::*;
pub use lines::*;
pub use route::*;
pub use status::*;
pub use vantages::*;

use std::collections::HashMap;
use std::sync::Arc;

use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Datelike, Duration as TimeDelta, NaiveDate, Utc};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use super::api::{self, Figures, FiguresCache, PROBE_KINDS, UPTIME_KINDS};
use super::i18n::{self, Lang, ReasonFigures, Text};
use super::AppState;
use crate::alert::maintenance::window_active;
use crate::config::{Config, MaintenanceConfig};
use crate::health::{fmt_ms, fmt_spread, HealthSnapshot, Incident, RouteStatus, State as St};
use crate::probe::outcome::scrub;
use crate::route::{Route, RouteId, Tier};
use crate::slo;
use crate::store::{Counts, DailyCounts, Granularity, Reader, Store, StoreError};

/// Days of bars.
pub const DAYS: i64 = 90;
/// Most incidents the pages read (90 days, all routes).
pub const MAX_INCIDENTS: usize = 2000;
/// The stylesheet, compiled in.
pub const STYLE: &str = include_str!("../../../static/style.css");
/// The CSP of every page: no script at all, styles only from our own stylesheet.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Path-segment encoding for route ids in links (`/` becomes `%2F`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What the pages read beyond [`Figures`], for every route at once.
#[derive(Debug, Default)]
pub struct PageData {
    /// Daily synthetic counts of the [`DAYS`] − 1 days before today per route, oldest first.
    /// Past days change rarely (an agent's late outcomes, the demo's history): they are read
    /// again every [`PAST_DAYS_TTL`] and at midnight UTC, and shared by the reads between.
    past: Arc<PastDays>,
    /// Today's counts so far per route (read each time).
    today: api::RouteMap<Counts>,
    /// Incidents open at some time in the last [`DAYS`] days, newest first.
    pub incidents: Vec<Incident>,
    /// Probe counts of this calendar month per route (rollups): the month's error budget.
    pub month: HashMap<RouteId, Counts>,
    /// Bad probe outcomes inside each incident's span within this month, by incident id,
    /// counted on the raw outcomes; absent for an incident whose span in the month starts
    /// before the raw outcomes kept (`[storage] retention_days`).
    pub incident_bad: HashMap<String, u64>,
    /// The span of simulated history the built-in demo wrote, when it did.
    pub demo_history: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// How long the days before today are reused by [`PageData::load`].
pub const PAST_DAYS_TTL: TimeDelta = TimeDelta::minutes(10);

/// The days before `today` (a UTC day start), as read at `read_at`.
#[derive(Debug, Default)]
struct PastDays {
    today: DateTime<Utc>,
    read_at: DateTime<Utc>,
    /// Per route, oldest first, exactly as many as it has: 16 bytes a day, not a growing
    /// vector of 40-byte entries (90 days of 10,000 routes: 14 MB instead of about 50).
    days: api::RouteMap<Box<[PastDay]>>,
}

/// One route's counts of one day, as the bars read them.
#[derive(Debug, Clone, Copy)]
struct PastDay {
    /// Days since 1970-01-01 (UTC).
    day: u32,
    count: u32,
    successes: u32,
    good: u32,
}

impl PastDays {
    fn compact(days: DailyCounts) -> api::RouteMap<Box<[PastDay]>> {
        // A day's counts of one route fit 32 bits (a probe every millisecond for a day).
        let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        days.into_iter()
            .map(|(id, v)| {
                let v = v
                    .into_iter()
                    .map(|(day, c)| PastDay {
                        day: n(day.max(0).unsigned_abs()),
                        count: n(c.count),
                        successes: n(c.successes),
                        good: n(c.good),
                    })
                    .collect();
                (id, v)
            })
            .collect()
    }

    fn of(&self, id: &RouteId) -> impl Iterator<Item = (DateTime<Utc>, Counts)> + '_ {
        self.days.get(id).into_iter().flatten().map(|d| {
            let at = DateTime::from_timestamp(i64::from(d.day) * 86_400, 0).unwrap_or_default();
            let c = Counts {
                count: u64::from(d.count),
                successes: u64::from(d.successes),
                good: u64::from(d.good),
            };
            (at, c)
        })
    }
}

/// What the pages' error-budget figures depend on in the config.
#[derive(Debug, Clone, Copy)]
pub struct ErrorBudgetSource {
    /// `[slo] latency_threshold`: a slower success is bad time.
    pub latency_threshold: std::time::Duration,
    /// `[storage] retention_days`: how far back raw outcomes answer per-incident figures.
    pub retention_days: u32,
}

impl ErrorBudgetSource {
    pub fn from_config(c: &crate::config::Config) -> Self {
        Self {
            latency_threshold: c.slo.latency_threshold,
            retention_days: c.storage.retention_days,
        }
    }
}

impl PageData {
    /// Reads the pages' figures at `now`; the days before today come from `previous` when it
    /// read them on the same UTC day less than [`PAST_DAYS_TTL`] ago.
    pub fn load(
        reader: &Reader,
        now: DateTime<Utc>,
        src: ErrorBudgetSource,
        previous: Option<&PageData>,
    ) -> Result<Self, StoreError> {
        let since = Granularity::Day.bucket_start(now) - TimeDelta::days(DAYS - 1);
        let until = now + TimeDelta::milliseconds(1);
        let incidents = reader.incidents(None, since, MAX_INCIDENTS)?;
        let (m0, m1) = incidents::month_bounds(now);
        let raw_since = now - TimeDelta::days(i64::from(src.retention_days));
        let threshold_ms = src.latency_threshold.as_secs_f64() * 1000.0;
        let mut incident_bad = HashMap::new();
        for i in &incidents {
            let (from, to) = incidents::span_in_month(i, m0, m1, now);
            if to <= from || from < raw_since {
                continue;
            }
            let bad = reader.bad_outcomes_between(&i.route, from, to, slo::KINDS, threshold_ms)?;
            incident_bad.insert(i.id.clone(), bad);
        }
        let today = Granularity::Day.bucket_start(now);
        let past = match previous {
            Some(p) if p.past.today == today && now - p.past.read_at < PAST_DAYS_TTL => {
                p.past.clone()
            }
            _ => Arc::new(PastDays {
                today,
                read_at: now,
                days: PastDays::compact(reader.daily_counts_by_route(
                    since,
                    today,
                    UPTIME_KINDS,
                )?),
            }),
        };
        let today_counts = reader
            .daily_counts_by_route(today, until, UPTIME_KINDS)?
            .into_iter()
            .filter_map(|(id, days)| Some((id, days.last()?.1)))
            .collect();
        Ok(Self {
            past,
            today: today_counts,
            incidents,
            month: reader.counts_by_route(m0, until, slo::KINDS)?,
            incident_bad,
            demo_history: reader
                .meta(crate::demo::history::MARKER)?
                .as_deref()
                .and_then(crate::demo::history::parse_marker),
        })
    }

    /// One route's daily counts of the last [`DAYS`] days, oldest first, today's last.
    pub fn days_of(&self, id: &RouteId) -> Vec<(DateTime<Utc>, Counts)> {
        let mut days: Vec<_> = self.past.of(id).collect();
        if let Some(c) = self.today.get(id) {
            days.push((self.past.today, *c));
        }
        days
    }
}

impl FiguresCache {
    /// [`PageData`] at most [`super::api::FIGURES_TTL`] old (or a little older while a read runs), one
    /// store read at a time; past days' bars are reused from the previous read.
    pub async fn pages(
        &self,
        store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
        src: ErrorBudgetSource,
    ) -> Result<Arc<PageData>, PageError> {
        let store = store.clone();
        let load = Arc::new(move |now, previous: Option<Arc<PageData>>| {
            PageData::load(&store.reader()?, now, src, previous.as_deref())
        });
        Ok(self.pages.get(clock, load).await?)
    }

    /// The status figures and [`PageData`] together: when both must be read (after a start,
    /// or a quiet spell), the two reads run side by side on their own connections.
    pub async fn figures_and_pages(
        &self,
        store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
        src: ErrorBudgetSource,
    ) -> Result<(Arc<Figures>, Arc<PageData>), PageError> {
        let figures = async { self.get(store, clock).await.map_err(PageError::from) };
        tokio::try_join!(figures, self.pages(store, clock, src))
    }
}

/// Why a page could not be shown; rendered as `error.html` with its status.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("not found")]
    NotFound,
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

impl From<super::refresh::RefreshError> for PageError {
    fn from(e: super::refresh::RefreshError) -> Self {
        match e {
            super::refresh::RefreshError::Store(e) => PageError::Store(e),
            super::refresh::RefreshError::Task(e) => PageError::Internal(e.to_string()),
        }
    }
}

impl From<super::ApiError> for PageError {
    fn from(e: super::ApiError) -> Self {
        PageError::Internal(e.to_string())
    }
}

/// What every page handler starts from: the reader's language, `now`, the live config, and
/// the error page that goes with them.
struct PageRequest {
    lang: Lang,
    now: DateTime<Utc>,
    config: Arc<crate::config::Config>,
}

impl PageRequest {
    fn new(
        state: &AppState,
        q: &Result<Query<LangQuery>, QueryRejection>,
        headers: &HeaderMap,
    ) -> Self {
        Self {
            lang: pick_lang(q, headers),
            now: state.clock.now(),
            config: state.config.current(),
        }
    }

    /// `error` as this request's error page.
    fn fail(&self, error: PageError) -> AppError {
        AppError {
            lang: self.lang,
            error,
            title: self.config.server.title.clone(),
            now: self.now,
        }
    }
}

/// A [`PageError`] in a language: what handlers return.
#[derive(Debug)]
pub struct AppError {
    pub lang: Lang,
    pub error: PageError,
    pub title: String,
    pub now: DateTime<Utc>,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let t = self.lang.text();
        let (status, heading, text) = match &self.error {
            PageError::NotFound => (StatusCode::NOT_FOUND, t.not_found, t.not_found_text),
            PageError::BadRequest(_) => {
                (StatusCode::BAD_REQUEST, t.bad_request, t.bad_request_text)
            }
            other => {
                tracing::error!(error = %other, "page failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    t.server_error,
                    t.server_error_text,
                )
            }
        };
        let page = ErrorPage {
            c: Chrome::new(self.lang, heading, &self.title, "/", self.now),
            heading,
            text,
        };
        match page.render() {
            Ok(body) => html(status, body),
            // The error page has no fallible part; plain text if it ever fails.
            Err(_) => (status, heading.to_owned()).into_response(),
        }
    }
}

/// `text/html` with the pages' security headers.
pub fn html(status: StatusCode, body: String) -> Response {
    let mut r = (status, Html(body)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Language"));
    r
}

/// `GET /static/style.css`.
pub async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        STYLE,
    )
        .into_response()
}

#[derive(Debug, Default, Deserialize)]
pub struct LangQuery {
    lang: Option<String>,
    /// `/`'s route filter.
    q: Option<String>,
    /// `/`'s logical-model filter.
    serves: Option<String>,
}

fn pick_lang(q: &Result<Query<LangQuery>, QueryRejection>, headers: &HeaderMap) -> Lang {
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    Lang::pick(q.as_ref().ok().and_then(|q| q.lang.as_deref()), accept)
}

pub fn route_href(id: &RouteId, lang: Lang) -> String {
    format!(
        "/routes/{}?lang={}",
        utf8_percent_encode(id.as_str(), SEGMENT),
        lang.code()
    )
}

/// `/` with one logical model's routes only.
pub fn model_href(model: &str, lang: Lang) -> String {
    format!(
        "/?serves={}&lang={}",
        utf8_percent_encode(model, SEGMENT),
        lang.code()
    )
}

fn anchor(id: &RouteId) -> String {
    let s: String = id
        .as_str()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("r-{s}")
}

pub fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// What `_layout.html` needs.
pub struct Chrome {
    pub t: &'static Text,
    pub html_lang: &'static str,
    pub page_title: String,
    pub site_title: String,
    pub home: String,
    pub incidents: String,
    pub switch_href: String,
    pub switch_code: &'static str,
    pub generated: String,
    /// This page's language code, for the filter form.
    pub code: &'static str,
    /// The incident feed in this language.
    pub atom: String,
    /// A badge to show as the footer's example (a route's state badge), when there is one.
    pub badge: Option<String>,
    /// Says which part of the figures is the demo's simulated history, when there is one.
    pub demo_history: Option<String>,
}

impl Chrome {
    fn new(lang: Lang, page_title: &str, site_title: &str, path: &str, now: DateTime<Utc>) -> Self {
        let other = match lang {
            Lang::En => Lang::Zh,
            Lang::Zh => Lang::En,
        };
        Self {
            t: lang.text(),
            html_lang: lang.html_lang(),
            page_title: page_title.to_owned(),
            site_title: site_title.to_owned(),
            home: format!("/?lang={}", lang.code()),
            incidents: format!("/incidents?lang={}", lang.code()),
            switch_href: format!("{path}?lang={}", other.code()),
            switch_code: other.code(),
            generated: when(now),
            code: lang.code(),
            atom: format!("/incidents.atom?lang={}", lang.code()),
            badge: None,
            demo_history: None,
        }
    }

    /// The page marks the demo's simulated history, if `data` has one.
    fn with_history(mut self, lang: Lang, data: &PageData) -> Self {
        self.demo_history = data
            .demo_history
            .map(|(from, to)| i18n::demo_history(lang, (to - from).num_days(), &when(to)));
        self
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub c: Chrome,
    pub heading: &'static str,
    pub text: &'static str,
}

pub fn state_class(s: St) -> &'static str {
    match s {
        St::Unknown => "st-unknown",
        St::Normal => "st-normal",
        St::Warning => "st-warning",
        St::Degraded => "st-degraded",
        St::Critical => "st-critical",
        St::Switched => "st-switched",
    }
}

fn day_class(s: Option<St>) -> &'static str {
    match s {
        None | Some(St::Unknown) => "d-none",
        Some(St::Normal) => "d-normal",
        Some(St::Warning) => "d-warning",
        Some(St::Degraded) => "d-degraded",
        Some(St::Critical) => "d-critical",
        Some(St::Switched) => "d-switched",
    }
}

/// How bad a state is for "worst of": SWITCHED (traffic moved off) ranks with DEGRADED.
fn severity(s: St) -> u8 {
    match s {
        St::Unknown => 0,
        St::Normal => 1,
        St::Warning => 2,
        St::Degraded | St::Switched => 3,
        St::Critical => 4,
    }
}

fn worse(a: Option<St>, b: St) -> St {
    match a {
        Some(a) if severity(a) >= severity(b) => a,
        _ => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_days_keep_their_counts_and_days_in_16_bytes_each() {
        let id = RouteId::new("p", "r", "m");
        let first = 1_780_000_000 / 86_400;
        let c = |n: u64| Counts {
            count: n,
            successes: n - 1,
            good: n - 2,
        };
        let read: Vec<(i64, Counts)> = (0..89).map(|d| (first + d, c(2880 + d as u64))).collect();
        let past = PastDays {
            days: PastDays::compact(HashMap::from([(id.clone(), read.clone())])),
            ..PastDays::default()
        };
        let day = |d: i64| DateTime::from_timestamp(d * 86_400, 0).unwrap();
        let shown: Vec<_> = read.iter().map(|(d, c)| (day(*d), *c)).collect();
        assert_eq!(past.of(&id).collect::<Vec<_>>(), shown);
        assert_eq!(past.of(&RouteId::new("x", "y", "z")).count(), 0);
        assert_eq!(std::mem::size_of::<PastDay>(), 16);
        assert_eq!(past.days[&id].len(), 89, "no room past the days read");
    }
}
