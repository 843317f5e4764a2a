//! The `async_queue` behaviour: jobs persisted in SQLite (`contract_jobs`), a worker that runs
//! them once their model is healthy again, and `GET /v1/jobs/{id}`.
//!
//! - A job is stored (request body, the client-key hash as owner, feature, model, times)
//!   before the 202 is sent: nothing accepted is lost on restart. At most [`MAX_QUEUED`] jobs
//!   wait at once; beyond that the request gets 503 `queue_full`. With client keys, one
//!   client holds at most [`MAX_QUEUED_PER_CLIENT`] of them (one client cannot fill the queue,
//!   each job with a `max_body` request, for everyone); beyond that it gets 429
//!   `client_queue_full`.
//! - The worker ([`Proxy::spawn_jobs`]) takes queued jobs whose model is no longer DEGRADED or
//!   CRITICAL, oldest first, at most [`WorkerOptions::concurrency`] at once, and runs each
//!   through the proxy's normal path without contracts, non-streaming (a queued streaming
//!   request runs with `stream: false`; the job says `stream_requested`). The result — status
//!   and body, bounded by `max_body` — is stored; a 5xx or 429 made of every route failing is
//!   retried up to [`MAX_RUNS`] runs while the TTL lasts. A job not run before its TTL is
//!   `expired`. A run is metered like any request, under the job's id as its request id.
//! - **One worker per run, across a fleet**: every proxy on one database runs a worker; a job
//!   is taken with a conditional update (`queued` → `running`, in a writer transaction), so
//!   exactly one worker gets it. Its claim holds for [`JOB_LEASE`] and the worker renews it
//!   while the run lasts.
//! - **At least once**: a job whose claim lapsed (its worker stopped, crashed or lost the
//!   database mid-run) is queued again and taken by any worker, so an upstream may see the
//!   same request twice.
//! - Finished and expired jobs are deleted after [`WorkerOptions::retention`] (24 h). The
//!   worker also purges cached answers older than the longest `cached_response` max age, and
//!   beats the heartbeat [`HEARTBEAT_JOB`].
//! - `GET /v1/jobs/{id}` answers only the client key that created the job (when client auth
//!   is on; another key gets 404) with the job's state and, once done, its result.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::contract;
use super::failover;
use super::reject::Reject;
use super::request::{finish, RequestCtx};
use super::select::Needs;
use super::{Inner, Proxy};
use crate::store::{ContractOp, JobRecord, JobStatus, Store};

/// Jobs waiting at most; more get 503 `queue_full`.
pub const MAX_QUEUED: u64 = 10_000;
/// Jobs one client (one client key) may have waiting at once.
pub const MAX_QUEUED_PER_CLIENT: u64 = MAX_QUEUED / 10;
/// Runs of one job at most (transient failures are retried while the TTL lasts).
pub const MAX_RUNS: u32 = 3;
/// The worker's heartbeat job name (`heartbeats` table, `/readyz`).
pub const HEARTBEAT_JOB: &str = "async_jobs";
/// `Retry-After` of a job's poll when its contract is gone from the config.
const DEFAULT_POLL: Duration = Duration::from_secs(60);
/// Queued jobs read per worker round.
const SCAN: usize = 64;
/// Rows deleted per purge step.
const PURGE_BATCH: u64 = 1000;
/// How long a worker's claim on a running job holds without renewal (renewed every third).
pub const JOB_LEASE: Duration = Duration::from_secs(30);

/// The proxy's job queue.
#[derive(Debug)]
pub struct Jobs {
    store: Store,
    max_body: usize,
    /// This worker's name in the jobs it claims.
    worker: String,
    /// Wakes the worker (a new job may be runnable at once).
    notify: Notify,
}

/// A job to queue.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub owner: String,
    pub feature: String,
    pub model: String,
    pub residency: Option<String>,
    pub stream_requested: bool,
    pub request: Vec<u8>,
    pub ttl: Duration,
    pub now: DateTime<Utc>,
}

