//! Drift against fake upstreams (real axum servers on loopback): a route that changes its
//! answer format or its reported model is found within a bounded number of runs — on that
//! route only — and a route with a stable but different style from another is never flagged.
//! Also: malformed sets give located errors, the shipped sets parse and accept known-good
//! answers, the runner records runs and publishes them, and `probeok regress` prints a report.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{fake, json, openai, Reply, Server};
use probeok::clock::SystemClock;
use probeok::drift::{self, DriftKind, History, RegressionSet, SetRun};
use probeok::probe::ProbeClient;
use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};
use serde_json::json as j;

const SET: &str = r#"
name = "mini"
every = "1h"
applies_to = ["chat"]
[params]
max_tokens = 32
stream = false

[[case]]
name = "add"
user = "What is 2 + 2? Reply with the number only."
exact = "4"

[[case]]
name = "json"
user = "Return {\"ok\": true}"
json_schema = { type = "object", required = ["ok"] }

[[case]]
name = "word"
user = "Say hi"
one_of = ["hi", "Hi"]

[[case]]
name = "date"
user = "Today?"
regex = '^\d{4}-\d{2}-\d{2}$'

[[case]]
name = "csv"
user = "1 to 3"
exact = "1,2,3"
"#;

fn set() -> RegressionSet {
    drift::sets::parse(SET, "mini.toml").unwrap()
}

/// A non-streamed OpenAI answer with a chosen model name.
fn body(text: &str, model: &str) -> serde_json::Value {
    let mut v = openai::body(text, "stop", Some(3));
    v["model"] = j!(model);
    v
}

/// Answers each case of [`SET`] from `answers`, keyed by a word of the prompt.
fn answer_for(prompt: &str, fenced: bool) -> String {
    let a = if prompt.contains("2 + 2") {
        "4"
    } else if prompt.contains("ok") {
        r#"{"ok": true}"#
    } else if prompt.contains("hi") {
        "hi"
    } else if prompt.contains("Today") {
        "2026-01-31"
    } else {
        "1,2,3"
    };
    if fenced && (prompt.contains("ok") || prompt.contains("2 + 2")) {
        // The drifted model wraps answers in Markdown — 2 of 5 cases break (40 %).
        format!("```\n{a}\n```")
    } else {
        a.to_owned()
    }
}

fn prompt(c: &common::Captured) -> String {
    c.json()["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn route(server: &Server, provider: &str) -> Route {
    Route {
        id: RouteId::new(provider, "r1", "m"),
        provider: provider.into(),
        region: "r1".into(),
        model: "m".into(),
        kind: ProviderKind::Openai,
        base_url: format!("{}/v1", server.base_url()),
        api_key_env: None,
        serves: "chat".into(),
        tier: Tier::Primary,
        weight: 100,
        price: None,
        capabilities: vec![],
        context_window: None,
        embedding: None,
        residency: None,
        slo: 0.999,
        probe: ProbeSettings {
            interval: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(10),
            jitter: 0.0,
            stream: false,
            max_tokens: 16,
            throughput_every: Duration::from_secs(300),
            throughput_prompt: "count".into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: None,
        },
    }
}

/// A fake whose behaviour switches after `switch_after` requests: `before`/`after` map a
/// prompt to (answer, model).
async fn switching(
    switch_after: usize,
    before: fn(&str) -> (String, String),
    after: fn(&str) -> (String, String),
) -> Server {
    let n = Arc::new(AtomicUsize::new(0));
    let (server, _) = fake("/v1/chat/completions", move |c| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        let p = prompt(c);
        let (text, model) = if i < switch_after {
            before(&p)
        } else {
            after(&p)
        };
        Reply::now(json(axum::http::StatusCode::OK, body(&text, &model)))
    })
    .await;
    server
}

fn good(p: &str) -> (String, String) {
    (answer_for(p, false), "model-v1".into())
}

fn fenced(p: &str) -> (String, String) {
    (answer_for(p, true), "model-v1".into())
}

fn new_model(p: &str) -> (String, String) {
    (answer_for(p, false), "model-v2".into())
}

