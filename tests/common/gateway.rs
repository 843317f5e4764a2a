//! A fake new-api / one-api admin channel API: a real axum server on 127.0.0.1:0 that answers
//! and refuses as the gateways' own Go code does. Read from their sources:
//!
//! - routes: one-api `router/api.go` and new-api `router/api-router.go` —
//!   `channelRoute := apiRouter.Group("/channel"); channelRoute.Use(middleware.AdminAuth())`,
//!   `GET /:id` → `controller.GetChannel`, `PUT /` → `controller.UpdateChannel`;
//! - the envelope: `controller/channel.go` answers `{"success": …, "message": …, "data": …}`,
//!   business errors with HTTP 200 and `success: false`;
//! - admin auth: `middleware/auth.go` `authHelper` — no `Authorization`: HTTP 401
//!   "无权进行此操作，未登录且未提供 access token"; a token that matches no user
//!   (`model.ValidateAccessToken` strips "Bearer " and looks the rest up): HTTP 200,
//!   `success: false`, "无权进行此操作，access token 无效". new-api then wants `New-Api-User`:
//!   missing → 401 "无权进行此操作，未提供 New-Api-User", not a number → 401 "…New-Api-User
//!   格式错误", another user than the token's → 401 "…New-Api-User 与登录用户不匹配";
//!   one-api has no such header;
//! - `model/channel.go`: `GetChannelById(id, false)` omits `key`; `status` 1 enabled,
//!   2 manually disabled, 3 auto-disabled; `weight` is `*uint`; `UpdateChannel` binds the
//!   JSON into `model.Channel` (`ShouldBindJSON`: a wrong type, e.g. a negative weight into a
//!   uint, is refused with `success: false` and Go's unmarshal message) and
//!   `channel.Update()` runs GORM's `Updates(channel)`, which skips zero values — so the key
//!   left out of the GET stays as it was when the channel is PUT back; an id of 0 has no
//!   `WHERE` ("WHERE conditions required");
//! - the channel cache: new-api's `UpdateChannel` calls `model.InitChannelCache()` right after
//!   the update (the new weight serves at once); one-api re-reads its cache every
//!   `SYNC_FREQUENCY` seconds (`model.SyncChannelCache`, when the memory cache is on).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    NewApi,
    OneApi,
}

/// One PUT the fake accepted: the channel id and the `status`/`weight` it then had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub channel: i64,
    pub status: i64,
    pub weight: i64,
}

#[derive(Debug)]
pub struct Inner {
    pub flavor: Flavor,
    /// The admin's access token and user id.
    pub token: String,
    pub user_id: i64,
    pub channels: BTreeMap<i64, Map<String, Value>>,
    pub writes: Vec<Write>,
    /// Every refusal's message, in order.
    pub refusals: Vec<String>,
    /// Every `Authorization` and `New-Api-User` header received (to check what is sent).
    pub seen_auth: Vec<(String, Option<String>)>,
}

#[derive(Clone)]
pub struct FakeGateway {
    pub addr: SocketAddr,
    pub inner: Arc<Mutex<Inner>>,
    _task: Arc<tokio::task::JoinHandle<()>>,
}

/// A channel as the gateway stores it (with its key, which GET never shows).
pub fn channel(id: i64, name: &str, status: i64, weight: i64) -> Map<String, Value> {
    let Value::Object(m) = json!({
        "id": id, "type": 1, "key": format!("sk-upstream-{id}"), "status": status,
        "name": name, "weight": weight, "created_time": 1_767_225_600, "test_time": 0,
        "response_time": 0, "base_url": "https://dashscope.aliyuncs.com/compatible-mode",
        "other": "", "balance": 0.0, "balance_updated_time": 0, "models": "qwen-max,qwen-plus",
        "group": "default", "used_quota": 0, "model_mapping": "", "priority": 0, "config": "",
    }) else {
        unreachable!()
    };
    m
}

impl FakeGateway {
    pub async fn start(
        flavor: Flavor,
        token: &str,
        user_id: i64,
        chans: Vec<Map<String, Value>>,
    ) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            flavor,
            token: token.to_owned(),
            user_id,
            channels: chans
                .into_iter()
                .map(|c| (c["id"].as_i64().unwrap(), c))
                .collect(),
            writes: Vec::new(),
            refusals: Vec::new(),
            seen_auth: Vec::new(),
        }));
        let app = Router::new()
            .route("/api/channel/{id}", get(get_channel))
            .route("/api/channel/", put(update_channel))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            inner,
            _task: Arc::new(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn status_weight(&self, id: i64) -> (i64, i64) {
        let g = self.inner.lock().unwrap();
        let c = &g.channels[&id];
        (
            c["status"].as_i64().unwrap(),
            c["weight"].as_i64().unwrap_or(0),
        )
    }

    /// An operator's edit in the gateway's UI.
    pub fn set(&self, id: i64, status: i64, weight: i64) {
        let mut g = self.inner.lock().unwrap();
        let c = g.channels.get_mut(&id).unwrap();
        c.insert("status".into(), status.into());
        c.insert("weight".into(), weight.into());
    }

    pub fn writes(&self, id: i64) -> Vec<Write> {
        let g = self.inner.lock().unwrap();
        g.writes
            .iter()
            .filter(|w| w.channel == id)
            .cloned()
            .collect()
    }

    pub fn refusals(&self) -> Vec<String> {
        self.inner.lock().unwrap().refusals.clone()
    }
}

