//! Every store table besides outcomes and detection's, on both engines (a SQLite file and a
//! PostgreSQL database): the alert outbox and silences, proxy metering and idempotency keys,
//! the degradation contracts' jobs and cache, switch records, regression set runs, drills and
//! the reads behind their reports, and the bulk reads behind the published views.

use crate::common::pg;
use crate::on_both_engines;

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use pg::TestDb;
use probeok::probe::outcome::{OutcomeKind, ProbeOutcome};
use probeok::records::drift::{CaseResult, SetRun, ValidatorFailure};
use probeok::records::drill::{Drill, EndedBy};
use probeok::records::switch::{Action, Episode, SwitchRecord};
use probeok::route::RouteId;
use probeok::silence::Silence;
use probeok::store::alerts::{AlertOp, FiringRow, NewEntry};
use probeok::store::drills::DrillOp;
use probeok::store::{
    AttemptRecord, CachedAnswer, ContractOp, Counts, Granularity, IdempotentAnswer, JobRecord,
    JobStatus, RequestFilter, RequestRecord, StoreOptions, Window,
};

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap()
}

fn job(id: &str, at: DateTime<Utc>) -> JobRecord {
    JobRecord {
        id: id.to_owned(),
        owner: "o".into(),
        feature: "default".into(),
        model: "chat".into(),
        residency: None,
        stream_requested: false,
        request: b"{}".to_vec(),
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

on_both_engines! {
#[tokio::test]
async fn one_owner_fills_only_its_share_of_the_queue(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let t0 = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
    let share = |id: &str, owner: &str| {
        let mut j = job(id, t0);
        j.owner = owner.into();
        ContractOp::InsertJob {
            job: Box::new(j),
            max_queued: 10,
            max_per_owner: 2,
        }
    };
    assert_eq!(w.contract(share("job_1", "greedy")).await.unwrap(), 1);
    assert_eq!(w.contract(share("job_2", "greedy")).await.unwrap(), 1);
    assert_eq!(
        w.contract(share("job_3", "greedy")).await.unwrap(),
        probeok::store::OWNER_SHARE_FULL
    );
    assert_eq!(w.contract(share("job_4", "modest")).await.unwrap(), 1);
    // A job that left the queue frees its place in the share.
    let start = ContractOp::StartJob {
        id: "job_1".into(),
        at: t0,
        worker: "w1".into(),
        lease_until: t0 + chrono::Duration::seconds(30),
    };
    assert_eq!(w.contract(start).await.unwrap(), 1);
    assert_eq!(w.contract(share("job_5", "greedy")).await.unwrap(), 1);
}
}

on_both_engines! {
#[tokio::test]
async fn jobs_are_bounded_started_once_and_expire(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let t0 = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
    let insert = |id: &str| ContractOp::InsertJob {
        job: Box::new(job(id, t0)),
        max_queued: 2,
        max_per_owner: 2,
    };
    assert_eq!(w.contract(insert("job_a")).await.unwrap(), 1);
    assert_eq!(w.contract(insert("job_b")).await.unwrap(), 1);
    assert_eq!(w.contract(insert("job_c")).await.unwrap(), 0, "queue full");
    let start = |id: &str| ContractOp::StartJob {
        id: id.into(),
        at: t0,
        worker: "w1".into(),
        lease_until: t0 + chrono::Duration::seconds(30),
    };
    assert_eq!(w.contract(start("job_a")).await.unwrap(), 1);
    assert_eq!(w.contract(start("job_a")).await.unwrap(), 0, "only once");
    assert_eq!(w.contract(ContractOp::RequeueRunning).await.unwrap(), 1);
    let later = t0 + chrono::Duration::minutes(11);
    assert_eq!(
        w.contract(ContractOp::ExpireJobs { now: later })
            .await
            .unwrap(),
        2
    );
    let r = store.reader().unwrap();
    let a = r.contract_job("job_a").unwrap().unwrap();
    assert_eq!(a.status, JobStatus::Expired);
    assert_eq!(a.runs, 1);
    assert!(r.queued_contract_jobs(t0, 10, &[]).unwrap().is_empty());
    // Jobs of models still degraded wait; the others are taken, oldest first.
    let mut other = job("job_d", t0 + chrono::Duration::seconds(1));
    other.model = "lite".into();
    for j in [job("job_c", t0), other] {
        let op = ContractOp::InsertJob {
            job: Box::new(j),
            max_queued: 10,
            max_per_owner: 10,
        };
        assert_eq!(w.contract(op).await.unwrap(), 1);
    }
    let ids = |skip: &[String]| -> Vec<String> {
        r.queued_contract_jobs(t0, 10, skip)
            .unwrap()
            .into_iter()
            .map(|j| j.id)
            .collect()
    };
    assert_eq!(ids(&[]), ["job_c", "job_d"]);
    assert_eq!(ids(&["chat".to_owned()]), ["job_d"]);
    let purged = w
        .contract(ContractOp::PurgeJobs {
            before: later + chrono::Duration::seconds(1),
            limit: 100,
        })
        .await
        .unwrap();
    assert_eq!(purged, 2, "ended jobs only");
    assert!(r.contract_job("job_a").unwrap().is_none());
    assert!(r.contract_job("job_c").unwrap().is_some());
    drop(r);
    store.close().await.unwrap();
}
}

fn outcome(route: &RouteId, kind: OutcomeKind, at: DateTime<Utc>, ok: bool) -> ProbeOutcome {
    ProbeOutcome {
        route: route.clone(),
        kind,
        started_at: at,
        success: ok,
        attributed_to: None,
        verified: Some(ok),
        ttfb_ms: Some(100.0),
        ttft_ms: Some(150.0),
        total_ms: if ok { 400.0 } else { 3000.0 },
        output_tokens: Some(3),
        tokens_estimated: false,
        tokens_per_second: Some(42.5),
        model_reported: None,
        system_fingerprint: None,
        http_status: Some(if ok { 200 } else { 503 }),
        error: None,
        answer: None,
        first_answer_ms: None,
        max_tokens_exhausted: false,
        ratelimit: None,
    }
}

on_both_engines! {
#[tokio::test]
async fn the_alert_outbox_firing_alerts_and_silences(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let entry = |key: &str, s: i64| NewEntry {
        dedup_key: key.to_owned(),
        channel: "ops".to_owned(),
        message: format!("{{\"key\":\"{key}\"}}"),
        created_at: t0() + Duration::seconds(s),
    };
    let firing = FiringRow {
        key: "route_down:a".into(),
        message: "{}".into(),
        opened_at: t0(),
    };
    let n = w
        .alert(AlertOp::Enqueue {
            entries: vec![entry("a#ops", 0), entry("b#ops", 1), entry("a#ops", 2)],
            firing: vec![firing.clone()],
            resolved: vec![],
        })
        .await
        .unwrap();
    assert_eq!(n, 2, "a known dedup key is skipped");
    let r = store.reader().unwrap();
    let due = r.outbox_due(t0() + Duration::seconds(5), 10).unwrap();
    assert_eq!(due.len(), 2);
    assert_eq!(due[0].dedup_key, "a#ops");
    assert_eq!(due[0].status, "pending");
    assert_eq!(r.outbox_due(t0() + Duration::seconds(5), 1).unwrap().len(), 1);
    assert_eq!(r.outbox_next_due().unwrap(), Some(t0()));
    assert_eq!(r.alert_firing().unwrap(), vec![firing]);

    let (a, b) = (due[0].id, due[1].id);
    let retry = AlertOp::Retry {
        id: a,
        count_attempt: true,
        next: t0() + Duration::seconds(60),
        error: Some("http 500".into()),
        claim: None,
    };
    assert_eq!(w.alert(retry).await.unwrap(), 1);
    // Deferred without counting, keeping the last error.
    let defer = AlertOp::Retry {
        id: a,
        count_attempt: false,
        next: t0() + Duration::seconds(90),
        error: None,
        claim: None,
    };
    assert_eq!(w.alert(defer).await.unwrap(), 1);
    // Claimed once by one member: a second claim finds nothing due, and only the claim's
    // holder can reschedule the row.
    let (due_at, held) = (t0() + Duration::seconds(90), t0() + Duration::seconds(150));
    let claim = |now| AlertOp::Claim { id: a, now, until: held };
    assert_eq!(w.alert(claim(due_at)).await.unwrap(), 1);
    assert_eq!(w.alert(claim(due_at)).await.unwrap(), 0);
    let release = |claim| AlertOp::Retry {
        id: a,
        count_attempt: false,
        next: due_at,
        error: None,
        claim: Some(claim),
    };
    assert_eq!(w.alert(release(due_at)).await.unwrap(), 0);
    assert_eq!(w.alert(release(held)).await.unwrap(), 1);
    let row = r.outbox_all().unwrap().into_iter().find(|e| e.id == a).unwrap();
    assert_eq!((row.attempts, row.last_error.as_deref()), (1, Some("http 500")));
    assert_eq!(row.next_attempt_at, t0() + Duration::seconds(90));
    assert_eq!(w.alert(AlertOp::Delivered { id: a, at: t0() }).await.unwrap(), 1);
    assert_eq!(w.alert(AlertOp::Delivered { id: a, at: t0() }).await.unwrap(), 0);
    let dropped = AlertOp::Dropped {
        id: b,
        at: t0(),
        error: "too old".into(),
    };
    assert_eq!(w.alert(dropped).await.unwrap(), 1);
    assert_eq!(r.outbox_next_due().unwrap(), None);
    let statuses: Vec<String> = r.outbox_all().unwrap().into_iter().map(|e| e.status).collect();
    assert_eq!(statuses, ["delivered", "dropped"]);

    let silence = Silence {
        id: "s1".into(),
        routes: vec!["openai/*".into()],
        starts_at: t0(),
        ends_at: t0() + Duration::hours(1),
        comment: "maintenance".into(),
        created_by: "ops".into(),
        created_at: t0(),
    };
    w.alert(AlertOp::PutSilence(silence.clone())).await.unwrap();
    let longer = Silence {
        ends_at: t0() + Duration::hours(2),
        ..silence.clone()
    };
    w.alert(AlertOp::PutSilence(longer.clone())).await.unwrap();
    assert_eq!(r.silences().unwrap(), vec![longer]);
    let resolved = AlertOp::Enqueue {
        entries: vec![],
        firing: vec![],
        resolved: vec!["route_down:a".into()],
    };
    w.alert(resolved).await.unwrap();
    assert!(r.alert_firing().unwrap().is_empty());
    let pruned = w
        .alert(AlertOp::Prune {
            before: t0() + Duration::hours(3),
        })
        .await
        .unwrap();
    assert_eq!(pruned, 3, "two finished entries and the ended silence");
    assert!(r.outbox_all().unwrap().is_empty());
    assert_eq!(w.alert(AlertOp::DeleteSilence("s1".into())).await.unwrap(), 0);
    drop(r);
    store.close().await.unwrap();
}
}

fn request(id: &str, at: DateTime<Utc>, attempts: Vec<AttemptRecord>) -> RequestRecord {
    RequestRecord {
        request_id: id.to_owned(),
        serves: "chat".into(),
        started_at: at,
        route: attempts.last().map(|a| a.route.clone()),
        outcome: "ok".into(),
        status: 200,
        stream: true,
        fallback_reason: (attempts.len() > 1).then(|| "http_503".to_owned()),
        prompt_tokens: Some(12),
        completion_tokens: Some(30),
        cost: Some(0.0021),
        currency: Some("USD".into()),
        latency_ms: 812.5,
        attempts,
        contract: None,
        trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        client: Some("team-a".into()),
    }
}

fn attempt(n: u32, route: &str, reason: Option<&str>) -> AttemptRecord {
    AttemptRecord {
        n,
        route: route.to_owned(),
        reason: reason.map(str::to_owned),
        status_class: if reason.is_some() { "5xx" } else { "2xx" }.into(),
        status: Some(if reason.is_some() { 503 } else { 200 }),
        ttfb_ms: Some(120.0),
        latency_ms: 400.0,
        prompt_tokens: Some(12),
        completion_tokens: reason.is_none().then_some(30),
        cost: None,
        outcome: if reason.is_some() { "failed" } else { "ok" }.into(),
    }
}

on_both_engines! {
#[tokio::test]
async fn metering_filters_and_idempotency_keys(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let one = request("r1", t0(), vec![attempt(1, "a/x/m", None)]);
    let two = request(
        "r2",
        t0() + Duration::seconds(10),
        vec![attempt(1, "a/x/m", Some("http_503")), attempt(2, "b/y/m", None)],
    );
    w.record_request(one.clone()).await.unwrap();
    w.record_request(two.clone()).await.unwrap();
    let r = store.reader().unwrap();
    let all = |f: RequestFilter| -> Vec<RequestRecord> { r.proxy_requests(&f).unwrap() };
    let ids = |v: Vec<RequestRecord>| -> Vec<String> { v.into_iter().map(|x| x.request_id).collect() };
    assert_eq!(all(RequestFilter { limit: 10, ..Default::default() }), vec![two.clone(), one.clone()]);
    let by_route = RequestFilter { limit: 10, route: Some("b/y/m".into()), ..Default::default() };
    assert_eq!(ids(all(by_route)), ["r2"]);
    let by_reason = RequestFilter { limit: 10, reason: Some("http_503".into()), ..Default::default() };
    assert_eq!(ids(all(by_reason)), ["r2"]);
    let since = RequestFilter { limit: 10, since: Some(t0() + Duration::seconds(1)), ..Default::default() };
    assert_eq!(ids(all(since)), ["r2"]);
    assert_eq!(ids(all(RequestFilter { limit: 1, ..Default::default() })), ["r2"]);

    let answer = IdempotentAnswer {
        scope_key: "k1".into(),
        owner: "o1".into(),
        body_hash: "h".into(),
        expires_at: t0() + Duration::minutes(10),
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        stream: true,
        body: b"data: {}\n\ndata: [DONE]\n\n".to_vec(),
    };
    w.store_idempotent(answer.clone(), t0()).await.unwrap();
    assert_eq!(r.idempotent("k1", t0()).unwrap(), Some(answer.clone()));
    assert_eq!(r.idempotent("k1", t0() + Duration::minutes(10)).unwrap(), None, "expired");
    let replaced = IdempotentAnswer { status: 201, ..answer };
    w.store_idempotent(replaced.clone(), t0()).await.unwrap();
    assert_eq!(r.idempotent("k1", t0()).unwrap(), Some(replaced));

    let cached = CachedAnswer {
        key: "c1".into(),
        owner: "o1".into(),
        feature: "default".into(),
        stream: false,
        stored_at: t0(),
        status: 200,
        body: vec![0, 159, 146, 150],
    };
    let upsert = ContractOp::CacheUpsert {
        answer: Box::new(cached.clone()),
        purge_before: t0() - Duration::hours(1),
        max_per_owner: 10,
    };
    w.contract(upsert).await.unwrap();
    assert_eq!(r.cached_answer("c1", t0()).unwrap(), Some(cached));
    assert_eq!(r.cached_answer("c1", t0() + Duration::seconds(1)).unwrap(), None);
    let purge = ContractOp::CachePurge { before: t0() + Duration::seconds(1), limit: 10 };
    assert_eq!(w.contract(purge).await.unwrap(), 1);

    // Retention removes old metering with its attempts.
    let report = w.retention(t0() + Duration::days(15), 14, 400).await.unwrap();
    assert_eq!(report.proxy_requests, 2);
    assert!(all(RequestFilter { limit: 10, ..Default::default() }).is_empty());
    drop(r);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn a_metering_batch_keeps_each_requests_attempts_with_it(db: &TestDb) {
    // One writer command, one transaction, the statements reused from row to row: every
    // attempt row still names its own request.
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let batch: Vec<RequestRecord> = (0..3)
        .map(|i| {
            let mut attempts = vec![attempt(1, "a/x/m", Some("http_503"))];
            attempts.extend((i > 0).then(|| attempt(2, "b/y/m", None)));
            request(&format!("r{i}"), t0() + Duration::seconds(i), attempts)
        })
        .collect();
    w.record_requests(batch.clone().into()).await.unwrap();
    let r = store.reader().unwrap();
    let mut read = r.proxy_requests(&RequestFilter { limit: 10, ..Default::default() }).unwrap();
    read.reverse(); // it reads newest first
    assert_eq!(read, batch);
    assert_eq!(read.iter().map(|x| x.attempts.len()).collect::<Vec<_>>(), [1, 2, 2]);
    drop(r);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn switch_records_drift_runs_and_drills(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let w = store.writer();
    let primary = RouteId::new("openai", "us", "gpt-x");
    let backup = RouteId::new("azure", "eu", "gpt-x");
    let switch = SwitchRecord {
        serves: "chat".into(),
        action: Action::Switch,
        at: t0(),
        trigger: "error_rate_high".into(),
        from: vec![primary.clone()],
        to: vec![backup.clone()],
        automatic: true,
        dwell_until: Some(t0() + Duration::minutes(10)),
        ratio: None,
        episode: Some(Episode {
            started_at: t0(),
            duration_s: 0,
            switches: 1,
            extra_cost: 0.5,
        }),
        text: "switched".into(),
    };
    let canary = SwitchRecord {
        action: Action::CanaryStage,
        at: t0() + Duration::minutes(20),
        ratio: Some(0.25),
        dwell_until: None,
        episode: None,
        ..switch.clone()
    };
    w.record_switch(switch.clone()).await.unwrap();
    w.record_switch(canary.clone()).await.unwrap();
    let r = store.reader().unwrap();
    assert_eq!(r.switch_records(10).unwrap(), vec![canary, switch.clone()]);
    assert_eq!(r.switch_records(1).unwrap().len(), 1);

    let case = |name: &str, passed: Option<bool>| CaseResult {
        case: name.to_owned(),
        passed,
        failures: if passed == Some(false) {
            vec![ValidatorFailure { validator: "exact".into(), message: "differs".into() }]
        } else {
            vec![]
        },
        output_chars: 7,
        latency_ms: 321.25,
        output_tokens: passed.map(|_| 3),
        model_reported: Some("gpt-x-2026".into()),
        system_fingerprint: None,
        error: passed.is_none().then(|| "timeout: no first byte".to_owned()),
        output: "PROBE_OK".into(),
    };
    let run = |s: i64| SetRun {
        route: primary.clone(),
        set: "basics".into(),
        started_at: t0() + Duration::seconds(s),
        cases: vec![case("one", Some(true)), case("two", Some(false)), case("three", None)],
    };
    for s in [0, 60, 120] {
        w.record_drift_run(run(s)).await.unwrap();
    }
    assert_eq!(r.drift_runs(&primary, "basics", 2).unwrap(), vec![run(60), run(120)]);
    let totals = r.drift_run_totals(&primary, t0(), t0() + Duration::hours(1)).unwrap();
    let t = &totals["basics"];
    assert_eq!((t.runs, t.passed, t.answered, t.cases), (3, 3, 6, 9));

    let drill = Drill {
        id: 0,
        route: primary.clone(),
        serves: "chat".into(),
        weight: 0,
        ramp: vec![50, 100],
        reason: "game day".into(),
        started_by: Some("ops".into()),
        forced: false,
        started_at: t0(),
        ends_at: t0() + Duration::hours(1),
        ended_at: None,
        ended_by: None,
        stopped_by: None,
        receivers: vec![],
    };
    let id = w.drill(DrillOp::Start(Box::new(drill.clone()))).await.unwrap() as i64;
    assert!(id > 0);
    assert!(
        w.drill(DrillOp::Start(Box::new(drill.clone()))).await.is_err(),
        "one active drill per route"
    );
    w.drill(DrillOp::Receivers { id, routes: vec![backup.clone()] }).await.unwrap();
    assert_eq!(r.active_drills().unwrap().len(), 1);
    let end = DrillOp::End { id, at: t0() + Duration::minutes(30), by: EndedBy::Stop, who: Some("ops".into()) };
    assert_eq!(w.drill(end.clone()).await.unwrap(), 1);
    assert_eq!(w.drill(end).await.unwrap(), 0, "already ended");
    let stored = r.drill(id).unwrap().unwrap();
    assert_eq!(stored.receivers, vec![backup.clone()]);
    assert_eq!(stored.ended_by, Some(EndedBy::Stop));
    assert_eq!(r.drills(10).unwrap(), vec![stored]);
    assert!(r.active_drills().unwrap().is_empty());
    assert_eq!(r.drill(id + 100).unwrap(), None);

    // The report's reads over the drill's window.
    let mut req = request("d1", t0() + Duration::minutes(1), vec![attempt(1, backup.as_str(), None)]);
    w.record_request(req.clone()).await.unwrap();
    req.request_id = "d2".into();
    req.outcome = "failed".into();
    req.fallback_reason = Some("http_503".into());
    req.contract = Some("reject".into());
    w.record_request(req).await.unwrap();
    let figures = r.drill_requests("chat", t0(), t0() + Duration::hours(1)).unwrap();
    assert_eq!((figures.total, figures.ok, figures.fallbacks), (2, 1, 1));
    assert_eq!(figures.contracts, BTreeMap::from([("reject".to_owned(), 1)]));
    assert_eq!(figures.by_route, BTreeMap::from([(backup.to_string(), 2)]));
    let outcomes = vec![
        outcome(&backup, OutcomeKind::Probe, t0() + Duration::minutes(2), true),
        outcome(&backup, OutcomeKind::Probe, t0() + Duration::minutes(3), false),
        outcome(&backup, OutcomeKind::Passive, t0() + Duration::minutes(3), true),
    ];
    w.record_many(outcomes).await.unwrap();
    let o = r.drill_outcomes(&backup, OutcomeKind::Probe, t0(), t0() + Duration::hours(1)).unwrap();
    assert_eq!((o.total, o.successes, o.validation_failures), (2, 1, 1));
    assert_eq!(o.latencies_ms, vec![400.0]);
    drop(r);
    store.close().await.unwrap();
}
}

on_both_engines! {
#[tokio::test]
async fn bulk_reads_for_the_published_views(db: &TestDb) {
    let store = db.open(StoreOptions {
        latency_threshold: std::time::Duration::from_secs(1),
    });
    let (a, b) = (RouteId::new("p", "r1", "m"), RouteId::new("p", "r2", "m"));
    let mut batch = Vec::new();
    // Two days of one probe an hour on `a` (one in four failing), a passive call on `b`.
    for h in 0..48 {
        let at = t0() + Duration::hours(h) + Duration::minutes(5);
        batch.push(outcome(&a, OutcomeKind::Probe, at, h % 4 != 0));
    }
    batch.push(outcome(&b, OutcomeKind::Passive, t0() + Duration::hours(47), true));
    store.writer().record_many(batch).await.unwrap();
    let r = store.reader().unwrap();
    let until = t0() + Duration::hours(48);
    let counts = r.counts_by_route(t0(), until, &[]).unwrap();
    assert_eq!((counts[&a].count, counts[&a].successes, counts[&a].good), (48, 36, 36));
    assert_eq!(counts[&b].count, 1);
    let probes = r.counts_by_route(t0(), until, &[OutcomeKind::Probe]).unwrap();
    assert!(!probes.contains_key(&b));
    let summaries = r.summaries_by_route(Granularity::Hour, t0(), until, &[]).unwrap();
    assert_eq!(summaries[&a].count, 48);
    assert_eq!(summaries[&a].histogram.count(), 36);
    assert_eq!(summaries[&a].latency_sum_us, 36 * 400_000);
    let days = r.daily_counts_by_route(t0(), until, &[]).unwrap();
    let a_days: Vec<u64> = days[&a].iter().map(|(_, c)| c.count).collect();
    assert_eq!(a_days, [24, 24]);
    assert_eq!(days[&a][1].0, t0().timestamp() / 86_400 + 1);
    let samples = r
        .recent_samples(t0() + Duration::hours(46), &[OutcomeKind::Probe], ALL)
        .unwrap();
    assert_eq!(samples[&a].ttfb_ms, vec![100.0, 100.0], "hours 46 and 47");
    assert_eq!(samples[&b].tokens_per_second, vec![42.5]);
    assert!(samples[&b].ttfb_ms.is_empty(), "passive TTFB was not asked for");
    let bad = r
        .bad_outcomes_between(&a, t0(), until, &[OutcomeKind::Probe], 1000.0)
        .unwrap();
    assert_eq!(bad, 12);
    let summary = r.summary(&a, Granularity::Day, t0(), until, &[]).unwrap();
    assert_eq!(summary.count, 48);
    let recent = r.recent_outcomes_of(&a, &[OutcomeKind::Probe], 3).unwrap();
    assert_eq!(recent.len(), 3);
    assert!(recent[0].started_at > recent[1].started_at);
    drop(r);
    store.close().await.unwrap();
}
}

// A day bar sums the day's kinds that were asked for, and only those; days come oldest first.
on_both_engines! {
#[tokio::test]
async fn day_bars_sum_the_kinds_asked_for(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let a = RouteId::new("p", "r1", "m");
    let mut batch = Vec::new();
    for (h, kind, ok) in [
        (1, OutcomeKind::Probe, true),
        (2, OutcomeKind::Throughput, false),
        (3, OutcomeKind::Passive, true),
        (26, OutcomeKind::Probe, false),
        (27, OutcomeKind::Probe, true),
    ] {
        batch.push(outcome(&a, kind, t0() + Duration::hours(h), ok));
    }
    store.writer().record_many(batch).await.unwrap();
    let r = store.reader().unwrap();
    let until = t0() + Duration::days(2);
    let uptime = [OutcomeKind::Probe, OutcomeKind::Throughput];
    let days = r.daily_counts_by_route(t0(), until, &uptime).unwrap();
    let got: Vec<_> = days[&a].iter().map(|(d, c)| (*d, c.count, c.successes)).collect();
    let day = t0().timestamp() / 86_400;
    assert_eq!(got, [(day, 2, 1), (day + 1, 2, 1)]);
    let all = r.daily_counts_by_route(t0(), until, &[]).unwrap();
    assert_eq!(all[&a][0].1.count, 3, "every kind when none is named");
    let from_day_two = r.daily_counts_by_route(t0() + Duration::days(1), until, &[]).unwrap();
    assert_eq!(from_day_two[&a].len(), 1);
    drop(r);
    store.close().await.unwrap();
}
}

// Several windows read together (one scan per stretch of rollups) count what each alone
// would: the raw outcomes from the hour holding its start, of its kinds only.
on_both_engines! {
#[tokio::test]
async fn windows_read_together_count_each_its_own_outcomes(db: &TestDb) {
    let store = db.open(StoreOptions::default());
    let (a, b) = (RouteId::new("p", "r1", "m"), RouteId::new("p", "r2", "m"));
    let mut batch = Vec::new();
    // Ten and a half days: a probe every 40 minutes on `a` (every fifth failing), a
    // throughput probe every 3 hours on `b`.
    for i in 0..(10 * 36 + 20) {
        let at = t0() + Duration::minutes(40 * i + 7);
        batch.push(outcome(&a, OutcomeKind::Probe, at, i % 5 != 0));
        if i % 9 == 0 {
            batch.push(outcome(&b, OutcomeKind::Throughput, at, i % 2 == 0));
        }
    }
    let until = t0() + Duration::days(10) + Duration::hours(13) + Duration::minutes(30);
    let windows = [
        Window { since: until - Duration::days(1), kinds: &[OutcomeKind::Probe, OutcomeKind::Throughput] },
        Window { since: until - Duration::days(7), kinds: &[OutcomeKind::Probe, OutcomeKind::Throughput] },
        Window { since: until - Duration::days(7), kinds: &[OutcomeKind::Probe] },
        Window { since: until - Duration::days(9) - Duration::minutes(50), kinds: &[] },
    ];
    let expected = |w: &Window<'_>, route: &RouteId| {
        let start = Granularity::Hour.bucket_start(w.since);
        let mut c = Counts::default();
        for o in batch.iter().filter(|o| &o.route == route) {
            if o.started_at >= start && o.started_at < until && (w.kinds.is_empty() || w.kinds.contains(&o.kind)) {
                c.count += 1;
                c.successes += u64::from(o.success);
                c.good += u64::from(o.success);
            }
        }
        c
    };
    let wanted: Vec<[Counts; 2]> = windows.iter().map(|w| [expected(w, &a), expected(w, &b)]).collect();
    assert!(wanted.iter().all(|w| w[0].count > 0 && w[0].successes < w[0].count));
    assert_eq!(wanted[2][1].count, 0, "`b` has no probes");
    assert!(wanted[3][1].count > wanted[1][1].count);
    store.writer().record_many(batch.clone()).await.unwrap();
    let r = store.reader().unwrap();
    let got: Vec<HashMap<RouteId, Counts>> = r.counts_by_routes(&windows, until).unwrap();
    assert_eq!(got.len(), windows.len());
    for (i, (got, want)) in got.iter().zip(&wanted).enumerate() {
        for (route, want) in [&a, &b].into_iter().zip(want) {
            assert_eq!(got.get(route).copied().unwrap_or_default(), *want, "window {i}, {route}");
        }
        // Alone, the same answer.
        let alone = r.counts_by_route(windows[i].since, until, windows[i].kinds).unwrap();
        assert_eq!(&alone, got, "window {i} alone");
    }
    drop(r);
    store.close().await.unwrap();
}
}

const ALL: &[OutcomeKind] = probeok::store::ALL_KINDS;

// An older store kept a copy of a grouped message in every firing row: upgrading keeps every
// row and stores each distinct message once, shared by the rows that held it; resolving them
// all later deletes it.
on_both_engines! {
#[tokio::test]
async fn the_alert_message_migration_keeps_every_firing_row_and_one_copy_per_message(db: &TestDb) {
    let at = probeok::store::migrate::MIGRATIONS
        .iter()
        .position(|(name, _)| name.ends_with("_alert_messages"))
        .expect("the migration is listed") as u32;
    let big = format!("{{\"key\":\"provider:qwen:firing:x\",\"pad\":\"{}\"}}", "x".repeat(50_000));
    {
        let mut conn = db.connect();
        probeok::store::migrate_to(&mut conn, at).unwrap();
        for (key, message) in [
            ("incident:a", big.as_str()),
            ("incident:b", big.as_str()),
            ("incident:c", big.as_str()),
            ("burn:qwen/cn/m", "{\"key\":\"burn\"}"),
        ] {
            conn.execute(
                "INSERT INTO alert_state (key, message, opened_ms) VALUES (?1, ?2, 1000)",
                [key, message],
            )
            .unwrap();
        }
    }
    let store = db.open(StoreOptions::default());
    let r = store.reader().unwrap();
    let firing = r.alert_firing().unwrap();
    let keys: Vec<&str> = firing.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(keys, ["burn:qwen/cn/m", "incident:a", "incident:b", "incident:c"]);
    assert_eq!(&*firing[1].message, big.as_str());
    assert_eq!(&*firing[0].message, "{\"key\":\"burn\"}");
    assert!(std::sync::Arc::ptr_eq(&firing[1].message, &firing[3].message));
    assert_eq!(firing[2].opened_at, DateTime::from_timestamp_millis(1000).unwrap());
    let (bytes, messages) = r.alert_message_bytes().unwrap();
    assert_eq!(messages, 2);
    assert_eq!(bytes as usize, big.len() + "{\"key\":\"burn\"}".len());
    let resolve = AlertOp::Enqueue {
        entries: vec![],
        firing: vec![],
        resolved: vec!["incident:a".into(), "incident:b".into()],
    };
    store.writer().alert(resolve).await.unwrap();
    assert_eq!(r.alert_message_bytes().unwrap().1, 2, "incident:c still names it");
    let resolve = AlertOp::Enqueue {
        entries: vec![],
        firing: vec![],
        resolved: vec!["incident:c".into()],
    };
    store.writer().alert(resolve).await.unwrap();
    assert_eq!(r.alert_message_bytes().unwrap().1, 1);
    drop(r);
    store.close().await.unwrap();
}
}
