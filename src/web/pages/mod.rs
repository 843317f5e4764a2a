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
//! read again off the request path). The days before today are no request's read: a task
//! keeps them ([`past`]: read at the start, every [`PAST_DAYS_EVERY`] and after midnight UTC),
//! and a page read adds the days since its last read (today). The long windows (uptimes, the
//! error budgets, the month's) are kept the same way ([`crate::web::windows`]: every bucket
//! before the hour of its last read), and a page read adds the hours since. Until the
//! keepers' first reads end a page shows the rest and says what is still being read
//! ([`Warming`]); it never waits for them. Nothing scans raw outcomes but the route page's
//! last 50 probes and the last hour's samples.
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
pub mod past;
mod route;
mod shadow;
mod status;
mod vantages;

pub use chart::*;
pub use incidents::*;
pub use lines::*;
pub use past::{PastBars, PAST_DAYS_EVERY};
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
use crate::web::windows::{KeptWindows, Span};

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
#[derive(Debug)]
pub struct PageData {
    /// Daily synthetic counts of the days before today per route, as the keeper last read
    /// them ([`past`]): looked at when a page is drawn, so a read that ends meanwhile shows.
    past: Arc<PastBars>,
    /// The days from the keeper's last read on (today, and after midnight yesterday until
    /// the keeper read again) per route, oldest first: read each time.
    recent: DailyCounts,
    /// Incidents open at some time in the last [`DAYS`] days, newest first.
    pub incidents: Vec<Incident>,
    /// Probe counts of this calendar month per route (rollups): the month's error budget;
    /// the kept windows' ([`crate::web::windows`]) and the hours since their read.
    pub month: HashMap<RouteId, Counts>,
    /// The month's counts are not read yet (the windows' first read runs): `month` is empty.
    pub month_warming: bool,
    /// Bad probe outcomes inside each incident's span within this month, by incident id,
    /// counted on the raw outcomes; absent for an incident whose span in the month starts
    /// before the raw outcomes kept (`[storage] retention_days`).
    pub incident_bad: HashMap<String, u64>,
    /// The span of simulated history the built-in demo wrote, when it did.
    pub demo_history: Option<(DateTime<Utc>, DateTime<Utc>)>,
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
    /// Reads the pages' figures at `now`, with the days before the keeper's last read day
    /// from `past` (see [`past`]): a request reads the days since then, not [`DAYS`] of them.
    pub fn load(
        reader: &Reader,
        now: DateTime<Utc>,
        src: ErrorBudgetSource,
        past: &Arc<PastBars>,
        windows: Option<&KeptWindows>,
    ) -> Result<Self, StoreError> {
        let today = Granularity::Day.bucket_start(now);
        let since = today - TimeDelta::days(DAYS - 1);
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
        // Today, and the days the keeper has not read yet (after midnight, until it did).
        let recent_since = past.get().map_or(today, |p| p.today.clamp(since, today));
        Ok(Self {
            past: past.clone(),
            recent: reader.daily_counts_by_route(recent_since, until, UPTIME_KINDS)?,
            incidents,
            month: match windows {
                Some(w) => w
                    .at(reader, now, &[Span::Month])?
                    .pop()
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
                None => HashMap::new(),
            },
            month_warming: windows.is_none(),
            incident_bad,
            demo_history: reader
                .meta(crate::demo::history::MARKER)?
                .as_deref()
                .and_then(crate::demo::history::parse_marker),
        })
    }

    /// One route's daily counts of the last [`DAYS`] days, oldest first, today's last.
    pub fn days_of(&self, id: &RouteId) -> Vec<(DateTime<Utc>, Counts)> {
        let day = |d: i64| DateTime::from_timestamp(d * 86_400, 0).unwrap_or_default();
        let recent = self.recent.get(id).map_or(&[][..], Vec::as_slice);
        // The keeper's days end where the request's own read begins.
        let from = recent.first().map(|(d, _)| day(*d));
        let past = self.past.get();
        let mut days: Vec<_> = past
            .iter()
            .flat_map(|p| p.of(id))
            .filter(|(at, _)| from.is_none_or(|f| *at < f))
            .collect();
        days.extend(recent.iter().map(|(d, c)| (day(*d), *c)));
        days
    }

    /// What is still being read right after a start: the days before today (their bars are
    /// blank for now), the month's counts.
    pub fn warming(&self) -> Warming {
        Warming {
            days: self.past.get().is_none(),
            figures: self.month_warming,
            latest: false,
        }
    }
}

/// What a page's figures still miss right after a start, until the keepers' first reads end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Warming {
    /// The day bars of the days before today ([`past`]).
    pub days: bool,
    /// The long windows: uptimes, error budgets ([`crate::web::windows`]).
    pub figures: bool,
    /// The last hour's figures too (latencies; [`Figures::pending`]).
    pub latest: bool,
}

