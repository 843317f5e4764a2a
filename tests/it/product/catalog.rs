//! The model catalog against fake providers (real HTTP on 127.0.0.1:0) that serve the model
//! lists as the providers document them — OpenAI's `GET /v1/models` (`{"object": "list",
//! "data": [{"id", "object": "model", "created", "owned_by"}]}`, Bearer key) and Anthropic's
//! paginated `GET /v1/models` (`after_id`/`limit`, `has_more`/`first_id`/`last_id`,
//! `x-api-key` and `anthropic-version`) — next to a chat endpoint the probe client calls. The
//! catalog's passes are driven one by one on the injected clock; its events go through the
//! alert engine's grouping into a real outbox.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, TimeDelta, Utc};
use common::app::at;
use common::{json, openai, Script, Server};
use probeok::alert::{Lang, Severity};
use probeok::catalog::{Catalog, CatalogDriver};
use probeok::clock::{Clock, ManualClock};
use probeok::config::Config;
use probeok::health::HealthEvent;
use probeok::probe::{OutcomeKind, ProbeClient};
use probeok::route::Route;
use probeok::secret::Env;
use probeok::store::{Store, StoreOptions};
use serde::Deserialize;
use serde_json::{json as j, Value};
use tokio::sync::broadcast;

const KEY: &str = "sk-catalog-test";
const OLD: &str = "gpt-4-0613";

/// What the fake provider answers, changed by the test.
#[derive(Default)]
struct Provider {
    /// The model list.
    listed: Vec<String>,
    /// Models the chat endpoint serves (any other: 404 `model_not_found`).
    served: BTreeSet<String>,
    /// A broken list answer instead of the list.
    broken: Option<Broken>,
    /// Anthropic: the `after_id` of every page asked for.
    cursors: Vec<Option<String>>,
}

#[derive(Clone, Copy, Debug)]
enum Broken {
    Status500,
    NotJson,
    Oversized,
    NoModels,
}

type Shared = Arc<Mutex<Provider>>;

fn broken(b: Broken) -> Response {
    match b {
        Broken::Status500 => json(
            StatusCode::INTERNAL_SERVER_ERROR,
            openai::error("The server had an error", "server_error", None),
        ),
        Broken::NotJson => (StatusCode::OK, "<html>maintenance</html>").into_response(),
        // Valid JSON, 5 MiB of it: only the size bound refuses it.
        Broken::Oversized => (
            StatusCode::OK,
            format!(
                "{}{}",
                " ".repeat(5 << 20),
                j!({"object": "list", "data": [{"id": "x"}]})
            ),
        )
            .into_response(),
        Broken::NoModels => json(StatusCode::OK, j!({"object": "list", "data": []})),
    }
}

async fn openai_models(State(p): State<Shared>, headers: HeaderMap) -> Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {KEY}"))
    {
        return json(
            StatusCode::UNAUTHORIZED,
            openai::error(
                "Incorrect API key provided",
                "invalid_request_error",
                Some("invalid_api_key"),
            ),
        );
    }
    let p = p.lock().unwrap();
    if let Some(b) = p.broken {
        return broken(b);
    }
    let data: Vec<Value> = p
        .listed
        .iter()
        .map(|id| j!({"id": id, "object": "model", "created": 1_686_588_896, "owned_by": "openai"}))
        .collect();
    json(StatusCode::OK, j!({"object": "list", "data": data}))
}

async fn chat(State(p): State<Shared>, Json(body): Json<Value>) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if !p.lock().unwrap().served.contains(&model) {
        return json(
            StatusCode::NOT_FOUND,
            openai::error(
                &format!("The model `{model}` does not exist or you do not have access to it."),
                "invalid_request_error",
                Some("model_not_found"),
            ),
        );
    }
    Script::new()
        .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
        .sse()
}

#[derive(Deserialize)]
struct Page {
    limit: Option<usize>,
    after_id: Option<String>,
}

