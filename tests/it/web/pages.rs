//! The public HTML pages over real sockets: `/`, `/routes/{id}`, `/incidents` in English and
//! Chinese, the error page, the security headers, and provider text never reaching a page
//! unescaped.

use crate::common;

use common::pages::{serve, CLAUDE, DEEPSEEK, OPENAI, QWEN, STATES, XSS};
use probeok::health::State;
use reqwest::StatusCode;

struct Page {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

async fn get(url: &str, accept_language: Option<&str>) -> Page {
    let mut req = reqwest::Client::new().get(url);
    if let Some(l) = accept_language {
        req = req.header("accept-language", l);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.text().await.unwrap();
    Page {
        status,
        headers,
        body,
    }
}

fn encoded(id: &str) -> String {
    id.replace('/', "%2F")
}

fn zh_state(s: State) -> &'static str {
    match s {
        State::Unknown => "未知",
        State::Normal => "正常",
        State::Warning => "警告",
        State::Degraded => "降级",
        State::Critical => "严重",
        State::Switched => "已切换",
    }
}

fn assert_headers(p: &Page) {
    let h = |n: &str| {
        p.headers
            .get(n)
            .unwrap_or_else(|| panic!("{n} missing"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert!(h("content-type").starts_with("text/html"));
    let csp = h("content-security-policy");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("style-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(h("x-content-type-options"), "nosniff");
    assert_eq!(h("referrer-policy"), "no-referrer");
}

/// No script, no inline style, no external resource: what the CSP would block anyway.
fn assert_self_contained(body: &str) {
    assert!(!body.contains("<script"), "a script tag reached the page");
    assert!(!body.contains(" style="), "inline style");
    assert!(!body.contains("<style"), "style element");
    assert!(
        !body.contains("http://") || !body.contains("src=\"http"),
        "external resource"
    );
    assert!(body.contains(r#"<meta http-equiv="refresh" content="30">"#));
    assert!(body.contains(r#"href="/static/style.css""#));
}

/// The days of each route's bar on `/` (the `sN` spans of its runs), in page order.
fn bar_days(body: &str) -> Vec<usize> {
    body.split("class=\"bar\"")
        .skip(1)
        .map(|bar| {
            let bar = &bar[..bar.find("</span>").unwrap()];
            bar.split("<i class=\"d-")
                .skip(1)
                .map(|i| {
                    let span = i.split(" s").nth(1).unwrap();
                    let end = span.find('"').unwrap();
                    span[..end].parse::<usize>().unwrap()
                })
                .sum()
        })
        .collect()
}

#[tokio::test]
async fn status_page_shows_every_route_in_both_languages() {
    let f = serve().await;
    for (lang, accept) in [
        ("en", None),
        ("zh", None),
        ("zh", Some("zh-CN,zh;q=0.9")),
        ("en", Some("en-GB")),
    ] {
        let url = if accept.is_some() {
            f.s.url("/")
        } else {
            f.s.url(&format!("/?lang={lang}"))
        };
        let p = get(&url, accept).await;
        assert_eq!(p.status, StatusCode::OK);
        assert_headers(&p);
        assert_self_contained(&p.body);
        let b = &p.body;
        assert!(
            b.contains(&format!(
                "<html lang=\"{}",
                if lang == "zh" { "zh-CN" } else { "en" }
            )),
            "{lang}"
        );
        for (route, state) in STATES {
            assert!(b.contains(route), "{route} missing ({lang})");
            assert!(b.contains(&format!("href=\"/routes/{}?lang={lang}\"", encoded(route))));
            assert!(b.contains(state.as_str()), "{state} missing");
            if lang == "zh" {
                assert!(b.contains(zh_state(*state)), "{}", zh_state(*state));
            }
        }
        // Groups, 90 day bars per route, the banner, the incidents on top, the finding.
        for serves in ["chat-main", "chat-lite", "chat-fallback"] {
            assert!(b.contains(serves));
        }
        // One compact line per route: its 90 days as runs of equal days that add up to 90.
        assert_eq!(b.matches("class=\"bar\"").count(), STATES.len());
        assert_eq!(bar_days(b), vec![90; STATES.len()]);
        assert!(b.contains("d-critical") && b.contains("d-degraded") && b.contains("d-normal"));
        assert!(b.contains("id=\"active-incidents\""));
        assert!(b.contains("id=\"findings\""));
        if lang == "en" {
            assert!(b.contains("Some routes are degraded"));
            assert!(b.contains("Active incidents"));
            // The reason in plain words with the numbers.
            assert!(
                b.contains("against a normal of 1.1 s ± 0.3 s for 12:00-13:00"),
                "reason"
            );
            assert!(b.contains("unavailable: errors or timeouts"));
            // The error budget is a detail: on the route page, not on the line. The budget is
            // time: QWEN has no bad probe in 30 days; OPENAI 7 bad probes (6 on May 10, one
            // 20 s ago) × 30 s = 210 s of 2,592 s.
            for (route, want) in [
                (QWEN, "100.0% · 0 s bad of 43.2 min"),
                (OPENAI, "91.9% · 3 m 30 s bad of 43.2 min"),
            ] {
                let page = get(
                    &f.s.url(&format!("/routes/{}?lang=en", encoded(route))),
                    None,
                )
                .await;
                assert!(page.body.contains("Error budget left"), "{route}");
                assert!(page.body.contains(want), "{route}: budget");
            }
        } else {
            assert!(b.contains("部分线路性能下降"));
            assert!(b.contains("进行中的事故"));
            assert!(b.contains("正常水平为 1.1 s ± 0.3 s"));
        }
    }
    f.h.shutdown.cancel();
}

/// Which signal moved, both against their normals: on the route page (zh/en) and in the status
/// API; a healthy route shows none.
#[tokio::test]
async fn route_page_and_status_api_show_both_signals_against_their_baselines() {
    let f = serve().await;
    let en = get(&f.s.url(&format!("/routes/{DEEPSEEK}?lang=en")), None).await;
    assert!(
        en.body
            .contains("first token 13.0 s against a normal of 900 ms · tokens/s 48 against 50"),
        "{}",
        en.body
    );
    let zh = get(&f.s.url(&format!("/routes/{DEEPSEEK}?lang=zh")), None).await;
    assert!(
        zh.body
            .contains("首 token 13.0 s，正常水平为 900 ms · 每秒 token 48，正常为 50"),
        "{}",
        zh.body
    );
    let healthy = get(&f.s.url(&format!("/routes/{QWEN}?lang=en")), None).await;
    assert!(!healthy.body.contains("class=\"why signals\""));

    let status: serde_json::Value = reqwest::get(f.s.url("/api/v1/status"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let route = |id: &str| {
        status["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap()
    };
    let split = &route(DEEPSEEK)["split"];
    assert_eq!(split["code"], "ttft_above_baseline", "{split}");
    assert_eq!(split["ttft"]["observed_ms"], 13_000.0);
    assert_eq!(split["ttft"]["late"], true);
    assert_eq!(split["tps"]["observed"], 48.2);
    assert_eq!(split["tps"]["low"], false);
    assert!(route(QWEN)["split"].is_null());
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn route_page_has_chart_timeline_and_incidents() {
    let f = serve().await;
    for lang in ["en", "zh"] {
        // The id with its slashes percent-encoded, and raw.
        for path in [
            format!("/routes/{}?lang={lang}", encoded(DEEPSEEK)),
            format!("/routes/{DEEPSEEK}?lang={lang}"),
        ] {
            let p = get(&f.s.url(&path), None).await;
            assert_eq!(p.status, StatusCode::OK, "{path}");
            assert_headers(&p);
            assert_self_contained(&p.body);
            let b = &p.body;
            assert!(b.contains(DEEPSEEK));
            assert!(b.contains("DEGRADED"));
            assert!(b.contains("<svg class=\"chart\""));
            assert!(b.contains("<polyline class=\"p95\" points=\""));
            assert!(b.contains("<rect class=\"band\""), "baseline band");
            assert_eq!(b.matches("<i class=\"d-").count(), 90);
            // The timeline with evidence, and the open incident.
            assert!(b.contains("id=\"timeline\""));
            assert!(b.contains("latency_ms"));
            assert!(b.contains("12:00-13:00"));
            assert!(b.contains("id=\"route-incidents\""));
            // What probing the route costs per month, as /api/v1/status's `probe_cost` gives
            // it (the default probe settings; the fixture's routes have no price).
            let cost = if lang == "zh" {
                "id=\"probe-cost\">4,224,096 token（未配置价格）<"
            } else {
                "id=\"probe-cost\">4,224,096 tokens (no price configured)<"
            };
            assert!(b.contains(cost), "{cost} not in the {lang} route page");
            if lang == "zh" {
                assert!(b.contains("状态时间线") && b.contains("进行中"));
            } else {
                assert!(b.contains("State timeline") && b.contains("ongoing"));
            }
        }
    }
    // Every route has a page; the chart even without data.
    for (route, _) in STATES {
        let p = get(&f.s.url(&format!("/routes/{}", encoded(route))), None).await;
        assert_eq!(p.status, StatusCode::OK, "{route}");
        assert!(p.body.contains("<svg class=\"chart\""));
    }
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn incidents_page_accounts_for_the_months_budget() {
    let f = serve().await;
    for lang in ["en", "zh"] {
        let p = get(&f.s.url(&format!("/incidents?lang={lang}")), None).await;
        assert_eq!(p.status, StatusCode::OK);
        assert_headers(&p);
        assert_self_contained(&p.body);
        let b = &p.body;
        for r in [DEEPSEEK, OPENAI, CLAUDE] {
            assert!(b.contains(r), "{r}");
        }
        assert!(!b.contains(&format!(">{QWEN}<")));
        assert!(b.contains("2026-05"));
        if lang == "en" {
            assert!(b.contains("Where this month&#39;s error budget went"));
            // OPENAI's month: 7 bad probes × 30 s = 210 s of 2,678.4 s (0.999 of May). Its
            // open incident (30 min) holds one of them; the other 6 are outside incidents.
            assert!(b.contains("3 m 30 s (7.8%)"), "the route's month");
            assert!(
                b.contains("<strong>30 s</strong>"),
                "the open incident's bad time"
            );
            assert!(b.contains("1.1% of the route"));
            assert!(b.contains("<strong>3 m</strong>"), "the rest");
            assert!(b.contains("bad probes outside incidents"));
            assert!(b.contains("6.7% of the route"));
            // The closed CLAUDE incident (May 3) is older than the raw results kept (14 days).
            assert!(b.contains("older than the raw results kept"));
            assert!(
                !b.contains("<strong>3 m 12 s</strong>"),
                "no longer its duration"
            );
        } else {
            assert!(b.contains("本月错误预算花在了哪里"));
            assert!(b.contains("<strong>30 秒</strong>"));
            assert!(b.contains("事故之外的坏探测"));
        }
    }
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn unknown_route_is_a_404_error_page() {
    let f = serve().await;
    for (path, lang) in [
        ("/routes/nope%2Fx%2Fy?lang=en", "en"),
        ("/routes/not-an-id?lang=zh", "zh"),
    ] {
        let p = get(&f.s.url(path), None).await;
        assert_eq!(p.status, StatusCode::NOT_FOUND);
        assert_headers(&p);
        assert!(p.body.contains("id=\"error\""));
        assert!(p.body.contains(if lang == "en" {
            "Not found"
        } else {
            "页面不存在"
        }));
    }
    let css = reqwest::get(f.s.url("/static/style.css")).await.unwrap();
    assert_eq!(css.status(), StatusCode::OK);
    assert!(css.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    assert!(css.text().await.unwrap().contains(".days"));
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn provider_text_never_reaches_a_page_unescaped() {
    const ESCAPED: &str = "&#60;script&#62;alert(1)&#60;/script&#62;";
    let f = serve().await;
    let mut pages = vec!["/".to_owned(), "/incidents".to_owned()];
    for (route, _) in STATES {
        pages.push(format!("/routes/{}", encoded(route)));
    }
    let mut seen_escaped = 0;
    for lang in ["en", "zh"] {
        for path in &pages {
            let p = get(&f.s.url(&format!("{path}?lang={lang}")), None).await;
            assert_eq!(p.status, StatusCode::OK, "{path}");
            assert!(!p.body.contains(XSS), "{path} carries the script unescaped");
            assert!(!p.body.contains("<script"), "{path}");
            assert!(
                !p.body.contains("sk-abcdefghijklmnop"),
                "{path} shows a key"
            );
            if p.body.contains(ESCAPED) {
                seen_escaped += 1;
            }
        }
    }
    // The error message and the reported model are shown (escaped) on OpenAI's page, and the
    // reason detail on `/` is replaced by our own words.
    let p = get(
        &f.s.url(&format!("/routes/{}?lang=en", encoded(OPENAI))),
        None,
    )
    .await;
    assert!(p
        .body
        .contains(&format!("HTTP 503: upstream says {ESCAPED}")));
    assert!(
        p.body.contains(&format!("<dd>{ESCAPED}</dd>")),
        "model_reported"
    );
    assert!(p.body.contains("[redacted]"));
    assert!(seen_escaped >= 2, "{seen_escaped}");
    f.h.shutdown.cancel();
}

#[tokio::test]
async fn the_extra_cost_budget_is_on_the_status_page_in_both_languages() {
    let f = common::pages::serve().await;
    let page = |lang: &'static str| {
        let url = f.s.url(&format!("/?lang={lang}"));
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    // No budget attached: no line.
    assert!(!page("en").await.contains(r#"id="budget""#));
    let budget = probeok::extra_cost::ExtraCost::new(
        probeok::config::ExtraCostConfig {
            max_extra_cost_per_hour: 300.0,
            degrade_at: 0.8,
        },
        &f.h.state.routes,
        f.h.state.clock.clone(),
        None,
    );
    f.h.state.metrics.attach_budget(budget);
    let en = page("en").await;
    assert!(
        en.contains("Extra cost of serving off the primaries this hour: 0.00 of 300.00 (0.0%)"),
        "{en}"
    );
    let zh = page("zh").await;
    assert!(zh.contains("本小时非主线路额外成本：0.00 / 300.00"), "{zh}");
}

#[tokio::test]
async fn a_switched_model_is_on_the_status_page_in_both_languages() {
    let f = common::pages::serve().await;
    let page = |lang: &'static str| {
        let url = f.s.url(&format!("/?lang={lang}"));
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    assert!(!page("en").await.contains(r#"id="switches""#));
    let budget = probeok::extra_cost::ExtraCost::new(
        probeok::config::ExtraCostConfig::default(),
        &f.h.state.routes,
        f.h.state.clock.clone(),
        None,
    );
    let since = common::pages::now() - chrono::TimeDelta::minutes(3);
    let backup = probeok::route::RouteId::parse(DEEPSEEK).unwrap();
    let status = probeok::switch::SwitchStatus {
        generated_at: common::pages::now(),
        models: vec![probeok::switch::ModelSwitch {
            serves: "chat-main".into(),
            primaries: vec![probeok::route::RouteId::parse(QWEN).unwrap()],
            phase: probeok::switch::Phase::Switched {
                backup: backup.clone(),
                since,
                wait_from: since,
                healthy_since: None,
            },
            dwell_until: None,
            switches_last_hour: 1,
        }],
        budget: budget.snapshot(),
    };
    let (_tx, rx) = tokio::sync::watch::channel(std::sync::Arc::new(status));
    f.h.state.metrics.attach_switch(rx);
    let en = page("en").await;
    assert!(
        en.contains(&format!(
            "chat-main: traffic switched to backup {backup} since"
        )),
        "{en}"
    );
    let zh = page("zh").await;
    assert!(zh.contains("流量已切换到备用线路"), "{zh}");
}
