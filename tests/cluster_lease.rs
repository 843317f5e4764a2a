//! The leader lease against a real PostgreSQL server (`PROBEOK_TEST_PG_URL`, a URL of a
//! database the tests may create databases from; `scripts/test` provides one). Each test
//! makes its own database, so the lock of one test never meets another's.
//!
//! Real time throughout (a real server cannot be paused): every wait polls with a deadline.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{connect as admin, with_dbname, Db};

use probeok::cluster::{self, Lease, LeaseOptions, Role, Target};
use probeok::secret::Secret;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const LEASE: Duration = Duration::from_secs(3);

fn target(db: &Db) -> Target {
    Target::parse("PROBEOK_TEST_PG_URL", &Secret::new(db.url.clone())).expect("url parses")
}

fn lease(target: Target) -> (Lease, CancellationToken) {
    let stop = CancellationToken::new();
    let l = cluster::spawn(target, LeaseOptions::new(LEASE), stop.clone());
    (l, stop)
}

fn leaders(roles: &[&watch::Receiver<Role>]) -> usize {
    roles.iter().filter(|r| r.borrow().is_leader()).count()
}

/// Polls `f` every 20 ms until it holds or `within` passes; the time it took.
async fn until(within: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ends the session holding the lease lock in `db`, as a dead leader's would end.
async fn kill_lock_holder(db: &Db) -> i32 {
    let c = admin(&db.url).await;
    let row = c
        .query_one(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
            &[],
        )
        .await
        .expect("exactly one session holds the lease");
    let pid: i32 = row.get(0);
    c.query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate the holder");
    pid
}

#[tokio::test]
async fn two_members_on_one_database_have_exactly_one_leader() {
    let db = Db::create().await;
    let (a, stop_a) = lease(target(&db));
    let (b, stop_b) = lease(target(&db));
    until(LEASE + Duration::from_secs(5), "one leader", || {
        leaders(&[&a.role, &b.role]) == 1
    })
    .await;
    // And it stays that way: both keep checking every second.
    let hold = Instant::now();
    while hold.elapsed() < Duration::from_secs(3) {
        assert_eq!(leaders(&[&a.role, &b.role]), 1, "exactly one leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_a.cancel();
    stop_b.cancel();
    let _ = a.task.await;
    let _ = b.task.await;
    db.drop_now().await;
}

/// The leader's session is killed, five times over: the other member leads within
/// `lease` + 5 s each time and the old leader comes back as a follower. Prints the
/// takeover times and their median.
#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_lease_and_returns_as_a_follower() {
    let db = Db::create().await;
    let (a, stop_a) = lease(target(&db));
    let (b, stop_b) = lease(target(&db));
    until(LEASE + Duration::from_secs(5), "a first leader", || {
        leaders(&[&a.role, &b.role]) == 1
    })
    .await;
    let mut times = Vec::new();
    for _ in 0..5 {
        let (old, new) = if a.role.borrow().is_leader() {
            (&a.role, &b.role)
        } else {
            (&b.role, &a.role)
        };
        kill_lock_holder(&db).await;
        let killed = Instant::now();
        until(
            LEASE + Duration::from_secs(5),
            "the other member leads",
            || new.borrow().is_leader(),
        )
        .await;
        times.push(killed.elapsed());
        until(Duration::from_secs(3), "the old leader steps down", || {
            !old.borrow().is_leader()
        })
        .await;
        // It keeps trying, and stays a follower while the new leader lives.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!old.borrow().is_leader(), "the old leader is a follower");
        assert!(new.borrow().is_leader(), "the new leader keeps leading");
    }
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "takeover times after the leader's session was killed: {times:?}; median {:?}",
        sorted[sorted.len() / 2]
    );
    stop_a.cancel();
    stop_b.cancel();
    let _ = a.task.await;
    let _ = b.task.await;
    db.drop_now().await;
}

#[tokio::test]
async fn a_leader_that_stops_hands_over_at_once() {
    let db = Db::create().await;
    let (a, stop_a) = lease(target(&db));
    until(LEASE + Duration::from_secs(5), "a leads alone", || {
        a.role.borrow().is_leader()
    })
    .await;
    let (b, stop_b) = lease(target(&db));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!b.role.borrow().is_leader(), "b follows while a leads");
    stop_a.cancel();
    let _ = a.task.await;
    assert!(!a.role.borrow().is_leader(), "a stopped as a follower");
    let took = until(Duration::from_secs(3), "b leads after a stopped", || {
        b.role.borrow().is_leader()
    })
    .await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    stop_b.cancel();
    let _ = b.task.await;
    db.drop_now().await;
}

