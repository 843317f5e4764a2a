//! Detection's baselines as saved state (`migrations/*/0028_baseline_parts.sql`), so a start
//! reads each route's baselines instead of replaying its raw history: one row per time-of-day
//! bucket that changed since the last save, and a head row (the all-day window, the runs of
//! held samples, the newest outcome learned and the configuration the state was learned
//! under). Rows are bounded by routes × buckets, whatever the history's length. The bytes are
//! the health module's (`health::baseline::saved`); the store only keeps them.

use chrono::{DateTime, Utc};

use super::sql::params;
use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// The part index of a baseline's head row.
pub const HEAD_PART: i32 = -1;

/// One baseline's saved state: the head and the buckets that changed (a save), or the head
/// and every bucket stored (a read).
#[derive(Debug, Clone, PartialEq)]
pub struct SavedBaseline {
    pub route: String,
    /// Empty for the monitor's own probes; else the remote vantage.
    pub vantage: String,
    /// What decides how outcomes become samples; a state learned under another is not used.
    pub shape: String,
    /// The newest outcome the state learned from: a start replays only what came after.
    pub newest: Option<DateTime<Utc>>,
    pub head: Vec<u8>,
    /// (bucket index, bytes).
    pub buckets: Vec<(i32, Vec<u8>)>,
}

pub(crate) fn save(
    conn: &super::sql::Connection,
    saved: &[SavedBaseline],
) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO baseline_parts (route, vantage, part, shape, newest_ms, state)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (route, vantage, part) DO UPDATE SET shape = excluded.shape,
             newest_ms = excluded.newest_ms, state = excluded.state",
    )?;
    let mut n = 0;
    for s in saved {
        let newest = s.newest.map(to_ms);
        n += stmt.execute(params![
            s.route, s.vantage, HEAD_PART, s.shape, newest, s.head
        ])?;
        for (part, bytes) in &s.buckets {
            n += stmt.execute(params![s.route, s.vantage, *part, s.shape, newest, bytes])?;
        }
    }
    Ok(u64::try_from(n).unwrap_or(u64::MAX))
}

impl Writer {
    /// Saves baselines' changed parts in one transaction; resolves after COMMIT.
    pub async fn save_baselines(&self, saved: Vec<SavedBaseline>) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Baselines { saved, ack })
            .await
    }
}

impl Reader {
    /// A route's saved baseline at `vantage` ("" for the monitor's own), if it has a head.
    pub fn saved_baseline(
        &self,
        route: &str,
        vantage: &str,
    ) -> Result<Option<SavedBaseline>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT part, shape, newest_ms, state FROM baseline_parts
             WHERE route = ?1 AND vantage = ?2 ORDER BY part",
        )?;
        let rows = stmt.query_map(params![route, vantage], |r| {
            Ok((
                r.get::<_, i32>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, Vec<u8>>(3)?,
            ))
        })?;
        let mut head = None;
        let mut buckets = Vec::new();
        for row in rows {
            let (part, shape, newest_ms, state) = row?;
            if part == HEAD_PART {
                head = Some((shape, newest_ms, state));
            } else {
                buckets.push((part, state));
            }
        }
        let Some((shape, newest_ms, head)) = head else {
            return Ok(None);
        };
        Ok(Some(SavedBaseline {
            route: route.to_owned(),
            vantage: vantage.to_owned(),
            shape,
            newest: newest_ms.map(from_ms).transpose()?,
            head,
            buckets,
        }))
    }
}
