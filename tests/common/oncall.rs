//! Fake on-call services for the on-call channel tests: real axum servers on 127.0.0.1:0, one
//! per service, that check each request against the service's published API and answer as the
//! service does, including its rate-limit and error answers.
//!
//! - Slack incoming webhooks: <https://api.slack.com/messaging/webhooks>,
//!   <https://api.slack.com/reference/block-kit/blocks>, <https://api.slack.com/docs/rate-limits>
//!   — 200 `ok`; 400 `invalid_payload`; 404 `channel_not_found`; 429 `Retry-After`.
//! - Teams Workflows webhooks: <https://learn.microsoft.com/en-us/connectors/teams/?tabs=text1#microsoft-teams-webhook>,
//!   <https://adaptivecards.io/explorer/> — 202 with an empty body; 400 for a body that is not
//!   a message with an Adaptive Card attachment; 429 `Retry-After`.
//! - Telegram Bot API: <https://core.telegram.org/bots/api#sendmessage>,
//!   <https://core.telegram.org/bots/api#making-requests> — `{"ok":true,"result":{…}}`;
//!   `{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}`;
//!   `{"ok":false,"error_code":429,…,"parameters":{"retry_after":N}}`; 401 for a wrong token.
//! - PagerDuty Events API v2: <https://developer.pagerduty.com/docs/events-api-v2/trigger-events/>,
//!   <https://developer.pagerduty.com/docs/events-api-v2/overview/#response-codes--retry-logic>
//!   — 202 `{"status":"success","message":"Event processed","dedup_key":…}`; 400
//!   `{"status":"invalid event","message":"Event object is invalid","errors":[…]}`; 429.
//! - Opsgenie Alert API: <https://docs.opsgenie.com/docs/alert-api>,
//!   <https://docs.opsgenie.com/docs/authentication> — 202 `{"result":"Request will be
//!   processed","took":…,"requestId":…}`; 401 without a valid `GenieKey`; 422 with `errors`;
//!   429.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// The secrets the tests configure; none may appear in a log line or an answer.
pub const SLACK_URL: &str = "https://hooks.slack.com/services/T0001/B0001/SlackSecretXyz123";
pub const TEAMS_URL: &str = "https://prod-00.westeurope.logic.azure.com:443/workflows/0a1b/triggers/manual/paths/invoke?api-version=2016-06-01&sig=TeamsSigSecret456";
pub const TELEGRAM_TOKEN: &str = "123456:TelegramTokenSecret789";
pub const TELEGRAM_CHAT: &str = "-1001234567890";
pub const PD_ROUTING_KEY: &str = "R0ut1ngKeySecret0000000000000abc";
pub const OPSGENIE_KEY: &str = "0e1f2a3b-4c5d-6e7f-OpsgenieSecret";

