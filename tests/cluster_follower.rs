//! How far a follower's `/api/v1/status` is behind the leader's judgements at 1,000 routes:
//! two `probeok serve` processes on one PostgreSQL database (`PROBEOK_TEST_PG_URL`), the
//! leader probing 1,000 routes of a provider whose address refuses connections, so every
//! route changes state (and changes again) while the test watches the follower.
//!
//! Both members' `/api/v1/status` are polled in turn; a change — (route, state, since) —
//! first shown by a member's poll N was not shown by its poll N-1. The follower's lag behind
//! the leader lies between (its poll N-1's end − the leader's showing poll's end) and (its
//! poll N's end − the leader's poll before). It prints the figures (the target is 2 s) and
//! fails when the follower fell behind for good: a change still missing 15 s after the
//! leader showed it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::cluster::Db;
use probeok::store::sql::PgUrl;
use probeok::store::{Store, StoreLocation, StoreOptions};

const ROUTES: usize = 1000;

/// A follower this far behind the leader has stopped following, whatever the machine.
const FALLEN_BEHIND_S: f64 = 15.0;
const URL_VAR: &str = "PROBEOK_FOLLOWER_DATABASE_URL";

use common::free_port;

fn write_config(dir: &Path, name: &str, port: u16, dead: u16) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::create_dir_all(dir.join("no-sets")).unwrap();
    let mut body = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"

[storage]
path = "{db}"
url_env = "{URL_VAR}"

[cluster]
lease = "5s"

[probe]
interval = "3s"
timeout = "1s"
first_byte_timeout = "900ms"
throughput_every = "1h"

[drift]
sets = "{sets}"

[[provider]]
id = "gone"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "http://127.0.0.1:{dead}/v1"
"#,
        db = dir.join("ignored.db").display(),
        sets = dir.join("no-sets").display(),
    );
    for i in 0..ROUTES {
        body += &format!(
            "\n[[route]]\nprovider = \"gone\"\nregion = \"r1\"\nmodel = \"m{i:04}\"\nserves = \"chat-{:02}\"\n",
            i % 50
        );
    }
    std::fs::write(&path, body).unwrap();
    path
}

