//! The simulator over a real socket, as the probe client and the demo see it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use probeok::sim::{base_url, serve, Scenario, SimConfig};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

fn probe_body(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "Reply with exactly: PROBE_OK"},
            {"role": "user", "content": "health check"}
        ],
        "max_tokens": 16,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

/// The `data:` payloads of an SSE body, with the arrival time of the read that carried them.
async fn sse_events(resp: reqwest::Response) -> Vec<(Instant, String)> {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    out.push((Instant::now(), data.to_owned()));
                }
            }
        }
    }
    out
}

fn content_of(events: &[(Instant, String)]) -> (Vec<String>, Vec<Value>) {
    let mut tokens = Vec::new();
    let mut chunks = Vec::new();
    for (_, data) in events {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            if !c.is_empty() {
                tokens.push(c.to_owned());
            }
        }
        chunks.push(v);
    }
    (tokens, chunks)
}

#[tokio::test]
async fn speaks_openai_chat_completions_and_stops_on_shutdown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(
        listener,
        SimConfig::standalone(Scenario::Healthy),
        shutdown.clone(),
    ));
    let base = base_url(addr, "sim", "r1");
    let client = reqwest::Client::new();
    let url = format!("{base}/chat/completions");

    let streaming = async {
        let resp = client
            .post(&url)
            .json(&probe_body("sim-large", true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let events = sse_events(resp).await;
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let (tokens, chunks) = content_of(&events);
        assert_eq!(tokens.concat(), "PROBE_OK");
        assert!((2..=3).contains(&tokens.len()), "{tokens:?}");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let finish: Vec<&Value> = chunks
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(finish.len(), 1);
        assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], tokens.len());
        assert_eq!(usage["model"], "sim-large");
        assert!(usage["system_fingerprint"].is_string());
    };

    let non_streaming = async {
        let resp = client
            .post(&url)
            .json(&probe_body("sim-small", false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "PROBE_OK");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["model"], "sim-small");
        assert!(v["system_fingerprint"].is_string());
        assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 2);
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    };

    let throughput = async {
        let body = json!({
            "model": "sim-large",
            "messages": [{"role": "user", "content":
                "Count from 1 to 40, separated by single spaces. Reply with the numbers only."}],
            "max_tokens": 128,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let resp = client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let events = sse_events(resp).await;
        let (tokens, chunks) = content_of(&events);
        let expected: Vec<String> = (1..=40).map(|n| n.to_string()).collect();
        assert_eq!(tokens.concat(), expected.join(" "));
        assert_eq!(tokens.len(), 40);
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 40);
        // Paced at ~50 tok/s: 39 gaps of ~20 ms.
        let first = events
            .iter()
            .find(|(_, d)| d.contains("\"content\":\"1\""))
            .unwrap()
            .0;
        let last = events.last().unwrap().0;
        let tps = 39.0 / (last - first).as_secs_f64();
        assert!((35.0..70.0).contains(&tps), "{tps} tok/s");
    };

    let unknown_model = async {
        let resp = client
            .post(&url)
            .json(&probe_body("gpt-nope", true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-nope"));
        assert!(v["error"]["type"].is_string());
    };

    let models = async {
        let v: Value = client
            .get(format!("{base}/models"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["sim-large", "sim-small"]);
    };

    tokio::join!(streaming, non_streaming, throughput, unknown_model, models);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("server stops promptly")
        .unwrap()
        .unwrap();
    let after = reqwest::Client::new()
        .post(&url)
        .json(&probe_body("sim-large", false))
        .send()
        .await;
    assert!(after.is_err(), "still answering after shutdown");
}

/// The latency spike queues after its headers with no keep-alive comments (as vLLM-style
/// servers do). Probed for real and judged by the detector against a 1.1 s baseline, it is
/// slowness — DEGRADED with failure mode `degraded` — never an outage.
#[tokio::test]
async fn a_spike_without_keepalives_is_degraded_not_unavailable() {
    use probeok::clock::SystemClock;
    use probeok::config::DetectionConfig;
    use probeok::health::{Baseline, Detector, FailureMode, State};
    use probeok::probe::{OutcomeKind, ProbeClient};
    use probeok::route::{ProbeSettings, ProviderKind, Route, RouteId, Tier};

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    // Twelve minutes in: two minutes into the 23-minute spike, in real time.
    tokio::spawn(probeok::sim::serve_from(
        listener,
        SimConfig::standalone(Scenario::LatencySpike),
        Duration::from_secs(12 * 60),
        shutdown.clone(),
    ));
    let route = Route {
        id: RouteId::new("sim", "r1", "sim-large"),
        provider: "sim".into(),
        region: "r1".into(),
        model: "sim-large".into(),
        kind: ProviderKind::Openai,
        base_url: base_url(addr, "sim", "r1"),
        api_key_env: None,
        serves: "chat-main".into(),
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
            timeout: Duration::from_secs(45),
            jitter: 0.0,
            stream: true,
            max_tokens: 16,
            throughput_every: Duration::from_secs(300),
            throughput_prompt:
                "Count from 1 to 40, separated by single spaces. Reply with the numbers only."
                    .into(),
            throughput_max_tokens: 128,
            system: "Reply with exactly: PROBE_OK".into(),
            user: "health check".into(),
            expect: "PROBE_OK".into(),
            confirm_after: None,
        },
    };
    let client = ProbeClient::new(std::slice::from_ref(&route), Arc::new(SystemClock)).unwrap();
    let outcomes =
        futures_util::future::join_all((0..4).map(|_| client.probe(&route, OutcomeKind::Probe)))
            .await;
    for o in &outcomes {
        assert!(o.success, "a queued request is a slow success: {o:?}");
    }
    assert!(
        outcomes.iter().filter(|o| o.total_ms > 2000.0).count() >= 3,
        "the spike is slow: {outcomes:?}"
    );

    // Judge them 30 s apart, after a learned baseline of 1.1 s ± 0.15 s.
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let t0 = chrono::Utc::now();
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let mut h = det.route(route.id.clone(), at(-3000));
    let mut b = Baseline::new(route.id.clone(), &cfg);
    let healthy = &outcomes[0];
    for i in 0..100i64 {
        let mut o = healthy.clone();
        o.started_at = at(-3000 + 30 * i);
        o.total_ms = if i % 2 == 0 { 950.0 } else { 1250.0 };
        o.ttft_ms = Some(o.total_ms * 0.8);
        o.ttfb_ms = Some(200.0);
        det.ingest(&mut h, &mut b, &o, o.started_at);
    }
    assert_eq!(h.state(), State::Normal);
    let mut slow: Vec<_> = outcomes
        .into_iter()
        .filter(|o| o.total_ms > 2000.0)
        .collect();
    slow.truncate(3);
    for (i, mut o) in slow.into_iter().enumerate() {
        o.started_at = at(30 * i as i64);
        det.ingest(&mut h, &mut b, &o, o.started_at);
    }
    assert_eq!(h.state(), State::Degraded);
    assert_eq!(h.failure_mode(), Some(FailureMode::Degraded));
    shutdown.cancel();
}