pub fn secrets() -> [&'static str; 6] {
    [
        "SlackSecretXyz123",
        "TeamsSigSecret456",
        "TelegramTokenSecret789",
        PD_ROUTING_KEY,
        "OpsgenieSecret",
        "hooks.slack.com/services",
    ]
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Service {
    Slack,
    Teams,
    Telegram,
    PagerDuty,
    Opsgenie,
}

/// One request the fake accepted.
#[derive(Debug, Clone)]
pub struct Got {
    pub path: String,
    pub query: Option<String>,
    pub body: Value,
    /// When it arrived (wall clock), for the latency figures.
    pub at: std::time::Instant,
}

pub struct Fake {
    pub service: Service,
    /// Answer the service's rate-limit answer to this many more valid requests.
    pub throttle: AtomicU32,
    /// The wait the rate-limit answer asks for, in seconds.
    pub retry_after_s: AtomicU32,
    /// Answer the service's permanent refusal to this many more valid requests.
    pub refuse: AtomicU32,
    /// Requests refused for not following the service's documented shape (each with why).
    pub malformed: Mutex<Vec<String>>,
    pub got: Mutex<Vec<Got>>,
}

impl Fake {
    pub fn new(service: Service) -> Arc<Self> {
        Arc::new(Self {
            service,
            throttle: AtomicU32::new(0),
            retry_after_s: AtomicU32::new(30),
            refuse: AtomicU32::new(0),
            malformed: Mutex::new(Vec::new()),
            got: Mutex::new(Vec::new()),
        })
    }

    pub fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    pub fn malformed(&self) -> Vec<String> {
        self.malformed.lock().unwrap().clone()
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

pub async fn serve(f: Arc<Fake>) -> (SocketAddr, JoinHandle<()>) {
    let app = Router::new().fallback(any(receive)).with_state(f);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let h = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, h)
}

fn s(v: &Value) -> Option<&str> {
    v.as_str()
}

/// What is wrong with a request, by the service's documentation; `None` when it is valid.
fn check(
    service: Service,
    path: &str,
    query: Option<&str>,
    h: &HeaderMap,
    b: &Value,
) -> Option<String> {
    let json_ct = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_ct {
        return Some("content-type is not application/json".into());
    }
    match service {
        Service::Slack => {
            if path != "/services/T0001/B0001/SlackSecretXyz123" {
                return Some(format!("unknown webhook path {path}"));
            }
            if s(&b["text"]).is_none_or(str::is_empty) {
                return Some("no_text".into());
            }
            let blocks = b["blocks"].as_array()?;
            if blocks.is_empty() || blocks.len() > 50 {
                return Some("invalid_blocks: 1 to 50 blocks".into());
            }
            for bl in blocks {
                match s(&bl["type"]) {
                    Some("header") => {
                        if bl["text"]["type"] != "plain_text"
                            || s(&bl["text"]["text"]).is_none_or(|t| t.chars().count() > 150)
                        {
                            return Some("invalid_blocks: header".into());
                        }
                    }
                    Some("section") => {
                        if let Some(t) = s(&bl["text"]["text"]) {
                            if t.chars().count() > 3000 {
                                return Some("invalid_blocks: section text over 3000".into());
                            }
                        }
                        for f in bl["fields"].as_array().into_iter().flatten() {
                            if s(&f["text"]).is_none_or(|t| t.chars().count() > 2000) {
                                return Some("invalid_blocks: field".into());
                            }
                        }
                    }
                    Some("actions") | Some("context") | Some("divider") => {}
                    other => return Some(format!("invalid_blocks: type {other:?}")),
                }
            }
            None
        }
        Service::Teams => {
            if !path.starts_with("/workflows/0a1b/")
                || !query.is_some_and(|q| q.contains("sig=TeamsSigSecret456"))
            {
                return Some("unknown flow".into());
            }
            if b["type"] != "message" {
                return Some("type is not message".into());
            }
            let a = &b["attachments"][0];
            if a["contentType"] != "application/vnd.microsoft.card.adaptive" {
                return Some("attachment is not an Adaptive Card".into());
            }
            let c = &a["content"];
            if c["type"] != "AdaptiveCard" || s(&c["version"]).is_none() || !c["body"].is_array() {
                return Some("content is not an AdaptiveCard with a body".into());
            }
            if serde_json::to_vec(b).unwrap().len() > 28 * 1024 {
                return Some("card over 28 KB".into());
            }
            None
        }
        Service::Telegram => {
            if path != format!("/bot{TELEGRAM_TOKEN}/sendMessage") {
                return Some("401 Unauthorized".into());
            }
            if b["chat_id"] != TELEGRAM_CHAT {
                return Some("Bad Request: chat not found".into());
            }
            if b["parse_mode"] != "HTML" {
                return Some("parse_mode is not HTML".into());
            }
            let t = s(&b["text"]).unwrap_or("");
            if t.is_empty() || t.chars().count() > 4096 {
                return Some("Bad Request: message text is empty or too long".into());
            }
            // Only the tags Telegram supports, and every other `<`, `>`, `&` escaped.
            let mut rest = t;
            while let Some(i) = rest.find('<') {
                let after = &rest[i..];
                let end = after.find('>')?;
                let tag = &after[1..end];
                let name = tag
                    .trim_start_matches('/')
                    .split([' ', '='])
                    .next()
                    .unwrap_or("");
                if !["b", "i", "u", "s", "a", "code", "pre"].contains(&name) {
                    return Some(format!(
                        "Bad Request: can't parse entities: unsupported tag {name:?}"
                    ));
                }
                rest = &after[end + 1..];
            }
            for (i, _) in t.match_indices('&') {
                let ent = &t[i..];
                if !["&amp;", "&lt;", "&gt;", "&quot;"]
                    .iter()
                    .any(|e| ent.starts_with(e))
                {
                    return Some("Bad Request: can't parse entities: unescaped &".into());
                }
            }
            None
        }
        Service::PagerDuty => {
            if path != "/v2/enqueue" {
                return Some(format!("unknown path {path}"));
            }
            let mut errors = Vec::new();
            if b["routing_key"] != PD_ROUTING_KEY {
                errors.push("'routing_key' is invalid".to_owned());
            }
            if s(&b["dedup_key"]).is_none_or(|k| k.is_empty() || k.len() > 255) {
                errors.push("'dedup_key' is missing or longer than 255".to_owned());
            }
            match s(&b["event_action"]) {
                Some("trigger") => {
                    let p = &b["payload"];
                    if s(&p["summary"]).is_none_or(|x| x.is_empty() || x.chars().count() > 1024) {
                        errors.push("'payload.summary' is missing or longer than 1024".into());
                    }
                    if s(&p["source"]).is_none_or(str::is_empty) {
                        errors.push("'payload.source' is missing".into());
                    }
                    if !["critical", "error", "warning", "info"]
                        .contains(&s(&p["severity"]).unwrap_or(""))
                    {
                        errors.push("'payload.severity' is invalid".into());
                    }
                }
                Some("resolve") | Some("acknowledge") => {}
                _ => errors.push("'event_action' is invalid".into()),
            }
            (!errors.is_empty()).then(|| errors.join("|"))
        }
        Service::Opsgenie => {
            if h.get("authorization").and_then(|v| v.to_str().ok())
                != Some(&format!("GenieKey {OPSGENIE_KEY}"))
            {
                return Some("401".into());
            }
            if path == "/v2/alerts" {
                if s(&b["message"]).is_none_or(|m| m.is_empty() || m.chars().count() > 130) {
                    return Some("message: Message can not be empty or longer than 130.".into());
                }
                if s(&b["alias"]).is_none_or(|a| a.chars().count() > 512) {
                    return Some("alias: too long".into());
                }
                if !["P1", "P2", "P3", "P4", "P5"].contains(&s(&b["priority"]).unwrap_or("P3")) {
                    return Some("priority: invalid".into());
                }
                None
            } else if path.starts_with("/v2/alerts/") && path.ends_with("/close") {
                (query != Some("identifierType=alias"))
                    .then(|| "identifierType is not alias".into())
            } else {
                Some(format!("unknown path {path}"))
            }
        }
    }
}

async fn receive(
    State(f): State<Arc<Fake>>,
    uri: Uri,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        f.malformed.lock().unwrap().push("not JSON".into());
        return (StatusCode::BAD_REQUEST, "invalid_payload").into_response();
    };
    if let Some(why) = check(f.service, &path, query.as_deref(), &headers, &b) {
        f.malformed.lock().unwrap().push(why.clone());
        return malformed(f.service, &why);
    }
    let wait = f.retry_after_s.load(Ordering::SeqCst);
    if Fake::take(&f.throttle) {
        return throttled(f.service, wait);
    }
    if Fake::take(&f.refuse) {
        return refused(f.service);
    }
    let n = {
        let mut got = f.got.lock().unwrap();
        got.push(Got {
            path,
            query,
            body: b.clone(),
            at: std::time::Instant::now(),
        });
        got.len()
    };
    match f.service {
        Service::Slack => (StatusCode::OK, "ok").into_response(),
        Service::Teams => StatusCode::ACCEPTED.into_response(),
        Service::Telegram => axum::Json(json!({"ok": true, "result": {
            "message_id": n, "chat": {"id": -1001234567890i64, "type": "supergroup"},
            "date": 1_764_900_000, "text": "…"}}))
        .into_response(),
        Service::PagerDuty => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"status": "success", "message": "Event processed", "dedup_key": b["dedup_key"]})),
        )
            .into_response(),
        Service::Opsgenie => (
            StatusCode::ACCEPTED,
            axum::Json(json!({"result": "Request will be processed", "took": 0.107, "requestId": format!("43a29c5c-3dbf-4fa4-9c26-f4f71023e1{n:02}")})),
        )
            .into_response(),
    }
}