struct Member {
    child: Child,
    base: String,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(config: &Path, port: u16, url: &str, log: &Path) -> Member {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_probeok"))
        .args(["serve", "--config"])
        .arg(config)
        .env_remove("PROBEOK_CONFIG")
        .env(URL_VAR, url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start probeok serve");
    Member {
        child,
        base: format!("http://127.0.0.1:{port}"),
    }
}

async fn status(http: &reqwest::Client, m: &Member) -> Option<serde_json::Value> {
    let r = http
        .get(format!("{}/api/v1/status", m.base))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

async fn until_role(http: &reqwest::Client, m: &Member, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = http.get(format!("{}/readyz", m.base)).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                if v["role"] == want {
                    return;
                }
            }
        }
        assert!(Instant::now() < deadline, "{} is not {want}", m.base);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Per change (route, state, since): the end of the poll before the one that first showed
/// it, and the end of that one.
type Seen = HashMap<(String, String, String), (DateTime<Utc>, DateTime<Utc>)>;

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_status_follows_the_leaders_at_1000_routes() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Postgres(PgUrl::parse(&db.url).unwrap().unwrap());
    Store::open_at(&location, StoreOptions::default())
        .unwrap()
        .close()
        .await
        .unwrap();
    // Nothing listens there: every probe fails at once with a refused connection.
    let dead = free_port();
    let (pa, pb) = (free_port(), free_port());
    let ca = write_config(dir.path(), "a", pa, dead);
    let cb = write_config(dir.path(), "b", pb, dead);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let leader = start(&ca, pa, &db.url, &dir.path().join("a.log"));
    until_role(&http, &leader, "leader", Duration::from_secs(30)).await;
    let follower = start(&cb, pb, &db.url, &dir.path().join("b.log"));
    until_role(&http, &follower, "follower", Duration::from_secs(30)).await;

    // Each change — (route, state, since) — as first seen on the leader and on the follower:
    // the poll that first showed it, and the end of the poll before (which did not).
    let mut leader_seen: Seen = HashMap::new();
    let mut follower_seen: Seen = HashMap::new();
    let mut previous: [Option<DateTime<Utc>>; 2] = [None, None];
    // How long each of the follower's answers took (the client's view, body included).
    let mut follower_polls: Vec<f64> = Vec::new();
    let watch_until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < watch_until {
        for (k, m) in [&leader, &follower].into_iter().enumerate() {
            let asked = Instant::now();
            let Some(v) = status(&http, m).await else {
                previous[k] = None;
                continue;
            };
            if k == 1 {
                follower_polls.push(asked.elapsed().as_secs_f64() * 1000.0);
            }
            let end = Utc::now();
            let seen = if k == 0 {
                &mut leader_seen
            } else {
                &mut follower_seen
            };
            if let Some(prev) = previous[k] {
                for r in v["routes"].as_array().into_iter().flatten() {
                    let (Some(id), Some(state), Some(since)) =
                        (r["id"].as_str(), r["state"].as_str(), r["since"].as_str())
                    else {
                        continue;
                    };
                    if state != "UNKNOWN" {
                        seen.entry((id.to_owned(), state.to_owned(), since.to_owned()))
                            .or_insert((prev, end));
                    }
                }
            }
            previous[k] = Some(end);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Behind the leader: the follower showed a change between the end of its poll before and
    // the end of its poll that showed it; the leader by the end of its first showing poll.
    let mut lower = Vec::new();
    let mut upper = Vec::new();
    let mut judged = Vec::new();
    let mut worst = (f64::MIN, String::new());
    for (change, (l_prev, l_end)) in &leader_seen {
        let Some((f_prev, f_end)) = follower_seen.get(change) else {
            continue;
        };
        let secs = |d: chrono::Duration| d.num_milliseconds() as f64 / 1000.0;
        let lo = secs(*f_prev - *l_end).max(0.0);
        lower.push(lo);
        upper.push(secs(*f_end - *l_prev).max(0.0));
        if let Ok(at) = DateTime::parse_from_rfc3339(&change.2) {
            judged.push(secs(*l_end - at.with_timezone(&Utc)).max(0.0));
        }
        if lo > worst.0 {
            worst = (lo, format!("{} {} since {}", change.0, change.1, change.2));
        }
    }
    assert!(
        lower.len() >= ROUTES / 2,
        "only {} state changes seen on both members",
        lower.len()
    );
    println!(
        "follower behind the leader at {ROUTES} routes, over {} state changes seen on both: \
         median between {:.2} s and {:.2} s, p95 at most {:.2} s, max at most {:.2} s; \
         the leader's own page showed a change {:.2} s (median) after its `since` \
         (shared, loaded machine; each member polled every ~200 ms)",
        lower.len(),
        quantile(&lower, 0.5),
        quantile(&upper, 0.5),
        quantile(&upper, 0.95),
        quantile(&upper, 1.0),
        quantile(&judged, 0.5),
    );
    println!(
        "the follower's /api/v1/status at {ROUTES} routes: p50 {:.1} ms, p95 {:.1} ms over {} polls",
        quantile(&follower_polls, 0.5),
        quantile(&follower_polls, 0.95),
        follower_polls.len()
    );
    // Speed is the printed figure (the target is 2 s; a loaded machine and a debug build
    // add to it); what is asserted is that the follower keeps up at all.
    assert!(
        worst.0 <= FALLEN_BEHIND_S,
        "a change was still missing on the follower {:.2} s after the leader showed it: {}",
        worst.0,
        worst.1
    );
    drop(follower);
    drop(leader);
    db.drop_now().await;
}
