//! A served monitor whose routes are in several states, with 90 days of scripted synthetic
//! outcomes, stored transitions and incidents: what the page tests and the browser test look at.
//! One upstream error message and one reported model name carry `<script>alert(1)</script>`.

#![allow(dead_code)]

use chrono::{DateTime, Duration as TimeDelta, Utc};
use probeok::health::Incident;
use probeok::health::{
    BaselineSnapshot, ErrorRateEvidence, Evidence, FailureMode, Finding, FindingKind,
    IncidentSummary, LatencyRef, Observed, Reason, RouteHealth, RouteStatus, State, Threshold,
    Transition,
};
use probeok::probe::{OutcomeKind, ProbeError};

use super::app::{at, id, normal, outcome, snapshot, Harness, Served, Spec};

pub const QWEN: &str = "qwen/cn-beijing/qwen-max";
pub const DEEPSEEK: &str = "deepseek/cn/deepseek-ai/DeepSeek-V3";
pub const OPENAI: &str = "openai/us-east-1/gpt-4o-mini";
pub const CLAUDE: &str = "anthropic/us-west-2/claude-haiku";
pub const KIMI: &str = "kimi/cn/moonshot-v1";
pub const LLAMA: &str = "local/dc1/llama-3";

pub const XSS: &str = "<script>alert(1)</script>";

pub const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    Spec::new("kimi", "cn", "moonshot-v1")
        .serves("chat-main")
        .weight(20),
    Spec::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3")
        .serves("chat-main")
        .backup(),
    Spec::new("openai", "us-east-1", "gpt-4o-mini").serves("chat-lite"),
    Spec::new("anthropic", "us-west-2", "claude-haiku")
        .serves("chat-lite")
        .backup(),
    Spec::new("local", "dc1", "llama-3")
        .serves("chat-fallback")
        .fallback(),
];

/// Every route with the state the fixture gives it.
pub const STATES: &[(&str, State)] = &[
    (QWEN, State::Normal),
    (KIMI, State::Switched),
    (DEEPSEEK, State::Degraded),
    (OPENAI, State::Critical),
    (CLAUDE, State::Warning),
    (LLAMA, State::Unknown),
];

pub fn now() -> DateTime<Utc> {
    at("2026-05-20T12:00:00Z")
}

fn baseline() -> BaselineSnapshot {
    BaselineSnapshot {
        bucket: "12:00-13:00".into(),
        samples: 100,
        mean_ms: 1100.0,
        stddev_ms: 300.0,
        p50_ms: 1050.0,
        p95_ms: 1600.0,
        p99_ms: 1900.0,
        ttft_samples: 100,
        ttft_mean_ms: Some(420.0),
        ttft_p50_ms: Some(400.0),
        ttft_p95_ms: Some(600.0),
        ttft_p99_ms: Some(700.0),
        tps_samples: 20,
        tps_mean: Some(42.0),
    }
}

pub fn evidence(ms: f64, ok: bool) -> Evidence {
    Evidence {
        observed: Some(Observed {
            kind: OutcomeKind::Probe,
            started_at: now() - TimeDelta::minutes(40),
            success: ok,
            verified: Some(ok),
            total_ms: ms,
            ttft_ms: None,
            tokens_per_second: None,
            http_status: Some(if ok { 200 } else { 503 }),
            error: (!ok).then(|| "http".to_owned()),
        }),
        signals: Vec::new(),
        baseline: Some(LatencyRef {
            bucket: "12:00-13:00".into(),
            samples: 100,
            mean_ms: 1100.0,
            stddev_ms: 300.0,
            threshold_ms: 1700.0,
        }),
        tps_baseline: None,
        thresholds: vec![Threshold {
            name: "latency_ms".into(),
            observed: ms,
            limit: 1700.0,
        }],
        error_rate: ErrorRateEvidence {
            window_s: 300,
            total: 20,
            failures: if ok { 0 } else { 4 },
            rate: if ok { 0.0 } else { 0.2 },
            fast_window_s: 10,
            fast_total: 0,
            fast_failures: 0,
            above_since: None,
        },
        consecutive_abnormal: 3,
    }
}

