//! Status page subscriptions (`[subscriptions]`): the public form's endpoints and the admin API.
//!
//! - `POST /subscribe` (a plain form: `kind`, `target`, `scope`, `lang`) → an HTML page;
//!   the subscription waits for its confirmation (the mailed link, or the webhook echoing the
//!   code), which is the proof of consent, so the form needs no session or CSRF token.
//! - `GET /subscribe/confirm?t=…` → confirms an email subscription (the link is valid 24 h).
//! - `GET /subscribe/unsubscribe?t=…` → a page with one button; `POST` (RFC 8058 one-click,
//!   body `List-Unsubscribe=One-Click`) → unsubscribed.
//! - `GET /api/v1/admin/subscribers`, `DELETE /api/v1/admin/subscribers?id=N` (admin token).
//!
//! Addresses are shown only to the admin API; pages echo none and log lines name ids.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::{Form, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::openapi::admin_responses;
use super::{ApiError, AppState};
use crate::alert::subscribers::{self, deliver, Keys, Scope};
use crate::store::subscribers::{NewSubscriber, Subscribed, SubscriberOp};

/// Largest form body accepted (bytes).
pub const MAX_FORM: usize = 4 * 1024;

#[derive(Debug, Deserialize)]
pub struct SubscribeForm {
    pub kind: String,
    pub target: String,
    #[serde(default)]
    pub scope: String,
    #[serde(default)]
    pub lang: String,
}

#[derive(Debug, Deserialize)]
pub struct Token {
    #[serde(default)]
    pub t: String,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <link rel=\"stylesheet\" href=\"/static/style.css\"></head><body><main>\
         <h1>{t}</h1>{body}<p><a href=\"/\">←</a></p></main></body></html>",
        t = esc(title)
    );
    (status, Html(html)).into_response()
}

fn refused(zh: bool, en: &str, zh_text: &str) -> Response {
    let status = StatusCode::TOO_MANY_REQUESTS;
    if zh {
        page(status, "订阅未受理", &format!("<p>{}</p>", esc(zh_text)))
    } else {
        page(
            status,
            "Subscription refused",
            &format!("<p>{}</p>", esc(en)),
        )
    }
}

fn off() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Subscriptions are off",
        "<p>This status page offers no subscriptions.</p>",
    )
}