/// What queueing a job gave.
#[derive(Debug)]
pub enum Created {
    Queued(Box<JobRecord>),
    /// [`MAX_QUEUED`] jobs are waiting.
    Full,
    /// The client already has [`MAX_QUEUED_PER_CLIENT`] jobs waiting.
    ClientFull,
    /// The store could not take it (logged).
    Unavailable,
}

impl Jobs {
    pub fn new(store: Store, max_body: usize) -> Self {
        Self {
            store,
            max_body,
            worker: format!("w_{:016x}", rand::random::<u64>()),
            notify: Notify::new(),
        }
    }

    /// Persists a new queued job (committed before this returns).
    pub async fn create(&self, new: NewJob) -> Created {
        if !self.store.health().available() {
            // Read-only mode: no job can be kept, and the writer would only wait to fail.
            return Created::Unavailable;
        }
        let job = JobRecord {
            id: format!("job_{:032x}", rand::random::<u128>()),
            owner: new.owner,
            feature: new.feature,
            model: new.model,
            residency: new.residency,
            stream_requested: new.stream_requested,
            request: new.request,
            status: JobStatus::Queued,
            runs: 0,
            created_at: new.now,
            expires_at: new.now + chrono::Duration::from_std(new.ttl).unwrap_or_default(),
            started_at: None,
            finished_at: None,
            result_status: None,
            result_body: None,
            error: None,
        };
        // Without client auth every request is the same owner: the whole queue is its share.
        let max_per_owner = if job.owner == contract::owner_of("") {
            MAX_QUEUED
        } else {
            MAX_QUEUED_PER_CLIENT
        };
        let op = ContractOp::InsertJob {
            job: Box::new(job.clone()),
            max_queued: MAX_QUEUED,
            max_per_owner,
        };
        match self.store.writer().contract(op).await {
            Ok(0) => Created::Full,
            Ok(crate::store::OWNER_SHARE_FULL) => Created::ClientFull,
            Ok(_) => {
                self.notify.notify_one();
                Created::Queued(Box::new(job))
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot queue an async job");
                Created::Unavailable
            }
        }
    }
}

/// Where a job is polled.
pub fn poll_path(id: &str) -> String {
    format!("/v1/jobs/{id}")
}

fn secs(t: DateTime<Utc>) -> i64 {
    t.timestamp()
}

/// A job as clients see it (OpenAI-style: an `object` type, Unix-second times). A queued job
/// past its TTL reads `expired` even before the worker marks it.
pub fn job_json(job: &JobRecord, poll_after: Duration) -> Value {
    job_json_at(job, poll_after, None)
}

