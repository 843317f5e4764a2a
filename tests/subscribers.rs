//! Status page subscribers, end to end through `probeok serve`: a real SMTP receiver (the
//! SMTP dialogue of RFC 5321) and a webhook receiver that checks `X-Probeok-Signature` and
//! echoes the confirmation code, as docs/http-api.md ("Subscriber webhooks") asks of it.
//!
//! Twenty routes of one provider fail together and recover: a confirmed subscriber gets one
//! mail when they fail and one when they recover (grouped, with RFC 8058 headers), an
//! unconfirmed one gets nothing, the one-click unsubscribe ends it, and the abuse limits hold.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::alerts::{hmac, smtp_server};
use common::{fake, free_port, Reply};
use serde_json::Value;

const SMTP_VAR: &str = "PROBEOK_SUBS_SMTP";
const ADMIN_VAR: &str = "PROBEOK_SUBS_ADMIN";
const ROUTES: usize = 20;

/// A config of `routes` routes of one provider; `storage` is the `[storage]` (and `[cluster]`) text.
fn write_config(
    dir: &Path,
    name: &str,
    port: u16,
    upstream: &str,
    routes_n: usize,
    storage: &str,
) -> PathBuf {
    write_config_grouped(dir, name, port, upstream, routes_n, storage, "3s")
}

