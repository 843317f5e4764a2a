//! Embeddings routes' vectors (`migrations/*/0027_embedding_references.sql`): per route the
//! reference vector later probes are compared with, and the latest good vector (what an admin
//! makes the reference after an intended model change). Vectors are kept as little-endian f32
//! bytes. Writes are [`EmbeddingOp`]s through the writer thread; reads are [`Reader`] methods.

use chrono::{DateTime, Utc};

use super::sql::params;
use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// A route's stored vectors.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRow {
    pub reference: Vec<f32>,
    pub reference_at: DateTime<Utc>,
    pub latest: Vec<f32>,
    pub latest_at: DateTime<Utc>,
}

/// A write to `embedding_references`.
#[derive(Debug, Clone)]
pub enum EmbeddingOp {
    /// A good vector of `route` at `at`: its latest, and its reference when it has none.
    Observe {
        route: String,
        vector: Vec<f32>,
        at: DateTime<Utc>,
    },
    /// The latest vector becomes the reference. Answers 0 when the route has no vector yet.
    AdoptLatest { route: String },
    /// Forgets the route's vectors: its next good vector becomes the reference.
    Clear { route: String },
}

/// Little-endian f32 bytes.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inverse of [`to_bytes`]; a trailing partial value (no build writes one) is dropped.
pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(crate) fn apply(conn: &super::sql::Connection, op: &EmbeddingOp) -> Result<u64, StoreError> {
    let n = match op {
        EmbeddingOp::Observe { route, vector, at } => {
            let bytes = to_bytes(vector);
            conn.prepare_cached(
                "INSERT INTO embedding_references (route, reference, reference_ms, latest, latest_ms)
                 VALUES (?1, ?2, ?3, ?2, ?3)
                 ON CONFLICT (route) DO UPDATE SET latest = excluded.latest,
                     latest_ms = excluded.latest_ms",
            )?
            .execute(params![route, bytes, to_ms(*at)])?
        }
        EmbeddingOp::AdoptLatest { route } => conn
            .prepare_cached(
                "UPDATE embedding_references SET reference = latest, reference_ms = latest_ms
                 WHERE route = ?1",
            )?
            .execute(params![route])?,
        EmbeddingOp::Clear { route } => conn
            .prepare_cached("DELETE FROM embedding_references WHERE route = ?1")?
            .execute(params![route])?,
    };
    Ok(u64::try_from(n).unwrap_or(0))
}

impl Writer {
    /// One write to the embeddings vectors; resolves after COMMIT.
    pub async fn embedding(&self, op: EmbeddingOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Embedding { op, ack })
            .await
    }
}

impl Reader {
    /// The route's stored vectors, if it has any.
    pub fn embedding_row(&self, route: &str) -> Result<Option<EmbeddingRow>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT reference, reference_ms, latest, latest_ms FROM embedding_references
             WHERE route = ?1",
        )?;
        let rows = stmt.query_map(params![route], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let (reference, reference_ms, latest, latest_ms) = row?;
        Ok(Some(EmbeddingRow {
            reference: from_bytes(&reference),
            reference_at: from_ms(reference_ms)?,
            latest: from_bytes(&latest),
            latest_at: from_ms(latest_ms)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_through_bytes() {
        let v = vec![0.0, -1.5, f32::MIN_POSITIVE, 3.25];
        assert_eq!(from_bytes(&to_bytes(&v)), v);
        assert_eq!(to_bytes(&v).len(), 16);
    }
}
