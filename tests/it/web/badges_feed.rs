//! Badges and the incident feed over real sockets: the SVG badges parse as XML and carry the
//! route's figures and states, and `/incidents.atom` parses as XML and follows an incident
//! from its opening to its resolution, in English and Chinese.

use crate::common;

use chrono::Duration as D;
use common::app::*;
use probeok::health::State;
use probeok::probe::OutcomeKind;
use reqwest::StatusCode;

const QWEN: &str = "qwen/cn-beijing/qwen-max";
const DS: &str = "deepseek/cn/v3";
const LITE: &str = "local/lab/small";

const ROUTES: &[Spec<'static>] = &[
    Spec::new("qwen", "cn-beijing", "qwen-max")
        .serves("chat-main")
        .weight(80),
    Spec::new("deepseek", "cn", "v3")
        .serves("chat-main")
        .backup()
        .weight(20),
    Spec::new("local", "lab", "small").serves("chat/lite"),
];

fn now() -> chrono::DateTime<chrono::Utc> {
    at("2026-03-04T12:00:00Z")
}

struct Svg {
    status: StatusCode,
    content_type: String,
    cache_control: String,
    body: String,
}

async fn fetch(url: &str) -> Svg {
    let r = reqwest::get(url).await.unwrap();
    let h = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (content_type, cache_control) = (h("content-type"), h("cache-control"));
    Svg {
        status: r.status(),
        content_type,
        cache_control,
        body: r.text().await.unwrap(),
    }
}

/// The badge parsed as SVG: its `<title>` and the texts it draws (label, value).
fn parse_badge(svg: &Svg) -> (String, Vec<String>) {
    assert_eq!(svg.status, StatusCode::OK, "{}", svg.body);
    assert!(
        svg.content_type.starts_with("image/svg+xml"),
        "{}",
        svg.content_type
    );
    assert!(
        svg.cache_control.contains("max-age="),
        "{}",
        svg.cache_control
    );
    let doc = roxmltree::Document::parse(&svg.body).expect("the badge is XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let width: f64 = root.attribute("width").unwrap().parse().unwrap();
    assert!(width > 20.0);
    let title = root
        .descendants()
        .find(|n| n.has_tag_name("title"))
        .and_then(|n| n.text())
        .unwrap()
        .to_owned();
    let mut texts: Vec<String> = root
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(str::to_owned))
        .collect();
    // Each text is drawn twice (shadow, then text).
    texts.dedup();
    (title, texts)
}