fn job_json_at(job: &JobRecord, poll_after: Duration, now: Option<DateTime<Utc>>) -> Value {
    let expired_now =
        job.status == JobStatus::Queued && now.is_some_and(|now| now >= job.expires_at);
    let status = if expired_now {
        JobStatus::Expired
    } else {
        job.status
    };
    let mut v = json!({
        "id": job.id,
        "object": "probeok.job",
        "status": status.as_str(),
        "model": job.model,
        "feature": job.feature,
        "created_at": secs(job.created_at),
        "expires_at": secs(job.expires_at),
        "started_at": job.started_at.map(secs),
        "completed_at": job.finished_at.map(secs),
        "stream_requested": job.stream_requested,
        "poll": {"url": poll_path(&job.id), "retry_after": poll_after.as_secs()},
        "result": null,
        "error": null,
    });
    if job.stream_requested {
        v["note"] = json!(
            "a queued streaming request runs with stream: false; the result is one chat.completion object"
        );
    }
    if let (Some(status), Some(body)) = (job.result_status, &job.result_body) {
        let body = serde_json::from_slice::<Value>(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
        v["result"] = json!({"status": status, "body": body});
    }
    match status {
        JobStatus::Expired => {
            v["error"] = json!({
                "message": job.error.clone().unwrap_or_else(|| "the model did not recover before the job's TTL".to_owned()),
                "code": "job_expired",
            });
        }
        JobStatus::Failed => {
            v["error"] = json!({
                "message": job.error.clone().unwrap_or_else(|| "the job's run failed".to_owned()),
                "code": "job_failed",
            });
        }
        _ => {}
    }
    v
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix("job_")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `GET /v1/jobs/{id}`.
pub(super) async fn get_job(
    State(proxy): State<Proxy>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    job_answer(&proxy, &id, &headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn job_answer(proxy: &Proxy, id: &str, headers: &HeaderMap) -> Result<Response, Reject> {
    let p = &proxy.inner;
    let owner = contract::owner_of(&super::intake::identify(p, headers)?.0);
    let Some(jobs) = &p.jobs else {
        return Err(Reject::JobNotFound);
    };
    if !valid_id(id) {
        return Err(Reject::JobNotFound);
    }
    let store = jobs.store.clone();
    let id = id.to_owned();
    let read = tokio::task::spawn_blocking(move || store.reader()?.contract_job(&id)).await;
    let job = match read {
        Ok(Ok(Some(job))) if job.owner == owner => job,
        Ok(Ok(_)) => return Err(Reject::JobNotFound),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot read an async job");
            return Err(Reject::JobStoreUnavailable);
        }
        Err(_) => return Err(Reject::ReadTaskFailed),
    };
    let poll_after = p
        .live
        .borrow()
        .contract_for(Some(&job.feature))
        .map_or(DEFAULT_POLL, |c| c.retry_after);
    let body = job_json_at(&job, poll_after, Some(p.clock.now()));
    let waiting = matches!(body["status"].as_str(), Some("queued" | "running"));
    let mut r = Json(body).into_response();
    if waiting {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(poll_after.as_secs()));
    }
    Ok(r)
}

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// How often it looks for runnable jobs (it also wakes on a new job and on new weights).
    pub tick: Duration,
    /// Jobs run at once, at most.
    pub concurrency: usize,
    /// Finished and expired jobs are deleted this long after they ended.
    pub retention: Duration,
    pub heartbeat_every: Duration,
    /// Purges (old jobs, old cached answers) at most this often.
    pub maintenance_every: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(1),
            concurrency: 4,
            retention: Duration::from_secs(24 * 3600),
            heartbeat_every: Duration::from_secs(15),
            maintenance_every: Duration::from_secs(60),
        }
    }
}

impl Proxy {
    /// Starts the job worker (with a store; `None` without one). It ends at `shutdown` or
    /// once the proxy is dropped; runs in progress finish on their own (a run cut off by the
    /// process stopping is queued again at the next start).
    pub fn spawn_jobs(
        &self,
        opts: WorkerOptions,
        shutdown: CancellationToken,
    ) -> Option<JoinHandle<()>> {
        let jobs = self.inner.jobs.clone()?;
        let weak = Arc::downgrade(&self.inner);
        let weights = self.inner.weights.clone();
        Some(tokio::spawn(work(weak, jobs, weights, opts, shutdown)))
    }
}

