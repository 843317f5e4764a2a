//! `GET /incidents.atom?lang=en|zh`: the incidents of the last 90 days as an Atom 1.0 feed
//! (RFC 4287), newest first, at most [`MAX_ENTRIES`].
//!
//! One entry per incident, updated as it goes: its title says the route, the peak state and
//! whether it is resolved; its text says when it opened, when it reached its peak, and when it
//! was resolved (or for how long it has been running). `published` is the opening, `updated`
//! the latest of those, so a feed reader shows an incident again when it resolves. Links are
//! absolute, from `[server] public_url`. The incidents come from the same source as
//! `/api/v1/incidents`, read fresh (a bounded, indexed query) so a resolution is in the next poll.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration as TimeDelta, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{IncidentQuery, IncidentSource};
use super::badges::xml_escape;
use super::i18n::{self, Lang};
use super::pages::{route_href, when, DAYS};
use super::{ApiError, AppState};
use crate::clock::rfc3339;
use crate::state::Incident;
use crate::store::Store;

/// Most entries in the feed.
pub const MAX_ENTRIES: usize = 50;

#[derive(Debug, Default, Deserialize)]
pub struct FeedQuery {
    lang: Option<String>,
}

/// When the incident reached its peak: the first transition into the peak state.
fn peak_at(i: &Incident) -> DateTime<Utc> {
    i.transitions
        .iter()
        .find(|t| t.to == i.peak)
        .map_or(i.opened_at, |t| t.at)
}

/// The last moment the incident changed: resolved, else its latest transition.
fn updated(i: &Incident) -> DateTime<Utc> {
    i.closed_at.unwrap_or_else(|| {
        i.transitions
            .iter()
            .map(|t| t.at)
            .max()
            .unwrap_or(i.opened_at)
            .max(i.opened_at)
    })
}

/// An entry's title.
pub fn title(lang: Lang, i: &Incident) -> String {
    let peak = i18n::state(lang, i.peak);
    match (lang, i.closed_at.is_some()) {
        (Lang::En, true) => format!("{}: {peak}, resolved", i.route.as_str()),
        (Lang::En, false) => format!("{}: {peak}, ongoing", i.route.as_str()),
        (Lang::Zh, true) => format!("{}：{peak}，已恢复", i.route.as_str()),
        (Lang::Zh, false) => format!("{}：{peak}，进行中", i.route.as_str()),
    }
}

/// An entry's text: opened, peak, resolved.
pub fn summary(lang: Lang, i: &Incident, now: DateTime<Utc>) -> String {
    let peak = i18n::state(lang, i.peak);
    let mode = i.failure_mode.map(|m| i18n::mode(lang, m));
    let lasted = i18n::duration(
        lang,
        (i.closed_at.unwrap_or(now) - i.opened_at).num_seconds(),
    );
    let (opened, peaked) = (when(i.opened_at), when(peak_at(i)));
    match lang {
        Lang::En => {
            let mut s = format!("Opened {opened}. Peak {peak} at {peaked}");
            if let Some(m) = mode {
                s += &format!(" ({m})");
            }
            match i.closed_at {
                Some(c) => s += &format!(". Resolved {} after {lasted}.", when(c)),
                None => s += &format!(". Ongoing for {lasted}."),
            }
            s
        }
        Lang::Zh => {
            let mut s = format!("{opened} 开始。{peaked} 达到最严重状态 {peak}");
            if let Some(m) = mode {
                s += &format!("（{m}）");
            }
            match i.closed_at {
                Some(c) => s += &format!("。{} 恢复，持续 {lasted}。", when(c)),
                None => s += &format!("。仍在进行，已持续 {lasted}。"),
            }
            s
        }
    }
}

