//! A whole provider incident (t=0 → return) with every protection together: the detector driven second
//! by second with explicit times (as tests/detection.rs), the pure switch machine stepped on
//! the same clock, a real pre-probe (`ProbeClient::probe`) of the backup, the real hourly
//! budget, and real requests over sockets through the proxy to fake upstreams (real axum
//! servers) following the weights computed with the switch overrides.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, TimeZone, Utc};
use common::{fake, json, openai, Captured, Reply, Script};
use probeok::clock::ManualClock;
use probeok::config::{Config, ProviderConfig, RegionConfig, RouteConfig};
use probeok::extra_cost::ExtraCost;
use probeok::health::{Baseline, Detector, HealthSnapshot, RouteHealth, State};
use probeok::probe::client::ProbeClient;
use probeok::probe::{OutcomeKind, ProbeError, ProbeOutcome};
use probeok::proxy::{self, Proxy, WeightsView};
use probeok::route::{Price, Route, RouteId, Tier};
use probeok::switch::{self, Action, Effect, Input, Machine, SwitchRecord};
use probeok::weights::{Overrides, Policy, Weights};
use serde_json::json as j;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// 14:30 in Asia/Shanghai (the default timezone).
fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 6, 30, 0).unwrap()
}

fn at(s: f64) -> DateTime<Utc> {
    t0() + chrono::Duration::milliseconds((s * 1000.0).round() as i64)
}

fn outcome(route: &RouteId, kind: OutcomeKind, when: DateTime<Utc>, ms: f64) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: when,
        success: true,
        attributed_to: None,
        verified: (kind != OutcomeKind::Passive).then_some(true),
        ttfb_ms: Some(150.0),
        ttft_ms: Some(ms * 0.8),
        total_ms: ms,
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: None,
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(200),
        error: None,
        answer: Some("PROBE_OK".into()),
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

fn failed(mut o: ProbeOutcome) -> ProbeOutcome {
    let e = ProbeError::Http {
        status: 503,
        message: "busy".into(),
    };
    o.success = false;
    o.verified = None;
    o.http_status = e.status();
    o.error = Some(e);
    o.answer = None;
    o
}

/// A fake upstream answering OpenAI chat completions (streamed or not), failing with 500
/// while `broken`.
async fn upstream(broken: Arc<AtomicBool>) -> (common::Server, common::Requests) {
    fake("/chat/completions", move |c: &Captured| {
        if broken.load(Ordering::SeqCst) {
            return Reply::now(json(
                StatusCode::INTERNAL_SERVER_ERROR,
                openai::error("overloaded", "server_error", None),
            ));
        }
        let stream = serde_json::from_slice::<serde_json::Value>(&c.body)
            .ok()
            .and_then(|v| v["stream"].as_bool())
            .unwrap_or(false);
        if stream {
            Reply::now(
                Script::new()
                    .send_all(openai::stream(&["PROBE_OK"], "stop", Some(3)))
                    .sse(),
            )
        } else {
            Reply::now(json(
                StatusCode::OK,
                openai::body("PROBE_OK", "stop", Some(40)),
            ))
        }
    })
    .await
}

/// Primary `qwen/cn/max` (¥2/¥6 per Mtok), backup `deepseek/cn/v3` (¥4/¥16 per Mtok).
fn config(primary: &str, backup: &str) -> Config {
    let mut c = Config::default();
    for (p, model, url, tier, price) in [
        ("qwen", "max", primary, Tier::Primary, (2.0, 6.0)),
        ("deepseek", "v3", backup, Tier::Backup, (4.0, 16.0)),
    ] {
        c.providers.push(ProviderConfig {
            id: p.into(),
            regions: vec![RegionConfig {
                id: "cn".into(),
                base_url: url.into(),
            }],
            ..ProviderConfig::default()
        });
        c.routes.push(RouteConfig {
            provider: p.into(),
            region: "cn".into(),
            model: model.into(),
            serves: "chat".into(),
            tier,
            weight: 100,
            price: Some(Price {
                input_per_mtok: price.0,
                output_per_mtok: price.1,
                currency: "CNY".into(),
            }),
            ..RouteConfig::default()
        });
    }
    c.proxy.enabled = true;
    c.proxy.total_timeout = Duration::from_secs(10);
    c
}

struct Proxied {
    base: String,
    http: reqwest::Client,
}

