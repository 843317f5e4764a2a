//! Many proxies on one database: idempotency keys claimed once across the fleet, async jobs
//! run by one worker, per-client shares of keys and cached answers (store, both engines), and
//! read-only mode while the database is gone.
//!
//! The process tests run `probeok proxy` two or three times on one PostgreSQL database of
//! `PROBEOK_TEST_PG_URL` (they need it, like the other PostgreSQL tests) in front of a fake
//! upstream that counts its calls. Real processes, real time: every wait polls with a deadline.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use common::cluster::{connect, server_url, with_dbname};
use common::pg::TestDb;
use common::upstream::{fake, json, openai, Reply};
use probeok::store::sql::PgUrl;
use probeok::store::{
    claim, CachedAnswer, ContractOp, IdempotencyEntry, IdempotencyOp, IdempotentAnswer, JobRecord,
    JobStatus, RequestFilter, Store, StoreLocation, StoreOptions,
};

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn claim_op(scope: &str, owner: &str, now: DateTime<Utc>, max: u64) -> IdempotencyOp {
    IdempotencyOp::Claim {
        scope_key: scope.into(),
        owner: owner.into(),
        body_hash: "h".into(),
        now,
        lease_until: now + secs(60),
        expires_at: now + secs(3600),
        max_per_owner: max,
    }
}

/// A stored `200 {}` answer for the key.
fn answer_of(scope: &str, owner: &str, expires_at: DateTime<Utc>) -> IdempotentAnswer {
    IdempotentAnswer {
        scope_key: scope.into(),
        owner: owner.into(),
        body_hash: "h".into(),
        expires_at,
        status: 200,
        headers: vec![],
        stream: false,
        body: b"{}".to_vec(),
    }
}