/// A relay between a member and the server that can stop passing bytes while keeping both
/// connections open: a session that is unanswered, not failed.
async fn freezable_relay(server: (String, u16)) -> (String, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (frozen_tx, frozen_rx) = watch::channel(false);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = TcpStream::connect((server.0.as_str(), server.1)).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (ur, uw) = upstream.into_split();
            tokio::spawn(pass(cr, uw, frozen_rx.clone()));
            tokio::spawn(pass(ur, cw, frozen_rx.clone()));
        }
    });
    (format!("127.0.0.1:{port}"), frozen_tx)
}

async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Frozen: hold the bytes (neither forward nor close) until thawed.
        while *frozen.borrow_and_update() {
            if frozen.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_leader_whose_session_goes_unanswered_steps_down_within_the_lease() {
    let db = Db::create().await;
    let direct: tokio_postgres::Config = db.url.parse().expect("url");
    let host = match direct.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = direct.get_ports().first().copied().unwrap_or(5432);
    let (relay, frozen) = freezable_relay((host.clone(), port)).await;
    let via_relay = {
        let mut u = url_with_authority(&db.url, &relay);
        if !u.contains("connect_timeout") {
            u.push_str(if u.contains('?') { "&" } else { "?" });
            u.push_str("connect_timeout=3");
        }
        u
    };
    let target =
        Target::parse("PROBEOK_TEST_PG_URL", &Secret::new(via_relay)).expect("relay url parses");
    let (a, stop_a) = lease(target);
    until(
        LEASE + Duration::from_secs(5),
        "a leads through the relay",
        || a.role.borrow().is_leader(),
    )
    .await;
    frozen.send_replace(true);
    let froze = Instant::now();
    until(LEASE + Duration::from_secs(2), "a steps down", || {
        !a.role.borrow().is_leader()
    })
    .await;
    let took = froze.elapsed();
    assert!(
        took >= LEASE - Duration::from_millis(1100),
        "stepped down after {took:?}, before the lease ran out"
    );
    stop_a.cancel();
    let _ = a.task.await;
    frozen.send_replace(false);
    db.drop_now().await;
}

/// `url` with its `host:port` replaced by `authority` (user and password kept).
fn url_with_authority(url: &str, authority: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let path_start = rest.find('/').unwrap_or(rest.len());
    let hostport = &rest[..path_start];
    let userinfo = hostport.rsplit_once('@').map(|(u, _)| u);
    let mut out = url[..scheme_end].to_owned();
    if let Some(u) = userinfo {
        out.push_str(u);
        out.push('@');
    }
    out.push_str(authority);
    out.push_str(&rest[path_start..]);
    out
}

#[test]
fn urls_are_rewritten_without_losing_parts() {
    assert_eq!(
        with_dbname("postgres://u:p@h:1/postgres?sslmode=disable", "x"),
        "postgres://u:p@h:1/x?sslmode=disable"
    );
    assert_eq!(with_dbname("postgres://h", "x"), "postgres://h/x");
    assert_eq!(
        url_with_authority("postgres://u:p@h:1/db?a=b", "127.0.0.1:9"),
        "postgres://u:p@127.0.0.1:9/db?a=b"
    );
}