/// The feed document.
pub fn feed(
    lang: Lang,
    site_title: &str,
    public_url: &str,
    incidents: &[Incident],
    now: DateTime<Utc>,
) -> String {
    let base = public_url.trim_end_matches('/');
    let e = |s: &str| xml_escape(s);
    let heading = match lang {
        Lang::En => format!("{site_title}: incidents"),
        Lang::Zh => format!("{site_title}：事故"),
    };
    let newest = incidents.iter().map(updated).max().unwrap_or(now);
    let code = lang.code();
    let mut out = format!(
        concat!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n",
            "<feed xmlns=\"http://www.w3.org/2005/Atom\" xml:lang=\"{lang}\">\n",
            "<id>{base}/incidents.atom</id>\n<title>{title}</title>\n<updated>{updated}</updated>\n",
            "<link rel=\"self\" type=\"application/atom+xml\" href=\"{base}/incidents.atom?lang={code}\"/>\n",
            "<link rel=\"alternate\" type=\"text/html\" href=\"{base}/incidents?lang={code}\"/>\n",
            "<author><name>{title}</name></author>\n<generator>probeok</generator>\n"
        ),
        lang = lang.html_lang(),
        base = e(base),
        title = e(&heading),
        updated = rfc3339(newest),
        code = code,
    );
    for i in incidents {
        out += &format!(
            concat!(
                "<entry>\n<id>{base}/incidents.atom#{id}</id>\n<title>{title}</title>\n",
                "<published>{published}</published>\n<updated>{updated}</updated>\n",
                "<link rel=\"alternate\" type=\"text/html\" href=\"{base}{href}\"/>\n",
                "<category term=\"{peak}\"/>\n<summary type=\"text\">{summary}</summary>\n</entry>\n"
            ),
            base = e(base),
            id = e(&utf8_fragment(&i.id)),
            title = e(&title(lang, i)),
            published = rfc3339(i.opened_at),
            updated = rfc3339(updated(i)),
            href = e(&route_href(&i.route, lang)),
            peak = i.peak.as_str(),
            summary = e(&summary(lang, i, now)),
        );
    }
    out += "</feed>\n";
    out
}

/// An incident id (`route@opened_at`) as an IRI fragment: `/`, `:` and `@` are allowed there,
/// anything else outside the unreserved set is percent-encoded.
fn utf8_fragment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'.'
            | b'_'
            | b'~'
            | b'/'
            | b':'
            | b'@' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET /incidents.atom`.
pub async fn handler(
    State(state): State<AppState>,
    q: Result<Query<FeedQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    let lang = Lang::pick(q.lang.as_deref(), accept);
    let now = state.clock.now();
    let config = state.config.current();
    let health = state.health.borrow().clone();
    let query = IncidentQuery {
        limit: MAX_ENTRIES,
        route: None,
        since: Some(now - TimeDelta::days(DAYS)),
    };
    let (source, store): (Arc<dyn IncidentSource>, Store) =
        (state.incidents.clone(), state.store.clone());
    let list =
        tokio::task::spawn_blocking(move || source.incidents(&store, &health, &query)).await??;
    let body = feed(
        lang,
        &config.server.title,
        &config.server.public_url,
        &list,
        now,
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/atom+xml; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=60"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::VARY, "Accept-Language"),
        ],
        body,
    )
        .into_response())
}

/// The feed's OpenAPI operation.
pub fn doc() -> Value {
    json!({
        "summary": "Incidents as an Atom 1.0 feed",
        "description": "The incidents of the last 90 days, newest first (at most 50): one entry per incident with its opening, peak and resolution, linking to the route page. `lang` (or Accept-Language) picks English or Chinese.",
        "operationId": "incidentsFeed", "tags": ["pages"],
        "parameters": [{"name": "lang", "in": "query", "required": false,
            "schema": {"type": "string", "enum": ["en", "zh"]}}],
        "responses": {
            "200": {"description": "Atom feed", "content": {"application/atom+xml": {"schema": {"type": "string"}}}},
            "400": {"description": "Bad query", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        }
    })
}
