//! The `switch_events` table: the switch controller's records ([`crate::switch`]), written
//! through the one writer thread, read back newest first for `GET /api/v1/switches` and the
//! status page.

use super::sql::{params, Connection};

use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};
use crate::records::switch::{Action, Episode, SwitchRecord};
use crate::route::RouteId;

fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid(format!("switch record: {e}")))
}

/// Inserts one record (inside the writer's transaction).
pub(crate) fn insert(conn: &Connection, r: &SwitchRecord) -> Result<(), StoreError> {
    let episode = r.episode.as_ref().map(json).transpose()?;
    conn.prepare_cached(
        "INSERT INTO switch_events (serves, action, at_ms, trigger_code, from_routes, to_routes,
             automatic, dwell_until_ms, ratio, episode, text)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        r.serves,
        r.action.as_str(),
        to_ms(r.at),
        r.trigger,
        json(&r.from)?,
        json(&r.to)?,
        r.automatic,
        r.dwell_until.map(to_ms),
        r.ratio,
        episode,
        r.text,
    ])?;
    Ok(())
}

impl Writer {
    /// Stores one switch record; resolves after COMMIT.
    pub async fn record_switch(&self, record: SwitchRecord) -> Result<(), StoreError> {
        self.request(|ack: Ack<()>| Command::Switch {
            record: Box::new(record),
            ack,
        })
        .await
    }
}

impl Reader {
    /// The latest `limit` switch records, newest first.
    pub fn switch_records(&self, limit: usize) -> Result<Vec<SwitchRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT serves, action, at_ms, trigger_code, from_routes, to_routes, automatic,
                    dwell_until_ms, ratio, episode, text
             FROM switch_events ORDER BY at_ms DESC, id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, bool>(6)?,
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<f64>>(8)?,
                r.get::<_, Option<String>>(9)?,
                r.get::<_, String>(10)?,
            ))
        })?;
        let corrupt = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("switch record {what}: {e}"))
        };
        let mut out = Vec::new();
        for row in rows {
            let (serves, action, at, trigger, from, to, automatic, dwell, ratio, episode, text) =
                row?;
            let action = Action::parse(&action).ok_or_else(|| corrupt("action", &action))?;
            let from: Vec<RouteId> =
                serde_json::from_str(&from).map_err(|e| corrupt("from_routes", &e))?;
            let to: Vec<RouteId> =
                serde_json::from_str(&to).map_err(|e| corrupt("to_routes", &e))?;
            let episode: Option<Episode> = episode
                .map(|e| serde_json::from_str(&e))
                .transpose()
                .map_err(|e| corrupt("episode", &e))?;
            out.push(SwitchRecord {
                serves,
                action,
                at: from_ms(at)?,
                trigger,
                from,
                to,
                automatic,
                dwell_until: dwell.map(from_ms).transpose()?,
                ratio,
                episode,
                text,
            });
        }
        Ok(out)
    }
}