async fn work(
    weak: Weak<Inner>,
    jobs: Arc<Jobs>,
    weights: super::WeightsRx,
    opts: WorkerOptions,
    shutdown: CancellationToken,
) {
    let writer = jobs.store.writer();
    let concurrency = opts.concurrency.max(1);
    let sem = Arc::new(Semaphore::new(concurrency));
    let mut weights = Some(weights);
    let mut last_beat: Option<Instant> = None;
    let mut last_purge: Option<Instant> = None;
    let mut last_renew = Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { break };
        let proxy = Proxy::from_inner(inner);
        let now = proxy.inner.clock.now();
        if !jobs.store.health().available() {
            // Read-only mode: the jobs wait in the database; nothing here can reach them.
            drop(proxy);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(opts.tick) => continue,
            }
        }
        // Runs of this worker keep their claims; lapsed ones (anyone's) are queued again.
        if sem.available_permits() < concurrency && last_renew.elapsed() >= JOB_LEASE / 3 {
            last_renew = Instant::now();
            let op = ContractOp::RenewJobs {
                worker: jobs.worker.clone(),
                until: now + lease(),
            };
            if let Err(e) = writer.contract(op).await {
                tracing::error!(error = %e, "cannot renew the claims of running async jobs");
            }
        }
        match writer.contract(ContractOp::RequeueLapsed { now }).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                jobs = n,
                "async jobs whose worker stopped mid-run are queued again (at least once)"
            ),
            Err(e) => tracing::error!(error = %e, "cannot requeue lapsed async jobs"),
        }
        if let Err(e) = writer.contract(ContractOp::ExpireJobs { now }).await {
            tracing::error!(error = %e, "cannot expire async jobs");
        }
        if last_purge.is_none_or(|t| t.elapsed() >= opts.maintenance_every) {
            last_purge = Some(Instant::now());
            purge(&proxy, &jobs, now, opts.retention).await;
        }
        dispatch(&proxy, &jobs, &sem, now).await;
        if last_beat.is_none_or(|t| t.elapsed() >= opts.heartbeat_every) {
            last_beat = Some(Instant::now());
            if let Err(e) = writer.heartbeat(HEARTBEAT_JOB, now).await {
                tracing::error!(error = %e, "cannot write the async jobs heartbeat");
            }
        }
        // Runs hold their own handle; the worker keeps none while it sleeps.
        drop(proxy);
        let weights_changed = async {
            match weights.as_mut() {
                Some(w) => w.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(opts.tick) => {}
            _ = jobs.notify.notified() => {}
            alive = weights_changed => if !alive { weights = None },
        }
    }
}

fn lease() -> chrono::Duration {
    chrono::Duration::from_std(JOB_LEASE).unwrap_or_default()
}

/// Deletes jobs ended before the retention and cached answers past every max age, in
/// batches (other writes interleave).
async fn purge(proxy: &Proxy, jobs: &Jobs, now: DateTime<Utc>, retention: Duration) {
    let writer = jobs.store.writer();
    let before = now - chrono::Duration::from_std(retention).unwrap_or_default();
    let longest =
        contract::longest_cache_age(&proxy.inner.live.borrow().contracts).unwrap_or_default();
    let cache_before = now - chrono::Duration::from_std(longest).unwrap_or_default();
    let ops = [
        ContractOp::PurgeJobs {
            before,
            limit: PURGE_BATCH,
        },
        ContractOp::CachePurge {
            before: cache_before,
            limit: PURGE_BATCH,
        },
    ];
    for op in ops {
        loop {
            match writer.contract(op.clone()).await {
                Ok(n) if n >= PURGE_BATCH => tokio::task::yield_now().await,
                Ok(_) => break,
                Err(e) => {
                    tracing::error!(error = %e, "cannot purge contract jobs or cached answers");
                    break;
                }
            }
        }
    }
}

/// Starts the queued jobs whose model is healthy again, within the concurrency.
async fn dispatch(proxy: &Proxy, jobs: &Jobs, sem: &Arc<Semaphore>, now: DateTime<Utc>) {
    if sem.available_permits() == 0 {
        return;
    }
    let view = proxy.inner.weights.borrow().clone();
    // Jobs of models still DEGRADED or CRITICAL wait; the others go ahead of them.
    let waiting: Vec<String> = view
        .models
        .keys()
        .filter(|m| contract::severity(&view, m).is_some())
        .cloned()
        .collect();
    let store = jobs.store.clone();
    let read = tokio::task::spawn_blocking(move || {
        store.reader()?.queued_contract_jobs(now, SCAN, &waiting)
    })
    .await;
    let queued = match read {
        Ok(Ok(q)) => q,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot read queued async jobs");
            return;
        }
        Err(_) => return,
    };
    let writer = jobs.store.writer();
    for job in queued {
        let Ok(permit) = sem.clone().try_acquire_owned() else {
            break;
        };
        let start = ContractOp::StartJob {
            id: job.id.clone(),
            at: now,
            worker: jobs.worker.clone(),
            lease_until: now + lease(),
        };
        match writer.contract(start).await {
            Ok(1) => {}
            Ok(_) => continue,
            Err(e) => {
                tracing::error!(error = %e, "cannot start an async job");
                break;
            }
        }
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _held = permit;
            run(proxy, job).await;
        });
    }
}