on_both_engines! {
#[tokio::test]
async fn an_idempotency_key_is_claimed_once_and_lapses_with_its_claimant(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    assert_eq!(w.idempotency(claim_op("a:k1", "a", t0(), 10)).await.unwrap(), claim::CLAIMED);
    assert_eq!(w.idempotency(claim_op("a:k1", "a", t0(), 10)).await.unwrap(), claim::TAKEN);
    let r = store.reader().unwrap();
    match r.idempotency_entry("a:k1", t0()).unwrap() {
        Some(IdempotencyEntry::Pending { body_hash, .. }) => assert_eq!(body_hash, "h"),
        other => panic!("a pending claim, not {other:?}"),
    }
    assert_eq!(r.idempotent("a:k1", t0()).unwrap(), None, "a claim is no answer");
    // A claimant that died leaves its claim to lapse: the key is free again.
    let later = t0() + secs(61);
    assert_eq!(r.idempotency_entry("a:k1", later).unwrap(), None);
    assert_eq!(w.idempotency(claim_op("a:k1", "a", later, 10)).await.unwrap(), claim::CLAIMED);
    // A renewed claim holds.
    let renew = IdempotencyOp::Renew { scope_key: "a:k1".into(), until: later + secs(120) };
    assert_eq!(w.idempotency(renew).await.unwrap(), 1);
    assert_eq!(w.idempotency(claim_op("a:k1", "a", later + secs(90), 10)).await.unwrap(), claim::TAKEN);
    // The answer replaces the claim; releasing then removes nothing.
    let answer = answer_of("a:k1", "a", later + secs(3600));
    w.store_idempotent(answer.clone(), later).await.unwrap();
    assert_eq!(w.idempotency(IdempotencyOp::Release { scope_key: "a:k1".into() }).await.unwrap(), 0);
    assert_eq!(r.idempotency_entry("a:k1", later).unwrap(), Some(IdempotencyEntry::Answered(answer)));
    assert_eq!(w.idempotency(claim_op("a:k1", "a", later + secs(4000), 10)).await.unwrap(), claim::CLAIMED, "expired");
    // A released claim frees the key at once.
    assert_eq!(w.idempotency(claim_op("a:k2", "a", t0(), 10)).await.unwrap(), claim::CLAIMED);
    assert_eq!(w.idempotency(IdempotencyOp::Release { scope_key: "a:k2".into() }).await.unwrap(), 1);
    assert_eq!(w.idempotency(claim_op("a:k2", "a", t0(), 10)).await.unwrap(), claim::CLAIMED);
    drop(r);
    store.close().await.unwrap();
}

#[tokio::test]
async fn one_client_cannot_hold_more_than_its_share_of_keys(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    for k in 0..3 {
        let op = claim_op(&format!("greedy:{k}"), "greedy", t0(), 3);
        assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    }
    let op = claim_op("greedy:3", "greedy", t0(), 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::OWNER_SHARE_FULL);
    // Another client is not affected.
    let op = claim_op("modest:0", "modest", t0(), 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    // Expired keys leave the share.
    let later = t0() + secs(3601);
    let op = claim_op("greedy:3", "greedy", later, 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    // The share is a count the store keeps as keys come and go: a released key leaves it,
    // and the answer that replaces a claim does not count twice.
    for k in 4..6 {
        let op = claim_op(&format!("greedy:{k}"), "greedy", later, 3);
        assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    }
    let op = claim_op("greedy:6", "greedy", later, 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::OWNER_SHARE_FULL);
    let release = IdempotencyOp::Release { scope_key: "greedy:5".into() };
    assert_eq!(w.idempotency(release).await.unwrap(), 1);
    let op = claim_op("greedy:6", "greedy", later, 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    let answer = answer_of("greedy:6", "greedy", later + secs(3600));
    w.store_idempotent(answer, later).await.unwrap();
    let op = claim_op("greedy:7", "greedy", later, 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::OWNER_SHARE_FULL, "3, 4 and 6 held");
    let op = claim_op("modest:1", "modest", later, 3);
    assert_eq!(w.idempotency(op).await.unwrap(), claim::CLAIMED);
    store.close().await.unwrap();
}

#[tokio::test]
async fn one_client_cannot_push_everyone_elses_answers_out_of_the_cache(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let put = |key: &str, owner: &str, at: DateTime<Utc>| ContractOp::CacheUpsert {
        answer: Box::new(CachedAnswer {
            key: key.into(),
            owner: owner.into(),
            feature: "default".into(),
            stream: false,
            stored_at: at,
            status: 200,
            body: b"{}".to_vec(),
        }),
        purge_before: t0() - secs(3600),
        max_per_owner: 2,
    };
    w.contract(put("m1", "modest", t0())).await.unwrap();
    for i in 0..5 {
        w.contract(put(&format!("g{i}"), "greedy", t0() + secs(i))).await.unwrap();
    }
    let r = store.reader().unwrap();
    assert_eq!(r.cached_answers_of("greedy").unwrap(), 2, "held to its share");
    assert!(r.cached_answer("g4", t0()).unwrap().is_some(), "the newest stays");
    assert!(r.cached_answer("g3", t0()).unwrap().is_some());
    assert!(r.cached_answer("g0", t0()).unwrap().is_none(), "its oldest went");
    assert!(r.cached_answer("m1", t0()).unwrap().is_some(), "another client's stays");
    // Replacing one's own answer is no new entry.
    w.contract(put("g4", "greedy", t0() + secs(10))).await.unwrap();
    assert!(r.cached_answer("g3", t0()).unwrap().is_some());
    drop(r);
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_running_job_is_taken_again_only_once_its_claim_lapses(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let op = ContractOp::InsertJob { job: Box::new(job("job_1", t0())), max_queued: 10, max_per_owner: 10 };
    assert_eq!(w.contract(op).await.unwrap(), 1);
    let start = |worker: &str, at: DateTime<Utc>| ContractOp::StartJob {
        id: "job_1".into(),
        at,
        worker: worker.into(),
        lease_until: at + secs(30),
    };
    assert_eq!(w.contract(start("w1", t0())).await.unwrap(), 1);
    assert_eq!(w.contract(start("w2", t0())).await.unwrap(), 0, "one worker only");
    // w1 lives and renews: nobody takes its job.
    let renew = ContractOp::RenewJobs { worker: "w1".into(), until: t0() + secs(60) };
    assert_eq!(w.contract(renew).await.unwrap(), 1);
    assert_eq!(w.contract(ContractOp::RequeueLapsed { now: t0() + secs(45) }).await.unwrap(), 0);
    // w1 dies: its claim lapses, and w2 takes the job.
    assert_eq!(w.contract(ContractOp::RequeueLapsed { now: t0() + secs(61) }).await.unwrap(), 1);
    assert_eq!(w.contract(start("w2", t0() + secs(61))).await.unwrap(), 1);
    let j = store.reader().unwrap().contract_job("job_1").unwrap().unwrap();
    assert_eq!(j.status, JobStatus::Running);
    assert_eq!(j.runs, 2, "at least once");
    store.close().await.unwrap();
}
}

fn job(id: &str, at: DateTime<Utc>) -> JobRecord {
    JobRecord {
        id: id.into(),
        owner: probeok::proxy::contract::owner_of(""),
        feature: "default".into(),
        model: "chat".into(),
        residency: None,
        stream_requested: false,
        request: serde_json::to_vec(&serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "queued"}],
        }))
        .unwrap(),
        status: JobStatus::Queued,
        runs: 0,
        created_at: at,
        expires_at: at + chrono::Duration::minutes(10),
        started_at: None,
        finished_at: None,
        result_status: None,
        result_body: None,
        error: None,
    }
}

