//! The degradation contracts' tables (`migrations/*/0008_contracts.sql`): `contract_jobs` (the
//! `async_queue` behaviour's persisted jobs) and `contract_cache` (the `cached_response`
//! behaviour's answers).
//!
//! Writes go through the one writer thread as [`ContractOp`]s ([`Writer::contract`]); reads are
//! synchronous [`Reader`] methods (call them from `spawn_blocking`). Only the proxy reads
//! these tables: cached answers are never exposed by any other endpoint.

use super::sql::{params, Connection, Engine, OptionalExtension, Row};
use chrono::{DateTime, Utc};

use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// What [`ContractOp::InsertJob`] answers when the owner's share of the queue is full.
pub const OWNER_SHARE_FULL: u64 = 2;

/// Old cached answers deleted per insert.
const CACHE_PRUNE: i64 = 64;

/// A job's lifecycle: `queued` → `running` → `succeeded` | `failed`; `queued` → `expired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Expired,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "succeeded" => JobStatus::Succeeded,
            "failed" => JobStatus::Failed,
            "expired" => JobStatus::Expired,
            _ => return None,
        })
    }
}

/// One `async_queue` job, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub id: String,
    /// `sha256(client key)` in hex (of the empty string without client auth).
    pub owner: String,
    pub feature: String,
    pub model: String,
    pub residency: Option<String>,
    pub stream_requested: bool,
    /// The request body as received.
    pub request: Vec<u8>,
    pub status: JobStatus,
    pub runs: u32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub result_status: Option<u16>,
    pub result_body: Option<Vec<u8>>,
    pub error: Option<String>,
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAnswer {
    pub key: String,
    /// Whose answer it is (the client-key digest), for the per-client share.
    pub owner: String,
    pub feature: String,
    /// `body` is a stream's SSE event sequence.
    pub stream: bool,
    pub stored_at: DateTime<Utc>,
    pub status: u16,
    pub body: Vec<u8>,
}

/// A write to the contract tables. The writer answers a count (see each op).
#[derive(Debug, Clone)]
pub enum ContractOp {
    /// Inserts a job unless `max_queued` jobs are already queued (0) or its owner already has
    /// `max_per_owner` of them queued (2, [`OWNER_SHARE_FULL`]): 1 inserted.
    InsertJob {
        job: Box<JobRecord>,
        max_queued: u64,
        max_per_owner: u64,
    },
    /// `queued` → `running` (one more run) for `worker`, its claim held until `lease_until`:
    /// 1 when it was queued, else 0 (another worker took it, or it expired).
    StartJob {
        id: String,
        at: DateTime<Utc>,
        worker: String,
        lease_until: DateTime<Utc>,
    },
    /// Extends the claims of `worker`'s running jobs to `until`. The count.
    RenewJobs {
        worker: String,
        until: DateTime<Utc>,
    },
    /// Running jobs whose claim lapsed by `now` (their worker died or lost the database)
    /// back to `queued`. The count.
    RequeueLapsed { now: DateTime<Utc> },
    /// `running` → `succeeded` | `failed` with the run's result.
    FinishJob {
        id: String,
        status: JobStatus,
        result_status: Option<u16>,
        result_body: Option<Vec<u8>>,
        error: Option<String>,
        at: DateTime<Utc>,
    },
    /// `running` → `queued` (a transient failure, retried while the TTL lasts).
    RequeueJob { id: String },
    /// Every `running` job back to `queued` (at start: their runs were cut off). The count.
    RequeueRunning,
    /// Queued jobs past their TTL → `expired`. The count.
    ExpireJobs { now: DateTime<Utc> },
    /// Finished or expired jobs that ended before `before`, at most `limit`. The count.
    PurgeJobs { before: DateTime<Utc>, limit: u64 },
    /// Stores (or replaces) a cached answer, first deleting a few answers stored before
    /// `purge_before` (cleanup keeps up with inserts without stalling one). An owner holding
    /// `max_per_owner` answers already has its oldest replaced: one client cannot fill the
    /// cache for everyone. 1 stored.
    CacheUpsert {
        answer: Box<CachedAnswer>,
        purge_before: DateTime<Utc>,
        max_per_owner: u64,
    },
    /// Cached answers stored before `before`, at most `limit`. The count.
    CachePurge { before: DateTime<Utc>, limit: u64 },
}

fn opt_ms(t: Option<DateTime<Utc>>) -> Option<i64> {
    t.map(to_ms)
}

