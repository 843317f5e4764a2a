//! The status page at a thousand routes over real sockets: one compact line per route under
//! the size bound, models and routes worst first, and the `?q=` filter; past a thousand
//! routes, lines for the worst thousand only, the rest a link per model (`?serves=`).

use crate::common;

use common::app::*;
use common::scale::{fixture, fixture_of, now, state_of, ROUTES};
use probeok::health::{IncidentSummary, RouteStatus, State};
use probeok::web::pages::{MAX_FOLDED_MODELS, MAX_INCIDENT_LINES, MAX_LINES};
use reqwest::StatusCode;

/// The page's weight bound at a thousand routes × 90 days.
const MAX_BYTES: usize = 1_500_000;

async fn page(s: &Served, path: &str) -> (StatusCode, String) {
    let r = reqwest::get(s.url(path)).await.unwrap();
    (r.status(), r.text().await.unwrap())
}

fn href(id: &str, lang: &str) -> String {
    format!("href=\"/routes/{}?lang={lang}\"", id.replace('/', "%2F"))
}

/// How bad a state class is, as the page orders it.
fn rank(class: &str) -> u8 {
    match class {
        "st-critical" => 4,
        "st-degraded" | "st-switched" => 3,
        "st-warning" => 2,
        "st-normal" => 1,
        _ => 0,
    }
}

/// The state class right after `marker` for every occurrence, in page order.
fn classes_after<'a>(body: &'a str, marker: &str) -> Vec<&'a str> {
    body.split(marker)
        .skip(1)
        .map(|rest| {
            let rest = &rest[rest.find("class=\"badge ").unwrap() + 13..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect()
}

#[tokio::test]
async fn a_thousand_routes_fit_in_the_bound_worst_first() {
    let (h, s, ids) = fixture().await;
    for lang in ["en", "zh"] {
        let (status, body) = page(&s, &format!("/?lang={lang}")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.len() < MAX_BYTES,
            "{lang}: {} bytes at {ROUTES} routes",
            body.len()
        );
        for id in &ids {
            assert!(body.contains(&href(id, lang)), "{id} missing ({lang})");
        }
        assert_eq!(body.matches("class=\"bar\"").count(), ROUTES);
        assert_eq!(body.matches("<tr><td class=\"rt\">").count(), ROUTES);
        assert!(body.contains(&format!("{ROUTES} ")), "the route count");
        // Models worst first, and the routes of each model worst first.
        let groups = classes_after(&body, "<h2 class=\"group\"");
        assert_eq!(groups.len(), 100);
        assert!(
            groups.windows(2).all(|w| rank(w[0]) >= rank(w[1])),
            "{groups:?}"
        );
        for section in body.split("<h2 class=\"group\"").skip(1) {
            let rows = classes_after(section, "<tr><td class=\"rt\">");
            assert_eq!(rows.len(), 10);
            assert!(
                rows.windows(2).all(|w| rank(w[0]) >= rank(w[1])),
                "{rows:?}"
            );
        }
        // The bad days stand out with their own tooltip.
        assert!(body.contains("d-critical s1\" title=\"2026-05-17 0.00% · "));
    }
    h.shutdown.cancel();
}

#[tokio::test]
async fn the_filter_keeps_matching_routes_only() {
    let (h, s, ids) = fixture().await;
    // A provider: `p3/…` (50 routes); a substring is case-insensitive.
    let (status, body) = page(&s, "/?lang=en&q=P3%2F").await;
    assert_eq!(status, StatusCode::OK);
    let kept: Vec<&String> = ids.iter().filter(|i| i.starts_with("p3/")).collect();
    assert_eq!(kept.len(), 50);
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), 50);
    for id in &ids {
        assert_eq!(
            body.contains(&href(id, "en")),
            id.starts_with("p3/"),
            "{id}"
        );
    }
    assert!(body.contains("50 / 1000 routes"), "the filter's count");
    assert!(body.contains("value=\"P3/\""), "the form keeps the filter");
    // A glob over the route id: every route of region r2 (200 routes).
    let (_, body) = page(&s, "/?lang=en&q=*%2Fr2%2F*").await;
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), 200);
    // One route by its whole id.
    let (_, body) = page(&s, "/?lang=zh&q=p7%2Fr1%2Fm27").await;
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), 1);
    assert!(body.contains(&href("p7/r1/m27", "zh")));
    // Nothing matches: said so, in the language.
    let (status, body) = page(&s, "/?lang=zh&q=nosuchprovider").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("id=\"no-match\""));
    assert!(body.contains("没有线路符合此筛选条件"));
    // A filter too long is a 400 error page, not a slow scan.
    let (status, body) = page(&s, &format!("/?q={}", "x".repeat(201))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("Bad request"));
    h.shutdown.cancel();
}