/// Another provider's house style: always adds a full stop and capitalises — it fails some
/// cases, every run the same way. Stable, so never drift.
fn other_style(p: &str) -> (String, String) {
    let a = answer_for(p, false);
    let styled = if a == "hi" { "Hi.".to_owned() } else { a };
    (styled, "other-model".into())
}

async fn run_rounds(
    routes: &[Route],
    rounds: usize,
    history: &mut History,
) -> Vec<(usize, RouteId, DriftKind)> {
    let client = ProbeClient::new(routes, Arc::new(SystemClock)).unwrap();
    let set = set();
    let mut first_seen = Vec::new();
    for round in 0..rounds {
        for r in routes {
            let run = drift::run_set(&client, r, &set, Duration::ZERO).await;
            for f in history.ingest(run) {
                if !first_seen
                    .iter()
                    .any(|(_, id, k)| id == &f.route && *k == f.kind)
                {
                    first_seen.push((round, f.route.clone(), f.kind));
                }
            }
        }
    }
    first_seen
}

const CASES: usize = 5;

#[tokio::test]
async fn a_format_change_is_found_on_that_route_only() {
    // Route a drifts after 8 good runs; route b stays good; route c has a different but
    // stable style from the start.
    let a = switching(8 * CASES, good, fenced).await;
    let b = switching(usize::MAX, good, good).await;
    let c = switching(usize::MAX, other_style, other_style).await;
    let routes = vec![route(&a, "a"), route(&b, "b"), route(&c, "c")];
    let mut history = History::new(drift::CompareOptions::default());
    let seen = run_rounds(&routes, 14, &mut history).await;

    let drops: Vec<_> = seen
        .iter()
        .filter(|(_, _, k)| *k == DriftKind::PassRateDrop)
        .collect();
    assert_eq!(drops.len(), 1, "{seen:?}");
    let (round, id, _) = drops[0];
    assert_eq!(id, &routes[0].id);
    // The change starts at round 8; two consecutive runs are needed, so round 9 at the
    // earliest; bounded: by round 10.
    assert!((9..=10).contains(round), "found at round {round}");
    assert!(
        seen.iter().all(|(_, id, _)| id == &routes[0].id),
        "only route a: {seen:?}"
    );

    let findings = history.findings();
    let f = findings
        .iter()
        .find(|f| f.kind == DriftKind::PassRateDrop)
        .unwrap();
    assert_eq!(f.severity, drift::Severity::Warning);
    assert_eq!(
        f.failure_mode,
        Some(probeok::health::FailureMode::BehaviorChanged)
    );
    let e = &f.evidence;
    assert_eq!(e.before.rate, Some(1.0), "{e:?}");
    assert!(e.after.rate.unwrap() < 0.8, "{e:?}");
    assert!(e.p_value.unwrap() < 0.001, "{e:?}");
    assert_eq!(e.runs.len(), 2);
    let ex = e
        .examples
        .iter()
        .find(|x| x.case == "json")
        .unwrap_or_else(|| panic!("{e:#?}"));
    assert_eq!(ex.before.as_deref(), Some(r#"{"ok": true}"#));
    assert!(ex.after.as_deref().unwrap().starts_with("```"), "{ex:?}");
    assert_eq!(ex.failures[0].validator, "json_schema");
}

#[tokio::test]
async fn a_reported_model_change_is_an_info_finding() {
    let a = switching(6 * CASES, good, new_model).await;
    let b = switching(usize::MAX, good, good).await;
    let routes = vec![route(&a, "a"), route(&b, "b")];
    let mut history = History::new(drift::CompareOptions::default());
    let seen = run_rounds(&routes, 8, &mut history).await;
    assert_eq!(
        seen,
        vec![(6, routes[0].id.clone(), DriftKind::ModelChanged)],
        "found in the first run with the new model, on route a only"
    );
    let f = &history.findings()[0];
    assert_eq!(f.severity, drift::Severity::Info);
    assert_eq!(f.failure_mode, None);
    let m = f.evidence.model.as_ref().unwrap();
    assert_eq!(m.before_model.as_deref(), Some("model-v1"));
    assert_eq!(m.after_model.as_deref(), Some("model-v2"));
    assert!(!f.is_drift());
}

#[tokio::test]
async fn transport_failures_are_not_drift() {
    let n = Arc::new(AtomicUsize::new(0));
    let (server, _) = fake("/v1/chat/completions", move |c| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        if i >= 6 * CASES {
            return Reply::now(json(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                openai::error("overloaded", "server_error", None),
            ));
        }
        Reply::now(json(
            axum::http::StatusCode::OK,
            body(&answer_for(&prompt(c), false), "m1"),
        ))
    })
    .await;
    let routes = vec![route(&server, "a")];
    let mut history = History::new(drift::CompareOptions::default());
    let seen = run_rounds(&routes, 10, &mut history).await;
    assert!(seen.is_empty(), "{seen:?}");
    let runs = history.runs(&routes[0].id, "mini");
    let last = runs.last().unwrap();
    assert_eq!((last.answered(), last.errors()), (0, CASES));
    assert!(last.cases[0].error.as_deref().unwrap().starts_with("http"));
}

#[test]
fn malformed_sets_give_located_errors() {
    let cases: &[(&str, &str)] = &[
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nregexp = \"x\"\n",
            "bad.toml:7:1: case[0].regexp: unknown key `regexp`",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nregex = \"(\"\n",
            "bad.toml:7:9: case[0].regex: invalid regex",
        ),
        (
            "name = \"x\"\nevery = \"soon\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nexact = \"1\"\n",
            "bad.toml:2:9: every: invalid duration \"soon\"",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\njson_schema = { type = \"object\", format = \"email\" }\n",
            "bad.toml:7:43: case[0].json_schema.format: unsupported JSON Schema keyword `format`",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\n",
            "bad.toml:4:1: case[0]: no validators",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[params]\nmax_tokens = 100000\n[[case]]\nname = \"a\"\nuser = \"q\"\nexact = \"1\"\nexample = \"2\"\n",
            "bad.toml:5:14: params.max_tokens: must be in 1..=4096",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nexact = \"1\"\nexample = \"2\"\n",
            "bad.toml:8:11: case[0].example: the known-good example fails validator exact",
        ),
        (
            "name = \"x\"\nevery = \"1h\"\napplies_to = [\"*\"\n",
            "bad.toml:4:1: invalid array",
        ),
    ];
    for (src, want) in cases {
        let err = drift::sets::parse(src, "bad.toml").unwrap_err().to_string();
        assert!(err.starts_with(want), "want {want:?}\n got {err:?}");
    }
}

fn shipped_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("probes")
}