#[tokio::test]
async fn badges_are_svg_with_the_routes_figures_and_states() {
    let h = Harness::new(ROUTES, now()).await;
    // qwen: 3 of 4 in the last day, 4 of 4 ten days ago → 24h 75%, 7d 75%, 30d 87.5%.
    let mut outcomes = Vec::new();
    for (k, ok) in [true, false, true, true].into_iter().enumerate() {
        let t = now() - D::hours(2 + k as i64);
        outcomes.push(outcome(QWEN, OutcomeKind::Probe, t, ok, 900.0));
        let old = now() - D::days(10) - D::hours(k as i64);
        outcomes.push(outcome(QWEN, OutcomeKind::Probe, old, true, 900.0));
    }
    h.record(outcomes).await;
    h.publish(snapshot(
        now(),
        vec![
            with_state(normal(QWEN, now() - D::hours(1)), State::Critical, "errors"),
            normal(DS, now() - D::hours(1)),
            with_state(normal(LITE, now() - D::hours(1)), State::Degraded, "slow"),
        ],
    ));
    let s = h.serve().await;

    for (window, value) in [("24h", "75.00%"), ("7d", "75.00%"), ("30d", "87.50%")] {
        let b = fetch(&s.url(&format!("/badges/{QWEN}/uptime.svg?window={window}"))).await;
        let (title, texts) = parse_badge(&b);
        assert_eq!(
            texts,
            [format!("uptime {window}"), value.to_owned()],
            "{window}"
        );
        assert_eq!(title, format!("uptime {window}: {value}"));
    }
    // 30 days by default; the route's id may be percent-encoded; no data is said so.
    let (_, texts) = parse_badge(&fetch(&s.url(&format!("/badges/{QWEN}/uptime.svg"))).await);
    assert_eq!(texts[1], "87.50%");
    let encoded = QWEN.replace('/', "%2F");
    let (_, texts) =
        parse_badge(&fetch(&s.url(&format!("/badges/{encoded}/uptime.svg?window=24h"))).await);
    assert_eq!(texts[1], "75.00%");
    let (_, texts) = parse_badge(&fetch(&s.url(&format!("/badges/{DS}/uptime.svg"))).await);
    assert_eq!(texts[1], "no data");

    // States: a route's, and a model's (the best of its primaries: qwen is chat-main's only
    // primary, so the normal backup does not lift it).
    let (_, texts) = parse_badge(&fetch(&s.url(&format!("/badges/{QWEN}/state.svg"))).await);
    assert_eq!(texts, [QWEN, "CRITICAL"]);
    let b = fetch(&s.url(&format!("/badges/{DS}/state.svg"))).await;
    assert!(b.body.contains("#1a7f37"), "a normal route is green");
    assert_eq!(parse_badge(&b).1, [DS, "NORMAL"]);
    let (_, texts) = parse_badge(&fetch(&s.url("/badges/model/chat-main/state.svg")).await);
    assert_eq!(texts, ["chat-main", "CRITICAL"]);
    // A model name with a slash, and Chinese.
    let (_, texts) = parse_badge(&fetch(&s.url("/badges/model/chat/lite/state.svg?lang=zh")).await);
    assert_eq!(texts, ["chat/lite", "降级"]);
    let (_, texts) =
        parse_badge(&fetch(&s.url(&format!("/badges/{QWEN}/uptime.svg?lang=zh"))).await);
    assert_eq!(texts[0], "可用率 30d");

    // Bad input: JSON errors.
    for (path, code) in [
        (
            format!("/badges/{QWEN}/uptime.svg?window=1y"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/badges/nope/x/y/state.svg".to_owned(),
            StatusCode::NOT_FOUND,
        ),
        (format!("/badges/{QWEN}/weights.svg"), StatusCode::NOT_FOUND),
        (
            "/badges/model/nope/state.svg".to_owned(),
            StatusCode::NOT_FOUND,
        ),
        (
            "/badges/model/chat-main/uptime.svg".to_owned(),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let r = reqwest::get(s.url(&path)).await.unwrap();
        assert_eq!(r.status(), code, "{path}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(v["error"]["message"].is_string(), "{path}: {v}");
    }
    h.shutdown.cancel();
}

struct Entry {
    id: String,
    title: String,
    published: String,
    updated: String,
    link: String,
    summary: String,
}

const ATOM: &str = "http://www.w3.org/2005/Atom";

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> roxmltree::Node<'a, 'i> {
    n.children()
        .find(|c| c.has_tag_name((ATOM, name)))
        .unwrap_or_else(|| panic!("no {name} in {:?}", n.tag_name()))
}

fn text(n: roxmltree::Node, name: &str) -> String {
    child(n, name).text().unwrap_or("").to_owned()
}

/// The feed parsed as Atom: its language and entries.
async fn feed(s: &Served, lang: &str) -> (String, Vec<Entry>) {
    let r = reqwest::get(s.url(&format!("/incidents.atom?lang={lang}")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/atom+xml"), "{ct}");
    let body = r.text().await.unwrap();
    let doc = roxmltree::Document::parse(&body).expect("the feed is XML");
    let atom = ATOM;
    let feed = doc.root_element();
    assert_eq!(feed.tag_name().name(), "feed");
    assert_eq!(feed.tag_name().namespace(), Some(atom));
    // What RFC 4287 requires of a feed: id, title, updated, an author.
    for name in ["id", "title", "updated", "author"] {
        child(feed, name);
    }
    let xml_lang = feed
        .attribute(("http://www.w3.org/XML/1998/namespace", "lang"))
        .unwrap()
        .to_owned();
    let entries = feed
        .children()
        .filter(|c| c.has_tag_name((atom, "entry")))
        .map(|e| Entry {
            id: text(e, "id"),
            title: text(e, "title"),
            published: text(e, "published"),
            updated: text(e, "updated"),
            link: child(e, "link").attribute("href").unwrap().to_owned(),
            summary: text(e, "summary"),
        })
        .collect();
    (xml_lang, entries)
}

#[tokio::test]
async fn the_feed_follows_an_incident_from_opening_to_resolution() {
    use probeok::config::DetectionConfig;
    use probeok::health::{Baseline, Detector};
    let mut h = Harness::new(ROUTES, now()).await;
    h.state.incidents = std::sync::Arc::new(probeok::web::StoreIncidents);
    h.publish(snapshot(now(), Vec::new()));
    let s = h.serve().await;
    let (_, entries) = feed(&s, "en").await;
    assert!(entries.is_empty());

    // The detector through an outage of qwen, its transitions stored as the health service does.
    let cfg = DetectionConfig::default();
    let det = Detector::new(&cfg);
    let start = now() - D::hours(3);
    let mut route = det.route(id(QWEN), start);
    let mut baseline = Baseline::new(id(QWEN), &cfg);
    let w = h.store.writer();
    let mut t = start;
    // Feeds outcomes until the incident is open (`ok` false) or closed (`ok` true).
    macro_rules! drive {
        ($ok:expr) => {
            for _ in 0..200 {
                t += D::seconds(30);
                let o = outcome(QWEN, OutcomeKind::Probe, t, $ok, 1100.0);
                if let Some(tr) = det.ingest(&mut route, &mut baseline, &o, t) {
                    let incident = tr.incident_id.as_deref().and_then(|iid| {
                        route
                            .incident()
                            .filter(|i| i.id == iid)
                            .or(route.last_closed().filter(|i| i.id == iid))
                    });
                    w.record_transition(&tr, incident, &route).await.unwrap();
                }
                if route.incident().is_some() != $ok {
                    break;
                }
            }
        };
    }
    drive!(false);
    assert!(
        route.incident().is_some(),
        "the failures opened an incident"
    );

    let (lang, entries) = feed(&s, "en").await;
    assert_eq!(lang, "en");
    assert_eq!(entries.len(), 1);
    let open = &entries[0];
    assert!(
        open.title.starts_with(&format!("{QWEN}: ")),
        "{}",
        open.title
    );
    assert!(open.title.ends_with("ongoing"), "{}", open.title);
    assert!(
        open.summary.starts_with("Opened 2026-03-04 09:"),
        "{}",
        open.summary
    );
    assert!(open.summary.contains("Ongoing for"), "{}", open.summary);
    assert_eq!(
        open.link,
        format!(
            "http://127.0.0.1:9400/routes/{}?lang=en",
            QWEN.replace('/', "%2F")
        )
    );

    // Back to normal: the same entry, resolved, updated at the resolution.
    drive!(true);
    assert!(route.incident().is_none(), "the incident closed");
    let (_, entries) = feed(&s, "en").await;
    assert_eq!(entries.len(), 1);
    let done = &entries[0];
    assert_eq!(done.id, open.id, "one entry per incident");
    assert!(done.title.ends_with("resolved"), "{}", done.title);
    assert!(
        done.summary.contains(". Resolved 2026-03-04 "),
        "{}",
        done.summary
    );
    assert!(done.summary.contains("Peak "), "{}", done.summary);
    assert_eq!(done.published, open.published);
    assert!(
        done.updated > open.updated,
        "{} {}",
        done.updated,
        open.updated
    );

    let (lang, entries) = feed(&s, "zh").await;
    assert_eq!(lang, "zh-CN");
    assert!(entries[0].title.ends_with("已恢复"), "{}", entries[0].title);
    assert!(
        entries[0].summary.contains("恢复，持续"),
        "{}",
        entries[0].summary
    );
    assert!(entries[0].link.ends_with("?lang=zh"));
    h.shutdown.cancel();
}