// ---- real processes on one PostgreSQL database ----

/// A database of the test's own on the `PROBEOK_TEST_PG_URL` server, dropped at its end.
struct Db {
    name: String,
    url: String,
}

impl Db {
    async fn create() -> Db {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "fleet_t{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect(&server_url()).await;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        Db {
            url: with_dbname(&server_url(), &name),
            name,
        }
    }

    async fn drop_now(self) {
        let admin = connect(&server_url()).await;
        let _ = admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

/// What the proxies read their database URL from (set on the child processes only).
const URL_VAR: &str = "PROBEOK_FLEET_DATABASE_URL";
const KEYS_VAR: &str = "PROBEOK_FLEET_CLIENT_KEYS";
/// The key of the named client with a spend limit, where a test configures one.
const TEAM_VAR: &str = "PROBEOK_FLEET_TEAM_KEY";

use common::free_port;

fn write_config(dir: &Path, name: &str, port: u16, upstream: &str, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let body = format!(
        r#"
[storage]
path = "{db}"
url_env = "{URL_VAR}"

[proxy]
listen = "127.0.0.1:{port}"
client_keys_env = "{KEYS_VAR}"
{extra}

[[provider]]
id = "up"
kind = "openai"
  [[provider.region]]
  id = "r1"
  base_url = "{upstream}"

[[route]]
provider = "up"
region = "r1"
model = "m1"
serves = "chat"
tier = "primary"
weight = 100
"#,
        // Without the URL variable every replica uses this one SQLite file.
        db = dir.join("shared.db").display(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

struct Replica {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `probeok proxy` on `db_url` and waits until it answers `/readyz`.
async fn start(dir: &Path, name: &str, db_url: &str, upstream: &str, extra: &str) -> Replica {
    start_with(dir, name, Some(db_url), upstream, extra, &[]).await
}

async fn start_with(
    dir: &Path,
    name: &str,
    db_url: Option<&str>,
    upstream: &str,
    extra: &str,
    args: &[&str],
) -> Replica {
    let port = free_port();
    let config = write_config(dir, name, port, upstream, extra);
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_probeok"));
    if let Some(url) = db_url {
        cmd.env(URL_VAR, url);
    }
    let child = cmd
        .args(["proxy", "--config"])
        .arg(&config)
        .args(args)
        .env_remove("PROBEOK_CONFIG")
        .env(KEYS_VAR, "key-a,key-b")
        .env(TEAM_VAR, "key-team")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start probeok proxy");
    let r = Replica {
        child,
        base: format!("http://127.0.0.1:{port}"),
        log,
    };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(resp) = http.get(format!("{}/readyz", r.base)).send().await {
            if resp.status().is_success() {
                return r;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} did not answer /readyz within 30 s:\n{}",
            r.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fake upstream answering after `delay`, counting its calls.
async fn upstream(delay: Duration) -> (common::upstream::Server, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let (server, _reqs) = fake("/chat/completions", move |_| {
        let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
        Reply::after(
            delay,
            json(
                StatusCode::OK,
                openai::body(&format!("answer {n}"), "stop", Some(3)),
            ),
        )
    })
    .await;
    (server, calls)
}

fn chat(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    idempotency: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut req = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "hello"}],
        }));
    if let Some(k) = idempotency {
        req = req.header("Idempotency-Key", k);
    }
    req
}

fn open_store(url: &str) -> Store {
    let url = PgUrl::parse(url).unwrap().unwrap();
    Store::open_at(&StoreLocation::Postgres(url), StoreOptions::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_on_two_replicas_at_once_reaches_the_upstream_once() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (up, calls) = upstream(Duration::from_millis(400)).await;
    let a = start(dir.path(), "a", &db.url, &up.base_url(), "").await;
    let b = start(dir.path(), "b", &db.url, &up.base_url(), "").await;
    let http = reqwest::Client::new();
    let (ra, rb) = tokio::join!(
        chat(&http, &a.base, "key-a", Some("order-1")).send(),
        chat(&http, &b.base, "key-a", Some("order-1")).send(),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.status(), 200, "{}", a.log());
    assert_eq!(rb.status(), 200, "{}", b.log());
    let replays = [&ra, &rb]
        .iter()
        .filter(|r| r.headers().get("x-probeok-idempotent-replay").is_some())
        .count();
    assert_eq!(replays, 1, "one answered, the other waited for its answer");
    let (ba, bb) = (ra.bytes().await.unwrap(), rb.bytes().await.unwrap());
    assert_eq!(ba, bb, "equal answers");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one upstream call");
    // The same key from another client is another key.
    let rc = chat(&http, &b.base, "key-b", Some("order-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(rc.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Both replicas metered into the one table (a replay is not metered: no upstream call).
    let store = open_store(&db.url);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = store
            .reader()
            .unwrap()
            .proxy_requests(&RequestFilter {
                limit: 100,
                ..Default::default()
            })
            .unwrap()
            .len();
        if n == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{n} metered requests, not 2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.close().await.unwrap();
    drop((a, b));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_on_two_processes_on_one_sqlite_file_reaches_the_upstream_once() {
    let dir = tempfile::tempdir().unwrap();
    let (up, calls) = upstream(Duration::from_millis(400)).await;
    let a = start_with(dir.path(), "a", None, &up.base_url(), "", &[]).await;
    let b = start_with(dir.path(), "b", None, &up.base_url(), "", &[]).await;
    let http = reqwest::Client::new();
    let (ra, rb) = tokio::join!(
        chat(&http, &a.base, "key-a", Some("order-1")).send(),
        chat(&http, &b.base, "key-a", Some("order-1")).send(),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        (ra.status().as_u16(), rb.status().as_u16()),
        (200, 200),
        "{}\n{}",
        a.log(),
        b.log()
    );
    assert_eq!(
        ra.bytes().await.unwrap(),
        rb.bytes().await.unwrap(),
        "equal answers"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one upstream call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_share_of_keys_gets_429() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (up, calls) = upstream(Duration::ZERO).await;
    let extra = "idempotency_keys_per_client = 2";
    let a = start(dir.path(), "a", &db.url, &up.base_url(), extra).await;
    let b = start(dir.path(), "b", &db.url, &up.base_url(), extra).await;
    let http = reqwest::Client::new();
    for (r, k) in [(&a, "k1"), (&b, "k2")] {
        let resp = chat(&http, &r.base, "key-a", Some(k)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let resp = chat(&http, &a.base, "key-a", Some("k3"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "client_idempotency_keys_full");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "no upstream call beyond the share"
    );
    // The other client has its own share; a replay is no new key.
    let resp = chat(&http, &b.base, "key-b", Some("k3"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = chat(&http, &b.base, "key-a", Some("k1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("x-probeok-idempotent-replay").is_some());
    drop((a, b));
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_runs_exactly_once_across_three_replicas() {
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (up, calls) = upstream(Duration::from_millis(300)).await;
    let replicas = [
        start(dir.path(), "a", &db.url, &up.base_url(), "").await,
        start(dir.path(), "b", &db.url, &up.base_url(), "").await,
        start(dir.path(), "c", &db.url, &up.base_url(), "").await,
    ];
    // Jobs queued while the model was degraded, now healthy: every worker sees them at once.
    let store = open_store(&db.url);
    let now = Utc::now();
    let ids: Vec<String> = (0..6).map(|i| format!("job_{i:032x}")).collect();
    for id in &ids {
        let op = ContractOp::InsertJob {
            job: Box::new(job(id, now)),
            max_queued: 100,
            max_per_owner: 100,
        };
        assert_eq!(store.writer().contract(op).await.unwrap(), 1);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = store.reader().unwrap();
        let done = ids
            .iter()
            .filter(|id| r.contract_job(id).unwrap().unwrap().status == JobStatus::Succeeded)
            .count();
        if done == ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {} jobs done:\n{}",
            ids.len(),
            replicas[0].log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = store.reader().unwrap();
    for id in &ids {
        assert_eq!(
            r.contract_job(id).unwrap().unwrap().runs,
            1,
            "{id} ran once"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        ids.len(),
        "one upstream call per job"
    );
    drop(r);
    store.close().await.unwrap();
    drop(replicas);
    db.drop_now().await;
}

/// Cuts the database off (sessions ended, new ones refused) or lets it back.
async fn set_reachable(db: &Db, reachable: bool) {
    let admin = connect(&server_url()).await;
    if reachable {
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS true",
                db.name
            ))
            .await
            .unwrap();
    } else {
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS false",
                db.name
            ))
            .await
            .unwrap();
        // A session that was being opened as the door closed may still come in: end them
        // until none is left.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                    &[&db.name],
                )
                .await
                .unwrap();
            if rows.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "sessions on {} stay", db.name);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn readyz(http: &reqwest::Client, r: &Replica) -> serde_json::Value {
    http.get(format!("{}/readyz", r.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_database_a_proxy_serves_buffers_and_refuses_only_idempotent_calls() {
    // A client with a spend limit: held to the reservations it holds while nothing can be
    // written.
    let team = format!(
        "[[proxy.client]]\nid = \"team\"\nkey_env = \"{TEAM_VAR}\"\nlimit = {{ amount = 100.0, per = \"day\" }}\n"
    );
    let db = Db::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (up, calls) = upstream(Duration::ZERO).await;
    // The monitor's ingest, where the passive outcomes go whatever the database does (its
    // weights feed is absent here: the proxy routes on the configured weights).
    let (monitor, ingested) = fake("/api/v1/ingest", |_| {
        Reply::now(json(StatusCode::OK, serde_json::json!({"accepted": 1})))
    })
    .await;
    let passive = move || -> usize {
        ingested
            .all()
            .iter()
            .map(|c| c.json().as_array().map_or(0, Vec::len))
            .sum()
    };
    let a = start_with(
        dir.path(),
        "a",
        Some(&db.url),
        &up.base_url(),
        &team,
        &["--weights-from", &monitor.base_url()],
    )
    .await;
    let http = reqwest::Client::new();
    let ok = chat(&http, &a.base, "key-a", None).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert!(ok.headers().get("x-probeok-store").is_none());
    let booked = chat(&http, &a.base, "key-team", None).send().await.unwrap();
    assert_eq!(
        booked.status(),
        200,
        "the limited client is booked while the store is up"
    );

    set_reachable(&db, false).await;
    let cut = Instant::now();
    // Read-only mode within a few checks.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if readyz(&http, &a).await["store"] == "unavailable" {
            break;
        }
        assert!(Instant::now() < deadline, "no read-only mode:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "read-only mode {:?} after the database went away",
        cut.elapsed()
    );
    let ready = readyz(&http, &a).await;
    assert_eq!(ready["serving"], true);
    assert_eq!(ready["status"], "read_only");
    assert!(ready["store_unavailable_since"].is_string());
    const OUTAGE_REQUESTS: usize = 5;
    for _ in 0..OUTAGE_REQUESTS {
        let r = chat(&http, &a.base, "key-a", None).send().await.unwrap();
        assert_eq!(r.status(), 200, "normal requests are served");
        assert_eq!(
            r.headers()
                .get("x-probeok-store")
                .map(|v| v.to_str().unwrap()),
            Some("unavailable"),
            "{}",
            a.log()
        );
    }
    let before = calls.load(Ordering::SeqCst);
    let r = chat(&http, &a.base, "key-a", Some("pay-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-probeok-store"], "unavailable");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "store_unavailable");
    assert_eq!(calls.load(Ordering::SeqCst), before, "never sent upstream");
    // The limited client cannot book anything new: refused, never sent upstream.
    let r = chat(&http, &a.base, "key-team", None).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "store_unavailable");
    assert_eq!(calls.load(Ordering::SeqCst), before, "never sent upstream");
    // Every attempt of the outage reached the monitor as a passive outcome.
    let deadline = Instant::now() + Duration::from_secs(20);
    while passive() < 2 + OUTAGE_REQUESTS {
        assert!(
            Instant::now() < deadline,
            "{} passive outcomes ingested",
            passive()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    set_reachable(&db, true).await;
    let back = Instant::now();
    let store = open_store(&db.url);
    let deadline = Instant::now() + Duration::from_secs(60);
    let flushed = loop {
        let n = store
            .reader()
            .unwrap()
            .proxy_requests(&RequestFilter {
                limit: 100,
                ..Default::default()
            })
            .unwrap()
            .len();
        // Two before the outage and the outage's five (the refused idempotent and limited
        // requests were refused before any attempt: not metered, as any refused key is not).
        if n == 2 + OUTAGE_REQUESTS {
            break back.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{n} metered requests after the return:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("the outage's metering was written {flushed:?} after the database returned");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = chat(&http, &a.base, "key-a", Some("pay-2"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 && r.headers().get("x-probeok-store").is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "the header stayed:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(readyz(&http, &a).await["status"], "ready");
    store.close().await.unwrap();
    drop(a);
    db.drop_now().await;
}