fn status(route: &str, state: State, code: &str, text: &str) -> RouteStatus {
    let mut s = normal(route, now() - TimeDelta::minutes(45));
    s.state = state;
    s.judged = state;
    if state != State::Normal {
        s.reason = Some(Reason::new(code, text));
    }
    s.baseline = (state != State::Unknown).then(baseline);
    s
}

pub struct Fixture {
    pub h: Harness,
    pub s: Served,
}

/// Builds the store and the snapshot, and serves the router on 127.0.0.1:0.
pub async fn serve() -> Fixture {
    let h = Harness::new(ROUTES, now()).await;
    let n = now();
    let today = n - TimeDelta::hours(12);
    let mut all = Vec::new();
    for (route, _) in STATES {
        if *route == LLAMA {
            continue; // never probed: no data anywhere
        }
        // 90 days, 24 probes a day.
        for d in 0..90 {
            let day = today - TimeDelta::days(d);
            for k in 0..24 {
                let t = day + TimeDelta::minutes(k * 50);
                if t > n {
                    continue;
                }
                let bad = match (*route, d) {
                    (OPENAI, 10) => k < 6,    // 25% failures: a critical day
                    (DEEPSEEK, 30) => k == 0, // ~4%: degraded
                    _ => false,
                };
                all.push(outcome(
                    route,
                    OutcomeKind::Probe,
                    t,
                    !bad,
                    1000.0 + (k as f64) * 10.0,
                ));
            }
        }
        // The last 24 hours every 5 minutes (the chart).
        for m in 0..288 {
            let t = n - TimeDelta::minutes(5 * m) + TimeDelta::seconds(30);
            if t > n {
                continue;
            }
            let slow = *route == DEEPSEEK && m < 12;
            let ms = if slow {
                4200.0
            } else {
                900.0 + ((m % 7) as f64) * 60.0
            };
            let mut o = outcome(route, OutcomeKind::Probe, t, true, ms);
            o.model_reported = Some(format!("{}-2026", route.rsplit('/').next().unwrap_or("m")));
            all.push(o);
        }
    }
    // The XSS payloads: an upstream error message and a reported model name.
    let mut bad = outcome(
        OPENAI,
        OutcomeKind::Probe,
        n - TimeDelta::seconds(20),
        false,
        300.0,
    );
    bad.error = Some(ProbeError::Http {
        status: 503,
        message: format!("upstream says {XSS} and key sk-abcdefghijklmnopqrstuvwxyz123456"),
    });
    all.push(bad);
    let mut weird = outcome(
        OPENAI,
        OutcomeKind::Probe,
        n - TimeDelta::seconds(10),
        true,
        800.0,
    );
    weird.model_reported = Some(XSS.to_owned());
    all.push(weird);
    for chunk in all.chunks(2000) {
        h.record(chunk.to_vec()).await;
    }

    // Incidents and transitions: an open one on DeepSeek and OpenAI, a closed one this month.
    let config = h.state.config.current();
    let detection = &config.detection;
    let open = |route: &str, peak: State, mode: FailureMode, mins: i64| Incident {
        id: format!("{route}@{}", n - TimeDelta::minutes(mins)),
        route: id(route),
        opened_at: n - TimeDelta::minutes(mins),
        closed_at: None,
        peak,
        failure_mode: Some(mode),
        transitions: Vec::new(),
        cause: None,
    };
    let deep = open(DEEPSEEK, State::Degraded, FailureMode::Degraded, 40);
    let oai = open(OPENAI, State::Critical, FailureMode::Unavailable, 30);
    let closed = Incident {
        id: format!("{CLAUDE}@old"),
        route: id(CLAUDE),
        opened_at: at("2026-05-03T08:00:00Z"),
        closed_at: Some(at("2026-05-03T08:03:12Z")),
        peak: State::Critical,
        failure_mode: Some(FailureMode::Unavailable),
        transitions: Vec::new(),
        cause: None,
    };
    let transitions = [
        (
            DEEPSEEK,
            State::Normal,
            State::Warning,
            44,
            "latency_above_baseline",
            Some(&deep),
            4200.0,
            true,
        ),
        (
            DEEPSEEK,
            State::Warning,
            State::Degraded,
            40,
            "latency_above_baseline",
            Some(&deep),
            4300.0,
            true,
        ),
        (
            OPENAI,
            State::Normal,
            State::Degraded,
            30,
            "probe_failed",
            Some(&oai),
            300.0,
            false,
        ),
        (
            OPENAI,
            State::Degraded,
            State::Critical,
            29,
            "error_rate_high",
            Some(&oai),
            300.0,
            false,
        ),
    ];
    for (route, from, to, mins, code, inc, ms, ok) in transitions {
        let t = Transition {
            route: id(route),
            from,
            to,
            at: n - TimeDelta::minutes(mins),
            reason: Reason::new(code, format!("{code}: detector text")),
            failure_mode: inc.and_then(|i| i.failure_mode),
            evidence: evidence(ms, ok),
            incident_id: inc.map(|i| i.id.clone()),
        };
        let health = RouteHealth::new(id(route), detection, n);
        h.store
            .writer()
            .record_transition(&t, inc, &health)
            .await
            .unwrap();
    }
    let t = Transition {
        route: id(CLAUDE),
        from: State::Normal,
        to: State::Critical,
        at: closed.opened_at,
        reason: Reason::new("probe_failed", "probes failing"),
        failure_mode: Some(FailureMode::Unavailable),
        evidence: evidence(300.0, false),
        incident_id: Some(closed.id.clone()),
    };
    let health = RouteHealth::new(id(CLAUDE), detection, n);
    h.store
        .writer()
        .record_transition(&t, Some(&closed), &health)
        .await
        .unwrap();

    let mut routes: Vec<RouteStatus> = Vec::new();
    for (route, state) in STATES {
        let mut s = match *state {
            State::Degraded => status(
                route,
                *state,
                "latency_above_baseline",
                "p95 4.2 s above 1.7 s",
            ),
            State::Critical => status(
                route,
                *state,
                "error_rate_high",
                &format!("error rate 25% {XSS}"),
            ),
            State::Warning => status(route, *state, "latency_above_baseline", "one slow probe"),
            State::Switched => status(route, *state, "switched", "traffic moved to the backup"),
            _ => status(route, *state, "", ""),
        };
        match *route {
            DEEPSEEK => {
                s.failure_mode = Some(FailureMode::Degraded);
                s.incident = Some(IncidentSummary::from(&deep));
                // Queueing: the first token late, tokens/s normal.
                s.split = probeok::health::Split {
                    ttft: Some(probeok::health::TtftCheck {
                        observed_ms: 13_000.0,
                        mean_ms: 900.0,
                        stddev_ms: 100.0,
                        threshold_ms: 1_200.0,
                        late: true,
                    }),
                    tps: Some(probeok::health::TpsCheck {
                        observed: 48.2,
                        mean: 50.0,
                        floor: 15.0,
                        low: false,
                    }),
                };
            }
            OPENAI => {
                s.failure_mode = Some(FailureMode::Unavailable);
                s.success_ratio = Some(0.75);
                s.incident = Some(IncidentSummary::from(&oai));
            }
            _ => {}
        }
        routes.push(s);
    }
    let mut snap = snapshot(n, routes);
    snap.findings.push(Finding {
        kind: FindingKind::RequestSide,
        routes: vec![id(CLAUDE)],
        providers: vec!["anthropic".into()],
        code: "request_side".into(),
        text: "probes fine, traffic failing".into(),
    });
    h.publish(snap);
    let s = h.serve().await;
    Fixture { h, s }
}