#[tokio::test]
async fn past_a_thousand_lines_the_worst_are_drawn_and_the_rest_are_a_link_per_model() {
    // 2,500 routes in 1,250 models of two: more lines and more models than the page lists.
    const N: usize = 2500;
    let (h, s, ids) = fixture_of(N, 2, 2).await;
    let (status, body) = page(&s, "/?lang=en").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.len() < MAX_BYTES, "{} bytes at {N} routes", body.len());
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), MAX_LINES);
    // Every route worse than WARNING has its line (fewer than MAX_LINES of them).
    let bad: Vec<&String> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            matches!(
                state_of(*i, 2),
                State::Critical | State::Degraded | State::Switched
            )
        })
        .map(|(_, id)| id)
        .collect();
    assert!(bad.len() < MAX_LINES && bad.len() > 500, "{}", bad.len());
    for id in &bad {
        assert!(body.contains(&href(id, "en")), "{id} has no line");
    }
    // Models worst first still; those past the lines fold into one link each, up to a bound,
    // and the page says how many more it left out.
    let groups = classes_after(&body, "<h2 class=\"group\"");
    assert!(
        groups.windows(2).all(|w| rank(w[0]) >= rank(w[1])),
        "{groups:?}"
    );
    let sections: Vec<&str> = body.split("<h2 class=\"group\"").skip(1).collect();
    let folded = sections
        .iter()
        .filter(|s| !s.contains("<table class=\"lines\">"))
        .count();
    assert_eq!(folded, MAX_FOLDED_MODELS);
    let drawn = sections.len() - folded;
    let hidden = 1250 - drawn - folded;
    assert!(
        body.contains(&format!(
            "{hidden} more models, all better than those listed"
        )),
        "the hidden models' count ({hidden})"
    );
    for section in sections.iter().filter(|s| !s.contains("<table")) {
        assert!(section.contains("2 routes, none of them among the worst listed above"));
        assert!(section.contains("href=\"/?serves=model-"));
    }
    assert!(
        body.contains(&format!("{N} ")),
        "the route count is of all routes"
    );

    // A model's link lists its routes, every one of them, and says what it filters.
    let (status, body) = page(&s, "/?serves=model-7&lang=en").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), 2);
    for id in ["p14/r0/m14", "p15/r0/m15"] {
        assert!(body.contains(&href(id, "en")), "{id}");
    }
    assert!(body.contains("model model-7 only"));
    assert!(
        body.contains("name=\"serves\" value=\"model-7\""),
        "the form keeps it"
    );

    // A provider-wide outage: every route CRITICAL with an incident. The page still fits,
    // listing the oldest incidents and counting the rest.
    let down: Vec<RouteStatus> = ids
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut st = with_state(normal(r, now()), State::Critical, "probes_failing");
            st.incident = Some(IncidentSummary {
                id: format!("inc-{i}"),
                opened_at: now() - chrono::TimeDelta::seconds(i as i64),
                peak: State::Critical,
                failure_mode: None,
            });
            st
        })
        .collect();
    h.publish(snapshot(now(), down));
    let (_, body) = page(&s, "/?lang=en").await;
    assert!(body.len() < MAX_BYTES, "{} bytes in the outage", body.len());
    let box_ = &body[body.find("id=\"active-incidents\"").unwrap()..];
    let box_ = &box_[..box_.find("</section>").unwrap()];
    assert_eq!(box_.matches("<li>").count(), MAX_INCIDENT_LINES);
    assert!(
        box_.contains(&href(&ids[N - 1], "en")),
        "the oldest is listed first"
    );
    assert!(box_.contains(&format!(
        "and {} more active incidents",
        N - MAX_INCIDENT_LINES
    )));
    assert_eq!(body.matches("<tr><td class=\"rt\">").count(), MAX_LINES);

    // The same outage judged on one shared cause: one line for all its routes.
    let one_cause: Vec<RouteStatus> = ids
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut st = with_state(normal(r, now()), State::Degraded, "shared_cause");
            st.incident = Some(IncidentSummary {
                id: format!("inc-{i}"),
                opened_at: now() - chrono::TimeDelta::seconds(i as i64),
                peak: State::Degraded,
                failure_mode: None,
            });
            // The first route alone failed otherwise.
            st.cause = (i > 0).then(|| "p0/r0:connection_refused".to_owned());
            st
        })
        .collect();
    h.publish(snapshot(now(), one_cause));
    let (_, body) = page(&s, "/?lang=en").await;
    let box_ = &body[body.find("id=\"active-incidents\"").unwrap()..];
    let box_ = &box_[..box_.find("</section>").unwrap()];
    assert_eq!(box_.matches("<li>").count(), 2, "{box_}");
    assert!(
        box_.contains(&format!(
            "{} routes with one cause: p0/r0:connection_refused",
            N - 1
        )),
        "{box_}"
    );
    assert!(box_.contains(&href(&ids[0], "en")));
    assert!(!box_.contains("more active incidents"));
    h.shutdown.cancel();
}