#[test]
fn shipped_sets_parse_and_accept_known_good_answers() {
    let sets = drift::load_dir(&shipped_dir()).unwrap();
    let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["deterministic", "format", "json"]);
    for s in &sets {
        assert_eq!(s.params.temperature, 0.0, "{}", s.name);
        assert!(s.params.max_tokens <= 128, "{}", s.name);
        for c in &s.cases {
            let good = c
                .example
                .as_deref()
                .unwrap_or_else(|| panic!("{}/{} has an example", s.name, c.name));
            for v in &c.validators {
                assert!(v.check(good).is_ok(), "{}/{}: {}", s.name, c.name, v.name());
            }
        }
    }
    // And they catch the classic silent change: JSON wrapped in a code fence.
    let json = sets.iter().find(|s| s.name == "json").unwrap();
    let person = json
        .cases
        .iter()
        .find(|c| c.name == "extract_person")
        .unwrap();
    let fenced = "```json\n{\"name\": \"Alice Zhang\", \"age\": 34}\n```";
    assert!(person.validators.iter().any(|v| v.check(fenced).is_err()));
    let format = sets.iter().find(|s| s.name == "format").unwrap();
    let word = format.cases.iter().find(|c| c.name == "one_word").unwrap();
    assert!(word
        .validators
        .iter()
        .any(|v| v.check("The capital is Paris.").is_err()));
}