/// `POST /subscribe`.
pub async fn subscribe(
    State(state): State<AppState>,
    ext: Extensions,
    Form(f): Form<SubscribeForm>,
) -> Response {
    let config = state.config.current();
    let c = &config.subscriptions;
    if !c.enabled {
        return off();
    }
    let zh = f.lang == "zh";
    let bad = |m: String| {
        page(
            StatusCode::BAD_REQUEST,
            if zh {
                "订阅未受理"
            } else {
                "Subscription refused"
            },
            &format!("<p>{}</p>", esc(&m)),
        )
    };
    let Some(scope) = Scope::parse(f.scope.trim()) else {
        return bad("unknown scope: all, model:<name> or provider:<id>".into());
    };
    let known = match &scope {
        Scope::All => true,
        Scope::Model(m) => state.routes.iter().any(|r| &r.serves == m),
        Scope::Provider(p) => state.routes.iter().any(|r| &r.provider == p),
    };
    if !known {
        return bad("no such logical model or provider on this page".into());
    }
    let target = f.target.trim().to_owned();
    let kind = match f.kind.as_str() {
        "email" if c.email => {
            if let Err(e) = subscribers::check_address(&target) {
                return bad(e.to_string());
            }
            "email"
        }
        "webhook" if c.webhook => {
            if let Err(e) = subscribers::check_webhook(&target, c.allow_private_webhooks).await {
                return bad(e.to_string());
            }
            "webhook"
        }
        _ => return bad("this kind of subscription is not offered".into()),
    };
    let ip = ext
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_string())
        .unwrap_or_else(|| "unknown".into());
    let digest: String = Sha256::digest(target.to_lowercase().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let secret = subscribers::random_secret();
    let new = NewSubscriber {
        kind: kind.into(),
        target,
        scope: scope.as_string(),
        lang: if zh { "zh" } else { "en" }.into(),
        secret: secret.clone(),
        now: state.clock.now(),
        ip_key: format!("ip:{ip}"),
        ip_limit: subscribers::PER_IP_PER_HOUR,
        to_key: format!("to:{digest}"),
        to_limit: subscribers::PER_ADDRESS_PER_DAY,
        max_subscribers: c.max_subscribers,
        confirm_body: serde_json::to_string(&subscribers::Notice::Confirm).unwrap_or_default(),
    };
    let answer = match state.store.writer().subscribe(new).await {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "subscription not stored");
            return page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again later",
                "<p>The subscription could not be stored.</p>",
            );
        }
    };
    match answer {
        Subscribed::TooManyFromIp => refused(zh,
            "Too many subscription attempts from your address in the last hour (at most 10); try again later.",
            "您的地址在过去一小时内订阅尝试过多（最多 10 次），请稍后再试。"),
        Subscribed::TooManyForTarget => refused(zh,
            "This address was sent 3 confirmation requests in the last 24 hours, the most we send; try again tomorrow.",
            "该地址在过去 24 小时内已收到 3 封确认请求（上限），请明天再试。"),
        Subscribed::Full => refused(zh,
            "This status page has as many subscribers as it takes; none can be added now.",
            "本状态页订阅人数已满，暂时无法添加。"),
        Subscribed::Already | Subscribed::Pending(_) if kind == "email" => {
            tracing::info!("email subscription requested; confirmation queued unless already confirmed");
            if zh {
                page(StatusCode::OK, "请查收确认邮件", "<p>如果该地址可以订阅，我们已发送一封确认邮件。点击邮件中的链接（24 小时内有效）后订阅才生效。</p>")
            } else {
                page(StatusCode::OK, "Check your mail", "<p>If the address can be subscribed, a confirmation mail is on its way. Nothing more is sent until you follow its link (valid for 24 hours).</p>")
            }
        }
        Subscribed::Already => bad("this webhook is subscribed already".into()),
        Subscribed::Pending(id) => {
            tracing::info!(subscriber = id, "webhook subscription requested; confirmation event queued");
            page(StatusCode::OK, if zh { "Webhook 订阅待确认" } else { "Webhook subscription pending" }, &format!(
                "<p>{}</p><p><code id=\"secret\">{}</code></p><p>{}</p>",
                if zh { "签名密钥（只显示这一次，请立即保存）：" } else { "Your signing secret (shown this once only: keep it now):" },
                esc(&secret),
                if zh { "我们会向该 URL 发送 subscription.confirm 事件，请在 2xx 响应体中原样返回其中的 code。每个事件带有 X-Probeok-Signature: sha256=<HMAC-SHA256(secret, body)>。" }
                else { "A subscription.confirm event goes to the URL: answer it 2xx with its code in the body. Every event carries X-Probeok-Signature: sha256=<hex HMAC-SHA256 of the raw body under this secret>." }
            ))
        }
    }
}

async fn check_token(state: &AppState, token: &str, confirm: bool) -> Result<i64, Response> {
    let bad = || {
        page(
            StatusCode::BAD_REQUEST,
            "Invalid link",
            &format!("<p>{}</p>", subscribers::SubscribeError::BadLink),
        )
    };
    let id = Keys::token_id(token).ok_or_else(bad)?;
    let keys = deliver::keys(&state.store).await.map_err(|_| bad())?;
    let store = state.store.clone();
    let sub = tokio::task::spawn_blocking(move || store.reader()?.subscriber(id))
        .await
        .ok()
        .and_then(|r| r.ok())
        .flatten()
        .ok_or_else(bad)?;
    if token.len() > 200 || !keys.verify(token, confirm, id, &sub.secret, state.clock.now()) {
        return Err(bad());
    }
    Ok(id)
}