pub(crate) fn apply(conn: &Connection, op: &ContractOp) -> Result<u64, StoreError> {
    let n = match op {
        ContractOp::InsertJob {
            job,
            max_queued,
            max_per_owner,
        } => {
            let queued: i64 = conn
                .prepare_cached("SELECT COUNT(*) FROM contract_jobs WHERE status = 'queued'")?
                .query_row([], |r| r.get(0))?;
            if u64::try_from(queued).unwrap_or(0) >= *max_queued {
                return Ok(0);
            }
            let owned: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM contract_jobs WHERE status = 'queued' AND owner = ?1",
                )?
                .query_row(params![job.owner], |r| r.get(0))?;
            if u64::try_from(owned).unwrap_or(0) >= *max_per_owner {
                return Ok(OWNER_SHARE_FULL);
            }
            conn.prepare_cached(
                "INSERT INTO contract_jobs (id, owner, feature, model, residency,
                     stream_requested, request, status, runs, created_at_ms, expires_at_ms,
                     started_at_ms, finished_at_ms, result_status, result_body, error)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?
            .execute(params![
                job.id,
                job.owner,
                job.feature,
                job.model,
                job.residency,
                job.stream_requested,
                job.request,
                job.status.as_str(),
                job.runs,
                to_ms(job.created_at),
                to_ms(job.expires_at),
                opt_ms(job.started_at),
                opt_ms(job.finished_at),
                job.result_status,
                job.result_body,
                job.error,
            ])?
        }
        ContractOp::StartJob {
            id,
            at,
            worker,
            lease_until,
        } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = 'running', runs = runs + 1, started_at_ms = ?2,
                     worker = ?3, lease_until_ms = ?4
                 WHERE id = ?1 AND status = 'queued' AND expires_at_ms > ?2",
            )?
            .execute(params![id, to_ms(*at), worker, to_ms(*lease_until)])?,
        ContractOp::RenewJobs { worker, until } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET lease_until_ms = ?2
                 WHERE status = 'running' AND worker = ?1",
            )?
            .execute(params![worker, to_ms(*until)])?,
        ContractOp::RequeueLapsed { now } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = 'queued', worker = NULL, lease_until_ms = NULL
                 WHERE status = 'running' AND (lease_until_ms IS NULL OR lease_until_ms <= ?1)",
            )?
            .execute(params![to_ms(*now)])?,
        ContractOp::FinishJob {
            id,
            status,
            result_status,
            result_body,
            error,
            at,
        } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = ?2, result_status = ?3, result_body = ?4,
                     error = ?5, finished_at_ms = ?6
                 WHERE id = ?1 AND status = 'running'",
            )?
            .execute(params![
                id,
                status.as_str(),
                result_status,
                result_body,
                error,
                to_ms(*at)
            ])?,
        ContractOp::RequeueJob { id } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = 'queued' WHERE id = ?1 AND status = 'running'",
            )?
            .execute(params![id])?,
        ContractOp::RequeueRunning => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = 'queued', worker = NULL, lease_until_ms = NULL
                 WHERE status = 'running'",
            )?
            .execute([])?,
        ContractOp::ExpireJobs { now } => conn
            .prepare_cached(
                "UPDATE contract_jobs SET status = 'expired', finished_at_ms = ?1,
                     error = 'the model did not recover before the job''s TTL'
                 WHERE status = 'queued' AND expires_at_ms <= ?1",
            )?
            .execute(params![to_ms(*now)])?,
        ContractOp::PurgeJobs { before, limit } => conn
            .prepare_cached(
                "DELETE FROM contract_jobs WHERE id IN
                     (SELECT id FROM contract_jobs
                      WHERE status IN ('succeeded', 'failed', 'expired') AND finished_at_ms < ?1
                      LIMIT ?2)",
            )?
            .execute(params![
                to_ms(*before),
                i64::try_from(*limit).unwrap_or(i64::MAX)
            ])?,
        ContractOp::CacheUpsert {
            answer,
            purge_before,
            max_per_owner,
        } => {
            conn.prepare_cached(
                "DELETE FROM contract_cache WHERE key IN
                     (SELECT key FROM contract_cache WHERE stored_at_ms < ?1 LIMIT ?2)",
            )?
            .execute(params![to_ms(*purge_before), CACHE_PRUNE])?;
            // The owner's share, counted without the row this replaces.
            let owned: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM contract_cache WHERE owner = ?1 AND key <> ?2",
                )?
                .query_row(params![answer.owner, answer.key], |r| r.get(0))?;
            let over = u64::try_from(owned).unwrap_or(0) + 1;
            if over > *max_per_owner {
                let evict = i64::try_from(over - *max_per_owner).unwrap_or(i64::MAX);
                conn.prepare_cached(
                    "DELETE FROM contract_cache WHERE key IN
                         (SELECT key FROM contract_cache WHERE owner = ?1 AND key <> ?2
                          ORDER BY stored_at_ms, key LIMIT ?3)",
                )?
                .execute(params![answer.owner, answer.key, evict])?;
            }
            conn.prepare_cached(
                "INSERT INTO contract_cache (key, feature, stream, stored_at_ms, status, body, owner)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (key) DO UPDATE SET feature = excluded.feature,
                     stream = excluded.stream, stored_at_ms = excluded.stored_at_ms,
                     status = excluded.status, body = excluded.body, owner = excluded.owner",
            )?
            .execute(params![
                answer.key,
                answer.feature,
                answer.stream,
                to_ms(answer.stored_at),
                answer.status,
                answer.body,
                answer.owner,
            ])?
        }
        ContractOp::CachePurge { before, limit } => conn
            .prepare_cached(
                "DELETE FROM contract_cache WHERE key IN
                     (SELECT key FROM contract_cache WHERE stored_at_ms < ?1 LIMIT ?2)",
            )?
            .execute(params![
                to_ms(*before),
                i64::try_from(*limit).unwrap_or(i64::MAX)
            ])?,
    };
    Ok(n as u64)
}

