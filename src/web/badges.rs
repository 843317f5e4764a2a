//! Shields-style SVG badges for READMEs and wikis:
//!
//! - `GET /badges/{route id}/uptime.svg?window=24h|7d|30d` (default `30d`): the route's
//!   synthetic success ratio over the window, from the same figures as `/api/v1/status`;
//! - `GET /badges/{route id}/state.svg`: the route's state;
//! - `GET /badges/model/{serves}/state.svg`: a logical model's state (the best of its primary
//!   routes, as on `/`).
//!
//! English by default, `?lang=zh` for Chinese (a badge is embedded and cached by its URL, so
//! the language is never taken from `Accept-Language`). `Cache-Control: public, max-age=60`:
//! a badge is as fresh as the figures behind it (5 s) plus a minute of caching by proxies.
//! An unknown route or model, or a bad window, is a JSON error like the rest of the API.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::i18n::{self, Lang};
use super::pages::model_state;
use super::{ApiError, AppState};
use crate::health::State as St;
use crate::route::RouteId;
use crate::store::Counts;

/// How long caches may keep a badge.
pub const CACHE_CONTROL: &str = "public, max-age=60";

#[derive(Debug, Default, Deserialize)]
pub struct BadgeQuery {
    window: Option<String>,
    lang: Option<String>,
}

/// An uptime window a badge may show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Day,
    Week,
    Month,
}

impl Window {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "24h" => Some(Self::Day),
            "7d" => Some(Self::Week),
            "30d" => Some(Self::Month),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "24h",
            Self::Week => "7d",
            Self::Month => "30d",
        }
    }
}

/// A badge: a grey label and a coloured value.
#[derive(Debug, Clone, PartialEq)]
pub struct Badge {
    pub label: String,
    pub value: String,
    /// `#rrggbb`.
    pub color: &'static str,
}

/// The colour of a state (the status page's palette).
pub fn state_color(s: St) -> &'static str {
    match s {
        St::Unknown => "#9f9f9f",
        St::Normal => "#1a7f37",
        St::Warning => "#9a6700",
        St::Degraded => "#bc4c00",
        St::Critical => "#cf222e",
        St::Switched => "#8250df",
    }
}

/// The colour of an uptime ratio: green from 99.9%, yellow-green from 99%, orange from 95%,
/// red below; grey without data.
pub fn uptime_color(ratio: Option<f64>) -> &'static str {
    match ratio {
        None => "#9f9f9f",
        Some(r) if r >= 0.999 => "#1a7f37",
        Some(r) if r >= 0.99 => "#7a8a00",
        Some(r) if r >= 0.95 => "#bc4c00",
        Some(_) => "#cf222e",
    }
}

/// A state as a badge says it: the code in English, the word in Chinese.
fn state_word(lang: Lang, s: St) -> &'static str {
    match lang {
        Lang::En => s.as_str(),
        Lang::Zh => i18n::state(lang, s).split(' ').next().unwrap_or(s.as_str()),
    }
}

/// The uptime badge of a route's counts over `window`.
pub fn uptime_badge(lang: Lang, window: Window, counts: Option<&Counts>) -> Badge {
    let ratio = counts.and_then(Counts::success_ratio);
    let label = match lang {
        Lang::En => format!("uptime {}", window.as_str()),
        Lang::Zh => format!("可用率 {}", window.as_str()),
    };
    Badge {
        label,
        value: ratio.map_or_else(|| lang.text().no_data.to_owned(), i18n::percent),
        color: uptime_color(ratio),
    }
}

/// A state badge labelled with what it is the state of.
pub fn state_badge(lang: Lang, label: &str, state: St) -> Badge {
    Badge {
        label: label.to_owned(),
        value: state_word(lang, state).to_owned(),
        color: state_color(state),
    }
}

