//! The `drift_runs` and `drift_cases` tables: every regression set run (see [`crate::drift`]),
//! written through the one writer thread like everything else, read back per (route, set) so
//! the runner resumes each route's own history after a restart. Old runs are pruned with the
//! raw outcomes (`retention_days`).

use super::sql::{params, Connection};

use super::writer::{Ack, Command};
use super::{from_ms, outcomes, to_ms, Reader, StoreError, Writer};
use crate::records::drift::{CaseResult, SetRun, ValidatorFailure};
use crate::route::RouteId;

/// Inserts one run and its cases (inside the writer's transaction).
pub(crate) fn insert_run(conn: &Connection, run: &SetRun) -> Result<(), StoreError> {
    let route_id = outcomes::intern_route(conn, &run.route)?;
    let run_id = conn
        .prepare_cached(
            "INSERT INTO drift_runs (route_id, set_name, started_at_ms, passed, answered, cases)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        )?
        .query_row(
            params![
                route_id,
                run.set,
                to_ms(run.started_at),
                run.passed() as i64,
                run.answered() as i64,
                run.cases.len() as i64,
            ],
            |r| r.get::<_, i64>(0),
        )?;
    let mut stmt = conn.prepare_cached(
        "INSERT INTO drift_cases (run_id, ord, case_name, passed, failures, output_chars,
             latency_ms, output_tokens, model_reported, system_fingerprint, error, output)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?;
    for (i, c) in run.cases.iter().enumerate() {
        let failures = serde_json::to_string(&c.failures)
            .map_err(|e| StoreError::Invalid(format!("drift case failures: {e}")))?;
        let latency = if c.latency_ms.is_finite() && c.latency_ms >= 0.0 {
            c.latency_ms
        } else {
            return Err(StoreError::Invalid(format!(
                "{}: drift case {} latency_ms = {}",
                run.route, c.case, c.latency_ms
            )));
        };
        stmt.execute(params![
            run_id,
            i as i64,
            c.case,
            c.passed,
            failures,
            c.output_chars,
            latency,
            c.output_tokens,
            c.model_reported,
            c.system_fingerprint,
            c.error,
            c.output,
        ])?;
    }
    Ok(())
}

/// Deletes up to `limit` runs (their cases cascade) older than `cutoff_ms`.
pub(crate) fn delete_old(
    conn: &Connection,
    cutoff_ms: i64,
    limit: usize,
) -> Result<u64, StoreError> {
    super::jobs::delete_oldest(conn, "drift_runs", "started_at_ms", cutoff_ms, limit)
}

impl Writer {
    /// Stores one regression set run; resolves after COMMIT.
    pub async fn record_drift_run(&self, run: SetRun) -> Result<(), StoreError> {
        self.request(|ack: Ack<()>| Command::DriftRun {
            run: Box::new(run),
            ack,
        })
        .await
    }
}

impl Reader {
    /// The latest `limit` runs of `set` on `route`, oldest first.
    pub fn drift_runs(
        &self,
        route: &RouteId,
        set: &str,
        limit: usize,
    ) -> Result<Vec<SetRun>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let mut runs_stmt = self.conn.prepare_cached(
            "SELECT id, started_at_ms FROM drift_runs WHERE route_id = ?1 AND set_name = ?2
             ORDER BY started_at_ms DESC, id DESC LIMIT ?3",
        )?;
        let heads: Vec<(i64, i64)> = runs_stmt
            .query_map(params![id, set, limit as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<Result<_, _>>()?;
        let mut cases_stmt = self.conn.prepare_cached(
            "SELECT case_name, passed, failures, output_chars, latency_ms, output_tokens,
                    model_reported, system_fingerprint, error, output
             FROM drift_cases WHERE run_id = ?1 ORDER BY ord",
        )?;
        let mut out = Vec::with_capacity(heads.len());
        for (run_id, at) in heads.into_iter().rev() {
            let rows = cases_stmt.query_map([run_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<bool>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, u32>(3)?,
                    r.get::<_, f64>(4)?,
                    r.get::<_, Option<u32>>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, Option<String>>(7)?,
                    r.get::<_, Option<String>>(8)?,
                    r.get::<_, String>(9)?,
                ))
            })?;
            let mut cases = Vec::new();
            for row in rows {
                let (
                    case,
                    passed,
                    failures,
                    output_chars,
                    latency_ms,
                    output_tokens,
                    model,
                    fp,
                    error,
                    output,
                ) = row?;
                let failures: Vec<ValidatorFailure> = serde_json::from_str(&failures)
                    .map_err(|e| StoreError::Corrupt(format!("drift case failures: {e}")))?;
                cases.push(CaseResult {
                    case,
                    passed,
                    failures,
                    output_chars,
                    latency_ms,
                    output_tokens,
                    model_reported: model,
                    system_fingerprint: fp,
                    error,
                    output,
                });
            }
            out.push(SetRun {
                route: route.clone(),
                set: set.to_owned(),
                started_at: from_ms(at)?,
                cases,
            });
        }
        Ok(out)
    }
}