impl Proxied {
    /// Sends `n` requests; (route → count, errors).
    async fn send(&self, n: usize) -> (HashMap<String, usize>, usize) {
        let mut by_route = HashMap::new();
        let mut errors = 0;
        for _ in 0..n {
            let r = self
                .http
                .post(format!("{}/v1/chat/completions", self.base))
                .json(&j!({"model": "chat", "max_tokens": 64,
                    "messages": [{"role": "user", "content": "hello there"}]}))
                .send()
                .await
                .expect("proxy answers");
            if r.status() != StatusCode::OK {
                errors += 1;
            }
            let route = r
                .headers()
                .get("x-probeok-route")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let _ = r.bytes().await;
            *by_route.entry(route).or_insert(0) += 1;
        }
        (by_route, errors)
    }
}

/// The detector's view of one route.
struct Judged {
    h: RouteHealth,
    b: Baseline,
}

fn snapshot(
    routes: &[Route],
    judged: &[(RouteId, State)],
    switched: bool,
    now: DateTime<Utc>,
) -> HealthSnapshot {
    let ids: Vec<RouteId> = routes.iter().map(|r| r.id.clone()).collect();
    let mut s = HealthSnapshot::initial(&ids, now);
    for r in &mut s.routes {
        if let Some((_, st)) = judged.iter().find(|(id, _)| *id == r.route) {
            r.judged = *st;
            r.state = if switched && r.route.as_str().starts_with("qwen") {
                State::Switched
            } else {
                *st
            };
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_000_whole_incident() {
    let primary_broken = Arc::new(AtomicBool::new(true));
    let (p_server, p_reqs) = upstream(primary_broken.clone()).await;
    let (b_server, b_reqs) = upstream(Arc::new(AtomicBool::new(false))).await;
    let config = config(&p_server.base_url(), &b_server.base_url());
    let routes = config.routes();
    let primary = routes[0].id.clone();
    let backup = routes[1].id.clone();
    let clock = Arc::new(ManualClock::new(at(0.0)));

    // The proxy, on a real socket, following a weights watch this test publishes.
    let (wtx, wrx) = watch::channel(Arc::new(WeightsView::from_config(&routes)));
    let (ptx, mut prx) = mpsc::channel(4096);
    tokio::spawn(async move { while prx.recv().await.is_some() {} });
    let px = Proxy::with_clock(&config, wrx, ptx, clock.clone()).expect("proxy");
    let budget = ExtraCost::new(config.budget.clone(), &routes, clock.clone(), None);
    px.set_budget(budget.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(proxy::serve(listener, px, shutdown.clone()));
    let client = Proxied {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
    };
    let prober = ProbeClient::new(&routes, clock.clone()).expect("probe client");

    // Detection: both routes with a learned baseline of 1.1 s ± 0.3 s.
    let det = Detector::new(&config.detection);
    let seed = |id: &RouteId| {
        let n = 40;
        let mut j = Judged {
            h: det.route(id.clone(), at(-30.0 * n as f64)),
            b: Baseline::new(id.clone(), &config.detection),
        };
        let a = 300.0 * ((n as f64 - 1.0) / n as f64).sqrt();
        for i in 0..n {
            let x = if i % 2 == 0 { 1100.0 - a } else { 1100.0 + a };
            let when = at(-30.0 * (n - i) as f64);
            det.ingest(
                &mut j.h,
                &mut j.b,
                &outcome(id, OutcomeKind::Probe, when, x),
                when,
            );
        }
        assert_eq!(j.h.state(), State::Normal);
        j
    };
    let mut p = seed(&primary);
    let mut b = seed(&backup);

    let mut weights = Weights::new(
        Arc::new(routes.clone()),
        Policy::default(),
        &snapshot(&routes, &[], false, at(0.0)),
    );
    let mut overrides = Overrides::new();
    let mut machine = Machine::new("chat", vec![primary.clone()], config.switch.clone());
    let mut switched = false;
    let mut records: Vec<SwitchRecord> = Vec::new();
    let mut timeline: Vec<(f64, String)> = Vec::new();
    let mut last_state = State::Normal;
    let mut critical_at = None;
    let mut on_backup_wall = None;
    let heal = 1200; // the provider recovers 20 min in; NORMAL 5 min later
    let mut i = 0u64;
    let mut canary_primary_share = Vec::new();
    let mut done_at = None;

    for s in 0..3600i64 {
        let now = at(s as f64);
        clock.set(now);
        let healthy = s >= heal;
        if s == heal {
            primary_broken.store(false, Ordering::SeqCst);
        }
        // Detection: probes every 30 s (4.2 s, 5.1 s, 6.8 s, then 7 s until healed), real
        // traffic at 10/s with 8% errors from t=61 until healed.
        det.tick(&mut p.h, now);
        det.tick(&mut b.h, now);
        if s % 30 == 0 {
            let ms = match s {
                0 => 4200.0,
                30 => 5100.0,
                60 => 6800.0,
                _ if healthy => 1100.0,
                _ => 7000.0,
            };
            det.ingest(
                &mut p.h,
                &mut p.b,
                &outcome(&primary, OutcomeKind::Probe, now, ms),
                now,
            );
            det.ingest(
                &mut b.h,
                &mut b.b,
                &outcome(&backup, OutcomeKind::Probe, now, 1000.0),
                now,
            );
        }
        if s > 60 && !switched_or_returned(&machine, switched) {
            for k in 0..10 {
                let when = at(s as f64 + 0.1 * k as f64);
                let ok = healthy || !(i % 25 == 0 || i % 25 == 12);
                i += 1;
                let o = outcome(&primary, OutcomeKind::Passive, when, 1100.0);
                let o = if ok { o } else { failed(o) };
                det.ingest(&mut p.h, &mut p.b, &o, when);
            }
        }
        if p.h.state() != last_state {
            timeline.push((s as f64, format!("primary {}", p.h.state())));
            if p.h.state() == State::Critical && critical_at.is_none() {
                critical_at = Some(s);
            }
            last_state = p.h.state();
        }

        // The switch controller: the pure machine, on the same clock.
        let judged = [
            (primary.clone(), p.h.state()),
            (backup.clone(), b.h.state()),
        ];
        let mut changed = false;
        for _ in 0..3 {
            let input = Input {
                now,
                primary: p.h.state(),
                primary_reason: p.h.reason().map(|r| r.code.clone()),
                backups: vec![(backup.clone(), b.h.state())],
                budget_allows: budget.allows_switch(),
                extra_cost_total: budget.total_for("chat"),
            };
            let effects = machine.step(&input);
            if effects.is_empty() {
                break;
            }
            let mut probed = false;
            for e in effects {
                match e {
                    Effect::PreProbe(id) => {
                        let started = std::time::Instant::now();
                        let route = routes.iter().find(|r| r.id == id).unwrap();
                        let o = prober.probe(route, OutcomeKind::Probe).await;
                        timeline.push((
                            s as f64,
                            format!(
                                "pre-probe {id}: {} in {} ms wall",
                                if switch::pre_probe_passed(&o) {
                                    "ok"
                                } else {
                                    "FAILED"
                                },
                                started.elapsed().as_millis()
                            ),
                        ));
                        on_backup_wall = Some(started);
                        machine.pre_probed(&id, switch::pre_probe_passed(&o), "probe");
                        probed = true;
                    }
                    Effect::SetSwitched { on, .. } => switched = on,
                    Effect::Override(o) => {
                        match o {
                            Some(o) => overrides.insert("chat".into(), o),
                            None => overrides.remove("chat"),
                        };
                        changed = true;
                    }
                    Effect::Record(r) => {
                        timeline.push((s as f64, format!("{} ({})", r.action.as_str(), r.trigger)));
                        if r.action == Action::Returned {
                            done_at = Some(s);
                        }
                        records.push(r);
                    }
                }
            }
            if !probed {
                break;
            }
        }
        // The weights, as the monitor publishes them, into the proxy's watch.
        weights.set_overrides(overrides.clone());
        let snap = snapshot(&routes, &judged, switched, now);
        if let Some(next) = weights.update(&snap) {
            wtx.send_replace(Arc::new(WeightsView::from_json(&next.json).unwrap()));
            changed = true;
        }
        if changed && machine_phase(&machine) == "switched" && on_backup_wall.is_some() {
            // Traffic on the backup: measured wall time from the pre-probe start.
            let wall = on_backup_wall.take().unwrap().elapsed();
            timeline.push((
                s as f64,
                format!(
                    "weights: all traffic on backup ({} ms wall after CRITICAL's step)",
                    wall.as_millis()
                ),
            ));
            let w = weights.current();
            assert_eq!(w.weight(&backup), Some(100));
            assert_eq!(w.weight(&primary), Some(0));
            let entry = &w.models["chat"].entries[1];
            assert_eq!(entry.reason, "switched");
        }

        // The budget and the proxy: real requests at the incident's moments.
        if s == 125 {
            let (by, errors) = client.send(30).await;
            assert_eq!(errors, 0, "{by:?}");
            assert_eq!(by.get(backup.as_str()), Some(&30), "{by:?}");
            timeline.push((
                s as f64,
                format!("30 requests: all served by {backup}, 0 errors"),
            ));
        }
        if let switch::Phase::Canary {
            ratio,
            stage,
            stage_started,
            ..
        } = machine.phase().clone()
        {
            if stage_started == now {
                let (by, errors) = client.send(100).await;
                assert_eq!(errors, 0, "{by:?}");
                let to_primary = by.get(primary.as_str()).copied().unwrap_or(0);
                canary_primary_share.push((stage, ratio, to_primary));
            }
        }
        if done_at.is_some_and(|d| s == d + 1) {
            let (by, errors) = client.send(30).await;
            assert_eq!(errors, 0);
            assert_eq!(by.get(primary.as_str()), Some(&30), "{by:?}");
            timeline.push((
                s as f64,
                format!("30 requests: all served by {primary} again"),
            ));
            break;
        }
    }
    shutdown.cancel();

    println!("observed timeline (s after the first slow probe):");
    for (s, what) in &timeline {
        println!("  t={:>6.0}s ({:>4.1} min)  {what}", s, s / 60.0);
    }
    println!("canary (stage, ratio, of 100 requests to the primary): {canary_primary_share:?}");

    // The incident's states in order.
    let states: Vec<&str> = timeline
        .iter()
        .filter_map(|(_, w)| w.strip_prefix("primary "))
        .collect();
    assert_eq!(
        &states[..3],
        &["WARNING", "DEGRADED", "CRITICAL"],
        "{states:?}"
    );
    let crit = critical_at.unwrap();
    assert!(crit <= 90 + 45, "CRITICAL at {crit}");
    // Switched in the very step CRITICAL was seen (pre-probe + budget + switch).
    let sw = records.iter().find(|r| r.action == Action::Switch).unwrap();
    assert_eq!(sw.at, at(crit as f64));
    assert_eq!(sw.trigger, "error_rate_high");
    assert_eq!(sw.from, vec![primary.clone()]);
    assert_eq!(sw.to, vec![backup.clone()]);
    assert_eq!(sw.dwell_until, Some(at(crit as f64 + 300.0)));
    // Canary 5 / 25 / 100, then the return.
    let stages: Vec<Option<f64>> = records
        .iter()
        .filter(|r| r.action == Action::CanaryStage)
        .map(|r| r.ratio)
        .collect();
    assert_eq!(stages, vec![Some(0.05), Some(0.25), Some(1.0)]);
    assert_eq!(canary_primary_share.len(), 3);
    assert!(canary_primary_share[0].2 < 25, "{canary_primary_share:?}");
    assert_eq!(canary_primary_share[2].2, 100);
    let ret = records.last().unwrap();
    assert_eq!(ret.action, Action::Returned);
    let ep = ret.episode.clone().unwrap();
    assert_eq!(ep.switches, 1);
    assert_eq!(ep.started_at, at(crit as f64));
    assert!(ep.extra_cost > 0.0, "{ep:?}");
    // 30 min after the switch the primary had been healthy for ≥ 5 min: canary, 3 × 2 min.
    let first_canary = records
        .iter()
        .find(|r| r.action == Action::CanaryStage)
        .unwrap();
    assert_eq!(first_canary.at, at(crit as f64 + 1800.0));
    assert_eq!(ep.duration_s, 1800 + 3 * 120);
    assert!(!records
        .iter()
        .any(|r| r.action == Action::Blocked || r.action == Action::Abort));
    println!(
        "recorded event: duration {} min, switches {}, extra cost ¥{:.6}; primary hits {}, backup hits {}",
        ep.duration_s / 60,
        ep.switches,
        ep.extra_cost,
        p_reqs.all().len(),
        b_reqs.all().len()
    );
}

fn machine_phase(m: &Machine) -> &'static str {
    match m.phase() {
        switch::Phase::Primary => "primary",
        switch::Phase::Probing { .. } => "probing",
        switch::Phase::Switched { .. } => "switched",
        switch::Phase::Canary { .. } => "canary",
    }
}

/// Real traffic only reaches the primary while it carries a share (before the switch and
/// during the canary): once switched, its passive errors stop (the incident's "0% errors").
fn switched_or_returned(m: &Machine, switched: bool) -> bool {
    switched && matches!(m.phase(), switch::Phase::Switched { .. })
}