/// Anthropic's list, at most two models a page (fewer than `limit`: a page is at most `limit`).
async fn anthropic_models(
    State(p): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<Page>,
) -> Response {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if h("x-api-key").as_deref() != Some(KEY) {
        return json(
            StatusCode::UNAUTHORIZED,
            j!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
        );
    }
    if h("anthropic-version").is_none() {
        return json(
            StatusCode::BAD_REQUEST,
            j!({"type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version: header is required"}}),
        );
    }
    let mut p = p.lock().unwrap();
    p.cursors.push(q.after_id.clone());
    let start = match &q.after_id {
        Some(a) => p
            .listed
            .iter()
            .position(|m| m == a)
            .map_or(p.listed.len(), |i| i + 1),
        None => 0,
    };
    let size = q.limit.unwrap_or(20).clamp(1, 1000).min(2);
    let page: Vec<&String> = p.listed.iter().skip(start).take(size).collect();
    let data: Vec<Value> = page
        .iter()
        .map(|id| j!({"type": "model", "id": id, "display_name": id, "created_at": "2025-02-19T00:00:00Z"}))
        .collect();
    json(
        StatusCode::OK,
        j!({"data": data, "has_more": start + page.len() < p.listed.len(),
            "first_id": page.first(), "last_id": page.last()}),
    )
}

async fn fake(listed: &[&str]) -> (Server, Shared) {
    let p: Shared = Arc::new(Mutex::new(Provider {
        listed: listed.iter().map(|m| (*m).to_owned()).collect(),
        served: listed.iter().map(|m| (*m).to_owned()).collect(),
        ..Provider::default()
    }));
    let router = Router::new()
        .route("/v1/models", get(openai_models))
        .route("/v1/chat/completions", post(chat))
        .route("/anthropic/v1/models", get(anthropic_models))
        .with_state(p.clone());
    (common::spawn(router).await, p)
}

/// Two providers on one base URL and key (one provider region), the old model routed by both;
/// and an Anthropic region.
fn config(server: &Server, retires: &str) -> Config {
    let base = server.base_url();
    let src = format!(
        r#"
[[provider]]
id = "oai"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "us"
  base_url = "{base}/v1"
[[provider]]
id = "oai-batch"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "us"
  base_url = "{base}/v1/"
[[provider]]
id = "claude"
kind = "anthropic"
api_key_env = "FAKE_KEY"
  [[provider.region]]
  id = "default"
  base_url = "{base}/anthropic"

[[route]]
provider = "oai"
region = "us"
model = "gpt-4o"
serves = "chat"
[[route]]
provider = "oai"
region = "us"
model = "{OLD}"
serves = "legacy"
retires = "{retires}"
[[route]]
provider = "oai-batch"
region = "us"
model = "{OLD}"
serves = "legacy"
tier = "backup"
[[route]]
provider = "claude"
region = "default"
model = "claude-3-opus-20240229"
serves = "claude"
"#
    );
    let mut c = Config::parse(&src, "catalog.toml").unwrap().config;
    c.env = Env::given().with("FAKE_KEY", KEY);
    c
}

struct Rig {
    _dir: tempfile::TempDir,
    store: Store,
    clock: Arc<ManualClock>,
    config: Config,
    routes: Arc<Vec<Route>>,
    events: broadcast::Sender<HealthEvent>,
    rx: broadcast::Receiver<HealthEvent>,
    catalog: Catalog,
}

impl Rig {
    async fn new(server: &Server, now: DateTime<Utc>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("catalog.db"), StoreOptions::default()).unwrap();
        Self::on(dir, store, server, now)
    }

    fn on(dir: tempfile::TempDir, store: Store, server: &Server, now: DateTime<Utc>) -> Self {
        let clock = Arc::new(ManualClock::new(now));
        let config = config(server, "2026-06-30");
        let routes = Arc::new(config.routes());
        let events = broadcast::channel(64).0;
        let rx = events.subscribe();
        let catalog = catalog(&config, &routes, &store, &clock, &events);
        Self {
            _dir: dir,
            store,
            clock,
            config,
            routes,
            events,
            rx,
            catalog,
        }
    }

    /// One pass at `now` plus `hours`; the events it sent.
    async fn pass_after(&mut self, hours: i64) -> (probeok::catalog::Pass, Vec<HealthEvent>) {
        self.clock.advance(std::time::Duration::from_secs(
            u64::try_from(hours * 3600).unwrap(),
        ));
        let pass = self.catalog.pass().await;
        let mut got = Vec::new();
        while let Ok(e) = self.rx.try_recv() {
            got.push(e);
        }
        (pass, got)
    }

    async fn probe(&self, route: &str) -> Option<u16> {
        let route = self.routes.iter().find(|r| r.id.as_str() == route).unwrap();
        let client = ProbeClient::with_env(
            std::slice::from_ref(route),
            self.clock.clone(),
            &self.config.env,
        )
        .unwrap();
        let o = client.probe(route, OutcomeKind::Probe).await;
        o.http_status
    }

    fn models(&self) -> Vec<(String, probeok::store::catalog::ModelRow)> {
        self.store.reader().unwrap().catalog_models().unwrap()
    }
}