/// Rendered width in pixels of `s` in 11 px Verdana, near enough for a badge: shields.io
/// measures the font; a table of the common widths keeps the text inside its box.
fn text_width(s: &str) -> f64 {
    s.chars()
        .map(|c| match c {
            'i' | 'l' | 'j' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' => 3.5,
            'f' | 't' | 'r' | ' ' | '/' | '(' | ')' | '-' => 4.8,
            'm' | 'w' => 9.5,
            '%' => 12.0,
            'M' | 'W' => 10.5,
            'A'..='Z' => 7.6,
            '0'..='9' => 7.0,
            c if c.is_ascii() => 6.6,
            _ => 11.0, // CJK and the rest: a full em
        })
        .sum()
}

/// XML text and attribute escaping.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The badge as a flat shields-style SVG document.
pub fn svg(b: &Badge) -> String {
    let lw = (text_width(&b.label) + 10.0).round();
    let vw = (text_width(&b.value) + 10.0).round();
    let w = lw + vw;
    let (label, value) = (xml_escape(&b.label), xml_escape(&b.value));
    let (lx, vx) = (lw / 2.0, lw + vw / 2.0);
    format!(
        concat!(
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="20" role="img" aria-label="{label}: {value}">"##,
            r##"<title>{label}: {value}</title>"##,
            r##"<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" stop-opacity=".1"/><stop offset="1" stop-opacity=".1"/></linearGradient>"##,
            r##"<clipPath id="r"><rect width="{w}" height="20" rx="3" fill="#fff"/></clipPath>"##,
            r##"<g clip-path="url(#r)"><rect width="{lw}" height="20" fill="#555"/><rect x="{lw}" width="{vw}" height="20" fill="{color}"/><rect width="{w}" height="20" fill="url(#s)"/></g>"##,
            r##"<g fill="#fff" text-anchor="middle" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">"##,
            r##"<text x="{lx}" y="15" fill="#010101" fill-opacity=".3">{label}</text><text x="{lx}" y="14">{label}</text>"##,
            r##"<text x="{vx}" y="15" fill="#010101" fill-opacity=".3">{value}</text><text x="{vx}" y="14">{value}</text>"##,
            "</g></svg>"
        ),
        w = w,
        lw = lw,
        vw = vw,
        lx = lx,
        vx = vx,
        label = label,
        value = value,
        color = b.color,
    )
}

fn respond(b: &Badge) -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml; charset=utf-8"),
            (header::CACHE_CONTROL, CACHE_CONTROL),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // An SVG opened on its own is a document: it may run nothing and load nothing.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'",
            ),
        ],
        svg(b),
    )
        .into_response()
}

fn query(q: Result<Query<BadgeQuery>, QueryRejection>) -> Result<BadgeQuery, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("bad_query", e.body_text()))
}

/// `GET /badges/{route id}/uptime.svg` and `GET /badges/{route id}/state.svg`.
pub async fn route(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    q: Result<Query<BadgeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let lang = Lang::pick(q.lang.as_deref(), None);
    let (raw, file) = rest
        .rsplit_once('/')
        .ok_or_else(|| ApiError::NotFound(format!("no badge at /badges/{rest}")))?;
    let route = RouteId::parse(raw)
        .filter(|id| state.routes.iter().any(|r| &r.id == id))
        .ok_or_else(|| ApiError::NotFound(format!("unknown route {raw:?}")))?;
    match file {
        "uptime.svg" => {
            let window = match q.window.as_deref() {
                None => Window::Month,
                Some(w) => Window::parse(w.trim()).ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_query",
                        format!("window must be 24h, 7d or 30d, got {w:?}"),
                    )
                })?,
            };
            let figures = state.figures.get(&state.store, &state.clock).await?;
            let counts = match window {
                Window::Day => &figures.uptime_24h,
                Window::Week => &figures.uptime_7d,
                Window::Month => &figures.uptime_30d,
            };
            Ok(respond(&uptime_badge(lang, window, counts.get(&route))))
        }
        "state.svg" => {
            let s = state
                .health
                .borrow()
                .route(&route)
                .map_or(St::Unknown, |s| s.state);
            Ok(respond(&state_badge(lang, route.as_str(), s)))
        }
        other => Err(ApiError::NotFound(format!(
            "no badge {other:?}: uptime.svg or state.svg"
        ))),
    }
}