fn write_config_grouped(
    dir: &Path,
    name: &str,
    port: u16,
    upstream: &str,
    routes_n: usize,
    storage: &str,
    group_wait: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::create_dir_all(dir.join("no-sets")).unwrap();
    let mut routes = String::new();
    for i in 0..routes_n {
        routes.push_str(&format!(
            "\n[[route]]\nprovider = \"qwen\"\nregion = \"cn\"\nmodel = \"m{i}\"\nserves = \"chat{}\"\n",
            i % 2
        ));
    }
    let body = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
admin_token_env = "{ADMIN_VAR}"

{storage}

[probe]
interval = "500ms"
timeout = "450ms"
first_byte_timeout = "400ms"
throughput_every = "1h"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
recover_after = "1s"
error_window = "10s"

[alerting]
group_wait = "{group_wait}"

[[alert.email]]
smtp_url_env = "{SMTP_VAR}"
from = "status@example.com"
to = ["oncall@example.com"]

[subscriptions]
enabled = true
allow_private_webhooks = true

[drift]
sets = "{sets}"

[[provider]]
id = "qwen"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "{upstream}/v1"
{routes}"#,
        sets = dir.join("no-sets").display(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn until<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A raw message's quoted-printable body decoded enough for links (soft breaks, `=3D`).
fn unqp(raw: &str) -> String {
    raw.replace("=\r\n", "").replace("=3D", "=")
}

fn mails_to(mails: &Mutex<Vec<String>>, to: &str) -> Vec<String> {
    mails
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.contains(&format!("To: {to}")))
        .map(|m| unqp(m))
        .collect()
}

fn link(mail: &str, path: &str) -> String {
    let start = mail.find("http://127.0.0.1").unwrap();
    let rest = &mail[start..];
    let at = rest
        .find(path)
        .unwrap_or_else(|| panic!("{path} in {mail}"));
    let end = rest[at..]
        .find(|c: char| c.is_whitespace() || c == '>')
        .unwrap()
        + at;
    rest[..end].to_owned()
}

fn header<'a>(mail: &'a str, name: &str) -> Option<&'a str> {
    mail.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_hear_of_a_grouped_outage_once_and_its_end_once() {
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let up = common::probe_ok_unless(failing.clone()).await;
    let (smtp, mails) = smtp_server().await;
    // The webhook receiver: keeps (event, body, signature ok, received at) and echoes codes.
    let secret: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let hooks: Arc<Mutex<Vec<(Value, bool, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let (hook_server, _) = {
        let (secret, hooks) = (secret.clone(), hooks.clone());
        fake("/hook", move |c| {
            let v = c.json();
            let sig_ok = match (
                secret.lock().unwrap().as_deref(),
                c.header("x-probeok-signature"),
            ) {
                (Some(s), Some(sig)) => {
                    let want: String = hmac(s.as_bytes(), &c.body)
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    sig == format!("sha256={want}")
                }
                _ => false,
            };
            let code = v["code"].as_str().unwrap_or("").to_owned();
            hooks.lock().unwrap().push((v, sig_ok, Instant::now()));
            Reply::now((StatusCode::OK, format!("{{\"code\":\"{code}\"}}")))
        })
        .await
    };
    let hook_url = format!("{}/hook", hook_server.base_url());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let storage = format!(
        "[storage]\npath = \"{}\"",
        dir.path().join("subs.db").display()
    );
    let config = write_config(dir.path(), "subs", port, &up.base_url(), ROUTES, &storage);
    let log = dir.path().join("serve.log");
    let _member = Member(
        Command::new(env!("CARGO_BIN_EXE_probeok"))
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("PROBEOK_CONFIG")
            .env(SMTP_VAR, format!("smtp://{smtp}"))
            .env(ADMIN_VAR, "admin-secret")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let all_normal = || async {
        let Ok(r) = http.get(format!("{base}/api/v1/status")).send().await else {
            return false;
        };
        let Ok(v) = r.json::<Value>().await else {
            return false;
        };
        v["routes"]
            .as_array()
            .is_some_and(|rs| rs.len() == ROUTES && rs.iter().all(|r| r["state"] == "NORMAL"))
    };
    until(Duration::from_secs(60), "every route NORMAL", all_normal).await;

    // The form is on the status page and the route pages.
    let page = http
        .get(format!("{base}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("action=\"/subscribe\"") && !page.contains("<script"),
        "form on /"
    );
    let route_page = http
        .get(format!("{base}/routes/qwen%2Fcn%2Fm0"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        route_page.contains("provider:qwen"),
        "the route page offers its provider"
    );

    let subscribe = |kind: &str, target: &str, scope: &str| {
        let form = [
            ("kind", kind),
            ("target", target),
            ("scope", scope),
            ("lang", "en"),
        ];
        let req = http.post(format!("{base}/subscribe")).form(&form);
        async move {
            let r = req.send().await.unwrap();
            (r.status(), r.text().await.unwrap())
        }
    };
    let (st, body) = subscribe("email", "reader@example.com", "provider:qwen").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert!(body.contains("Check your mail") && !body.contains("reader@example.com"));
    let (st, _) = subscribe("email", "never@example.com", "*").await;
    assert_eq!(st, StatusCode::OK);
    let (st, body) = subscribe("webhook", &hook_url, "model:chat0").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let shown = body
        .split("<code id=\"secret\">")
        .nth(1)
        .unwrap()
        .split('<')
        .next()
        .unwrap();
    *secret.lock().unwrap() = Some(shown.to_owned());

    // One confirmation mail each, then the link.
    until(
        Duration::from_secs(20),
        "the confirmation mails",
        || async {
            mails_to(&mails, "reader@example.com").len() == 1
                && mails_to(&mails, "never@example.com").len() == 1
        },
    )
    .await;
    let confirm = link(
        &mails_to(&mails, "reader@example.com")[0],
        "/subscribe/confirm?t=",
    );
    let r = http.get(&confirm).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The webhook handshake: a signed confirm event, its code echoed.
    until(
        Duration::from_secs(20),
        "the webhook confirmation",
        || async {
            let list = http
                .get(format!("{base}/api/v1/admin/subscribers"))
                .bearer_auth("admin-secret")
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap();
            list["subscribers"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| !s["confirmed_at"].is_null())
                .count()
                == 2
        },
    )
    .await;
    {
        let h = hooks.lock().unwrap();
        assert_eq!(h[0].0["type"], "subscription.confirm");
        assert!(h[0].1, "the confirm event's signature verifies");
    }

    // Twenty routes fail together, then recover.
    let t_fail = Instant::now();
    failing.store(true, Ordering::SeqCst);
    until(Duration::from_secs(60), "the incident mail", || async {
        mails_to(&mails, "reader@example.com").len() >= 2
    })
    .await;
    let mail_after_fail = t_fail.elapsed();
    until(Duration::from_secs(30), "the incident webhook", || async {
        hooks
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.0["type"] == "incident.opened")
    })
    .await;
    let hook_after_fail = t_fail.elapsed();
    failing.store(false, Ordering::SeqCst);
    until(Duration::from_secs(60), "the resolved mail", || async {
        mails_to(&mails, "reader@example.com").len() >= 3
    })
    .await;
    until(Duration::from_secs(30), "the resolved webhook", || async {
        hooks
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.0["type"] == "incident.resolved")
    })
    .await;
    until(
        Duration::from_secs(60),
        "every route NORMAL again",
        all_normal,
    )
    .await;
    // A moment for anything that would (wrongly) follow: the next group window and sends.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let reader = mails_to(&mails, "reader@example.com");
    assert_eq!(reader.len(), 3, "confirmation + opened + resolved");
    for m in &reader[1..] {
        let lu = header(m, "List-Unsubscribe").expect("List-Unsubscribe");
        assert!(lu.starts_with("<http://127.0.0.1") && lu.contains("/subscribe/unsubscribe?t="));
        assert_eq!(
            header(m, "List-Unsubscribe-Post"),
            Some("List-Unsubscribe=One-Click")
        );
        assert!(
            m.matches("qwen/cn/m").count() >= ROUTES,
            "one mail lists all 20 routes"
        );
    }
    assert!(header(&reader[1], "Subject").unwrap().contains("incident"));
    assert!(header(&reader[2], "Subject").unwrap().contains("resolved"));
    assert_eq!(
        mails_to(&mails, "never@example.com").len(),
        1,
        "unconfirmed: the confirmation only"
    );
    let events: Vec<(String, usize, bool)> = hooks
        .lock()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h.0["type"].as_str().unwrap().to_owned(),
                h.0["incidents"].as_array().map_or(0, |a| a.len()),
                h.1,
            )
        })
        .collect();
    assert_eq!(
        events,
        vec![
            ("subscription.confirm".to_owned(), 0, true),
            ("incident.opened".to_owned(), ROUTES / 2, true),
            ("incident.resolved".to_owned(), ROUTES / 2, true),
        ],
        "the webhook (model chat0: 10 routes) hears one grouped event each way, signed"
    );
    eprintln!(
        "figure: incident start → mail {:?}, → webhook {:?} (from the upstream failing; detection needs degraded_after probes)",
        mail_after_fail, hook_after_fail
    );

    // One-click unsubscribe (RFC 8058), then nothing more.
    let lu = header(&reader[2], "List-Unsubscribe").unwrap();
    let url = lu.trim_start_matches('<').trim_end_matches('>');
    let r = http
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    failing.store(true, Ordering::SeqCst);
    until(
        Duration::from_secs(60),
        "the webhook hears the second outage",
        || async {
            hooks
                .lock()
                .unwrap()
                .iter()
                .filter(|h| h.0["type"] == "incident.opened")
                .count()
                == 2
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        mails_to(&mails, "reader@example.com").len(),
        3,
        "nothing after unsubscribing"
    );
    failing.store(false, Ordering::SeqCst);

    // Abuse limits: the fourth confirmation to one address in a day is refused, clearly.
    for (i, scope) in ["*", "model:chat0", "model:chat1"].iter().enumerate() {
        let (st, body) = subscribe("email", "flood@example.com", scope).await;
        assert_eq!(st, StatusCode::OK, "attempt {i}: {body}");
    }
    let (st, body) = subscribe("email", "flood@example.com", "provider:qwen").await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body.contains("3 confirmation requests in the last 24 hours"),
        "{body}"
    );
    // And one client address gets 10 attempts an hour: 3 + 4 so far, 3 more, then refused.
    for i in 0..3 {
        let (st, body) = subscribe("email", &format!("x{i}@example.com"), "*").await;
        assert_eq!(st, StatusCode::OK, "{body}");
    }
    let (st, body) = subscribe("email", "y@example.com", "*").await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("Too many subscription attempts"), "{body}");
    // A private webhook is refused when not allowed is covered by the unit tests; bounded fields:
    let long = format!("{}@example.com", "a".repeat(600));
    let (st, _) = subscribe("email", &long, "*").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    // Addresses appear in no public answer and no log line; the admin API lists them.
    let addresses = [
        "reader@example.com",
        "never@example.com",
        "flood@example.com",
        &hook_url,
    ];
    for path in [
        "/",
        "/routes/qwen%2Fcn%2Fm0",
        "/incidents",
        "/api/v1/status",
        "/api/v1/incidents",
        "/metrics",
        "/api/openapi.json",
    ] {
        let text = http
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for a in addresses {
            assert!(!text.contains(a), "{a} in {path}");
        }
    }
    let r = http
        .get(format!("{base}/api/v1/admin/subscribers"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let list = http
        .get(format!("{base}/api/v1/admin/subscribers"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let subs = list["subscribers"].as_array().unwrap();
    assert!(subs.iter().any(|s| s["target"] == "never@example.com"));
    assert!(
        !subs.iter().any(|s| s["target"] == "reader@example.com"),
        "unsubscribed"
    );
    let id = subs[0]["id"].as_i64().unwrap();
    let r = http
        .delete(format!("{base}/api/v1/admin/subscribers?id={id}"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let logged = std::fs::read_to_string(&log).unwrap();
    for a in addresses {
        assert!(!logged.contains(a), "{a} in the log");
    }
    assert!(
        logged.contains("subscriber notice delivered"),
        "the log names deliveries by id"
    );
}

fn spawn_serve(
    config: &Path,
    smtp: std::net::SocketAddr,
    db_url: Option<&str>,
    log: &Path,
) -> Member {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
    cmd.args(["serve", "--config"])
        .arg(config)
        .env_remove("PROBEOK_CONFIG")
        .env(SMTP_VAR, format!("smtp://{smtp}"))
        .env(ADMIN_VAR, "admin-secret")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if let Some(url) = db_url {
        cmd.env(PAIR_URL_VAR, url);
    }
    Member(cmd.spawn().unwrap())
}

const PAIR_URL_VAR: &str = "PROBEOK_SUBS_DATABASE_URL";

/// Two `probeok serve` on one PostgreSQL database (needs `PROBEOK_TEST_PG_URL`): the
/// subscription is made on one member and confirmed through the other's link; the leader is
/// killed (-9) while the routes fail, and the other member resolves them. Each notice — the
/// confirmation, the outage, its end — reaches the subscriber once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_pair_sends_each_notice_once_across_a_takeover() {
    let db = common::cluster::Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let up = common::probe_ok_unless(failing.clone()).await;
    let (smtp, mails) = smtp_server().await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let storage = |name: &str| {
        format!(
            "[storage]\npath = \"{}\"\nurl_env = \"{PAIR_URL_VAR}\"\n\n[cluster]\nlease = \"3s\"",
            dir.path().join(format!("{name}-unused.db")).display()
        )
    };
    let (pa, pb) = (free_port(), free_port());
    let ca = write_config(dir.path(), "a", pa, &up.base_url(), 2, &storage("a"));
    let cb = write_config(dir.path(), "b", pb, &up.base_url(), 2, &storage("b"));
    let (ba, bb) = (
        format!("http://127.0.0.1:{pa}"),
        format!("http://127.0.0.1:{pb}"),
    );
    let role = |base: String| {
        let http = http.clone();
        async move {
            let Ok(r) = http.get(format!("{base}/readyz")).send().await else {
                return String::new();
            };
            r.json::<Value>()
                .await
                .ok()
                .and_then(|v| v["role"].as_str().map(str::to_owned))
                .unwrap_or_default()
        }
    };
    let mut a = Some(spawn_serve(
        &ca,
        smtp,
        Some(&db.url),
        &dir.path().join("a.log"),
    ));
    until(Duration::from_secs(30), "a leads", || async {
        role(ba.clone()).await == "leader"
    })
    .await;
    let _b = spawn_serve(&cb, smtp, Some(&db.url), &dir.path().join("b.log"));
    until(Duration::from_secs(30), "b follows", || async {
        role(bb.clone()).await == "follower"
    })
    .await;
    let normal = |base: String| {
        let http = http.clone();
        async move {
            let Ok(r) = http.get(format!("{base}/api/v1/status")).send().await else {
                return false;
            };
            r.json::<Value>().await.ok().is_some_and(|v| {
                v["routes"]
                    .as_array()
                    .is_some_and(|rs| rs.len() == 2 && rs.iter().all(|r| r["state"] == "NORMAL"))
            })
        }
    };
    until(Duration::from_secs(60), "routes NORMAL", || {
        normal(ba.clone())
    })
    .await;

    // Subscribed on the follower, confirmed through the leader: one store, one link key.
    let r = http
        .post(format!("{bb}/subscribe"))
        .form(&[
            ("kind", "email"),
            ("target", "pair@example.com"),
            ("scope", "*"),
            ("lang", "zh"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    until(Duration::from_secs(20), "the confirmation mail", || async {
        !mails_to(&mails, "pair@example.com").is_empty()
    })
    .await;
    let confirm = link(
        &mails_to(&mails, "pair@example.com")[0],
        "/subscribe/confirm?t=",
    )
    .replace(&format!("127.0.0.1:{pb}"), &format!("127.0.0.1:{pa}"));
    assert_eq!(
        http.get(&confirm).send().await.unwrap().status(),
        StatusCode::OK
    );

    failing.store(true, Ordering::SeqCst);
    until(Duration::from_secs(60), "the outage mail", || async {
        mails_to(&mails, "pair@example.com").len() >= 2
    })
    .await;
    // The leader dies while the routes fail; the other member takes over and resolves them.
    drop(a.take());
    failing.store(false, Ordering::SeqCst);
    until(Duration::from_secs(30), "b leads", || async {
        role(bb.clone()).await == "leader"
    })
    .await;
    until(Duration::from_secs(90), "the resolved mail", || async {
        mails_to(&mails, "pair@example.com").len() >= 3
    })
    .await;
    until(Duration::from_secs(60), "routes NORMAL on b", || {
        normal(bb.clone())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got = mails_to(&mails, "pair@example.com");
    let subjects: Vec<&str> = got
        .iter()
        .map(|m| header(m, "Subject").unwrap_or(""))
        .collect();
    assert_eq!(
        got.len(),
        3,
        "confirmation, outage, end — each once: {subjects:?}"
    );
    db.drop_now().await;
}

/// A webhook event and when it arrived.
type Received = (Value, chrono::DateTime<chrono::Utc>);

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The figures: over repeated outages of 20 routes of one provider, how long from the
/// incidents' opening (their `started_at`) to the subscriber's mail and webhook, and how many
/// notices each subscriber gets per outage (one opened and one resolved: grouped, not 20).
/// `[alerting] group_wait = "2s"` here; the notice waits that long by design (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_time_to_notice_and_notices_per_outage() {
    const CYCLES: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(false));
    let up = common::probe_ok_unless(failing.clone()).await;
    let (smtp, mails) = smtp_server().await;
    let hooks: Arc<Mutex<Vec<Received>>> = Arc::new(Mutex::new(Vec::new()));
    let (hook_server, _) = {
        let hooks = hooks.clone();
        fake("/hook", move |c| {
            let v = c.json();
            let code = v["code"].as_str().unwrap_or("").to_owned();
            hooks.lock().unwrap().push((v, chrono::Utc::now()));
            Reply::now((StatusCode::OK, code))
        })
        .await
    };
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let storage = format!(
        "[storage]\npath = \"{}\"",
        dir.path().join("fig.db").display()
    );
    let config = write_config_grouped(
        dir.path(),
        "fig",
        port,
        &up.base_url(),
        ROUTES,
        &storage,
        "2s",
    );
    let _m = spawn_serve(&config, smtp, None, &dir.path().join("fig.log"));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let normal = || async {
        let Ok(r) = http.get(format!("{base}/api/v1/status")).send().await else {
            return false;
        };
        r.json::<Value>().await.ok().is_some_and(|v| {
            v["routes"]
                .as_array()
                .is_some_and(|rs| rs.len() == ROUTES && rs.iter().all(|r| r["state"] == "NORMAL"))
        })
    };
    until(Duration::from_secs(60), "routes NORMAL", normal).await;
    for (kind, target) in [
        ("email", "fig@example.com"),
        (
            "webhook",
            &format!("{}/hook", hook_server.base_url()) as &str,
        ),
    ] {
        let r = http
            .post(format!("{base}/subscribe"))
            .form(&[
                ("kind", kind),
                ("target", target),
                ("scope", "provider:qwen"),
                ("lang", "en"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    until(Duration::from_secs(20), "the confirmation mail", || async {
        !mails_to(&mails, "fig@example.com").is_empty()
    })
    .await;
    let confirm = link(
        &mails_to(&mails, "fig@example.com")[0],
        "/subscribe/confirm?t=",
    );
    assert_eq!(
        http.get(&confirm).send().await.unwrap().status(),
        StatusCode::OK
    );
    until(Duration::from_secs(20), "the webhook confirmed", || async {
        let v: Value = http
            .get(format!("{base}/api/v1/admin/subscribers"))
            .bearer_auth("admin-secret")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["subscribers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| !s["confirmed_at"].is_null())
    })
    .await;

    let (mut to_mail, mut to_hook) = (Vec::new(), Vec::new());
    for cycle in 0..CYCLES {
        let mails_before = mails_to(&mails, "fig@example.com").len();
        let hooks_before = hooks.lock().unwrap().len();
        failing.store(true, Ordering::SeqCst);
        // The mail's arrival, seen within 10 ms.
        let start = Instant::now();
        while mails_to(&mails, "fig@example.com").len() == mails_before {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "cycle {cycle}: the outage mail"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mail_at = chrono::Utc::now();
        until(Duration::from_secs(30), "the outage webhook", || async {
            hooks.lock().unwrap().len() > hooks_before
        })
        .await;
        let (event, hook_at) = hooks.lock().unwrap()[hooks_before].clone();
        assert_eq!(event["type"], "incident.opened");
        let opened = event["incidents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["started_at"].as_str())
            .filter_map(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
            .max()
            .unwrap();
        to_mail.push((mail_at - opened).num_milliseconds() as f64);
        to_hook.push((hook_at - opened).num_milliseconds() as f64);
        failing.store(false, Ordering::SeqCst);
        until(Duration::from_secs(60), "the resolved mail", || async {
            mails_to(&mails, "fig@example.com").len() >= mails_before + 2
        })
        .await;
        until(Duration::from_secs(60), "routes NORMAL again", normal).await;
        // Every incident the outage opened is resolved to the webhook (in one event, asserted
        // below), then a moment for anything that would wrongly follow.
        until(
            Duration::from_secs(30),
            "every incident resolved",
            || async {
                let h = hooks.lock().unwrap();
                let count = |t: &str| -> usize {
                    h[hooks_before..]
                        .iter()
                        .filter(|(v, _)| v["type"] == t)
                        .map(|(v, _)| v["incidents"].as_array().map_or(0, |a| a.len()))
                        .sum()
                };
                count("incident.resolved") >= count("incident.opened")
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mails_now = mails_to(&mails, "fig@example.com").len() - mails_before;
        let hooks_now: Vec<(String, usize)> = hooks.lock().unwrap()[hooks_before..]
            .iter()
            .map(|(v, _)| {
                (
                    v["type"].as_str().unwrap().to_owned(),
                    v["incidents"].as_array().map_or(0, |a| a.len()),
                )
            })
            .collect();
        let subjects: Vec<String> = mails_to(&mails, "fig@example.com")[mails_before..]
            .iter()
            .map(|m| header(m, "Subject").unwrap_or("").to_owned())
            .collect();
        assert_eq!(
            mails_now, 2,
            "cycle {cycle}: one outage mail and one resolved mail: {subjects:?} {hooks_now:?}"
        );
        assert_eq!(
            hooks_now,
            vec![
                ("incident.opened".to_owned(), ROUTES),
                ("incident.resolved".to_owned(), ROUTES)
            ],
            "cycle {cycle}: one event each way, listing all {ROUTES} routes"
        );
    }
    to_mail.sort_by(f64::total_cmp);
    to_hook.sort_by(f64::total_cmp);
    eprintln!(
        "figure: {CYCLES} outages of {ROUTES} routes, group_wait 2s: incident opened → mail p50 {} ms p99 {} ms; → webhook p50 {} ms p99 {} ms; notices per subscriber per outage: 2 (1 opened + 1 resolved)",
        percentile(&to_mail, 0.5),
        percentile(&to_mail, 0.99),
        percentile(&to_hook, 0.5),
        percentile(&to_hook, 0.99),
    );
}
