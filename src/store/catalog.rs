//! The providers' model lists (`migrations/*/0025_catalog.sql`): per provider region and model,
//! when the leader first and last saw it listed and how many successful answers in a row have
//! lacked it; and the `model_retiring` notices already sent. Writes are [`CatalogOp`]s through
//! the writer thread; reads are [`Reader`] methods.

use chrono::{DateTime, NaiveDate, Utc};

use super::sql::params;
use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// One model of one provider region as the catalog remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRow {
    pub model: String,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    /// Consecutive successful answers that lacked it (0 while it is listed).
    pub missing: u32,
}

/// A write to the catalog tables.
#[derive(Debug, Clone)]
pub enum CatalogOp {
    /// One successful answer of `region`: `rows` written as they are, `forget` deleted.
    Answer {
        region: String,
        rows: Vec<ModelRow>,
        forget: Vec<String>,
    },
    /// A `model_retiring` notice was sent for `route` retiring on `retires`, `days` before.
    /// Answers 0 when it was already recorded.
    Notice {
        route: String,
        retires: NaiveDate,
        days: u32,
        at: DateTime<Utc>,
    },
}

pub(crate) fn apply(conn: &super::sql::Connection, op: &CatalogOp) -> Result<u64, StoreError> {
    let mut n = 0;
    match op {
        CatalogOp::Answer {
            region,
            rows,
            forget,
        } => {
            let mut up = conn.prepare_cached(
                "INSERT INTO catalog_models (region, model, first_seen_ms, last_seen_ms, missing)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (region, model) DO UPDATE SET first_seen_ms = excluded.first_seen_ms,
                     last_seen_ms = excluded.last_seen_ms, missing = excluded.missing",
            )?;
            for r in rows {
                n += up.execute(params![
                    region,
                    r.model,
                    to_ms(r.first_seen),
                    to_ms(r.last_seen),
                    i64::from(r.missing)
                ])?;
            }
            let mut del =
                conn.prepare_cached("DELETE FROM catalog_models WHERE region = ?1 AND model = ?2")?;
            for m in forget {
                n += del.execute(params![region, m])?;
            }
        }
        CatalogOp::Notice {
            route,
            retires,
            days,
            at,
        } => {
            n += conn
                .prepare_cached(
                    "INSERT INTO catalog_notices (route, retires, days, sent_ms)
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (route, retires, days) DO NOTHING",
                )?
                .execute(params![
                    route,
                    retires.format("%Y-%m-%d").to_string(),
                    i64::from(*days),
                    to_ms(*at)
                ])?;
        }
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

impl Writer {
    /// One write to the catalog tables; resolves after COMMIT.
    pub async fn catalog(&self, op: CatalogOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Catalog { op, ack })
            .await
    }
}

impl Reader {
    /// Every remembered model of every region: `(region, row)` by region, then model.
    pub fn catalog_models(&self) -> Result<Vec<(String, ModelRow)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT region, model, first_seen_ms, last_seen_ms, missing FROM catalog_models
             ORDER BY region, model",
        )?;
        let rows = stmt.query_map(params![], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (region, model, first, last, missing) = r?;
            out.push((
                region,
                ModelRow {
                    model,
                    first_seen: from_ms(first)?,
                    last_seen: from_ms(last)?,
                    missing: u32::try_from(missing).unwrap_or(u32::MAX),
                },
            ));
        }
        Ok(out)
    }

    /// The `model_retiring` notices sent: `(route, retires, days)`.
    pub fn catalog_notices(&self) -> Result<Vec<(String, NaiveDate, u32)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT route, retires, days FROM catalog_notices ORDER BY route")?;
        let rows = stmt.query_map(params![], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (route, retires, days) = r?;
            // A date this build cannot read was written by no build: skipped, not fatal.
            if let Ok(d) = NaiveDate::parse_from_str(&retires, "%Y-%m-%d") {
                out.push((route, d, u32::try_from(days).unwrap_or(u32::MAX)));
            }
        }
        Ok(out)
    }
}