/// `GET /badges/model/{serves}/state.svg`.
pub async fn model(
    State(state): State<AppState>,
    Path(rest): Path<String>,
    q: Result<Query<BadgeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let lang = Lang::pick(q.lang.as_deref(), None);
    let serves = rest
        .strip_suffix("/state.svg")
        .ok_or_else(|| ApiError::NotFound(format!("no badge at /badges/model/{rest}")))?;
    let health = state.health.borrow().clone();
    let members: Vec<_> = state
        .routes
        .iter()
        .filter(|r| r.serves == serves)
        .map(|r| (r.tier, health.route(&r.id).map_or(St::Unknown, |s| s.state)))
        .collect();
    if members.is_empty() {
        return Err(ApiError::NotFound(format!("unknown model {serves:?}")));
    }
    Ok(respond(&state_badge(lang, serves, model_state(members))))
}

fn svg_response() -> Value {
    json!({
        "200": {"description": "A shields-style SVG badge (cacheable for 60 s)",
            "content": {"image/svg+xml": {"schema": {"type": "string"}}}},
        "400": {"description": "Bad query (window)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
        "404": {"description": "Unknown route, model or badge", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    })
}

fn lang_param() -> Value {
    json!({"name": "lang", "in": "query", "required": false,
        "schema": {"type": "string", "enum": ["en", "zh"]},
        "description": "Badge language (default English)"})
}

/// The route badges' OpenAPI operation.
pub fn route_doc() -> Value {
    json!({
        "summary": "A route's badge: uptime over a window or its state",
        "description": "`uptime.svg`: the synthetic success ratio over `window` (24h, 7d, 30d; default 30d). `state.svg`: the route's state. Route ids contain `/`; they are written as they are.",
        "operationId": "routeBadge", "tags": ["pages"],
        "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}, "description": "Route id (provider/region/model)"},
            {"name": "badge", "in": "path", "required": true, "schema": {"type": "string", "enum": ["uptime.svg", "state.svg"]}},
            {"name": "window", "in": "query", "required": false, "schema": {"type": "string", "enum": ["24h", "7d", "30d"]}, "description": "uptime.svg's window"},
            lang_param()
        ],
        "responses": svg_response()
    })
}

/// The model badge's OpenAPI operation.
pub fn model_doc() -> Value {
    json!({
        "summary": "A logical model's state badge",
        "description": "The best state among the model's primary routes (all its routes when it has no primary), as on the status page.",
        "operationId": "modelBadge", "tags": ["pages"],
        "parameters": [
            {"name": "serves", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The logical model (a route's `serves`)"},
            lang_param()
        ],
        "responses": svg_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_badges_show_the_ratio_and_colour_it() {
        let c = |count, successes| Counts {
            count,
            successes,
            good: successes,
        };
        let b = uptime_badge(Lang::En, Window::Day, Some(&c(4, 3)));
        assert_eq!(b.label, "uptime 24h");
        assert_eq!(b.value, "75.00%");
        assert_eq!(b.color, "#cf222e");
        assert_eq!(
            uptime_badge(Lang::En, Window::Month, Some(&c(1000, 999))).color,
            "#1a7f37"
        );
        assert_eq!(uptime_badge(Lang::Zh, Window::Week, None).value, "无数据");
    }

    #[test]
    fn the_svg_escapes_its_text_and_fits_it() {
        let b = state_badge(Lang::En, "a&b<c>", St::Critical);
        let s = svg(&b);
        assert!(s.contains("a&amp;b&lt;c&gt;: CRITICAL"));
        assert!(!s.contains("a&b"));
        assert!(text_width("CRITICAL") > text_width("OK"));
        assert_eq!(state_badge(Lang::Zh, "m", St::Normal).value, "正常");
    }
}
