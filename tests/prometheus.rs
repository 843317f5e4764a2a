//! A real Prometheus server (Debian's `prometheus`, installed by `scripts/test`) scrapes the
//! router's `/metrics` every second; its HTTP API must report the target `up` with no scrape
//! error and one `probeok_probe_success` series per route. Prometheus listens on loopback
//! only, stores into a temp dir, and is killed when the test ends (also on failure).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::app::*;
use probeok::probe::OutcomeKind;
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";

const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    Spec::new("deepseek", "cn", "deepseek-ai/DeepSeek-V3")
        .serves("chat-main")
        .backup()
        .weight(20),
    Spec::new("local", "lab", "small").serves("chat-lite"),
];

/// Kills (and reaps) the server when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use common::free_port;

fn start_prometheus(dir: &Path, target: std::net::SocketAddr, port: u16) -> Killed {
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} is missing: install Debian's `prometheus` package (scripts/test does)"
    );
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: probeok\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start prometheus");
    Killed(child)
}

async fn api(port: u16, path: &str) -> Option<Value> {
    let r = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .ok()?;
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_metrics_cleanly() {
    let h = Harness::new(ROUTES, at("2026-03-04T12:00:00Z")).await;
    for (i, spec) in ROUTES.iter().enumerate() {
        let route = spec.id();
        let mut o = outcome(
            &route,
            OutcomeKind::Probe,
            at("2026-03-04T12:00:00Z"),
            i != 1,
            700.0,
        );
        o.tokens_per_second = Some(33.0);
        h.state.metrics.observe_outcome(&o);
    }
    let served = h.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _prometheus = start_prometheus(dir.path(), served.addr, port);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "Prometheus never reported the series; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(targets) = api(port, "/api/v1/targets").await else {
            last = "API not answering yet".into();
            continue;
        };
        let target = &targets["data"]["activeTargets"][0];
        last = target.to_string();
        if target["health"] != "up" {
            // A scrape error (e.g. a parse failure of our text) shows up here.
            assert!(
                target["lastError"].as_str().unwrap_or_default().is_empty(),
                "scrape failed: {target}"
            );
            continue;
        }
        assert_eq!(target["lastError"], "", "{target}");
        let Some(q) = api(port, "/api/v1/query?query=probeok_probe_success").await else {
            continue;
        };
        let series = q["data"]["result"].as_array().cloned().unwrap_or_default();
        last = q.to_string();
        if series.len() < ROUTES.len() {
            continue;
        }
        assert_eq!(series.len(), ROUTES.len(), "{q}");
        for s in &series {
            let model = s["metric"]["model"].as_str().unwrap();
            let want = if model == "deepseek-ai/DeepSeek-V3" {
                "0"
            } else {
                "1"
            };
            assert_eq!(s["value"][1], want, "{s}");
        }
        // The other families arrive too (histograms, info).
        let q = api(
            port,
            "/api/v1/query?query=probeok_probe_duration_seconds_count",
        )
        .await
        .unwrap();
        assert_eq!(q["data"]["result"].as_array().unwrap().len(), 2, "{q}");
        let q = api(port, "/api/v1/query?query=probeok_route_weight")
            .await
            .unwrap();
        assert_eq!(q["data"]["result"].as_array().unwrap().len(), 3, "{q}");
        break;
    }
}