/// `GET /subscribe/confirm`.
pub async fn confirm(State(state): State<AppState>, Query(t): Query<Token>) -> Response {
    if !state.config.current().subscriptions.enabled {
        return off();
    }
    let id = match check_token(&state, &t.t, true).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    let at = state.clock.now();
    if let Err(e) = state
        .store
        .writer()
        .subscriber(SubscriberOp::Confirm { id, at })
        .await
    {
        tracing::error!(error = %e, "confirmation not stored");
        return page(StatusCode::SERVICE_UNAVAILABLE, "Try again later", "");
    }
    tracing::info!(subscriber = id, "email subscription confirmed");
    page(StatusCode::OK, "Subscribed / 订阅成功", "<p>You will hear of incidents and their end. Every mail has an unsubscribe link. / 故障发生与恢复时您会收到邮件，每封邮件都附有退订链接。</p>")
}

/// `GET /subscribe/unsubscribe`: one button (a GET never unsubscribes: mail scanners follow links).
pub async fn unsubscribe_page(Query(t): Query<Token>) -> Response {
    page(
        StatusCode::OK,
        "Unsubscribe / 退订",
        &format!(
            "<form method=\"post\" action=\"/subscribe/unsubscribe?t={}\">\
         <input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\
         <button type=\"submit\">Unsubscribe / 退订</button></form>",
            esc(
                &percent_encoding::utf8_percent_encode(&t.t, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            )
        ),
    )
}

/// `POST /subscribe/unsubscribe` (RFC 8058 one-click).
pub async fn unsubscribe(State(state): State<AppState>, Query(t): Query<Token>) -> Response {
    let id = match check_token(&state, &t.t, false).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    if let Err(e) = state
        .store
        .writer()
        .subscriber(SubscriberOp::Delete { id })
        .await
    {
        tracing::error!(error = %e, "unsubscription not stored");
        return page(StatusCode::SERVICE_UNAVAILABLE, "Try again later", "");
    }
    tracing::info!(subscriber = id, "unsubscribed");
    page(
        StatusCode::OK,
        "Unsubscribed / 已退订",
        "<p>Nothing more will be sent. / 不会再发送任何通知。</p>",
    )
}

#[derive(Debug, Deserialize)]
pub struct Id {
    pub id: Option<i64>,
}

/// `GET /api/v1/admin/subscribers`.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    super::check_admin(&state.config.current(), &headers)?;
    let store = state.store.clone();
    let subs = tokio::task::spawn_blocking(move || store.reader()?.subscribers())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    let rows: Vec<Value> = subs
        .iter()
        .map(|s| {
            json!({
                "id": s.id, "kind": s.kind, "target": s.target, "scope": s.scope, "lang": s.lang,
                "created_at": crate::clock::rfc3339(s.created_at),
                "confirmed_at": s.confirmed_at.map(crate::clock::rfc3339),
                "failing_since": s.failing_since.map(crate::clock::rfc3339),
            })
        })
        .collect();
    Ok(Json(json!({ "subscribers": rows })))
}

