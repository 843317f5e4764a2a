//! The public HTML pages (askama templates in `templates/`, rendered to `Html<String>` here):
//!
//! - `GET /`: the overall banner; active incidents, maintenance windows and network findings on
//!   top; routes grouped by logical model (`serves`), each with its state (colour and text),
//!   since when, the reason in plain words, the failure mode, 90 day bars, uptime 24h/7d/30d,
//!   latency p50/p95 against the baseline, TTFT, tokens/s, SLO target and error budget left.
//! - `GET /routes/{id}`: one route — a 24 h SVG latency chart from the 5-minute rollups with
//!   the baseline band behind, the state timeline with each transition's evidence, the route's
//!   incidents and its recent synthetic probe errors.
//! - `GET /incidents`: 90 days of incidents and where this calendar month's error budget went.
//! - `GET /static/style.css`: the one stylesheet (the CSP allows no inline style or script).
//!
//! **Figures.** The same store figures as `/api/v1/status` ([`super::api::Figures`], through
//! the shared [`FiguresCache`]), plus [`PageData`] (daily rollups of 90 days for every route in
//! one range scan, and the incidents of 90 days), cached the same way. Nothing scans raw
//! outcomes but the route page's last 50 probes.
//!
//! **A day bar's state** (UTC days, the daily rollups' buckets) is the worst of: from the day's
//! synthetic outcomes, `CRITICAL` when fewer than 95% succeeded (the detector's
//! `critical_error_rate` default), `DEGRADED` below 99%, `WARNING` when the good-outcome ratio
//! is below the route's SLO target (the day spent more than its share of the budget), else
//! `NORMAL`; and the peak of every incident open during that day. A day without outcomes nor
//! incidents has no state (grey).
//!
//! **Error budget of the month** (`/incidents`, seed 002's account): a route's budget is
//! `(1 − target)` of the calendar month (UTC); an incident spends the time its route was
//! DEGRADED or worse inside the month.
//!
//! **Safety.** Every text is escaped by askama (no `|safe` anywhere); provider-controlled
//! text (error messages, reported model names, reason details) is also scrubbed of key-like
//! strings ([`scrub`]). Only synthetic outcomes (probe, throughput) are shown, never real
//! traffic. Responses carry a CSP without inline script or style, `nosniff` and
//! `Referrer-Policy: no-referrer`.

use std::borrow::Cow;
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
use tokio::time::Instant;

use super::api::{self, Figures, FiguresCache, FIGURES_TTL, PROBE_KINDS, UPTIME_KINDS};
use super::i18n::{self, Lang, ReasonFigures, Text};
use super::AppState;
use crate::alert::maintenance::window_active;
use crate::config::MaintenanceConfig;
use crate::health::{fmt_ms, fmt_spread, HealthSnapshot, Incident, RouteStatus, State as St};
use crate::probe::outcome::scrub;
use crate::route::{Route, RouteId, Tier};
use crate::store::{quantile, Counts, DailyCounts, Granularity, Reader, Store, StoreError};

/// Days of bars.
pub const DAYS: i64 = 90;
/// Most incidents the pages read (90 days, all routes).
pub const MAX_INCIDENTS: usize = 2000;
/// The stylesheet, compiled in.
pub const STYLE: &str = include_str!("../../static/style.css");
/// The CSP of every page: no script at all, styles only from our own stylesheet.
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Path-segment encoding for route ids in links (`/` becomes `%2F`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What the pages read beyond [`Figures`], for every route at once.
#[derive(Debug, Default)]
pub struct PageData {
    /// Daily synthetic counts of the last [`DAYS`] days per route, oldest first.
    pub days: DailyCounts,
    /// Incidents open at some time in the last [`DAYS`] days, newest first.
    pub incidents: Vec<Incident>,
}

impl PageData {
    pub fn load(reader: &Reader, now: DateTime<Utc>) -> Result<Self, StoreError> {
        let since = Granularity::Day.bucket_start(now) - TimeDelta::days(DAYS - 1);
        Ok(Self {
            days: reader.daily_counts_by_route(
                since,
                now + TimeDelta::milliseconds(1),
                UPTIME_KINDS,
            )?,
            incidents: reader.incidents(None, since, MAX_INCIDENTS)?,
        })
    }
}

impl FiguresCache {
    /// Fresh [`PageData`] (at most [`FIGURES_TTL`] old), one store read at a time.
    pub async fn pages(
        &self,
        store: &Store,
        now: DateTime<Utc>,
    ) -> Result<Arc<PageData>, PageError> {
        let mut last = self.pages.lock().await;
        if let Some((at, data)) = last.as_ref() {
            if at.elapsed() < FIGURES_TTL {
                return Ok(data.clone());
            }
        }
        let store = store.clone();
        let data = tokio::task::spawn_blocking(move || PageData::load(&store.reader()?, now))
            .await
            .map_err(|e| PageError::Internal(format!("blocking task: {e}")))??;
        let data = Arc::new(data);
        *last = Some((Instant::now(), data.clone()));
        Ok(data)
    }
}

/// Why a page could not be shown; rendered as `error.html` with its status.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("not found")]
    NotFound,
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Internal(String),
}

