//! A fake provider status page: a real axum server on 127.0.0.1:0 answering as an Atlassian
//! Statuspage page's public v2 API does (`GET /api/v2/summary.json`: `page`, `components`,
//! the unresolved `incidents` with their `incident_updates` and `components`,
//! `scheduled_maintenances`, `status`; `GET /api/v2/incidents.json`: `page` and the last 50
//! incidents, resolved or not, newest first) and as its incident history feed does
//! (`GET /history.atom`: one Atom entry per incident, its updates newest first in the
//! content, each led by `<strong>Status</strong> -`). Answers carry an `ETag`; a request
//! whose `If-None-Match` names it gets 304. A fault mode makes every answer a 500, a body
//! that is not JSON, a 50 MB body, or no answer at all.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    Http500,
    NotJson,
    /// 50 MB of JSON-looking bytes.
    Huge,
    /// Accepts the request and never answers.
    Silent,
}

#[derive(Debug, Clone)]
pub struct FakeIncident {
    pub id: String,
    pub name: String,
    /// investigating, identified, monitoring, resolved, postmortem.
    pub status: String,
    pub impact: String,
    pub created_at: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    /// Component names.
    pub components: Vec<String>,
}

impl FakeIncident {
    pub fn new(id: &str, name: &str, created_at: DateTime<Utc>, components: &[&str]) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            status: "investigating".into(),
            impact: "major".into(),
            created_at,
            started_at: created_at,
            resolved_at: None,
            components: components.iter().map(|c| (*c).to_owned()).collect(),
        }
    }
}

#[derive(Debug)]
pub struct Page {
    /// (name, status): operational, degraded_performance, partial_outage, major_outage,
    /// under_maintenance.
    pub components: Vec<(String, String)>,
    /// Newest first.
    pub incidents: Vec<FakeIncident>,
    pub fault: Fault,
    /// Requests answered with a body, and with 304.
    pub full: u64,
    pub not_modified: u64,
}

#[derive(Clone)]
pub struct FakeStatusPage {
    pub addr: SocketAddr,
    pub page: Arc<Mutex<Page>>,
}

impl FakeStatusPage {
    pub async fn start(components: &[(&str, &str)]) -> Self {
        let page = Arc::new(Mutex::new(Page {
            components: components
                .iter()
                .map(|(n, s)| ((*n).to_owned(), (*s).to_owned()))
                .collect(),
            incidents: Vec::new(),
            fault: Fault::None,
            full: 0,
            not_modified: 0,
        }));
        let app = Router::new()
            .route("/api/v2/summary.json", get(summary))
            .route("/api/v2/incidents.json", get(incidents))
            .route("/history.atom", get(atom))
            .with_state(page.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, page }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, f: impl FnOnce(&mut Page)) {
        f(&mut self.page.lock().unwrap());
    }

    pub fn counts(&self) -> (u64, u64) {
        let p = self.page.lock().unwrap();
        (p.full, p.not_modified)
    }
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn page_json(addr: &str) -> Value {
    json!({"id": "y2j98763l56x", "name": "Example AI", "url": addr,
           "time_zone": "Etc/UTC", "updated_at": "2026-12-01T00:00:00.000Z"})
}

fn component_json(i: usize, name: &str, status: &str) -> Value {
    json!({"id": format!("cmp{i}"), "name": name, "status": status,
           "created_at": "2024-01-01T00:00:00.000Z", "updated_at": "2026-12-01T00:00:00.000Z",
           "position": i + 1, "description": null, "showcase": true, "start_date": null,
           "group_id": null, "page_id": "y2j98763l56x", "group": false,
           "only_show_if_degraded": false})
}

fn incident_json(p: &Page, i: &FakeIncident) -> Value {
    let comps: Vec<Value> = p
        .components
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| i.components.contains(n))
        .map(|(k, (n, s))| component_json(k, n, s))
        .collect();
    let affected: Vec<Value> = i
        .components
        .iter()
        .map(|c| json!({"code": c, "name": c, "old_status": "operational", "new_status": "major_outage"}))
        .collect();
    let mut updates = vec![json!({
        "id": format!("{}-u1", i.id), "status": "investigating",
        "body": "We are currently investigating this issue.", "incident_id": i.id,
        "created_at": ts(i.created_at), "updated_at": ts(i.created_at), "display_at": ts(i.created_at),
        "affected_components": affected, "deliver_notifications": true,
        "custom_tweet": null, "tweet_id": null})];
    if let Some(r) = i.resolved_at {
        updates.insert(
            0,
            json!({
            "id": format!("{}-u2", i.id), "status": "resolved",
            "body": "This incident has been resolved.", "incident_id": i.id,
            "created_at": ts(r), "updated_at": ts(r), "display_at": ts(r),
            "affected_components": null, "deliver_notifications": true,
            "custom_tweet": null, "tweet_id": null}),
        );
    }
    json!({
        "id": i.id, "name": i.name, "status": i.status,
        "created_at": ts(i.created_at), "updated_at": ts(i.resolved_at.unwrap_or(i.created_at)),
        "monitoring_at": null, "resolved_at": i.resolved_at.map(ts), "impact": i.impact,
        "shortlink": format!("https://stspg.io/{}", i.id), "started_at": ts(i.started_at),
        "page_id": "y2j98763l56x", "incident_updates": updates, "components": comps})
}

