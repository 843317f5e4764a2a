//! A real browser: headless Chromium loads `/`, `/routes/{id}` and `/incidents` of a served
//! monitor whose routes are in several states, in English and Chinese; the rendered DOM must
//! have every route, its state text, the 90 day bars and the chart. Screenshots are kept under
//! `target/screenshots/` as test artifacts.
//!
//! Needs `/usr/bin/chromium` (Debian's `chromium`; `scripts/test` installs it). Set
//! `PROBEOK_CHROMIUM` to use another binary.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::pages::{serve, DEEPSEEK, OPENAI, STATES, XSS};

fn chromium() -> PathBuf {
    std::env::var_os("PROBEOK_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// Runs headless Chromium with `extra` then `url`; returns stdout.
async fn run_chromium(extra: &[String], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(extra)
    .arg(url)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("chromium finished within 90 s")
        .expect("chromium runs (install Debian's `chromium`)");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn dump_dom(url: &str) -> String {
    run_chromium(&["--dump-dom".to_owned()], url).await
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(url: &str, name: &str, size: &str) -> PathBuf {
    let path = screenshots_dir().join(name);
    let _ = std::fs::remove_file(&path);
    run_chromium(
        &[
            format!("--screenshot={}", path.display()),
            format!("--window-size={size}"),
        ],
        url,
    )
    .await;
    let meta = std::fs::metadata(&path).expect("screenshot written");
    assert!(
        meta.len() > 10_000,
        "{} is too small to show a page",
        path.display()
    );
    path
}

fn encoded(id: &str) -> String {
    id.replace('/', "%2F")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_every_page_in_both_languages() {
    if !chromium().exists() {
        panic!(
            "{} is missing: install Debian's `chromium` (scripts/test does)",
            chromium().display()
        );
    }
    let f = serve().await;
    for lang in ["en", "zh"] {
        // `/`: every route, its state, 90 bars each, the banner.
        let dom = dump_dom(&f.s.url(&format!("/?lang={lang}"))).await;
        assert!(dom.contains("id=\"overall\""), "{lang}: banner");
        for (route, state) in STATES {
            assert!(dom.contains(route), "{lang}: {route} missing from the DOM");
            assert!(dom.contains(state.as_str()), "{lang}: {state} missing");
        }
        assert_eq!(
            dom.matches("class=\"bar\"").count(),
            STATES.len(),
            "{lang}: a 90-day bar per route"
        );
        assert!(!dom.contains(XSS));
        if lang == "zh" {
            assert!(dom.contains("<html lang=\"zh-CN\""));
            for w in [
                "正常",
                "降级",
                "严重",
                "警告",
                "已切换",
                "未知",
                "最近 90 天",
            ] {
                assert!(dom.contains(w), "zh: {w}");
            }
        } else {
            assert!(dom.contains("Last 90 days"));
        }

        // `/routes/{id}` with a `/` in the model name: the chart and the timeline.
        let dom = dump_dom(&f.s.url(&format!("/routes/{}?lang={lang}", encoded(DEEPSEEK)))).await;
        assert!(dom.contains(DEEPSEEK));
        assert!(dom.contains("DEGRADED"));
        assert!(dom.contains("<svg class=\"chart\""), "{lang}: chart");
        assert!(dom.contains("<polyline class=\"p50\" points=\""));
        assert!(dom.contains("<rect class=\"band\""));
        assert_eq!(dom.matches("<i class=\"d-").count(), 90);
        assert!(dom.contains("id=\"timeline\""));

        let dom = dump_dom(&f.s.url(&format!("/routes/{}?lang={lang}", encoded(OPENAI)))).await;
        assert!(dom.contains("CRITICAL"));
        assert!(!dom.contains(XSS), "{lang}: script reached the DOM");
        assert!(
            !dom.contains("<script"),
            "{lang}: a script element was created"
        );

        // `/incidents`: history and the month's budget account.
        let dom = dump_dom(&f.s.url(&format!("/incidents?lang={lang}"))).await;
        assert!(dom.contains("id=\"budget\"") && dom.contains("id=\"history\""));
        assert!(dom.contains(OPENAI) && dom.contains(DEEPSEEK));

        // Screenshots to look at.
        screenshot(
            &f.s.url(&format!("/?lang={lang}")),
            &format!("status-{lang}.png"),
            "1280,2000",
        )
        .await;
        screenshot(
            &f.s.url(&format!("/routes/{}?lang={lang}", encoded(DEEPSEEK))),
            &format!("route-{lang}.png"),
            "1280,2000",
        )
        .await;
        screenshot(
            &f.s.url(&format!("/incidents?lang={lang}")),
            &format!("incidents-{lang}.png"),
            "1280,2000",
        )
        .await;
    }
    // A phone.
    screenshot(&f.s.url("/?lang=zh"), "status-zh-phone.png", "390,1600").await;
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn chromium_renders_a_thousand_routes() {
    let (h, s, ids) = common::scale::fixture().await;
    let dom = dump_dom(&s.url("/?lang=en")).await;
    assert_eq!(dom.matches("class=\"bar\"").count(), ids.len());
    for id in &ids {
        assert!(dom.contains(id.as_str()), "{id} missing from the DOM");
    }
    screenshot(&s.url("/?lang=en"), "status-1000-en.png", "1280,2000").await;
    screenshot(
        &s.url("/?lang=zh&q=p3%2F"),
        "status-1000-zh-filtered.png",
        "1280,2000",
    )
    .await;
    screenshot(&s.url("/?lang=en"), "status-1000-en-phone.png", "390,1600").await;
    h.shutdown.cancel();
}
