//! Client spend limits and the fleet's hourly extra-cost budget through real proxies:
//!
//! - one in-process proxy on a SQLite store: 60 concurrent requests of a client whose limit
//!   covers about 20 — spent never passes the limit, the others get 429
//!   `spend_limit_reached` with `Retry-After` and never reach the upstream; the admin API, the
//!   metric and metering say who spent what;
//! - three `probeok proxy` processes on one PostgreSQL database (`PROBEOK_TEST_PG_URL`): the
//!   same 60 requests spread over them stop at the one limit, and backup traffic through them
//!   stops at one shared hourly budget (counted at the fake upstreams);
//! - the latency a reservation and its settlement add per request, printed (`--nocapture`),
//!   never asserted.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::{fake, json, openai, Captured, Reply, Requests, Server};
use probeok::config::{
    ClientConfig, Config, Per, ProviderConfig, RegionConfig, RouteConfig, SpendLimit,
};
use probeok::proxy::{Proxy, ProxyOptions, WeightsView};
use probeok::route::{Price, Tier};
use probeok::store::{RequestFilter, Store, StoreLocation, StoreOptions};
use serde_json::{json as j, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-team-a-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789";
/// Prices per million tokens: a token of input costs 1000 micro-units, of output 2000.
const IN_PRICE: f64 = 1000.0;
const OUT_PRICE: f64 = 2000.0;
/// The fake upstream's usage (`openai::body`): 12 prompt tokens, 3 completion tokens.
const ACTUAL_MICROS: i64 = 12 * 1000 + 3 * 2000;
const MAX_TOKENS: u64 = 10;

fn body() -> Value {
    j!({"model": "chat", "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "hello there"}]})
}

/// The proxy's estimate of [`body`] in micro-units at `in_price`/`out_price`.
fn estimate(in_price: f64, out_price: f64) -> i64 {
    let prompt = probeok::proxy::select::estimate_prompt_tokens(&body());
    (prompt as f64 * in_price + MAX_TOKENS as f64 * out_price).ceil() as i64
}

async fn slow_ok(delay: Duration) -> (Server, Requests) {
    fake("/chat/completions", move |_: &Captured| Reply {
        delay,
        ..Reply::now(json(StatusCode::OK, openai::body("hi", "stop", Some(3))))
    })
    .await
}

fn price(input: f64, output: f64) -> Price {
    Price {
        input_per_mtok: input,
        output_per_mtok: output,
        currency: "CNY".into(),
    }
}

fn in_process_config(up: &Server, limit: Option<f64>) -> Config {
    let mut config = Config::default();
    config.providers.push(ProviderConfig {
        id: "p0".into(),
        api_key_env: Some("SPEND_TEST_UP_KEY".into()),
        regions: vec![RegionConfig {
            id: "r".into(),
            base_url: up.base_url(),
        }],
        ..ProviderConfig::default()
    });
    config.routes.push(RouteConfig {
        provider: "p0".into(),
        region: "r".into(),
        model: "up-0".into(),
        serves: "chat".into(),
        tier: Tier::Primary,
        weight: 100,
        price: Some(price(IN_PRICE, OUT_PRICE)),
        ..RouteConfig::default()
    });
    config
        .env
        .set("SPEND_TEST_UP_KEY", "sk-upstream-0123456789");
    config.env.set("TEAM_A_KEY", KEY);
    config.env.set("SPEND_ADMIN", ADMIN);
    config.server.admin_token_env = "SPEND_ADMIN".into();
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(20);
    config.proxy.clients.push(ClientConfig {
        id: "team-a".into(),
        key_env: "TEAM_A_KEY".into(),
        limit: limit.map(|amount| SpendLimit {
            amount,
            per: Per::Day,
        }),
    });
    config
}

struct Px {
    base: String,
    shutdown: CancellationToken,
    proxy: Proxy,
    store: Store,
    _passive: mpsc::Receiver<probeok::probe::ProbeOutcome>,
}

impl Drop for Px {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(config: &Config, location: &StoreLocation) -> Px {
    let loc = location.clone();
    let store = tokio::task::spawn_blocking(move || Store::open_at(&loc, StoreOptions::default()))
        .await
        .unwrap()
        .unwrap();
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(4096);
    let proxy = Proxy::with_options(
        config,
        wrx,
        ptx,
        ProxyOptions {
            store: Some(store.clone()),
            ..ProxyOptions::default()
        },
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(probeok::proxy::serve(
        listener,
        proxy.clone(),
        shutdown.clone(),
    ));
    Px {
        base,
        shutdown,
        proxy,
        store,
        _passive: prx,
    }
}

/// Sends [`body`] as `team-a`: the status, `Retry-After` and the JSON body.
async fn send(http: &reqwest::Client, base: &str) -> (u16, Option<u64>, Value) {
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let after = (r.headers().get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, after, r.json().await.unwrap_or(Value::Null))
}

async fn clients(http: &reqwest::Client, base: &str) -> Value {
    let r = http
        .get(format!("{base}/api/v1/admin/clients"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["clients"][0].clone()
}

/// The admin view once every booking is settled (settlements land off the request path).
async fn settled(http: &reqwest::Client, base: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = clients(http, base).await;
        if c["reserved"].as_f64() == Some(0.0) || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn micros(v: &Value) -> i64 {
    (v.as_f64().unwrap() * 1e6).round() as i64
}

/// 60 requests at once from one client whose limit covers about 20 of their estimates.
async fn sixty_at_once(http: &reqwest::Client, bases: &[String]) -> Vec<(u16, Option<u64>, Value)> {
    let mut tasks = Vec::new();
    for i in 0..60 {
        let (http, base) = (http.clone(), bases[i % bases.len()].clone());
        tasks.push(tokio::spawn(async move { send(&http, &base).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// What every run of [`sixty_at_once`] must show: nothing passes the limit, every refusal
/// is a 429 `spend_limit_reached` with `Retry-After` within the day, and only admitted
/// requests reached the upstream.
fn check_limit_held(
    results: &[(u16, Option<u64>, Value)],
    calls: usize,
    limit_micros: i64,
) -> usize {
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!(ok + refused.len(), 60, "{results:?}");
    assert!(ok >= 20, "the limit covers 20 estimates: {ok} admitted");
    assert!(!refused.is_empty(), "60 requests cannot all fit");
    assert_eq!(calls, ok, "refused requests never reach the upstream");
    assert!(ok as i64 * ACTUAL_MICROS <= limit_micros);
    for (_, after, body) in refused {
        assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
        assert_eq!(body["error"]["code"], "spend_limit_reached", "{body}");
        let after = after.expect("Retry-After");
        assert!((1..=86_400).contains(&after), "{after}");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_proxy_on_sqlite_holds_a_client_to_its_limit() {
    let (up, reqs) = slow_ok(Duration::from_millis(800)).await;
    let limit_micros = 20 * estimate(IN_PRICE, OUT_PRICE) + estimate(IN_PRICE, OUT_PRICE) / 2;
    let limit = limit_micros as f64 / 1e6;
    let config = in_process_config(&up, Some(limit));
    let dir = tempfile::tempdir().unwrap();
    let px = start(&config, &StoreLocation::Sqlite(dir.path().join("p.db"))).await;
    let http = reqwest::Client::new();

    let results = sixty_at_once(&http, std::slice::from_ref(&px.base)).await;
    let ok = check_limit_held(&results, reqs.all().len(), limit_micros);

    let c = settled(&http, &px.base).await;
    assert_eq!(c["id"], "team-a");
    assert_eq!(c["period"], "day");
    assert_eq!(micros(&c["limit"]), limit_micros);
    assert_eq!(micros(&c["spent"]), ok as i64 * ACTUAL_MICROS, "{c}");
    assert_eq!(micros(&c["reserved"]), 0);
    assert_eq!(
        micros(&c["remaining"]),
        limit_micros - ok as i64 * ACTUAL_MICROS
    );
    assert_eq!(
        px.proxy.client_spend(),
        vec![("team-a".to_owned(), ok as f64 * ACTUAL_MICROS as f64 / 1e6)]
    );

    // Wrong admin token; a wrong client key.
    let r = http
        .get(format!("{}/api/v1/admin/clients", px.base))
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(format!("{}/v1/chat/completions", px.base))
        .bearer_auth("sk-someone-else")
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Metering names the client, admitted or refused.
    let store = px.store.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = store.clone();
        let rows = tokio::task::spawn_blocking(move || {
            s.reader().unwrap().proxy_requests(&RequestFilter {
                limit: 100,
                ..Default::default()
            })
        })
        .await
        .unwrap()
        .unwrap();
        if rows.len() == 60 {
            assert!(rows.iter().all(|r| r.client.as_deref() == Some("team-a")));
            assert_eq!(rows.iter().filter(|r| r.status == 429).count(), 60 - ok);
            assert!(rows
                .iter()
                .filter(|r| r.status == 429)
                .all(|r| r.outcome == "rejected" && r.attempts.is_empty()));
            break;
        }
        assert!(Instant::now() < deadline, "metered {} of 60", rows.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_without_a_limit_and_anonymous_keys_still_pass() {
    let (up, reqs) = slow_ok(Duration::ZERO).await;
    let mut config = in_process_config(&up, None);
    config.env.set("PROBEOK_CLIENT_KEYS", "sk-anonymous-1");
    let dir = tempfile::tempdir().unwrap();
    let px = start(&config, &StoreLocation::Sqlite(dir.path().join("p.db"))).await;
    let http = reqwest::Client::new();
    for _ in 0..3 {
        assert_eq!(send(&http, &px.base).await.0, 200);
    }
    let r = http
        .post(format!("{}/v1/chat/completions", px.base))
        .bearer_auth("sk-anonymous-1")
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(reqs.all().len(), 4);
    let c = clients(&http, &px.base).await;
    assert_eq!(c["id"], "team-a");
    assert!(c["limit"].is_null() && c["remaining"].is_null(), "{c}");
}

// ---- Three `probeok proxy` processes on one PostgreSQL database ----

use common::free_port;

struct Fleet {
    children: Vec<Child>,
    bases: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `[[route]]` lines for `(provider id, base url, tier, weight, input, output price)`.
fn routes_toml(routes: &[(&str, String, &str, u32, f64, f64)]) -> String {
    let mut s = String::new();
    for (id, base, tier, weight, input, output) in routes {
        s.push_str(&format!(
            r#"
[[provider]]
id = "{id}"
kind = "openai"
api_key_env = "SPEND_FLEET_UP_KEY"
  [[provider.region]]
  id = "r"
  base_url = "{base}"

[[route]]
provider = "{id}"
region = "r"
model = "m-{id}"
serves = "chat"
tier = "{tier}"
weight = {weight}
price = {{ input_per_mtok = {input:?}, output_per_mtok = {output:?}, currency = "CNY" }}
"#
        ));
    }
    s
}

fn write_config(dir: &Path, port: u16, extra: &str, routes: &str) -> PathBuf {
    let path = dir.join(format!("proxy-{port}.toml"));
    let body = format!(
        r#"
[server]
listen = "127.0.0.1:{server}"
admin_token_env = "SPEND_ADMIN"

[storage]
path = "{db}"
url_env = "SPEND_FLEET_DB"

[proxy]
enabled = true
listen = "127.0.0.1:{port}"
total_timeout = "20s"
max_retry_wait = "0s"
{extra}
{routes}
"#,
        server = free_port(),
        db = dir.join("unused.db").display(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

async fn fleet(url: &str, extra: &str, routes: &str) -> Fleet {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let mut fleet = Fleet {
        children: Vec::new(),
        bases: Vec::new(),
        _dir: tempfile::tempdir().unwrap(),
    };
    // Migrate once first: three processes racing to create the schema is not what is tested.
    let location =
        StoreLocation::resolve(Path::new(""), Some("X"), |_| Some(url.to_owned())).unwrap();
    let store =
        tokio::task::spawn_blocking(move || Store::open_at(&location, StoreOptions::default()))
            .await
            .unwrap()
            .unwrap();
    store.close().await.unwrap();
    for i in 0..3 {
        let port = free_port();
        let config = write_config(dir.path(), port, extra, routes);
        let log = std::fs::File::create(dir.path().join(format!("proxy-{i}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_probeok"))
            .args(["proxy", "--config"])
            .arg(&config)
            .env_remove("PROBEOK_CONFIG")
            .env("SPEND_FLEET_DB", url)
            .env("SPEND_FLEET_UP_KEY", "sk-upstream-0123456789")
            .env("TEAM_A_KEY", KEY)
            .env("SPEND_ADMIN", ADMIN)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start probeok proxy");
        fleet.children.push(child);
        fleet.bases.push(format!("http://127.0.0.1:{port}"));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for base in &fleet.bases {
        loop {
            let up = http.get(format!("{base}/v1/models")).send().await;
            if up.is_ok_and(|r| r.status() == 200) {
                break;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = (0..3)
                    .map(|i| {
                        std::fs::read_to_string(dir.path().join(format!("proxy-{i}.log")))
                            .unwrap_or_default()
                    })
                    .collect();
                panic!("{base} did not start: {logs:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    fleet._dir = dir;
    fleet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_proxies_on_postgres_hold_a_client_to_one_limit() {
    let db = common::cluster::Db::create().await;
    let (up, reqs) = slow_ok(Duration::from_millis(1500)).await;
    let limit_micros = 20 * estimate(IN_PRICE, OUT_PRICE) + estimate(IN_PRICE, OUT_PRICE) / 2;
    let extra = format!(
        r#"
[[proxy.client]]
id = "team-a"
key_env = "TEAM_A_KEY"
limit = {{ amount = {:?}, per = "day" }}
"#,
        limit_micros as f64 / 1e6
    );
    let routes = routes_toml(&[("p0", up.base_url(), "primary", 100, IN_PRICE, OUT_PRICE)]);
    let fleet = fleet(&db.url, &extra, &routes).await;
    let http = reqwest::Client::new();

    let results = sixty_at_once(&http, &fleet.bases).await;
    let ok = check_limit_held(&results, reqs.all().len(), limit_micros);
    // Every proxy served some and refused some: they shared one limit, not three.
    for base in &fleet.bases {
        let c = settled(&http, base).await;
        assert_eq!(
            micros(&c["spent"]),
            ok as i64 * ACTUAL_MICROS,
            "{base}: {c}"
        );
        assert_eq!(micros(&c["reserved"]), 0);
    }
    println!(
        "three proxies, one client limit of {:.6} CNY: {ok} of 60 admitted, {} refused, {} upstream calls",
        limit_micros as f64 / 1e6,
        60 - ok,
        reqs.all().len()
    );
    drop(fleet);
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_traffic_through_three_proxies_on_postgres_stops_at_one_hourly_budget() {
    let db = common::cluster::Db::create().await;
    let (primary, primary_reqs) = fake("/chat/completions", |_: &Captured| {
        Reply::now(json(
            StatusCode::SERVICE_UNAVAILABLE,
            openai::error("down", "server_error", None),
        ))
    })
    .await;
    let (backup, backup_reqs) = slow_ok(Duration::from_millis(1500)).await;
    // The backup costs 2000/4000 micro-units per token more than the primary.
    let extra_estimate = estimate(2000.0, 4000.0);
    let budget_micros = 10 * extra_estimate + extra_estimate / 2;
    let extra = format!(
        "\n[budget]\nmax_extra_cost_per_hour = {:?}\n",
        budget_micros as f64 / 1e6
    );
    let routes = routes_toml(&[
        (
            "p0",
            primary.base_url(),
            "primary",
            100,
            IN_PRICE,
            OUT_PRICE,
        ),
        ("p1", backup.base_url(), "backup", 0, 3000.0, 6000.0),
    ]);
    // No client keys: loopback proxies, anonymous traffic; the budget is the only limit.
    let fleet = fleet(&db.url, &extra, &routes).await;
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..45 {
        let (http, base) = (http.clone(), fleet.bases[i % 3].clone());
        tasks.push(tokio::spawn(async move {
            http.post(format!("{base}/v1/chat/completions"))
                .json(&body())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == 200);
    }
    let backup_calls = backup_reqs.all().len();
    assert_eq!(ok, backup_calls, "every answer came from the backup");
    assert!(
        backup_calls >= 10,
        "the budget covers 10 estimates: {backup_calls}"
    );
    // One budget, not three: what the backup's answers cost extra fits in it.
    let actual_extra = 12 * 2000 + 3 * 4000;
    assert!(
        backup_calls as i64 * actual_extra <= budget_micros,
        "{backup_calls} backup answers overran a budget of {budget_micros} micro-units"
    );
    assert!(ok < 45, "the budget cannot cover 45 backup answers");
    assert!(!primary_reqs.all().is_empty());
    // The fleet's ledger row: spent is what the backup's answers cost extra.
    let location =
        StoreLocation::resolve(Path::new(""), Some("X"), |_| Some(db.url.clone())).unwrap();
    let ledger = Arc::new(probeok::store::SpendLedger::new(&location));
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let l = ledger.clone();
        let row = tokio::task::spawn_blocking(move || {
            let now = chrono::Utc::now();
            let start = probeok::spend::period_start(Per::Hour, now);
            l.row(probeok::extra_cost::LEDGER_KEY, start, now)
        })
        .await
        .unwrap()
        .unwrap();
        if row.reserved_micros == 0 || Instant::now() > deadline {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        row.spent_micros,
        backup_calls as i64 * actual_extra,
        "{row:?}"
    );
    println!(
        "three proxies, one hourly budget of {:.6}: {backup_calls} backup answers of 45, spent {:.6}",
        budget_micros as f64 / 1e6,
        row.spent_micros as f64 / 1e6
    );
    drop(fleet);
    db.drop_now().await;
}
