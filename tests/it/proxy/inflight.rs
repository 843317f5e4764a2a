//! In-flight limits: the proxy caps requests per route and per provider only where the config
//! says so (`max_in_flight`); past a cap the next candidate serves, or the client gets 429
//! naming the cap; a stream holds its place until it ends or its client leaves. Fake
//! upstreams are real HTTP servers that hold each answer open until the test releases it.

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::{openai, Server};
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::probe::ProbeOutcome;
use probeok::proxy::{self, BreakerState, Proxy, WeightsView};
use probeok::route::Tier;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// An OpenAI-compatible upstream that sends each stream's first chunk at once and the rest
/// (finish, usage, `[DONE]`) only once released; a non-streamed answer waits for the release.
struct Held {
    server: Server,
    /// Requests received.
    opened: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

impl Held {
    fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }

    fn release(&self) {
        let _ = self.release.send(true);
    }
}

async fn held() -> Held {
    let opened = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let count = opened.clone();
    let app = Router::new().route(
        "/chat/completions",
        post(move |body: Bytes| {
            let count = count.clone();
            let mut released = released.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let req: Value = serde_json::from_slice(&body).unwrap_or_default();
                if req["stream"] != json!(true) {
                    let _ = released.wait_for(|r| *r).await;
                    return common::json(StatusCode::OK, openai::body("hello", "stop", Some(3)));
                }
                let chunks = futures_util::stream::unfold(0u8, move |step| {
                    let mut released = released.clone();
                    async move {
                        let chunk = match step {
                            0 => openai::content("hello"),
                            1 => {
                                let _ = released.wait_for(|r| *r).await;
                                [openai::finish("stop"), openai::usage(3), openai::done()].concat()
                            }
                            _ => return None,
                        };
                        Some((Ok::<_, Infallible>(Bytes::from(chunk)), step + 1))
                    }
                });
                common::with_type(
                    StatusCode::OK,
                    "text/event-stream",
                    Body::from_stream(chunks),
                )
            }
        }),
    );
    Held {
        server: common::spawn(app).await,
        opened,
        release,
    }
}

/// One `[[route]]` of the test's config: `provider/region/m`, serving `chat`.
struct R<'a> {
    provider: &'a str,
    region: &'a str,
    up: &'a Held,
    tier: Tier,
    max_in_flight: Option<u32>,
}

struct Running {
    base: String,
    proxy: Proxy,
    passive: mpsc::Receiver<ProbeOutcome>,
    shutdown: CancellationToken,
    http: reqwest::Client,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The proxy over `routes`, candidates in the given tiers' order; `providers` names the
/// provider caps.
async fn start(routes: &[R<'_>], providers: &[(&str, u32)]) -> Running {
    let mut config = Config::default();
    for r in routes {
        let region = RegionConfig {
            id: r.region.into(),
            base_url: r.up.server.base_url(),
        };
        match config.providers.iter_mut().find(|p| p.id == r.provider) {
            Some(p) => p.regions.push(region),
            None => config.providers.push(ProviderConfig {
                id: r.provider.into(),
                max_in_flight: (providers.iter())
                    .find(|(id, _)| *id == r.provider)
                    .map(|(_, n)| *n),
                regions: vec![region],
                ..ProviderConfig::default()
            }),
        }
        config.routes.push(RouteConfig {
            provider: r.provider.into(),
            region: r.region.into(),
            model: "m".into(),
            serves: "chat".into(),
            tier: r.tier,
            max_in_flight: r.max_in_flight,
            ..RouteConfig::default()
        });
    }
    config.proxy.enabled = true;
    config.proxy.total_timeout = Duration::from_secs(120);
    // A loaded test machine may take seconds to open a thousand streams: none of them may fail
    // over for a late first event (that is the watchdog's test, not this one's).
    config.proxy.first_byte_timeout = Duration::from_secs(120);
    config.proxy.max_connections = 4096;
    let (_wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&config.routes())));
    let (ptx, prx) = mpsc::channel(8192);
    let p = Proxy::new(&config, wrx, ptx).expect("proxy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, p.clone(), shutdown.clone()));
    Running {
        base: format!("http://{addr}"),
        proxy: p,
        passive: prx,
        shutdown,
        http: reqwest::Client::new(),
    }
}

fn route<'a>(provider: &'a str, region: &'a str, up: &'a Held, tier: Tier) -> R<'a> {
    R {
        provider,
        region,
        up,
        tier,
        max_in_flight: None,
    }
}