/// One run of a job through the proxy's normal path (no contract), non-streaming.
async fn run(proxy: Proxy, job: JobRecord) {
    let p = &proxy.inner;
    let Some(jobs) = p.jobs.clone() else { return };
    let writer = jobs.store.writer();
    let failed = |error: String, result_status, result_body, at| ContractOp::FinishJob {
        id: job.id.clone(),
        status: JobStatus::Failed,
        result_status,
        result_body,
        error: Some(error),
        at,
    };
    let op = match serde_json::from_slice::<Value>(&job.request) {
        Err(e) => failed(
            format!("the stored request cannot be read: {e}"),
            None,
            None,
            p.clock.now(),
        ),
        Ok(mut request) => {
            if let Some(obj) = request.as_object_mut() {
                if job.stream_requested {
                    obj.insert("stream".to_owned(), Value::Bool(false));
                    obj.remove("stream_options");
                }
            }
            let needs = Needs::from_request(&request, job.residency.as_deref());
            let mut ctx = RequestCtx::new(job.id.clone(), p.clock.now());
            ctx.trace = (p.tracer.begin(&axum::http::HeaderMap::new())).map(Box::new);
            let view = p.weights.borrow().clone();
            tracing::info!(job = %job.id, model = %job.model, "running an async job");
            let answer = failover::route(&proxy, &mut ctx, &request, &job.model, &needs, &view)
                .await
                .unwrap_or_else(Into::into);
            let response = finish(&proxy, ctx, answer).await;
            let status = response.status().as_u16();
            let body = axum::body::to_bytes(response.into_body(), jobs.max_body).await;
            let now = p.clock.now();
            let runs = job.runs + 1;
            match body {
                Err(_) => failed(
                    "the answer is larger than the proxy's max_body".to_owned(),
                    Some(status),
                    None,
                    now,
                ),
                Ok(body) if (200..300).contains(&status) => ContractOp::FinishJob {
                    id: job.id.clone(),
                    status: JobStatus::Succeeded,
                    result_status: Some(status),
                    result_body: Some(body.to_vec()),
                    error: None,
                    at: now,
                },
                Ok(_)
                    if (status >= 500 || status == 429)
                        && runs < MAX_RUNS
                        && now < job.expires_at =>
                {
                    tracing::info!(job = %job.id, status, runs, "async job run failed transiently; queued again");
                    ContractOp::RequeueJob { id: job.id.clone() }
                }
                Ok(body) => failed(
                    format!("the run got HTTP {status}"),
                    Some(status),
                    Some(body.to_vec()),
                    now,
                ),
            }
        }
    };
    if let Err(e) = writer.contract(op).await {
        tracing::error!(job = %job.id, error = %e, "cannot store an async job's result");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_checked_before_any_read() {
        assert!(valid_id(&format!("job_{:032x}", 7u128)));
        for bad in ["job_", "job_xyz", "abc", &format!("job_{:031x}", 7u128)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_queued_job_past_its_ttl_reads_expired() {
        let t0 = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let job = JobRecord {
            id: "job_1".into(),
            owner: "o".into(),
            feature: "default".into(),
            model: "chat".into(),
            residency: None,
            stream_requested: true,
            request: b"{}".to_vec(),
            status: JobStatus::Queued,
            runs: 0,
            created_at: t0,
            expires_at: t0 + chrono::Duration::minutes(1),
            started_at: None,
            finished_at: None,
            result_status: None,
            result_body: None,
            error: None,
        };
        let v = job_json_at(&job, Duration::from_secs(30), Some(t0));
        assert_eq!(v["status"], "queued");
        assert_eq!(v["object"], "probeok.job");
        assert_eq!(v["poll"]["url"], "/v1/jobs/job_1");
        assert!(v["note"].is_string());
        let later = t0 + chrono::Duration::minutes(2);
        let v = job_json_at(&job, Duration::from_secs(30), Some(later));
        assert_eq!(v["status"], "expired");
        assert_eq!(v["error"]["code"], "job_expired");
    }
}