fn malformed(service: Service, why: &str) -> Response {
    match service {
        Service::Slack => (StatusCode::BAD_REQUEST, "invalid_payload").into_response(),
        Service::Teams => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"code": "TriggerInputSchemaMismatch", "message": why}})),
        )
            .into_response(),
        Service::Telegram if why.starts_with("401") => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})),
        )
            .into_response(),
        Service::Telegram => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"ok": false, "error_code": 400, "description": why})),
        )
            .into_response(),
        Service::PagerDuty => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"status": "invalid event", "message": "Event object is invalid", "errors": why.split('|').collect::<Vec<_>>()})),
        )
            .into_response(),
        Service::Opsgenie if why == "401" => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"message": "Key format is not valid!", "took": 0.0, "requestId": "x"})),
        )
            .into_response(),
        Service::Opsgenie => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"message": "Request body is not processable. Please check the errors.", "errors": {"message": why}, "took": 0.0, "requestId": "x"})),
        )
            .into_response(),
    }
}

fn throttled(service: Service, wait: u32) -> Response {
    let ra = [("retry-after", wait.to_string())];
    match service {
        Service::Slack => (StatusCode::TOO_MANY_REQUESTS, ra, "rate_limited").into_response(),
        Service::Teams => (
            StatusCode::TOO_MANY_REQUESTS,
            ra,
            axum::Json(json!({"error": {"code": "WorkflowTriggeredTooFrequently", "message": "Rate limit is exceeded."}})),
        )
            .into_response(),
        // Telegram says the wait in the body, not in a header.
        Service::Telegram => (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({"ok": false, "error_code": 429, "description": format!("Too Many Requests: retry after {wait}"), "parameters": {"retry_after": wait}})),
        )
            .into_response(),
        Service::PagerDuty => (
            StatusCode::TOO_MANY_REQUESTS,
            ra,
            axum::Json(json!({"status": "throttle event", "message": "Requests for this service are arriving too quickly. Please retry later."})),
        )
            .into_response(),
        Service::Opsgenie => (
            StatusCode::TOO_MANY_REQUESTS,
            ra,
            axum::Json(json!({"message": "You are making too many requests! To avoid errors, we recommend you limit requests.", "took": 0.0, "requestId": "x"})),
        )
            .into_response(),
    }
}