impl From<super::ApiError> for PageError {
    fn from(e: super::ApiError) -> Self {
        PageError::Internal(e.to_string())
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
}

fn pick_lang(q: &Result<Query<LangQuery>, QueryRejection>, headers: &HeaderMap) -> Lang {
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    Lang::pick(q.as_ref().ok().and_then(|q| q.lang.as_deref()), accept)
}

fn route_href(id: &RouteId, lang: Lang) -> String {
    format!(
        "/routes/{}?lang={}",
        utf8_percent_encode(id.as_str(), SEGMENT),
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

fn when(t: DateTime<Utc>) -> String {
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
        }
    }
}

/// One day bar; its tooltip is `{date} {up} · {state}`.
pub struct Bar {
    pub class: &'static str,
    pub date: Arc<str>,
    pub up: Cow<'static, str>,
    pub state: &'static str,
}

/// The [`DAYS`] UTC dates ending today, oldest first, formatted once per page.
pub fn day_dates(now: DateTime<Utc>) -> Vec<Arc<str>> {
    let first = Granularity::Day.bucket_start(now) - TimeDelta::days(DAYS - 1);
    (0..DAYS)
        .map(|i| Arc::from((first + TimeDelta::days(i)).format("%Y-%m-%d").to_string()))
        .collect()
}

/// One route as the pages show it (`/` cards and the head of `/routes/{id}`).
pub struct RouteCard {
    pub id: String,
    pub anchor: String,
    pub href: String,
    pub tier: &'static str,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub since: String,
    pub reason: Option<String>,
    pub mode: Option<&'static str>,
    pub days: Vec<Bar>,
    pub days_summary: String,
    pub uptime_24h: String,
    pub uptime_7d: String,
    pub uptime_30d: String,
    pub p50: String,
    pub p95: String,
    pub baseline: String,
    pub ttft: String,
    pub tps: String,
    pub slo: String,
    pub budget: String,
}

pub struct Group {
    pub name: String,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub routes: Vec<RouteCard>,
}

pub struct IncidentLine {
    pub route: String,
    pub href: String,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub mode: &'static str,
    pub opened: String,
    pub running: String,
}

#[derive(Template)]
#[template(path = "status.html")]
pub struct StatusPage {
    pub c: Chrome,
    pub overall_class: &'static str,
    pub overall_text: &'static str,
    pub incidents: Vec<IncidentLine>,
    pub maintenance: Vec<String>,
    pub findings: Vec<String>,
    pub groups: Vec<Group>,
    /// The hourly extra-cost budget of serving off the primaries, when it is in force.
    pub budget: Option<String>,
    /// Logical models whose traffic the switch controller moved (switched, canary, probing).
    pub switches: Vec<String>,
    /// Monitoring jobs silent for `[heartbeat] stale_after`: the figures may be stale.
    pub stale_jobs: Vec<String>,
    /// Active drills (route, reason, stage, end).
    pub drills: Vec<String>,
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

/// A day's state from its synthetic outcome counts (see the module doc).
pub fn day_state(c: &Counts, target: f64) -> Option<St> {
    let success = c.success_ratio()?;
    let good = c.good_ratio()?;
    Some(if success < 0.95 {
        St::Critical
    } else if success < 0.99 {
        St::Degraded
    } else if good < target {
        St::Warning
    } else {
        St::Normal
    })
}

/// The [`DAYS`] bars of one route, oldest first, ending today (UTC).
pub fn day_bars(
    lang: Lang,
    now: DateTime<Utc>,
    dates: &[Arc<str>],
    days: &[(DateTime<Utc>, Counts)],
    incidents: &[&Incident],
    target: f64,
) -> (Vec<Bar>, String) {
    let today = Granularity::Day.bucket_start(now);
    let first = today - TimeDelta::days(DAYS - 1);
    let n = DAYS as usize;
    let mut worst: Vec<Option<St>> = vec![None; n];
    let mut ratio: Vec<Option<f64>> = vec![None; n];
    let index = |t: DateTime<Utc>| -> Option<usize> {
        let d = (t - first).num_days();
        (0..DAYS).contains(&d).then_some(d as usize)
    };
    for (start, c) in days {
        if let Some(i) = index(*start) {
            ratio[i] = c.success_ratio();
            worst[i] = day_state(c, target);
        }
    }
    for inc in incidents {
        let end = inc.closed_at.unwrap_or(now).min(now);
        let from = inc.opened_at.max(first);
        if end < first {
            continue;
        }
        let (Some(a), Some(b)) = (
            index(Granularity::Day.bucket_start(from)),
            index(Granularity::Day.bucket_start(end)),
        ) else {
            continue;
        };
        for w in worst.iter_mut().take(b + 1).skip(a) {
            *w = Some(worse(*w, inc.peak));
        }
    }
    let mut tally: Vec<(Option<St>, usize)> = Vec::new();
    let bars = (0..n)
        .map(|i| {
            match tally.iter_mut().find(|(s, _)| *s == worst[i]) {
                Some((_, k)) => *k += 1,
                None => tally.push((worst[i], 1)),
            }
            Bar {
                class: day_class(worst[i]),
                date: dates.get(i).cloned().unwrap_or_else(|| Arc::from("")),
                up: i18n::day_uptime(lang, ratio[i]),
                // A normal day's tooltip says only its uptime: it is most days, and page weight counts.
                state: worst[i]
                    .filter(|s| *s != St::Normal)
                    .map_or("", |s| i18n::state(lang, s)),
            }
        })
        .collect();
    tally.sort_by_key(|(s, _)| std::cmp::Reverse(s.map_or(0, severity)));
    let summary = tally
        .iter()
        .map(|(s, k)| match s {
            Some(s) => format!("{} {k}", i18n::state(lang, *s)),
            None => format!("{} {k}", lang.text().no_data),
        })
        .collect::<Vec<_>>()
        .join(", ");
    (bars, summary)
}

fn opt_ms(v: Option<f64>, t: &Text) -> String {
    v.map_or_else(|| t.no_data.to_owned(), fmt_ms)
}

fn ratio(m: &HashMap<RouteId, Counts>, id: &RouteId, t: &Text) -> String {
    m.get(id)
        .and_then(Counts::success_ratio)
        .map_or_else(|| t.no_data.to_owned(), i18n::percent)
}

/// One route's card from the snapshot and the cached figures.
#[allow(clippy::too_many_arguments)] // the card's sources, each different
pub fn route_card(
    lang: Lang,
    route: &Route,
    status: Option<&RouteStatus>,
    figures: &Figures,
    data: &PageData,
    incidents: &[&Incident],
    dates: &[Arc<str>],
    now: DateTime<Utc>,
) -> RouteCard {
    let t = lang.text();
    let id = &route.id;
    let state = status.map_or(St::Unknown, |s| s.state);
    let latency = figures.latency.get(id);
    let samples = figures.samples.get(id);
    let baseline = status.and_then(|s| s.baseline.as_ref());
    let p50 = latency.and_then(|r| r.p50());
    let p95 = latency.and_then(|r| r.p95());
    let tps_now = samples.and_then(|s| quantile(&mut s.tokens_per_second.clone(), 0.5));
    let ttfb_now = samples.and_then(|s| quantile(&mut s.ttfb_ms.clone(), 0.5));
    let reason = status.and_then(|s| s.reason.as_ref()).map(|r| {
        let f = ReasonFigures {
            p95: p95.map(fmt_ms),
            normal: baseline.map(|b| fmt_spread(b.mean_ms, b.stddev_ms)),
            bucket: baseline.map(|b| b.bucket.clone()),
            success_ratio: status.and_then(|s| s.success_ratio),
            tps: tps_now,
            tps_normal: baseline.and_then(|b| b.tps_mean),
        };
        i18n::reason(lang, &r.code, &f, &scrub(&r.text))
    });
    let (days, days_summary) = day_bars(
        lang,
        now,
        dates,
        data.days.get(id).map_or(&[][..], Vec::as_slice),
        incidents,
        route.slo,
    );
    let budget_min = (1.0 - route.slo) * 30.0 * 24.0 * 60.0;
    let budget = api::error_budget_remaining(figures.uptime_30d.get(id), route.slo).map_or_else(
        || t.no_data.to_owned(),
        |f| i18n::budget_left(lang, f, budget_min),
    );
    let since = status.map_or_else(
        || t.no_data.to_owned(),
        |s| {
            format!(
                "{} ({})",
                when(s.since),
                i18n::for_duration(lang, (now - s.since).num_seconds())
            )
        },
    );
    RouteCard {
        id: id.as_str().to_owned(),
        anchor: anchor(id),
        href: route_href(id, lang),
        tier: i18n::tier(lang, route.tier),
        state_class: state_class(state),
        state_text: i18n::state(lang, state),
        since,
        reason,
        mode: status
            .and_then(|s| s.failure_mode)
            .map(|m| i18n::mode(lang, m)),
        days,
        days_summary,
        uptime_24h: ratio(&figures.uptime_24h, id, t),
        uptime_7d: ratio(&figures.uptime_7d, id, t),
        uptime_30d: ratio(&figures.uptime_30d, id, t),
        p50: opt_ms(p50, t),
        p95: opt_ms(p95, t),
        baseline: baseline.map_or_else(
            || t.no_data.to_owned(),
            |b| {
                format!(
                    "{} ({}, p95 {})",
                    fmt_spread(b.mean_ms, b.stddev_ms),
                    b.bucket,
                    fmt_ms(b.p95_ms)
                )
            },
        ),
        ttft: match (baseline.and_then(|b| b.ttft_p50_ms), ttfb_now) {
            (Some(ttft), Some(ttfb)) => format!("{} (TTFB {})", fmt_ms(ttft), fmt_ms(ttfb)),
            (Some(ttft), None) => fmt_ms(ttft),
            (None, Some(ttfb)) => format!("TTFB {}", fmt_ms(ttfb)),
            (None, None) => t.no_data.to_owned(),
        },
        tps: match (tps_now, baseline.and_then(|b| b.tps_mean)) {
            (Some(now), Some(normal)) => format!("{now:.1} ({} {normal:.1})", t.normal_is),
            (Some(now), None) => format!("{now:.1}"),
            (None, Some(normal)) => format!("{} ({} {normal:.1})", t.no_data, t.normal_is),
            (None, None) => t.no_data.to_owned(),
        },
        slo: i18n::percent(route.slo),
        budget,
    }
}

fn incident_line(lang: Lang, i: &Incident, now: DateTime<Utc>) -> IncidentLine {
    let t = lang.text();
    let end = i.closed_at.unwrap_or(now);
    let secs = (end - i.opened_at).num_seconds();
    IncidentLine {
        route: i.route.as_str().to_owned(),
        href: route_href(&i.route, lang),
        state_class: state_class(i.peak),
        state_text: i18n::state(lang, i.peak),
        mode: i.failure_mode.map_or("", |m| i18n::mode(lang, m)),
        opened: when(i.opened_at),
        running: if i.closed_at.is_some() {
            i18n::duration(lang, secs)
        } else {
            format!("{}, {}", t.ongoing, i18n::duration(lang, secs))
        },
    }
}

/// The window that is open now or opens next (within 7 days), as (start, end).
fn next_window(
    m: &MaintenanceConfig,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let len = TimeDelta::from_std(m.duration).ok()?;
    let every = m
        .every
        .and_then(|e| TimeDelta::from_std(e).ok())
        .filter(|e| *e > TimeDelta::zero());
    let start = match every {
        Some(e) if now > m.start => {
            let k = (now - m.start).num_milliseconds() / e.num_milliseconds().max(1);
            let cur = m.start + TimeDelta::milliseconds(e.num_milliseconds() * k);
            if window_active(m, now) {
                cur
            } else {
                cur + e
            }
        }
        _ => m.start,
    };
    let end = start + len;
    (end > now && start < now + TimeDelta::days(7)).then_some((start, end))
}

/// The `/` page's view model (a pure function of its inputs: the benchmark calls it).
#[allow(clippy::too_many_arguments)] // each input is a different source; a struct would only rename them
pub fn status_page(
    lang: Lang,
    title: &str,
    routes: &[Route],
    maintenance: &[MaintenanceConfig],
    health: &HealthSnapshot,
    figures: &Figures,
    data: &PageData,
    now: DateTime<Utc>,
) -> StatusPage {
    let t = lang.text();
    let by_id: HashMap<&RouteId, &RouteStatus> =
        health.routes.iter().map(|s| (&s.route, s)).collect();
    let mut incidents_of: HashMap<&RouteId, Vec<&Incident>> = HashMap::new();
    for i in &data.incidents {
        incidents_of.entry(&i.route).or_default().push(i);
    }
    let dates = day_dates(now);
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for r in routes {
        let status = by_id.get(&r.id).copied();
        let incidents = incidents_of.get(&r.id).map_or(&[][..], Vec::as_slice);
        let card = route_card(lang, r, status, figures, data, incidents, &dates, now);
        let gi = *group_of.entry(r.serves.as_str()).or_insert_with(|| {
            groups.push(Group {
                name: r.serves.clone(),
                state_class: "",
                state_text: "",
                routes: Vec::new(),
            });
            groups.len() - 1
        });
        groups[gi].routes.push(card);
    }
    // A logical model's state: the best among its primary routes (SPEC), judged ones first.
    for g in &mut groups {
        let members: Vec<(Tier, St)> = routes
            .iter()
            .filter(|r| r.serves == g.name)
            .map(|r| (r.tier, by_id.get(&r.id).map_or(St::Unknown, |s| s.state)))
            .collect();
        let primaries: Vec<St> = members
            .iter()
            .filter(|(t, _)| *t == Tier::Primary)
            .map(|(_, s)| *s)
            .collect();
        let pool = if primaries.is_empty() {
            members.iter().map(|(_, s)| *s).collect()
        } else {
            primaries
        };
        let best = pool
            .iter()
            .copied()
            .filter(|s| *s != St::Unknown)
            .min_by_key(|s| severity(*s))
            .unwrap_or(St::Unknown);
        g.state_class = state_class(best);
        g.state_text = i18n::state(lang, best);
    }
    let (overall_class, overall_text) = match api::overall(routes, health) {
        "outage" => ("outage", t.overall_outage),
        "degraded" => ("degraded", t.overall_degraded),
        _ => ("operational", t.overall_operational),
    };
    let mut active: Vec<&RouteStatus> = health
        .routes
        .iter()
        .filter(|s| s.incident.is_some())
        .collect();
    active.sort_by_key(|s| s.incident.as_ref().map(|i| i.opened_at));
    let incidents = active
        .iter()
        .filter_map(|s| {
            let i = s.incident.as_ref()?;
            let full = Incident {
                id: i.id.clone(),
                route: s.route.clone(),
                opened_at: i.opened_at,
                closed_at: None,
                peak: i.peak,
                failure_mode: i.failure_mode,
                transitions: Vec::new(),
            };
            let mut line = incident_line(lang, &full, now);
            line.state_class = state_class(s.state);
            line.state_text = i18n::state(lang, s.state);
            Some(line)
        })
        .collect();
    let maintenance = maintenance
        .iter()
        .filter_map(|m| {
            let (start, end) = next_window(m, now)?;
            Some(i18n::maintenance(
                lang,
                start <= now,
                &m.routes.join(", "),
                &when(start),
                &when(end),
            ))
        })
        .collect();
    let findings = health
        .findings
        .iter()
        .map(|f| i18n::finding(lang, f.kind, &f.providers, f.routes.len()))
        .collect();
    StatusPage {
        c: Chrome::new(lang, t.nav_status, title, "/", now),
        overall_class,
        overall_text,
        incidents,
        maintenance,
        findings,
        groups,
        budget: None,
        switches: Vec::new(),
        stale_jobs: Vec::new(),
        drills: Vec::new(),
    }
}

/// `GET /`.
pub async fn status(
    State(state): State<AppState>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let lang = pick_lang(&q, &headers);
    let now = state.clock.now();
    let config = state.config.current();
    let fail = |error: PageError| AppError {
        lang,
        error,
        title: config.server.title.clone(),
        now,
    };
    let health = state.health.borrow().clone();
    let figures = state
        .figures
        .get(&state.store, now)
        .await
        .map_err(|e| fail(e.into()))?;
    let data = state.figures.pages(&state.store, now).await.map_err(fail)?;
    let mut page = status_page(
        lang,
        &config.server.title,
        &state.routes,
        &config.maintenance,
        &health,
        &figures,
        &data,
        now,
    );
    page.stale_jobs = stale_jobs(&state, config.heartbeat.stale_after, now)
        .await
        .iter()
        .map(|s| i18n::stale_job(lang, s))
        .collect();
    page.budget = state
        .metrics
        .budget()
        .map(|b| i18n::budget(lang, &b.snapshot()));
    if let Some(sw) = state.metrics.switch() {
        page.switches = sw
            .models
            .iter()
            .filter_map(|m| i18n::switch_line(lang, m, &when))
            .collect();
    }
    page.drills = drill_lines(&state, lang, now, None);
    let body = page
        .render()
        .map_err(|e| fail(PageError::Internal(format!("rendering /: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}

/// The expected jobs silent for `stale_after`. A store that cannot be read shows no banner:
/// the page then fails on its own figures anyway.
async fn stale_jobs(
    state: &AppState,
    stale_after: std::time::Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<crate::heartbeat::Stale> {
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await {
        Ok(Ok(beats)) => state.jobs.stale(&beats, now, stale_after),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "status page: cannot read heartbeats");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(error = %e, "status page: cannot read heartbeats");
            Vec::new()
        }
    }
}

/// The active drills as lines for people (only those on `route` when given).
fn drill_lines(
    state: &AppState,
    lang: Lang,
    now: DateTime<Utc>,
    route: Option<&RouteId>,
) -> Vec<String> {
    state
        .metrics
        .drills()
        .map(|all| {
            all.iter()
                .filter(|d| route.is_none_or(|r| *r == d.route))
                .map(|d| i18n::drill_line(lang, d, now, &when))
                .collect()
        })
        .unwrap_or_default()
}

/// One point of the chart's y axis.
pub struct GridLine {
    pub y: String,
    pub text_y: String,
    pub label: String,
}

pub struct XTick {
    pub x: String,
    pub label: String,
}

pub struct Band {
    pub y: String,
    pub h: String,
    pub thr: String,
}

/// The 24 h latency chart, as numbers for `route.html`'s inline SVG.
pub struct Chart {
    pub width: u32,
    pub height: u32,
    pub left: u32,
    pub left_label: u32,
    pub right: u32,
    pub plot_width: u32,
    pub axis_y: u32,
    pub grid: Vec<GridLine>,
    pub xticks: Vec<XTick>,
    pub band: Option<Band>,
    pub p50: String,
    pub p95: String,
    pub label: String,
}

/// One 5-minute bucket: its start, p50 and p95 (ms).
pub type ChartPoint = (DateTime<Utc>, Option<f64>, Option<f64>);

/// p50/p95 per 5-minute bucket over the last 24 h, the baseline (mean ± σ, and the anomaly
/// threshold) drawn behind as a band and a dashed line.
pub fn chart(
    lang: Lang,
    points: &[ChartPoint],
    baseline: Option<(f64, f64, f64)>,
    now: DateTime<Utc>,
) -> Chart {
    let (width, height, left, right, top, bottom) = (720u32, 220u32, 56u32, 692u32, 10u32, 190u32);
    let plot_w = f64::from(right - left);
    let plot_h = f64::from(bottom - top);
    let start = now - TimeDelta::hours(24);
    let mut max = points
        .iter()
        .filter_map(|(_, a, b)| b.or(*a))
        .fold(0.0f64, f64::max);
    if let Some((mean, sd, thr)) = baseline {
        max = max.max(thr).max(mean + sd);
    }
    let step = nice_step(max.max(1.0) / 4.0);
    let top_v = (max / step).ceil().max(1.0) * step;
    let x = |t: DateTime<Utc>| {
        let s = (t - start).num_seconds() as f64 + 150.0;
        f64::from(left) + (s / 86_400.0).clamp(0.0, 1.0) * plot_w
    };
    let y = |v: f64| f64::from(bottom) - (v / top_v).clamp(0.0, 1.0) * plot_h;
    let line = |pick: fn(&ChartPoint) -> Option<f64>| {
        points
            .iter()
            .filter_map(|p| pick(p).map(|v| format!("{:.1},{:.1}", x(p.0), y(v))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut grid = Vec::new();
    let mut v = 0.0;
    while v <= top_v + step / 2.0 {
        grid.push(GridLine {
            y: format!("{:.1}", y(v)),
            text_y: format!("{:.1}", y(v) + 4.0),
            label: fmt_ms(v),
        });
        v += step;
    }
    let xticks = (0..=4)
        .map(|k| {
            let t = start + TimeDelta::hours(6 * k);
            XTick {
                x: format!("{:.1}", f64::from(left) + plot_w * k as f64 / 4.0),
                label: t.format("%H:%M").to_string(),
            }
        })
        .collect();
    let band = baseline.map(|(mean, sd, thr)| {
        let hi = y(mean + sd);
        let lo = y((mean - sd).max(0.0));
        Band {
            y: format!("{hi:.1}"),
            h: format!("{:.1}", (lo - hi).max(1.0)),
            thr: format!("{:.1}", y(thr)),
        }
    });
    let latest = points.iter().rev().find_map(|p| p.2);
    let label = match (lang, latest) {
        (Lang::En, Some(p)) => format!(
            "p50 and p95 latency over the last 24 hours; latest p95 {}",
            fmt_ms(p)
        ),
        (Lang::Zh, Some(p)) => format!("最近 24 小时的 p50 与 p95 延迟；最新 p95 {}", fmt_ms(p)),
        (Lang::En, None) => "p50 and p95 latency over the last 24 hours: no data".to_owned(),
        (Lang::Zh, None) => "最近 24 小时的 p50 与 p95 延迟：无数据".to_owned(),
    };
    Chart {
        width,
        height,
        left,
        left_label: left - 6,
        right,
        plot_width: right - left,
        axis_y: height - 8,
        grid,
        xticks,
        band,
        p50: line(|p| p.1),
        p95: line(|p| p.2),
        label,
    }
}

/// 1, 2 or 5 × a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

pub struct TimelineRow {
    pub at: String,
    pub from: &'static str,
    pub from_class: &'static str,
    pub to: &'static str,
    pub to_class: &'static str,
    pub reason: String,
    pub evidence: Vec<String>,
}

pub struct ErrorRow {
    pub at: String,
    pub text: String,
}

#[derive(Template)]
#[template(path = "route.html")]
pub struct RoutePage {
    pub c: Chrome,
    pub r: RouteCard,
    pub provider: String,
    pub region: String,
    pub model: String,
    pub serves: String,
    pub model_reported: String,
    pub chart: Chart,
    pub timeline: Vec<TimelineRow>,
    pub incidents: Vec<IncidentLine>,
    pub errors: Vec<ErrorRow>,
    /// Active drills on this route.
    pub drills: Vec<String>,
}

/// `GET /routes/{id}` (the id's slashes raw or percent-encoded).
pub async fn route(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let lang = pick_lang(&q, &headers);
    let now = state.clock.now();
    let config = state.config.current();
    let fail = |error: PageError| AppError {
        lang,
        error,
        title: config.server.title.clone(),
        now,
    };
    let Some(route) = RouteId::parse(&raw)
        .and_then(|id| state.routes.iter().find(|r| r.id == id))
        .cloned()
    else {
        return Err(fail(PageError::NotFound));
    };
    let health = state.health.borrow().clone();
    let figures = state
        .figures
        .get(&state.store, now)
        .await
        .map_err(|e| fail(e.into()))?;
    let data = state.figures.pages(&state.store, now).await.map_err(fail)?;
    let store = state.store.clone();
    let id = route.id.clone();
    let read = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let reader = store.reader()?;
        let since = now - TimeDelta::hours(24);
        let until = now + TimeDelta::milliseconds(1);
        let buckets = reader.rollups(
            &id,
            Granularity::FiveMinutes,
            since,
            until,
            api::LATENCY_KINDS,
        )?;
        let transitions = reader.transitions(&id, now - TimeDelta::days(30), 100)?;
        let incidents = reader.incidents(Some(&id), now - TimeDelta::days(DAYS), 100)?;
        let recent = reader.recent_outcomes_of(&id, PROBE_KINDS, 50)?;
        Ok((buckets, transitions, incidents, recent))
    })
    .await
    .map_err(|e| fail(PageError::Internal(format!("blocking task: {e}"))))?
    .map_err(|e| fail(e.into()))?;
    let (buckets, transitions, incidents, recent) = read;
    let status = health.route(&route.id);
    let body = RoutePage {
        c: Chrome::new(
            lang,
            route.id.as_str(),
            &config.server.title,
            &format!(
                "/routes/{}",
                utf8_percent_encode(route.id.as_str(), SEGMENT)
            ),
            now,
        ),
        r: route_card(
            lang,
            &route,
            status,
            &figures,
            &data,
            &data
                .incidents
                .iter()
                .filter(|i| i.route == route.id)
                .collect::<Vec<_>>(),
            &day_dates(now),
            now,
        ),
        provider: route.provider.clone(),
        region: route.region.clone(),
        model: route.model.clone(),
        serves: route.serves.clone(),
        model_reported: recent
            .iter()
            .find_map(|o| o.model_reported.as_deref())
            .map_or_else(|| lang.text().no_data.to_owned(), scrub),
        chart: chart(
            lang,
            &buckets
                .iter()
                .map(|b| (b.bucket_start, b.p50(), b.p95()))
                .collect::<Vec<_>>(),
            status.and_then(|s| s.baseline.as_ref()).map(|b| {
                (
                    b.mean_ms,
                    b.stddev_ms,
                    b.p95_ms.max(b.mean_ms + b.stddev_ms),
                )
            }),
            now,
        ),
        timeline: transitions
            .iter()
            .map(|tr| TimelineRow {
                at: when(tr.at),
                from: i18n::state(lang, tr.from),
                from_class: state_class(tr.from),
                to: i18n::state(lang, tr.to),
                to_class: state_class(tr.to),
                reason: i18n::reason(
                    lang,
                    &tr.reason.code,
                    &ReasonFigures::default(),
                    &scrub(&tr.reason.text),
                ),
                evidence: i18n::evidence(lang, &tr.evidence),
            })
            .collect(),
        incidents: incidents
            .iter()
            .map(|i| incident_line(lang, i, now))
            .collect(),
        errors: recent
            .iter()
            .filter(|o| !o.success)
            .take(10)
            .map(|o| ErrorRow {
                at: o.started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                text: format!(
                    "{} · {}",
                    o.kind.as_str(),
                    o.error
                        .as_ref()
                        .map_or_else(String::new, |e| scrub(&e.to_string()))
                ),
            })
            .collect(),
        drills: drill_lines(&state, lang, now, Some(&route.id)),
    }
    .render()
    .map_err(|e| fail(PageError::Internal(format!("rendering a route page: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}

pub struct Spend {
    pub route: String,
    pub href: String,
    pub spent: String,
    pub share: String,
    pub what: String,
}

pub struct BudgetRow {
    pub route: String,
    pub href: String,
    pub budget: String,
    pub spent: String,
}

#[derive(Template)]
#[template(path = "incidents.html")]
pub struct IncidentsPage {
    pub c: Chrome,
    pub month: String,
    pub spends: Vec<Spend>,
    pub budgets: Vec<BudgetRow>,
    pub incidents: Vec<IncidentLine>,
}

/// The first instant of `now`'s calendar month (UTC) and of the next one.
pub fn month_bounds(now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let (y, m) = (now.year(), now.month());
    let first = NaiveDate::from_ymd_opt(y, m, 1);
    let next = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    };
    let at = |d: Option<NaiveDate>| {
        d.and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or(now)
    };
    (at(first), at(next))
}

/// The `/incidents` view model.
pub fn incidents_page(
    lang: Lang,
    title: &str,
    routes: &[Route],
    data: &PageData,
    now: DateTime<Utc>,
) -> IncidentsPage {
    let t = lang.text();
    let (m0, m1) = month_bounds(now);
    let month_s = (m1 - m0).num_seconds() as f64;
    let target: HashMap<&RouteId, f64> = routes.iter().map(|r| (&r.id, r.slo)).collect();
    let mut spends: Vec<(i64, Spend)> = Vec::new();
    let mut per_route: Vec<(RouteId, f64, i64)> = Vec::new();
    for i in &data.incidents {
        let from = i.opened_at.max(m0);
        let to = i.closed_at.unwrap_or(now).min(now).min(m1);
        let spent = (to - from).num_seconds();
        if spent <= 0 {
            continue;
        }
        let slo = target.get(&i.route).copied().unwrap_or(0.999);
        let budget_s = (1.0 - slo) * month_s;
        let opening = i.transitions.first().map_or_else(String::new, |tr| {
            i18n::reason(
                lang,
                &tr.reason.code,
                &ReasonFigures::default(),
                &scrub(&tr.reason.text),
            )
        });
        spends.push((
            spent,
            Spend {
                route: i.route.as_str().to_owned(),
                href: route_href(&i.route, lang),
                spent: i18n::duration(lang, spent),
                share: format!(
                    "{:.1}%",
                    if budget_s > 0.0 {
                        spent as f64 / budget_s * 100.0
                    } else {
                        100.0
                    }
                ),
                what: format!(
                    "{} · {}",
                    when(i.opened_at),
                    i18n::incident_what(lang, i.peak, i.failure_mode, &opening)
                ),
            },
        ));
        match per_route.iter_mut().find(|(r, ..)| r == &i.route) {
            Some((_, _, s)) => *s += spent,
            None => per_route.push((i.route.clone(), budget_s, spent)),
        }
    }
    spends.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
    per_route.sort_by_key(|(_, _, s)| std::cmp::Reverse(*s));
    IncidentsPage {
        c: Chrome::new(lang, t.nav_incidents, title, "/incidents", now),
        month: m0.format("%Y-%m").to_string(),
        spends: spends.into_iter().map(|(_, s)| s).collect(),
        budgets: per_route
            .iter()
            .map(|(r, budget_s, spent)| BudgetRow {
                route: r.as_str().to_owned(),
                href: route_href(r, lang),
                budget: i18n::duration(lang, *budget_s as i64),
                spent: i18n::budget_spent(lang, *spent, *budget_s),
            })
            .collect(),
        incidents: data
            .incidents
            .iter()
            .map(|i| incident_line(lang, i, now))
            .collect(),
    }
}

/// `GET /incidents`.
pub async fn incidents(
    State(state): State<AppState>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let lang = pick_lang(&q, &headers);
    let now = state.clock.now();
    let config = state.config.current();
    let fail = |error: PageError| AppError {
        lang,
        error,
        title: config.server.title.clone(),
        now,
    };
    let data = state.figures.pages(&state.store, now).await.map_err(fail)?;
    let body = incidents_page(lang, &config.server.title, &state.routes, &data, now)
        .render()
        .map_err(|e| fail(PageError::Internal(format!("rendering /incidents: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn day_states_follow_the_thresholds() {
        let c = |count, successes, good| Counts {
            count,
            successes,
            good,
        };
        assert_eq!(day_state(&c(0, 0, 0), 0.999), None);
        assert_eq!(day_state(&c(1000, 1000, 1000), 0.999), Some(St::Normal));
        assert_eq!(day_state(&c(1000, 999, 998), 0.999), Some(St::Warning));
        assert_eq!(day_state(&c(1000, 980, 980), 0.999), Some(St::Degraded));
        assert_eq!(day_state(&c(1000, 900, 900), 0.999), Some(St::Critical));
    }

    #[test]
    fn incidents_colour_the_days_they_overlap() {
        let now = at("2026-05-20T12:00:00Z");
        let id = RouteId::parse("a/b/c").unwrap();
        let days = vec![
            (
                at("2026-05-18T00:00:00Z"),
                Counts {
                    count: 100,
                    successes: 100,
                    good: 100,
                },
            ),
            (
                at("2026-05-19T00:00:00Z"),
                Counts {
                    count: 100,
                    successes: 100,
                    good: 100,
                },
            ),
        ];
        let inc = Incident {
            id: "x".into(),
            route: id,
            opened_at: at("2026-05-18T23:00:00Z"),
            closed_at: Some(at("2026-05-19T01:00:00Z")),
            peak: St::Critical,
            failure_mode: None,
            transitions: Vec::new(),
        };
        let (bars, summary) = day_bars(Lang::En, now, &day_dates(now), &days, &[&inc], 0.999);
        assert_eq!(bars.len(), 90);
        assert_eq!(bars[89].class, "d-none"); // today: no data
        assert_eq!(bars[88].class, "d-critical");
        assert_eq!(bars[87].class, "d-critical");
        assert_eq!(bars[86].class, "d-none");
        assert_eq!(&*bars[88].date, "2026-05-19");
        assert_eq!(bars[88].up, "100%");
        assert_eq!(bars[88].state, "CRITICAL");
        assert!(summary.contains("CRITICAL 2"), "{summary}");
    }

    #[test]
    fn month_bounds_wrap_the_year() {
        let (a, b) = month_bounds(at("2026-12-15T10:00:00Z"));
        assert_eq!(a, at("2026-12-01T00:00:00Z"));
        assert_eq!(b, at("2027-01-01T00:00:00Z"));
    }

    #[test]
    fn chart_steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(300.0), 500.0);
        assert_eq!(nice_step(1200.0), 2000.0);
    }
}