/// The fault, or the body with its ETag (and 304 when the client has it).
fn answer(p: &mut Page, headers: &HeaderMap, content_type: &str, body: String) -> Response {
    match p.fault {
        Fault::None => {}
        Fault::Http500 => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
        Fault::NotJson => {
            return (
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body>We'll be right back</body></html>",
            )
                .into_response()
        }
        Fault::Huge => {
            let mut big = String::with_capacity(50 << 20);
            big.push_str("{\"components\": [");
            while big.len() < 50 << 20 {
                big.push_str("{\"name\": \"filler\", \"status\": \"operational\"},");
            }
            return ([(header::CONTENT_TYPE, "application/json")], big).into_response();
        }
        Fault::Silent => unreachable!("answered by the handlers"),
    }
    let etag = format!("\"{:016x}\"", fxhash(&body));
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        p.not_modified += 1;
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    p.full += 1;
    (
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::ETAG, etag),
        ],
        body,
    )
        .into_response()
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

async fn silent_if_asked(page: &Arc<Mutex<Page>>) {
    if page.lock().unwrap().fault == Fault::Silent {
        std::future::pending::<()>().await;
    }
}

async fn summary(State(page): State<Arc<Mutex<Page>>>, headers: HeaderMap) -> Response {
    silent_if_asked(&page).await;
    let mut p = page.lock().unwrap();
    let open: Vec<Value> = p
        .incidents
        .iter()
        .filter(|i| i.resolved_at.is_none())
        .map(|i| incident_json(&p, i))
        .collect();
    let worst = p.components.iter().any(|(_, s)| s != "operational");
    let body = json!({
        "page": page_json("https://status.example.com"),
        "components": p.components.iter().enumerate()
            .map(|(i, (n, s))| component_json(i, n, s)).collect::<Vec<_>>(),
        "incidents": open,
        "scheduled_maintenances": [],
        "status": if worst {
            json!({"indicator": "major", "description": "Partial System Outage"})
        } else {
            json!({"indicator": "none", "description": "All Systems Operational"})
        }
    })
    .to_string();
    answer(&mut p, &headers, "application/json", body)
}

async fn incidents(State(page): State<Arc<Mutex<Page>>>, headers: HeaderMap) -> Response {
    silent_if_asked(&page).await;
    let mut p = page.lock().unwrap();
    let list: Vec<Value> = p
        .incidents
        .iter()
        .take(50)
        .map(|i| incident_json(&p, i))
        .collect();
    let body =
        json!({"page": page_json("https://status.example.com"), "incidents": list}).to_string();
    answer(&mut p, &headers, "application/json", body)
}

async fn atom(State(page): State<Arc<Mutex<Page>>>, headers: HeaderMap) -> Response {
    silent_if_asked(&page).await;
    let mut p = page.lock().unwrap();
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut entries = String::new();
    for i in &p.incidents {
        let mut content = String::new();
        if let Some(r) = i.resolved_at {
            content.push_str(&format!(
                "<p><small>{}</small><br><strong>Resolved</strong> - This incident has been resolved.</p>",
                ts(r)
            ));
        }
        content.push_str(&format!(
            "<p><small>{}</small><br><strong>Investigating</strong> - We are investigating elevated errors on {}.</p>",
            ts(i.created_at),
            i.components.join(", ")
        ));
        entries.push_str(&format!(
            "<entry><id>tag:status.example.com,2005:Incident/{id}</id><published>{pub_}</published>\
             <updated>{upd}</updated><link rel=\"alternate\" type=\"text/html\" href=\"https://status.example.com/incidents/{id}\"/>\
             <title>{title}</title><content type=\"html\">{content}</content></entry>",
            id = i.id,
            pub_ = ts(i.created_at),
            upd = ts(i.resolved_at.unwrap_or(i.created_at)),
            title = esc(&i.name),
            content = esc(&content),
        ));
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><feed xml:lang=\"en-US\" xmlns=\"http://www.w3.org/2005/Atom\">\
         <id>tag:status.example.com,2005:/history</id><link rel=\"alternate\" type=\"text/html\" href=\"https://status.example.com\"/>\
         <link rel=\"self\" type=\"application/atom+xml\" href=\"https://status.example.com/history.atom\"/>\
         <title>Example AI Status - Incident History</title><updated>2026-12-01T00:00:00Z</updated>{entries}</feed>"
    );
    answer(&mut p, &headers, "application/atom+xml", body)
}