impl Writer {
    /// One write to the contract tables; resolves after COMMIT with the op's count.
    pub async fn contract(&self, op: ContractOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Contract { op, ack })
            .await
    }
}

const JOB_COLUMNS: &str = "id, owner, feature, model, residency, stream_requested, request,
    status, runs, created_at_ms, expires_at_ms, started_at_ms, finished_at_ms, result_status,
    result_body, error";

/// A row of [`JOB_COLUMNS`] as a job; a bad timestamp or status is reported as a conversion
/// failure of its column (the store is then corrupt).
fn job_row(r: &Row<'_>) -> super::sql::Result<JobRecord> {
    let corrupt = |i: usize, e: StoreError| super::sql::SqlError::Convert {
        column: i,
        message: e.to_string(),
    };
    let time = |i: usize| -> super::sql::Result<DateTime<Utc>> {
        from_ms(r.get(i)?).map_err(|e| corrupt(i, e))
    };
    let time_opt = |i: usize| -> super::sql::Result<Option<DateTime<Utc>>> {
        r.get::<_, Option<i64>>(i)?
            .map(|ms| from_ms(ms).map_err(|e| corrupt(i, e)))
            .transpose()
    };
    let status: String = r.get(7)?;
    Ok(JobRecord {
        status: JobStatus::parse(&status)
            .ok_or_else(|| corrupt(7, StoreError::Corrupt(format!("job status {status:?}"))))?,
        id: r.get(0)?,
        owner: r.get(1)?,
        feature: r.get(2)?,
        model: r.get(3)?,
        residency: r.get(4)?,
        stream_requested: r.get(5)?,
        request: r.get(6)?,
        runs: r.get(8)?,
        created_at: time(9)?,
        expires_at: time(10)?,
        started_at: time_opt(11)?,
        finished_at: time_opt(12)?,
        result_status: r.get(13)?,
        result_body: r.get(14)?,
        error: r.get(15)?,
    })
}

impl Reader {
    /// How many cached answers `owner` holds.
    pub fn cached_answers_of(&self, owner: &str) -> Result<u64, StoreError> {
        let n: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM contract_cache WHERE owner = ?1")?
            .query_row([owner], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// One job by id.
    pub fn contract_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let row = self
            .conn
            .prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM contract_jobs WHERE id = ?1"
            ))?
            .query_row([id], job_row)
            .optional()?;
        Ok(row)
    }

    /// Queued jobs not yet expired at `now`, oldest first, at most `limit`, leaving out those
    /// for the models in `skip` (still degraded: their jobs wait, others' go ahead).
    pub fn queued_contract_jobs(
        &self,
        now: DateTime<Utc>,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<JobRecord>, StoreError> {
        let skip = serde_json::to_string(skip)
            .map_err(|e| StoreError::Invalid(format!("model list: {e}")))?;
        // The models to leave out, as one JSON array parameter.
        let skipped = match self.conn.engine() {
            Engine::Sqlite => "SELECT value FROM json_each(?3)",
            Engine::Postgres => "SELECT json_array_elements_text(CAST(CAST(?3 AS TEXT) AS JSON))",
        };
        let rows: Vec<JobRecord> = self
            .conn
            .prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM contract_jobs
                 WHERE status = 'queued' AND expires_at_ms > ?1
                   AND model NOT IN ({skipped})
                 ORDER BY created_at_ms, id LIMIT ?2"
            ))?
            .query_map(
                params![to_ms(now), i64::try_from(limit).unwrap_or(i64::MAX), skip],
                job_row,
            )?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }

    /// The cached answer under `key`, if stored at or after `since`.
    pub fn cached_answer(
        &self,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<CachedAnswer>, StoreError> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT feature, stream, stored_at_ms, status, body, owner FROM contract_cache
                 WHERE key = ?1 AND stored_at_ms >= ?2",
            )?
            .query_row(params![key, to_ms(since)], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, bool>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, u16>(3)?,
                    r.get::<_, Vec<u8>>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .optional()?;
        let Some((feature, stream, at, status, body, owner)) = row else {
            return Ok(None);
        };
        Ok(Some(CachedAnswer {
            key: key.to_owned(),
            owner,
            feature,
            stream,
            stored_at: from_ms(at)?,
            status,
            body,
        }))
    }
}