impl Warming {
    /// The page's note, when something is still being read.
    pub fn note(self, t: &'static Text) -> Option<&'static str> {
        if self.latest {
            return Some(t.latest_warming);
        }
        match (self.days, self.figures) {
            (false, false) => None,
            (true, false) => Some(t.days_warming),
            (false, true) => Some(t.figures_warming),
            (true, true) => Some(t.all_warming),
        }
    }
}

impl FiguresCache {
    /// The kept days before today.
    pub fn past(&self) -> &Arc<PastBars> {
        &self.past
    }

    /// [`PageData`] at most [`super::api::FIGURES_TTL`] old (or a little older while a read
    /// runs), one store read at a time; the days before today are the keeper's ([`past`],
    /// started here unless the service started it).
    pub async fn pages(
        &self,
        state_store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
        src: ErrorBudgetSource,
    ) -> Result<Arc<PageData>, PageError> {
        // Started with the router; a cache used without one starts it here, ended with it.
        self.past.start(
            state_store,
            clock,
            &tokio_util::sync::CancellationToken::new(),
        );
        self.windows().start(
            state_store,
            clock,
            &tokio_util::sync::CancellationToken::new(),
        );
        let store = state_store.clone();
        let past = self.past.clone();
        let windows = self.windows().clone();
        let load = {
            let windows = windows.clone();
            Arc::new(move |now, _previous: Option<Arc<PageData>>| {
                PageData::load(&store.reader()?, now, src, &past, windows.get().as_deref())
            })
        };
        // Read while the month was not known: served once more after the windows' first read
        // ended, while the data with it is read.
        let fit = move |d: &PageData| api::fit_warming(d.month_warming, &windows);
        Ok(self.pages.get_where(clock, load, fit).await?)
    }

    /// The status figures and [`PageData`] together: when both must be read (after a start,
    /// or a quiet spell), the two reads run side by side on their own connections. Neither
    /// waits for the keepers' first reads: the figures then say they are warming.
    pub async fn figures_and_pages(
        &self,
        store: &Store,
        clock: &Arc<dyn crate::clock::Clock>,
        src: ErrorBudgetSource,
    ) -> Result<(Arc<Figures>, Arc<PageData>), PageError> {
        let figures = async {
            self.get_warming(store, clock)
                .await
                .map_err(PageError::from)
        };
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
    /// Says what is still being read right after a start (the days before today, the
    /// uptimes and budgets), when something is.
    pub warming: Option<&'static str>,
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
            warming: None,
        }
    }

    /// The page marks the demo's simulated history, if `data` has one, and says what its
    /// figures (`data`, and `figures` when it shows them) still miss.
    fn with_history(mut self, lang: Lang, data: &PageData, figures: Option<&Figures>) -> Self {
        self.demo_history = data
            .demo_history
            .map(|(from, to)| i18n::demo_history(lang, (to - from).num_days(), &when(to)));
        let mut warming = data.warming();
        warming.figures |= figures.is_some_and(|f| f.warming);
        warming.latest = figures.is_some_and(|f| f.pending);
        self.warming = warming.note(self.t);
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
    fn the_warming_note_says_what_is_still_being_read_in_both_languages() {
        for lang in [Lang::En, Lang::Zh] {
            let t = lang.text();
            let note = |days, figures| {
                Warming {
                    days,
                    figures,
                    latest: false,
                }
                .note(t)
            };
            assert_eq!(note(false, false), None);
            let latest = Warming {
                days: false,
                figures: true,
                latest: true,
            };
            assert_eq!(latest.note(t), Some(t.latest_warming));
            assert_eq!(note(true, false), Some(t.days_warming));
            assert_eq!(note(false, true), Some(t.figures_warming));
            assert_eq!(note(true, true), Some(t.all_warming));
        }
        assert!(Lang::En.text().figures_warming.contains("uptimes"));
        assert!(Lang::Zh.text().figures_warming.contains("可用率"));

        // A page whose figures were read before the windows: the month, or the uptimes.
        let now = DateTime::from_timestamp(1_780_000_000, 0).unwrap_or_default();
        let data = |month_warming| PageData {
            past: Arc::new(PastBars::default()),
            recent: DailyCounts::default(),
            incidents: Vec::new(),
            month: HashMap::new(),
            month_warming,
            incident_bad: HashMap::new(),
            demo_history: None,
        };
        let chrome = |data: &PageData, figures: Option<&Figures>| {
            Chrome::new(Lang::Zh, "t", "s", "/", now)
                .with_history(Lang::Zh, data, figures)
                .warming
        };
        let zh = Lang::Zh.text();
        assert_eq!(chrome(&data(true), None), Some(zh.all_warming));
        assert_eq!(chrome(&data(false), None), Some(zh.days_warming));
        let warming = Figures {
            warming: true,
            ..Figures::default()
        };
        assert_eq!(chrome(&data(false), Some(&warming)), Some(zh.all_warming));
        let pending = Figures::pending();
        assert_eq!(
            chrome(&data(false), Some(&pending)),
            Some(zh.latest_warming)
        );
    }
}