fn catalog(
    config: &Config,
    routes: &Arc<Vec<Route>>,
    store: &Store,
    clock: &Arc<ManualClock>,
    events: &broadcast::Sender<HealthEvent>,
) -> Catalog {
    Catalog::new(CatalogDriver {
        routes: routes.clone(),
        config: config.catalog.clone(),
        env: config.env.clone(),
        store: store.clone(),
        clock: clock.clone(),
        events: events.clone(),
    })
    .unwrap()
}

fn withdrawn(events: &[HealthEvent]) -> Vec<(String, String, Vec<String>, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            HealthEvent::ModelWithdrawn {
                region,
                model,
                routes,
                withdrawn,
                ..
            } => Some((
                region.clone(),
                model.clone(),
                routes.iter().map(ToString::to_string).collect(),
                *withdrawn,
            )),
            _ => None,
        })
        .collect()
}

fn t0() -> DateTime<Utc> {
    at("2026-03-02T09:00:00Z")
}

const LISTED: &[&str] = &[
    "gpt-4o",
    OLD,
    "o1",
    "claude-3-opus-20240229",
    "claude-3-5-haiku-20241022",
    "claude-sonnet-4-20250514",
];

/// The `model_withdrawn` rows of the alert outbox: (status, severity).
fn outbox_withdrawn(rig: &common::alerts::Rig) -> Vec<(String, String)> {
    rig.outbox()
        .into_iter()
        .filter_map(|r| {
            let m: Value = serde_json::from_str(&r.message).unwrap();
            (m["subject"]["type"] == "model_withdrawn").then(|| {
                (
                    m["status"].as_str().unwrap().to_owned(),
                    m["severity"].as_str().unwrap().to_owned(),
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn a_dropped_routed_model_is_one_critical_alert_after_two_answers_before_the_first_404() {
    let (server, p) = fake(LISTED).await;
    let mut r = Rig::new(&server, t0()).await;
    let hook = common::alerts::webhook(
        "hook",
        "127.0.0.1:9".parse().unwrap(),
        None,
        Severity::Warning,
    );
    let alerts = common::alerts::rig(vec![hook], r.clock.clone(), |_| {}).await;
    let push = |events: Vec<HealthEvent>| {
        let alerts = &alerts;
        async move { alerts.push(events).await }
    };

    let (pass, events) = r.pass_after(0).await;
    assert_eq!(pass.answered, vec!["oai/us", "claude/default"], "{pass:?}");
    assert!(withdrawn(&events).is_empty());
    assert_eq!(r.probe("oai/us/gpt-4-0613").await, Some(200));

    // The provider's list drops the old model; its endpoint still serves it.
    p.lock().unwrap().listed.retain(|m| m != OLD);
    let (_, events) = r.pass_after(1).await;
    assert!(
        withdrawn(&events).is_empty(),
        "one answer without it is not enough: {events:?}"
    );
    let row = r
        .models()
        .into_iter()
        .find(|(_, m)| m.model == OLD)
        .unwrap()
        .1;
    assert_eq!((row.missing, row.last_seen), (1, t0()));
    assert_eq!(r.probe("oai/us/gpt-4-0613").await, Some(200));

    let (_, events) = r.pass_after(1).await;
    let routes = vec![
        "oai/us/gpt-4-0613".to_owned(),
        "oai-batch/us/gpt-4-0613".to_owned(),
    ];
    assert_eq!(
        withdrawn(&events),
        vec![("oai/us".to_owned(), OLD.to_owned(), routes.clone(), true)]
    );
    push(events).await;
    assert_eq!(
        outbox_withdrawn(&alerts),
        vec![("firing".to_owned(), "critical".to_owned())]
    );
    // The alert is out, and the route still answers: it came before the first 404.
    assert_eq!(r.probe("oai/us/gpt-4-0613").await, Some(200));

    // More answers without it: still one alert.
    for _ in 0..3 {
        let (_, events) = r.pass_after(1).await;
        assert_eq!(withdrawn(&events).len(), 1);
        push(events).await;
    }
    assert_eq!(
        outbox_withdrawn(&alerts).len(),
        1,
        "{:?}",
        outbox_withdrawn(&alerts)
    );

    // Now the endpoint follows the list.
    p.lock().unwrap().served.remove(OLD);
    assert_eq!(r.probe("oai/us/gpt-4-0613").await, Some(404));

    // Listed again: resolved, once.
    p.lock().unwrap().listed.push(OLD.to_owned());
    let (_, events) = r.pass_after(1).await;
    assert_eq!(
        withdrawn(&events),
        vec![("oai/us".to_owned(), OLD.to_owned(), routes, false)]
    );
    push(events).await;
    assert_eq!(
        outbox_withdrawn(&alerts),
        vec![
            ("firing".to_owned(), "critical".to_owned()),
            ("resolved".to_owned(), "critical".to_owned())
        ]
    );
    let row = r
        .models()
        .into_iter()
        .find(|(_, m)| m.model == OLD)
        .unwrap()
        .1;
    assert_eq!((row.missing, row.first_seen), (0, t0()));
    let _ = &r.events;
}

#[tokio::test]
async fn anthropic_lists_are_read_page_by_page_and_a_dropped_model_alerts_after_two() {
    let (server, p) = fake(LISTED).await;
    let mut r = Rig::new(&server, t0()).await;
    // The OpenAI region lists what is routed; only the Anthropic one changes.
    let (pass, _) = r.pass_after(0).await;
    assert_eq!(pass.failed, Vec::<(String, String)>::new());
    // Six models two a page: three pages, each after the last id of the one before.
    assert_eq!(
        p.lock().unwrap().cursors,
        vec![
            None,
            Some(OLD.to_owned()),
            Some("claude-3-opus-20240229".to_owned())
        ]
    );
    let anthropic: BTreeSet<String> = r
        .models()
        .into_iter()
        .filter(|(k, _)| k.starts_with("anthropic "))
        .map(|(_, m)| m.model)
        .collect();
    assert_eq!(anthropic.len(), 6, "every page read: {anthropic:?}");

    p.lock()
        .unwrap()
        .listed
        .retain(|m| m != "claude-3-opus-20240229");
    let (_, events) = r.pass_after(1).await;
    assert!(withdrawn(&events).is_empty());
    let (_, events) = r.pass_after(1).await;
    assert_eq!(
        withdrawn(&events),
        vec![(
            "claude/default".to_owned(),
            "claude-3-opus-20240229".to_owned(),
            vec!["claude/default/claude-3-opus-20240229".to_owned()],
            true
        )]
    );
}

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_malformed_or_oversized_list_changes_nothing_and_is_a_warning() {
    let logs = Logs::default();
    let w = logs.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(sub);

    let (server, p) = fake(LISTED).await;
    let mut r = Rig::new(&server, t0()).await;
    r.pass_after(0).await;
    let before = r.models();
    for b in [
        Broken::Status500,
        Broken::NotJson,
        Broken::Oversized,
        Broken::NoModels,
    ] {
        p.lock().unwrap().broken = Some(b);
        logs.0.lock().unwrap().clear();
        // Three broken answers in a row: were any read as a list, the routed models would be
        // withdrawn twice over.
        for _ in 0..3 {
            let (pass, events) = r.pass_after(1).await;
            assert_eq!(pass.failed.len(), 1, "{b:?}: {pass:?}");
            assert_eq!(pass.failed[0].0, "oai/us");
            assert!(withdrawn(&events).is_empty(), "{b:?}: {events:?}");
        }
        let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
        assert!(
            text.contains("WARN") && text.contains("model list not read"),
            "{b:?}: {text}"
        );
        assert!(!text.contains(KEY), "the key is never logged");
        let oai = |rows: &[(String, probeok::store::catalog::ModelRow)]| {
            rows.iter()
                .filter(|(k, _)| k.starts_with("openai "))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(oai(&r.models()), oai(&before), "{b:?}: the catalog is kept");
    }
    // A good answer again: nothing was ever missing.
    p.lock().unwrap().broken = None;
    let (pass, events) = r.pass_after(1).await;
    assert!(pass.failed.is_empty() && withdrawn(&events).is_empty());
    assert!(r.models().iter().all(|(_, m)| m.missing == 0));
}

fn retiring(events: &[HealthEvent]) -> Vec<(u32, i64)> {
    events
        .iter()
        .filter_map(|e| match e {
            HealthEvent::ModelRetiring {
                route,
                days,
                days_left,
                ..
            } => {
                assert_eq!(route.as_str(), "oai/us/gpt-4-0613");
                Some((*days, *days_left))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn retires_warns_30_7_and_1_days_before_once_each_across_restarts() {
    let (server, _p) = fake(LISTED).await;
    // 31 days before 2026-06-30, early in the day.
    let mut r = Rig::new(&server, at("2026-05-30T01:00:00Z")).await;
    let mut got = Vec::new();
    // Every 4 hours for 32 days: six passes a day.
    for _ in 0..(32 * 6) {
        let (_, events) = r.pass_after(4).await;
        for e in retiring(&events) {
            got.push((r.clock.now().date_naive().to_string(), e));
        }
        if r.clock.now() >= at("2026-06-30T12:00:00Z") {
            break;
        }
    }
    assert_eq!(
        got,
        vec![
            ("2026-05-31".to_owned(), (30, 30)),
            ("2026-06-23".to_owned(), (7, 7)),
            ("2026-06-29".to_owned(), (1, 1)),
        ]
    );

    // A restart (a new leader on the same store) on the last day sends nothing again.
    let store = r.store.clone();
    let dir = tempfile::tempdir().unwrap();
    let mut again = Rig::on(dir, store, &server, at("2026-06-29T18:00:00Z"));
    let (_, events) = again.pass_after(1).await;
    assert!(retiring(&events).is_empty(), "{events:?}");
    // Through the alert engine: a warning naming the date.
    let hook = common::alerts::webhook(
        "hook",
        "127.0.0.1:9".parse().unwrap(),
        None,
        Severity::Warning,
    );
    let alerts = common::alerts::rig(vec![hook], r.clock.clone(), |_| {}).await;
    let e = HealthEvent::ModelRetiring {
        route: common::app::id("oai/us/gpt-4-0613"),
        retires: chrono::NaiveDate::from_ymd_opt(2026, 6, 30).unwrap(),
        days_left: 7,
        days: 7,
        at: r.clock.now(),
    };
    alerts.push(vec![e.clone()]).await;
    alerts.push(vec![e]).await;
    let rows = alerts.outbox();
    assert_eq!(rows.len(), 1, "one message per route, date and milestone");
    let m: Value = serde_json::from_str(&rows[0].message).unwrap();
    assert_eq!(m["severity"], "warning");
    let message: probeok::alert::Message = serde_json::from_value(m).unwrap();
    let ctx = probeok::alert::RenderCtx::from_config(&r.config);
    let en = probeok::alert::render::render(&message, Lang::En, &ctx).title;
    assert_eq!(
        en,
        "[WARNING] oai/us/gpt-4-0613: the model retires on 2026-06-30, in 7 day(s) (model_retiring)"
    );
    let zh = probeok::alert::render::render(&message, Lang::Zh, &ctx).title;
    assert!(zh.contains("2026-06-30") && zh.contains("7 天"), "{zh}");
}

#[tokio::test]
async fn the_catalog_endpoint_lists_models_per_provider_region_with_first_and_last_seen() {
    let (server, p) = fake(LISTED).await;
    let h = common::app::Harness::new(&[common::app::Spec::new("x", "y", "z")], t0()).await;
    let mut h = h;
    let config = config(&server, "2026-06-30");
    let routes = Arc::new(config.routes());
    h.state.routes = routes.clone();
    h.state.config = Arc::new(config.clone()).into();
    let catalog = catalog(&config, &routes, &h.store, &h.clock, &h.state.events);
    catalog.pass().await;
    p.lock().unwrap().listed.push("gpt-5".to_owned());
    h.clock
        .advance(std::time::Duration::from_secs(8 * 24 * 3600));
    catalog.pass().await;
    let served = h.serve().await;
    let body: Value = reqwest::get(served.url("/api/v1/catalog"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let regions: Vec<&str> = body["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["region"].as_str().unwrap())
        .collect();
    assert_eq!(regions, vec!["oai/us", "claude/default"]);
    let oai = &body["regions"][0];
    assert_eq!(oai["kind"], "openai");
    let model = |name: &str| {
        oai["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["model"] == name)
            .unwrap_or_else(|| panic!("{name} in {oai}"))
            .clone()
    };
    let first = t0();
    let later = first + TimeDelta::days(8);
    let old = model(OLD);
    assert_eq!(old["first_seen"], probeok::clock::rfc3339(first));
    assert_eq!(old["last_seen"], probeok::clock::rfc3339(later));
    assert_eq!(old["routed"], true);
    assert_eq!(old["listed"], true);
    assert_eq!(old["new"], false);
    assert_eq!(old["retires"], "2026-06-30");
    assert_eq!(
        old["routes"],
        j!(["oai/us/gpt-4-0613", "oai-batch/us/gpt-4-0613"])
    );
    let o1 = model("o1");
    assert_eq!(
        (o1["routed"].clone(), o1["routes"].clone()),
        (j!(false), j!([]))
    );
    let new = model("gpt-5");
    assert_eq!(new["new"], true);
    assert_eq!(new["first_seen"], probeok::clock::rfc3339(later));
    // No base URL, no key.
    let text = body.to_string();
    assert!(!text.contains("127.0.0.1") && !text.contains("FAKE_KEY") && !text.contains(KEY));
    h.shutdown.cancel();
}

/// The wiring: `serve`'s leader reads every provider region's list at the start of its term
/// (here the simulated providers' `GET /v1/models`), and `/api/v1/catalog` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reads_the_lists_at_start_and_the_api_shows_them() {
    use probeok::sim::{self, Scenario, SimConfig, SimRoute};
    use tokio_util::sync::CancellationToken;

    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim_addr = listener.local_addr().unwrap();
    let sim_config = SimConfig {
        routes: vec![SimRoute {
            provider: "sim".into(),
            region: "r1".into(),
            model: "m1".into(),
            scenario: Scenario::Healthy,
        }],
        time_scale: 1.0,
        seed: 7,
    };
    tokio::spawn(sim::serve(listener, sim_config, shutdown.child_token()));
    let src = format!(
        r#"
[storage]
path = "{db}"
[probe]
interval = "30s"
[[provider]]
id = "sim"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{base}"
[[route]]
provider = "sim"
region = "r1"
model = "m1"
serves = "chat"
"#,
        db = dir.path().join("serve.db").display(),
        base = sim::base_url(sim_addr, "sim", "r1"),
    );
    let config = Config::parse(&src, "test.toml").unwrap().config;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = probeok::app::start(
        config,
        listener,
        Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let url = format!("http://{}/api/v1/catalog", running.addr);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    let model = loop {
        let body: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        let m = body["regions"][0]["models"][0].clone();
        if m["first_seen"].is_string() {
            assert_eq!(body["regions"][0]["region"], "sim/r1");
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the list was not read within 15 s: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(model["model"], "m1");
    assert_eq!(model["listed"], true);
    assert_eq!(model["routes"], j!(["sim/r1/m1"]));
    shutdown.cancel();
    let stopped = tokio::time::timeout(
        probeok::app::DRAIN_TIMEOUT + std::time::Duration::from_secs(2),
        running.done,
    )
    .await
    .expect("shutdown drains within its bound")
    .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
}
