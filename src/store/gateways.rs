//! Gateway channels probeok disabled (`migrations/*/0023_sync_channels.sql`): a channel of a
//! new-api / one-api gateway whose route went to weight 0 is remembered here, so that only
//! these are enabled again when the route returns — never one an operator disabled. Writes
//! are [`GatewayOp`]s through the writer thread; reads are [`Reader`] methods.

use super::sql::params;
use chrono::{DateTime, Utc};

use super::writer::{Ack, Command};
use super::{to_ms, Reader, StoreError, Writer};

/// A write to the `sync_disabled` table.
#[derive(Debug, Clone)]
pub enum GatewayOp {
    /// probeok disabled `channel_id` of `gateway` because `route` went to weight 0.
    Disabled {
        gateway: String,
        channel_id: i64,
        route: String,
        at: DateTime<Utc>,
    },
    /// The channel is enabled again (by probeok, or by someone else): forgotten. Answers 1
    /// when it was remembered.
    Enabled { gateway: String, channel_id: i64 },
}

pub(crate) fn apply(conn: &super::sql::Connection, op: &GatewayOp) -> Result<u64, StoreError> {
    let n = match op {
        GatewayOp::Disabled {
            gateway,
            channel_id,
            route,
            at,
        } => conn
            .prepare_cached(
                "INSERT INTO sync_disabled (gateway, channel_id, route, disabled_ms)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (gateway, channel_id) DO UPDATE SET route = excluded.route,
                     disabled_ms = excluded.disabled_ms",
            )?
            .execute(params![gateway, channel_id, route, to_ms(*at)])?,
        GatewayOp::Enabled {
            gateway,
            channel_id,
        } => conn
            .prepare_cached("DELETE FROM sync_disabled WHERE gateway = ?1 AND channel_id = ?2")?
            .execute(params![gateway, channel_id])?,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

impl Writer {
    /// One write to the disabled-channels table; resolves after COMMIT.
    pub async fn gateway(&self, op: GatewayOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Gateway { op, ack })
            .await
    }
}

impl Reader {
    /// The channel ids of `gateway` that probeok disabled, ascending.
    pub fn sync_disabled(&self, gateway: &str) -> Result<Vec<i64>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT channel_id FROM sync_disabled WHERE gateway = ?1 ORDER BY channel_id",
        )?;
        let rows = stmt.query_map(params![gateway], |r| r.get::<_, i64>(0))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r?);
        }
        Ok(out)
    }
}
