//! Alert figures: time from a transition on the health broadcast to the message arriving at a
//! local fake DingTalk receiver (signed, group_wait = 0), p50/p95 over N transitions; and how
//! many messages a 20-route provider-wide outage sends (group_wait = 30 s and 0 s).
//!
//! `CARGO_TARGET_DIR=/work/target cargo bench --bench alerts`

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use chrono::Utc;
use serde_json::json;

use probeok::alert::dingtalk::DingTalk;
use probeok::alert::{AlertService, Notifier};
use probeok::clock::SystemClock;
use probeok::config::{
    ChannelOptions, Config, ProviderConfig, RegionConfig, RobotConfig, RouteConfig,
};
use probeok::health::{
    ErrorRateEvidence, Evidence, FailureMode, HealthEvent, Incident, Reason, State, Transition,
};
use probeok::route::RouteId;
use probeok::store::{Store, StoreOptions};

const N: usize = 200;

fn config(db: &std::path::Path, group_wait: Duration) -> Config {
    let mut c = Config::default();
    c.storage.path = db.to_owned();
    c.alerting.group_wait = group_wait;
    c.providers.push(ProviderConfig {
        id: "qwen".into(),
        regions: vec![RegionConfig {
            id: "cn".into(),
            base_url: "http://127.0.0.1:9/v1".into(),
        }],
        ..ProviderConfig::default()
    });
    for i in 0..20 {
        c.routes.push(RouteConfig {
            provider: "qwen".into(),
            region: "cn".into(),
            model: format!("m{i:02}"),
            serves: "chat".into(),
            ..RouteConfig::default()
        });
    }
    c
}

fn event(route: usize, seq: usize) -> HealthEvent {
    let r = RouteId::new("qwen", "cn", &format!("m{route:02}"));
    let at = Utc::now();
    let inc = Incident {
        id: format!("{r}@{seq}"),
        route: r.clone(),
        opened_at: at,
        closed_at: None,
        peak: State::Critical,
        failure_mode: Some(FailureMode::Unavailable),
        transitions: Vec::new(),
        cause: None,
    };
    HealthEvent::Transition {
        transition: Box::new(Transition {
            route: r,
            from: State::Degraded,
            to: State::Critical,
            at,
            reason: Reason::new("error_rate_high", "error rate 45% above 5%"),
            failure_mode: Some(FailureMode::Unavailable),
            evidence: Evidence {
                observed: None,
                signals: Vec::new(),
                baseline: None,
                tps_baseline: None,
                thresholds: Vec::new(),
                error_rate: ErrorRateEvidence {
                    window_s: 300,
                    total: 20,
                    failures: 9,
                    rate: 0.45,
                    fast_window_s: 10,
                    fast_total: 0,
                    fast_failures: 0,
                    above_since: None,
                },
                consecutive_abnormal: 3,
            },
            incident_id: Some(inc.id.clone()),
        }),
        incident: Some(Box::new(inc)),
    }
}

struct Receiver {
    arrivals: Arc<Mutex<Vec<Instant>>>,
    addr: std::net::SocketAddr,
}

async fn receiver() -> Receiver {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let a = arrivals.clone();
    let app = Router::new().route(
        "/robot/send",
        post(move || {
            let a = a.clone();
            async move {
                a.lock().unwrap().push(Instant::now());
                axum::Json(json!({"errcode": 0, "errmsg": "ok"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Receiver { arrivals, addr }
}

fn channel(addr: std::net::SocketAddr) -> Arc<dyn Notifier> {
    let vars: std::collections::HashMap<String, String> = [
        (
            "BENCH_DING_URL".to_owned(),
            format!("http://{addr}/robot/send?access_token=t"),
        ),
        ("BENCH_DING_SECRET".to_owned(), "SECbench".to_owned()),
    ]
    .into();
    let c = RobotConfig {
        webhook_env: "BENCH_DING_URL".into(),
        secret_env: Some("BENCH_DING_SECRET".into()),
        options: ChannelOptions::default(),
        mention: None,
    };
    let env = probeok::alert::ChannelEnv {
        name: "dingtalk[0]".into(),
        vars: &vars,
        http: probeok::alert::http_client().unwrap(),
    };
    Arc::new(DingTalk::from_config(&c, &env).unwrap())
}

/// A running engine with its broadcast sender.
async fn engine(
    dir: &std::path::Path,
    group_wait: Duration,
    addr: std::net::SocketAddr,
) -> (
    tokio::sync::broadcast::Sender<HealthEvent>,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let db = dir.join(format!("alerts-{}.db", group_wait.as_secs()));
    let c = config(&db, group_wait);
    let store = Store::open(&db, StoreOptions::default()).unwrap();
    let service = Arc::new(AlertService::new(
        Arc::new(c),
        store,
        Arc::new(SystemClock),
        vec![channel(addr)],
    ));
    let (tx, rx) = tokio::sync::broadcast::channel(1024);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(probeok::alert::run(service, rx, shutdown.clone()));
    (tx, shutdown, task)
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();

    // 1. Latency, group_wait = 0: one transition at a time, waiting for its arrival. DingTalk's
    //    20/min limit would defer the 21st message by design, so each sample uses its own robot
    //    (a fresh engine every 20 samples).
    let mut lat = Vec::new();
    let mut done = 0;
    while done < N {
        let rx = receiver().await;
        let (tx, shutdown, task) = engine(dir.path(), Duration::ZERO, rx.addr).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for k in 0..20.min(N - done) {
            let before = rx.arrivals.lock().unwrap().len();
            let t = Instant::now();
            tx.send(event(k % 20, done + k)).unwrap();
            loop {
                if let Some(at) = rx.arrivals.lock().unwrap().get(before) {
                    lat.push(at.duration_since(t));
                    break;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        done += 20;
        shutdown.cancel();
        let _ = task.await;
    }
    lat.sort();
    println!(
        "transition -> message at receiver (group_wait=0, signed DingTalk, {} samples): p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        lat.len(),
        pct(&lat, 0.5).as_secs_f64() * 1000.0,
        pct(&lat, 0.95).as_secs_f64() * 1000.0,
        lat.last().unwrap().as_secs_f64() * 1000.0
    );

    // 2. A 20-route provider-wide outage: 20 transitions spread over 2 s.
    for (label, wait) in [
        ("group_wait=30s (default)", Duration::from_secs(30)),
        ("group_wait=0s", Duration::ZERO),
    ] {
        let rx = receiver().await;
        let (tx, shutdown, task) = engine(dir.path(), wait, rx.addr).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for i in 0..20 {
            tx.send(event(i, 10_000 + i)).unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let settle = if wait.is_zero() {
            Duration::from_secs(2)
        } else {
            wait + Duration::from_secs(3)
        };
        tokio::time::sleep(settle).await;
        shutdown.cancel();
        let _ = task.await;
        println!(
            "20-route provider-wide outage, {label}: {} message(s) sent",
            rx.arrivals.lock().unwrap().len()
        );
    }
}