fn chat(stream: bool) -> Value {
    json!({"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

impl Running {
    async fn post(&self, stream: bool) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .json(&chat(stream))
            .send()
            .await
            .expect("proxy answers")
    }

    /// Requests in flight at `route` now.
    fn in_flight(&self, route: &str) -> u32 {
        (self.proxy.in_flight().into_iter())
            .find(|(id, _)| id.as_str() == route)
            .map_or(0, |(_, n)| n)
    }

    /// Every passive outcome sent so far.
    fn outcomes(&mut self) -> Vec<ProbeOutcome> {
        let mut out = Vec::new();
        while let Ok(o) = self.passive.try_recv() {
            out.push(o);
        }
        out
    }

    fn breakers_closed(&self) -> bool {
        (self.proxy.breakers().iter()).all(|b| b.state == BreakerState::Closed)
    }
}

/// Waits until `cond` holds, for at most `within`.
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    (r.headers().get(name))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A streamed answer read up to its first event (the proxy has committed it).
async fn first_event(r: reqwest::Response) -> (reqwest::Response, String) {
    let mut r = r;
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let chunk = r.chunk().await.expect("chunk").expect("a first event");
        seen.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    (r, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_streams_to_one_route_all_complete_without_a_limit() {
    const N: usize = 1000;
    // Each stream holds four descriptors in this process (client, proxy in and out, upstream).
    let _ = rlimit::increase_nofile_limit(8 * N as u64 + 1024);
    let up = held().await;
    let px = Arc::new(start(&[route("p", "r", &up, Tier::Primary)], &[]).await);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let streams: Vec<_> = (0..N)
        .map(|_| {
            let (http, url) = (http.clone(), format!("{}/v1/chat/completions", px.base));
            tokio::spawn(async move {
                let r = (http.post(url).json(&chat(true)).send().await).expect("proxy answers");
                let status = r.status();
                let body = r.text().await.expect("whole body");
                (status, body)
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while up.opened() < N {
        assert!(
            Instant::now() < deadline,
            "{} of {N} streams open upstream, {} in flight, {} finished",
            up.opened(),
            px.in_flight("p/r/m"),
            streams.iter().filter(|s| s.is_finished()).count()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until(Duration::from_secs(30), "the gauge at N", || {
        px.in_flight("p/r/m") == N as u32
    })
    .await;
    up.release();
    let mut done = 0;
    for s in streams {
        let (status, body) = s.await.expect("stream task");
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            body.contains("hello") && body.ends_with("data: [DONE]\n\n"),
            "{body}"
        );
        done += 1;
    }
    assert_eq!(done, N);
    until(Duration::from_secs(10), "every place given back", || {
        px.in_flight("p/r/m") == 0
    })
    .await;
}

#[tokio::test]
async fn past_a_route_limit_the_next_candidate_serves_and_nothing_counts_against_the_route() {
    let (a, b) = (held().await, held().await);
    let mut px = start(
        &[
            R {
                max_in_flight: Some(2),
                ..route("pa", "r", &a, Tier::Primary)
            },
            route("pb", "r", &b, Tier::Backup),
        ],
        &[],
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let r = px.post(true).await;
        assert_eq!(header(&r, "x-probeok-route"), "pa/r/m");
        open.push(first_event(r).await.0);
    }
    assert_eq!(px.in_flight("pa/r/m"), 2);
    let third = px.post(true).await;
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(header(&third, "x-probeok-route"), "pb/r/m");
    assert_eq!(
        header(&third, "x-probeok-fallback-reason"),
        "in_flight_limit"
    );
    let (third, _) = first_event(third).await;
    assert_eq!(
        (a.opened(), b.opened()),
        (2, 1),
        "the limit sent nothing to pa"
    );
    a.release();
    b.release();
    for r in open.into_iter().chain([third]) {
        assert!(r.text().await.expect("body").ends_with("data: [DONE]\n\n"));
    }
    assert!(px.breakers_closed(), "{:?}", px.proxy.breakers());
    until(Duration::from_secs(5), "three outcomes", || {
        px.passive.len() >= 3
    })
    .await;
    let outcomes = px.outcomes();
    assert_eq!(
        outcomes.len(),
        3,
        "one per answered stream, none for the skip"
    );
    assert!(outcomes.iter().all(|o| o.success), "{outcomes:?}");
    let failovers = px.proxy.counters().failovers;
    assert_eq!(failovers, vec![("in_flight_limit".to_owned(), 1)]);
}

#[tokio::test]
async fn past_a_route_limit_with_no_other_candidate_the_client_gets_429_naming_it() {
    let a = held().await;
    let mut px = start(
        &[R {
            max_in_flight: Some(2),
            ..route("pa", "r", &a, Tier::Primary)
        }],
        &[],
    )
    .await;
    // Non-streamed requests hold their place while the upstream holds the answer.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (http, url) = (px.http.clone(), format!("{}/v1/chat/completions", px.base));
            tokio::spawn(async move { http.post(url).json(&chat(false)).send().await })
        })
        .collect();
    until(Duration::from_secs(10), "two requests upstream", || {
        a.opened() == 2
    })
    .await;
    let r = px.post(false).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), "1");
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "in_flight_limit");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(
        body["probeok"]["limits"],
        json!([{"scope": "route", "id": "pa/r/m", "max_in_flight": 2}])
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("route `pa/r/m` max_in_flight = 2"),
        "{message}"
    );
    // A stream is refused the same way, before anything is sent.
    let r = px.post(true).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(a.opened(), 2, "refused requests never reach the upstream");
    a.release();
    for w in waiting {
        let r = w.await.expect("task").expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert!(px.breakers_closed(), "{:?}", px.proxy.breakers());
    until(Duration::from_secs(5), "two outcomes", || {
        px.passive.len() >= 2
    })
    .await;
    let outcomes = px.outcomes();
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(outcomes.iter().all(|o| o.success), "{outcomes:?}");
    until(Duration::from_secs(5), "the places back", || {
        px.in_flight("pa/r/m") == 0
    })
    .await;
}

#[tokio::test]
async fn a_provider_limit_counts_the_requests_of_all_its_routes() {
    let (one, two, other) = (held().await, held().await, held().await);
    // `shared/r1/m` takes one request; the second goes to `shared/r2/m`; the provider then has
    // 2, its cap: the third skips both of its routes.
    let shared = |with_other: bool| {
        let mut routes = vec![
            R {
                max_in_flight: Some(1),
                ..route("shared", "r1", &one, Tier::Primary)
            },
            route("shared", "r2", &two, Tier::Backup),
        ];
        if with_other {
            routes.push(route("other", "r", &other, Tier::Fallback));
        }
        routes
    };
    let px = start(&shared(true), &[("shared", 2)]).await;
    let first = px.post(true).await;
    assert_eq!(header(&first, "x-probeok-route"), "shared/r1/m");
    let (first, _) = first_event(first).await;
    let second = px.post(true).await;
    assert_eq!(header(&second, "x-probeok-route"), "shared/r2/m");
    let (second, _) = first_event(second).await;
    assert_eq!(
        px.proxy.provider_in_flight(),
        vec![("other".to_owned(), 0), ("shared".to_owned(), 2)]
    );
    let third = px.post(true).await;
    assert_eq!(header(&third, "x-probeok-route"), "other/r/m");
    let (third, _) = first_event(third).await;
    assert_eq!(two.opened(), 1, "the provider's cap kept r2 at one");

    // Without another provider the client hears of both caps, in the order met.
    let alone = start(&shared(false), &[("shared", 2)]).await;
    let alone_open = [
        first_event(alone.post(true).await).await.0,
        first_event(alone.post(true).await).await.0,
    ];
    let r = alone.post(true).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), "1");
    let body: Value = r.json().await.expect("json");
    assert_eq!(
        body["probeok"]["limits"],
        json!([
            {"scope": "route", "id": "shared/r1/m", "max_in_flight": 1},
            {"scope": "provider", "id": "shared", "max_in_flight": 2},
        ])
    );
    assert!(px.breakers_closed() && alone.breakers_closed());
    for u in [&one, &two, &other] {
        u.release();
    }
    for r in [first, second, third].into_iter().chain(alone_open) {
        assert!(r.text().await.expect("body").ends_with("data: [DONE]\n\n"));
    }
    until(Duration::from_secs(5), "the provider's places back", || {
        px.proxy.provider_in_flight().iter().all(|(_, n)| *n == 0)
    })
    .await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_frees_its_place() {
    let a = held().await;
    let px = start(
        &[R {
            max_in_flight: Some(1),
            ..route("pa", "r", &a, Tier::Primary)
        }],
        &[],
    )
    .await;
    let (r, first) = first_event(px.post(true).await).await;
    assert!(first.contains("hello"), "{first}");
    assert_eq!(px.in_flight("pa/r/m"), 1);
    assert_eq!(
        px.post(true).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the stream holds the only place"
    );
    // The client goes away while the upstream says nothing more.
    drop(r);
    until(Duration::from_secs(10), "the place given back", || {
        px.in_flight("pa/r/m") == 0
    })
    .await;
    let next = px.post(true).await;
    assert_eq!(next.status(), StatusCode::OK);
    assert_eq!(header(&next, "x-probeok-route"), "pa/r/m");
    a.release();
    assert!(next
        .text()
        .await
        .expect("body")
        .ends_with("data: [DONE]\n\n"));
    assert!(px.breakers_closed());
}

#[tokio::test]
async fn check_config_refuses_a_max_in_flight_of_zero_where_it_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inflight.toml");
    std::fs::write(
        &path,
        "[[provider]]\nid = \"p\"\nmax_in_flight = 0\n  [[provider.region]]\n  id = \"r\"\n  base_url = \"https://api.example.com/v1\"\n\
         [[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"m\"\nserves = \"chat\"\n\
         [[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"n\"\nserves = \"chat\"\nmax_in_flight = 0\n",
    )
    .expect("write");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .await
        .expect("probeok runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let file = path.display();
    assert!(
        stderr.contains(&format!(
            "{file}:3:17: provider[0].max_in_flight: must be at least 1, got 0"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{file}:17:17: route[1].max_in_flight: must be at least 1, got 0"
        )),
        "{stderr}"
    );
}

/// The same file, as `serve` runs its bundled proxy and as `probeok proxy` runs it alone: a
/// route's cap holds in both, and the monitor's `/metrics` shows the stream in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_the_standalone_proxy_both_keep_a_route_cap() {
    let up = held().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |proxy_port: u16, db: &str| {
        format!(
            "[storage]\npath = \"{db}\"\n[probe]\ninterval = \"1h\"\n\
             [proxy]\nenabled = true\nlisten = \"127.0.0.1:{proxy_port}\"\n\
             [[provider]]\nid = \"p\"\n  [[provider.region]]\n  id = \"r\"\n  base_url = \"{base}\"\n\
             [[route]]\nprovider = \"p\"\nregion = \"r\"\nmodel = \"m\"\nserves = \"chat\"\nmax_in_flight = 1\n",
            db = dir.path().join(db).display(),
            base = up.server.base_url(),
        )
    };
    let http = reqwest::Client::new();
    let post = |port: u16| {
        (http.post(format!("http://127.0.0.1:{port}/v1/chat/completions")))
            .json(&chat(true))
            .send()
    };
    // The one place is taken by a stream; the next request is refused naming the cap.
    let second_is_refused = |r: reqwest::Response| async move {
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let body: Value = r.json().await.expect("json");
        assert_eq!(
            body["probeok"]["limits"],
            json!([{"scope": "route", "id": "p/r/m", "max_in_flight": 1}])
        );
    };

    // `serve`.
    let port = common::free_port();
    let config = probeok::config::Config::parse(&file(port, "serve.db"), "serve.toml")
        .expect("valid config")
        .config;
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let running = probeok::app::start_with(
        config,
        listener,
        Arc::new(probeok::clock::SystemClock),
        shutdown.clone(),
        probeok::app::StartOptions::default(),
    )
    .await
    .expect("serve starts");
    let (open, _) = first_event(post(port).await.expect("proxy answers")).await;
    second_is_refused(post(port).await.expect("proxy answers")).await;
    let metrics = (http
        .get(format!("http://{}/metrics", running.addr))
        .send()
        .await)
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l == "probeok_proxy_in_flight{route=\"p/r/m\"} 1"),
        "{metrics}"
    );
    drop(open);

    // `probeok proxy`, on its own port and database.
    let port = common::free_port();
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, file(port, "proxy.db")).expect("write");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["proxy", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("probeok proxy starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "probeok proxy did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (open, _) = first_event(post(port).await.expect("proxy answers")).await;
    second_is_refused(post(port).await.expect("proxy answers")).await;
    up.release();
    assert!(open
        .text()
        .await
        .expect("body")
        .ends_with("data: [DONE]\n\n"));
    let _ = child.kill().await;
    shutdown.cancel();
    let _ = running.done.await;
}