/// `DELETE /api/v1/admin/subscribers?id=N`.
pub async fn remove(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<Id>,
) -> Result<Response, ApiError> {
    super::check_admin(&state.config.current(), &headers)?;
    let id =
        q.id.ok_or_else(|| ApiError::bad_request("missing_id", "give the subscriber as ?id=N"))?;
    let n = state
        .store
        .writer()
        .subscriber(SubscriberOp::Delete { id })
        .await?;
    if n == 0 {
        return Err(ApiError::NotFound(format!("no subscriber {id}")));
    }
    tracing::info!(subscriber = id, "subscriber removed by an admin");
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub fn list_doc() -> Value {
    let mut responses = admin_responses(json!({}));
    responses["200"] = json!({"description": "every subscriber: id, kind, target (address or URL), scope, lang, created_at, confirmed_at, failing_since"});
    json!({"summary": "Status page subscribers (admin)", "responses": responses})
}

pub fn remove_doc() -> Value {
    let mut responses = admin_responses(json!({}));
    responses["204"] = json!({"description": "removed"});
    responses["404"] = json!({"description": "no such subscriber"});
    json!({"summary": "Remove a status page subscriber (admin)",
        "parameters": [{"name": "id", "in": "query", "required": true, "schema": {"type": "integer"}}],
        "responses": responses})
}

pub fn subscribe_doc() -> Value {
    json!({"summary": "Subscribe to public incidents by email or webhook (HTML form)",
        "responses": {"200": {"description": "HTML: check your mail, or the webhook's secret (shown once)"},
                      "400": {"description": "HTML: what is wrong with the form"},
                      "429": {"description": "HTML: an abuse limit was reached"}}})
}

pub fn confirm_doc() -> Value {
    json!({"summary": "Confirm an email subscription (signed link, valid 24 h)",
        "responses": {"200": {"description": "HTML: subscribed"}, "400": {"description": "HTML: invalid or expired link"}}})
}

pub fn unsubscribe_page_doc() -> Value {
    json!({"summary": "The unsubscribe page (one button)", "responses": {"200": {"description": "HTML"}}})
}

pub fn unsubscribe_doc() -> Value {
    json!({"summary": "Unsubscribe (RFC 8058 one-click POST)",
        "responses": {"200": {"description": "HTML: unsubscribed"}, "400": {"description": "HTML: invalid link"}}})
}

/// The subscribe form of the status page (`scope` empty) or of a route page (its model and
/// provider offered first). Plain HTML, no JavaScript; empty when subscriptions are off.
pub fn form(
    c: &crate::config::SubscriptionsConfig,
    zh: bool,
    routes: &[crate::route::Route],
    route: Option<&crate::route::Route>,
) -> String {
    if !c.enabled {
        return String::new();
    }
    let mut scopes: Vec<(String, String)> = Vec::new();
    if let Some(r) = route {
        scopes.push((
            format!("model:{}", r.serves),
            format!("{} {}", if zh { "模型" } else { "model" }, r.serves),
        ));
        scopes.push((
            format!("provider:{}", r.provider),
            format!("{} {}", if zh { "服务商" } else { "provider" }, r.provider),
        ));
    }
    scopes.push((
        "*".into(),
        if zh {
            "全部线路".into()
        } else {
            "all routes".into()
        },
    ));
    if route.is_none() {
        let mut models: Vec<&str> = routes.iter().map(|r| r.serves.as_str()).collect();
        models.sort();
        models.dedup();
        let mut providers: Vec<&str> = routes.iter().map(|r| r.provider.as_str()).collect();
        providers.sort();
        providers.dedup();
        for m in models {
            scopes.push((
                format!("model:{m}"),
                format!("{} {m}", if zh { "模型" } else { "model" }),
            ));
        }
        for p in providers {
            scopes.push((
                format!("provider:{p}"),
                format!("{} {p}", if zh { "服务商" } else { "provider" }),
            ));
        }
    }
    let options: String = scopes
        .iter()
        .map(|(v, l)| format!("<option value=\"{}\">{}</option>", esc(v), esc(l)))
        .collect();
    let mut kinds = String::new();
    if c.email {
        kinds.push_str(&format!(
            "<option value=\"email\">{}</option>",
            if zh { "邮件" } else { "email" }
        ));
    }
    if c.webhook {
        kinds.push_str("<option value=\"webhook\">webhook</option>");
    }
    format!(
        "<section class=\"box\" id=\"subscribe\"><h2>{h}</h2>\
         <form method=\"post\" action=\"/subscribe\">\
         <label for=\"sub-kind\">{kl}</label> <select id=\"sub-kind\" name=\"kind\">{kinds}</select> \
         <label for=\"sub-target\">{tl}</label> <input id=\"sub-target\" name=\"target\" required maxlength=\"{max}\" placeholder=\"you@example.com / https://…\"> \
         <label for=\"sub-scope\">{sl}</label> <select id=\"sub-scope\" name=\"scope\">{options}</select>\
         <input type=\"hidden\" name=\"lang\" value=\"{lang}\"> <button type=\"submit\">{b}</button></form>\
         <p class=\"meta\">{note}</p></section>",
        h = if zh { "订阅故障通知" } else { "Subscribe to incidents" },
        kl = if zh { "方式" } else { "By" },
        tl = if zh { "地址" } else { "Address" },
        sl = if zh { "范围" } else { "For" },
        b = if zh { "订阅" } else { "Subscribe" },
        lang = if zh { "zh" } else { "en" },
        max = subscribers::MAX_TARGET,
        note = if zh { "确认后才会发送通知；每封邮件都可一键退订。" } else { "Nothing is sent until you confirm; every mail has a one-click unsubscribe link." },
    )
}