/// The service's refusal that no retry changes.
fn refused(service: Service) -> Response {
    match service {
        Service::Slack => (StatusCode::NOT_FOUND, "channel_not_found").into_response(),
        Service::Teams => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": {"code": "WorkflowNotFound", "message": "The workflow '0a1b' could not be found."}})),
        )
            .into_response(),
        Service::Telegram => (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"ok": false, "error_code": 403, "description": "Forbidden: bot was kicked from the supergroup chat"})),
        )
            .into_response(),
        Service::PagerDuty => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"status": "invalid event", "message": "Event object is invalid", "errors": ["Length of 'routing_key' is incorrect (should be 32 characters)"]})),
        )
            .into_response(),
        Service::Opsgenie => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(json!({"message": "Request body is not processable. Please check the errors.", "errors": {"message": "Message can not be empty."}, "took": 0.0, "requestId": "x"})),
        )
            .into_response(),
    }
}

/// A PagerDuty channel (warning and up, English) built as the service builds it, sending to
/// `addr` (a [`Fake`], or an address that refuses) with [`PD_ROUTING_KEY`].
pub fn pagerduty_channel(addr: SocketAddr) -> Arc<dyn probeok::alert::Notifier> {
    let mut c = probeok::config::Config::default();
    c.alert.pagerduty.push(probeok::config::PagerDutyConfig {
        routing_key_env: "PAGERDUTY_ROUTING_KEY".into(),
        api_base: Some(format!("http://{addr}")),
        options: probeok::config::ChannelOptions {
            min_severity: probeok::alert::Severity::Warning,
            lang: probeok::alert::Lang::En,
            ..probeok::config::ChannelOptions::default()
        },
    });
    let vars: std::collections::HashMap<String, String> = [(
        "PAGERDUTY_ROUTING_KEY".to_owned(),
        PD_ROUTING_KEY.to_owned(),
    )]
    .into();
    probeok::alert::build_channels(&c, &vars, super::alerts::http())
        .unwrap()
        .remove(0)
}