#[test]
fn duplicate_set_names_across_files_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let one = "name = \"dup\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nexact = \"1\"\n";
    std::fs::write(dir.path().join("a.toml"), one).unwrap();
    std::fs::write(dir.path().join("b.toml"), one).unwrap();
    let err = drift::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("b.toml:1:8: name: duplicate set name \"dup\""),
        "{err}"
    );
}

fn summary(passed: usize, failed: &[&str]) -> drift::RunSummary {
    drift::RunSummary {
        started_at: chrono::Utc::now(),
        passed,
        answered: passed + failed.len(),
        errors: 0,
        failed: failed.iter().map(|s| (*s).to_owned()).collect(),
        model: None,
    }
}

#[tokio::test]
async fn quality_gate_refuses_backups_whose_latest_runs_fail() {
    let (server, _) = fake("/x", |_| Reply::now("")).await;
    let mut backup = route(&server, "b");
    backup.tier = Tier::Backup;
    let mut primary = route(&server, "p");
    primary.tier = Tier::Primary;
    let snap = |route: &Route, runs: Vec<drift::RunSummary>| drift::DriftSnapshot {
        generated_at: chrono::Utc::now(),
        findings: vec![],
        sets: vec![drift::SetStatus {
            route: route.id.clone(),
            set: "json".into(),
            runs,
        }],
    };
    // Both latest runs fail: not eligible, and the reason says why.
    let s = snap(
        &backup,
        vec![
            summary(3, &["person: json_schema"]),
            summary(3, &["person: json_schema"]),
        ],
    );
    let e = drift::eligible(&backup, &s).unwrap_err();
    assert_eq!(e.code, "regression_failed");
    assert!(
        e.text.contains("\"json\"") && e.text.contains("person: json_schema"),
        "{}",
        e.text
    );
    // One good run among the latest two: eligible (a single flaky case does not flap it).
    let s = snap(
        &backup,
        vec![summary(4, &[]), summary(3, &["person: json_schema"])],
    );
    assert!(s.eligible(&backup).is_ok());
    // A primary is never gated (its drift is a finding and, with deweight, a lower weight).
    let s = snap(
        &primary,
        vec![summary(0, &["a: exact"]), summary(0, &["a: exact"])],
    );
    assert!(s.eligible(&primary).is_ok());
    // Fallbacks are gated like backups; no runs at all: eligible.
    let mut fallback = backup.clone();
    fallback.tier = Tier::Fallback;
    let s = snap(&fallback, vec![summary(1, &["a: exact"])]);
    assert!(s.eligible(&fallback).is_err());
    assert!(drift::DriftSnapshot::empty(chrono::Utc::now())
        .eligible(&fallback)
        .is_ok());
}