fn envelope(status: StatusCode, success: bool, message: &str, data: Option<Value>) -> Response {
    let mut body = json!({"success": success, "message": message});
    if let Some(d) = data {
        body["data"] = d;
    }
    (status, Json(body)).into_response()
}

/// `middleware/auth.go` `authHelper` for an admin route (the token's user is an admin): the
/// refusal, or `None` to go on.
fn admin_auth(g: &mut Inner, headers: &HeaderMap) -> Option<Response> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let user = headers
        .get("new-api-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    g.seen_auth.push((auth.clone(), user.clone()));
    let mut refuse = |status: StatusCode, msg: &str| {
        g.refusals.push(msg.to_owned());
        Some(envelope(status, false, msg, None))
    };
    if auth.is_empty() {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "无权进行此操作，未登录且未提供 access token",
        );
    }
    // model.ValidateAccessToken: strings.Replace(token, "Bearer ", "", 1), then a lookup.
    if auth.replacen("Bearer ", "", 1) != g.token {
        return refuse(StatusCode::OK, "无权进行此操作，access token 无效");
    }
    if g.flavor == Flavor::NewApi {
        let Some(user) = user else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "无权进行此操作，未提供 New-Api-User",
            );
        };
        let Ok(id) = user.parse::<i64>() else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "无权进行此操作，New-Api-User 格式错误",
            );
        };
        if id != g.user_id {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "无权进行此操作，New-Api-User 与登录用户不匹配",
            );
        }
    }
    None
}

/// `controller.GetChannel`: the channel without its key.
async fn get_channel(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let mut g = inner.lock().unwrap();
    if let Some(r) = admin_auth(&mut g, &headers) {
        return r;
    }
    let Ok(id) = id.parse::<i64>() else {
        let msg = format!("strconv.Atoi: parsing {id:?}: invalid syntax");
        return envelope(StatusCode::OK, false, &msg, None);
    };
    match g.channels.get(&id) {
        Some(c) => {
            let mut shown = c.clone();
            shown.remove("key");
            envelope(StatusCode::OK, true, "", Some(Value::Object(shown)))
        }
        None => envelope(StatusCode::OK, false, "record not found", None),
    }
}

/// Go's `encoding/json` into `model.Channel`: the fields' types, as `ShouldBindJSON` checks
/// them (a message like Go's for the first wrong one).
fn bind(body: &Value) -> Result<&Map<String, Value>, String> {
    let Some(m) = body.as_object() else {
        return Err("json: cannot unmarshal into Go value of type model.Channel".into());
    };
    const INTS: &[&str] = &["id", "type", "status", "response_time"];
    const UINTS: &[&str] = &["weight"];
    const STRINGS: &[&str] = &["key", "name", "models", "group", "config"];
    for (k, v) in m {
        let ok = if INTS.contains(&k.as_str()) {
            v.is_null() || v.as_i64().is_some()
        } else if UINTS.contains(&k.as_str()) {
            v.is_null() || v.as_u64().is_some()
        } else if STRINGS.contains(&k.as_str()) {
            v.is_null() || v.is_string()
        } else {
            true
        };
        if !ok {
            return Err(format!(
                "json: cannot unmarshal {v} into Go struct field Channel.{k}"
            ));
        }
    }
    Ok(m)
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// `controller.UpdateChannel` → `channel.Update()` (GORM `Updates`: non-zero fields only).
async fn update_channel(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let mut g = inner.lock().unwrap();
    if let Some(r) = admin_auth(&mut g, &headers) {
        return r;
    }
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return envelope(StatusCode::OK, false, &e.to_string(), None),
    };
    let fields = match bind(&parsed) {
        Ok(m) => m.clone(),
        Err(msg) => return envelope(StatusCode::OK, false, &msg, None),
    };
    let id = fields.get("id").and_then(Value::as_i64).unwrap_or(0);
    if id == 0 {
        return envelope(StatusCode::OK, false, "WHERE conditions required", None);
    }
    let flavor = g.flavor;
    let Some(stored) = g.channels.get_mut(&id) else {
        // new-api reads the original channel first; one-api's Updates touches no row.
        return match flavor {
            Flavor::NewApi => envelope(StatusCode::OK, false, "record not found", None),
            Flavor::OneApi => envelope(StatusCode::OK, true, "", Some(Value::Object(fields))),
        };
    };
    // Pointer fields (`*uint`, `*string`, `*int64`) are written when present, zero or not.
    const POINTERS: &[&str] = &[
        "weight",
        "base_url",
        "model_mapping",
        "priority",
        "system_prompt",
    ];
    for (k, v) in &fields {
        if !is_zero(v) || (POINTERS.contains(&k.as_str()) && !v.is_null()) {
            stored.insert(k.clone(), v.clone());
        }
    }
    let write = Write {
        channel: id,
        status: stored["status"].as_i64().unwrap_or(0),
        weight: stored["weight"].as_i64().unwrap_or(0),
    };
    let mut shown = stored.clone();
    shown.remove("key");
    g.writes.push(write);
    envelope(StatusCode::OK, true, "", Some(Value::Object(shown)))
}