fn config_for(dir: &Path, base_url: &str, sets: &str) -> PathBuf {
    let path = dir.join("probeok.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[storage]
path = "{db}"

[[provider]]
id = "fake"
  [[provider.region]]
  id = "r1"
  base_url = "{base_url}"

[[route]]
provider = "fake"
region = "r1"
model = "m"
serves = "chat"

[drift]
sets = "{sets}"
"#,
            db = dir.join("p.db").display()
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn the_runner_records_runs_and_publishes_findings() {
    let server = switching(usize::MAX, good, good).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sets")).unwrap();
    std::fs::write(
        dir.path().join("sets/mini.toml"),
        SET.replace("every = \"1h\"", "every = \"200ms\""),
    )
    .unwrap();
    let path = config_for(dir.path(), &format!("{}/v1", server.base_url()), "sets");
    let config = probeok::config::Config::load(&path).unwrap().config;
    let routes = config.routes();
    let store = probeok::store::Store::open(&config.storage.path, Default::default()).unwrap();
    let client = ProbeClient::new(&routes, Arc::new(SystemClock)).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let options = drift::RunnerOptions {
        case_gap: Duration::ZERO,
        first_run_within: Duration::from_millis(50),
        heartbeat_every: Duration::from_millis(100),
        jitter: 0.0,
        ..Default::default()
    };
    let handle = drift::spawn(
        &config,
        &routes,
        client,
        store.clone(),
        Arc::new(SystemClock),
        options,
        shutdown.clone(),
    )
    .await
    .unwrap();
    assert_eq!(handle.jobs, vec!["drift"]);
    let mut rx = handle.rx.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let runs = rx.borrow().sets.first().map_or(0, |s| s.runs.len());
        if runs >= 2 {
            break;
        }
        tokio::time::timeout_at(deadline, rx.changed())
            .await
            .expect("two runs within 10 s")
            .unwrap();
    }
    // GET /api/v1/drift serves the snapshot.
    let api = common::spawn(probeok::web::drift::router(handle.rx.clone())).await;
    let body: serde_json::Value = reqwest::get(format!("{}/api/v1/drift", api.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["sets"][0]["set"], "mini");
    assert_eq!(body["sets"][0]["runs"][0]["passed"], 5);
    assert!(body["findings"].as_array().unwrap().is_empty());
    shutdown.cancel();
    handle.task.await.unwrap();
    // Stored, and read back as this route's own history.
    let reader = store.reader().unwrap();
    let stored: Vec<SetRun> = reader.drift_runs(&routes[0].id, "mini", 10).unwrap();
    assert!(stored.len() >= 2, "{}", stored.len());
    assert_eq!(stored[0].cases.len(), CASES);
    assert_eq!(stored[0].passed(), CASES);
    assert_eq!(
        stored[0].cases[0].model_reported.as_deref(),
        Some("model-v1")
    );
    assert!(stored[0].started_at <= stored[1].started_at);
    let beats = reader.heartbeats().unwrap();
    assert!(beats.iter().any(|(job, _)| job == "drift"), "{beats:?}");
    drop(reader);
    store.close().await.unwrap();
}

#[tokio::test]
async fn regress_prints_a_report_and_check_config_lists_sets() {
    let server = switching(usize::MAX, fenced, fenced).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sets")).unwrap();
    std::fs::write(dir.path().join("sets/mini.toml"), SET).unwrap();
    let path = config_for(dir.path(), &format!("{}/v1", server.base_url()), "sets");
    let bin = env!("CARGO_BIN_EXE_probeok");
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(bin)
                .args(args)
                .env_remove("PROBEOK_CONFIG")
                .env("RUST_LOG", "warn")
                .output()
                .unwrap()
        })
    };
    let p = path.display().to_string();
    let out = run(vec!["regress".into(), "--config".into(), p.clone()])
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("route fake/r1/m"), "{stdout}");
    assert!(stdout.contains("set mini: 3/5 passed"), "{stdout}");
    assert!(
        stdout.contains("FAIL  json") && stdout.contains("json_schema: not JSON"),
        "{stdout}"
    );
    assert!(stdout.contains("answer: \"```⏎"), "{stdout}");

    let out = run(vec![
        "regress".into(),
        "--config".into(),
        p.clone(),
        "--json".into(),
    ])
    .await
    .unwrap();
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["set"], "mini");
    assert_eq!(line["cases"].as_array().unwrap().len(), CASES);

    let out = run(vec![
        "regress".into(),
        "--config".into(),
        p.clone(),
        "--set".into(),
        "nope".into(),
    ])
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("unknown regression set \"nope\" (known: mini)"));

    let out = run(vec!["check-config".into(), "--config".into(), p.clone()])
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("1 regression set(s)") && stdout.contains("mini"),
        "{stdout}"
    );

    // A bad set fails check-config and regress with exit 1 and a located error.
    std::fs::write(dir.path().join("sets/bad.toml"), "name = \"bad\"\nevery = \"1h\"\napplies_to = [\"*\"]\n[[case]]\nname = \"a\"\nuser = \"q\"\nregex = \"(\"\n").unwrap();
    for cmd in ["check-config", "regress"] {
        let out = run(vec![cmd.into(), "--config".into(), p.clone()])
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("bad.toml:7:9: case[0].regex: invalid regex"),
            "{cmd}: {stderr}"
        );
    }
}
