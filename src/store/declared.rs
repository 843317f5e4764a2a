//! What providers declare on their own status pages (`migrations/*/0024_declared.sql`):
//! component states as last read and incidents as they progress. One [`DeclaredOp`] per
//! successful read of a page goes through the writer thread; reads are [`Reader`] methods.

use super::sql::params;
use chrono::{DateTime, Utc};

use super::writer::{Ack, Command};
use super::{from_ms, to_ms, Reader, StoreError, Writer};

/// A component's state as the page declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredComponent {
    pub provider: String,
    pub page: String,
    /// The page's own component name.
    pub component: String,
    /// `operational`, `degraded_performance`, `partial_outage`, `major_outage`,
    /// `under_maintenance` (anything else the page says is kept as written).
    pub status: String,
    /// When probeok first read this status.
    pub since: DateTime<Utc>,
}

/// An incident as the page declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredIncident {
    pub provider: String,
    pub page: String,
    /// The page's own id (a Statuspage incident id, a feed entry's id).
    pub id: String,
    pub name: String,
    /// `investigating`, `identified`, `monitoring`, `resolved`, `postmortem`.
    pub status: String,
    pub impact: Option<String>,
    /// When the provider published it: the moment it told the world.
    pub declared_at: DateTime<Utc>,
    /// When the provider says the impact began (pages may backdate it).
    pub started_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub url: Option<String>,
    /// The page's component names it affects; empty when the page names none.
    pub components: Vec<String>,
    /// When probeok first read it.
    pub seen_at: DateTime<Utc>,
}

impl DeclaredIncident {
    pub fn is_resolved(&self) -> bool {
        self.resolved_at.is_some() || matches!(self.status.as_str(), "resolved" | "postmortem")
    }
}

/// A write to the declared tables.
#[derive(Debug, Clone)]
pub enum DeclaredOp {
    /// One successful read of `page`: every component's state (a status unchanged keeps its
    /// `since`), and the incidents it listed (first-seen times kept). Components the page no
    /// longer lists are forgotten; incidents are kept (they are the lead-time history).
    Page {
        provider: String,
        page: String,
        /// `None` when the page has no component states (a feed): those are left alone.
        components: Option<Vec<(String, String)>>,
        incidents: Vec<DeclaredIncident>,
        at: DateTime<Utc>,
    },
}

pub(crate) fn apply(conn: &super::sql::Connection, op: &DeclaredOp) -> Result<u64, StoreError> {
    let DeclaredOp::Page {
        provider,
        page,
        components,
        incidents,
        at,
    } = op;
    let mut n = 0;
    let at_ms = to_ms(*at);
    if let Some(components) = components {
        let listed: Vec<&str> = components.iter().map(|(c, _)| c.as_str()).collect();
        let mut known =
            conn.prepare_cached("SELECT component FROM declared_components WHERE page = ?1")?;
        let rows = known.query_map(params![page], |r| r.get::<_, String>(0))?;
        let mut gone = Vec::new();
        for r in rows {
            let c = r?;
            if !listed.contains(&c.as_str()) {
                gone.push(c);
            }
        }
        for c in gone {
            n += conn
                .prepare_cached(
                    "DELETE FROM declared_components WHERE page = ?1 AND component = ?2",
                )?
                .execute(params![page, c])?;
        }
        for (component, status) in components {
            n += conn
                .prepare_cached(
                    "INSERT INTO declared_components (page, provider, component, status, since_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (page, component) DO UPDATE SET
                         provider = excluded.provider,
                         since_ms = CASE WHEN declared_components.status = excluded.status
                                         THEN declared_components.since_ms ELSE excluded.since_ms END,
                         status = excluded.status",
                )?
                .execute(params![page, provider, component, status, at_ms])?;
        }
    }
    for i in incidents {
        n += conn
            .prepare_cached(
                "INSERT INTO declared_incidents (page, incident_id, provider, name, status, impact,
                     declared_ms, started_ms, resolved_ms, url, components, seen_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (page, incident_id) DO UPDATE SET
                     provider = excluded.provider, name = excluded.name, status = excluded.status,
                     impact = excluded.impact, declared_ms = excluded.declared_ms,
                     started_ms = excluded.started_ms, resolved_ms = excluded.resolved_ms,
                     url = excluded.url, components = excluded.components",
            )?
            .execute(params![
                page,
                i.id,
                provider,
                i.name,
                i.status,
                i.impact,
                to_ms(i.declared_at),
                to_ms(i.started_at),
                i.resolved_at.map(to_ms),
                i.url,
                i.components.join("\n"),
                at_ms,
            ])?;
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

impl Writer {
    /// One read of a status page into the declared tables; resolves after COMMIT.
    pub async fn declared(&self, op: DeclaredOp) -> Result<u64, StoreError> {
        self.request(|ack: Ack<u64>| Command::Declared { op, ack })
            .await
    }
}

impl Reader {
    /// Every declared component state, by page then component.
    pub fn declared_components(&self) -> Result<Vec<DeclaredComponent>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT provider, page, component, status, since_ms FROM declared_components
             ORDER BY page, component",
        )?;
        let rows = stmt.query_map(params![], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (provider, page, component, status, since) = r?;
            out.push(DeclaredComponent {
                provider,
                page,
                component,
                status,
                since: from_ms(since)?,
            });
        }
        Ok(out)
    }

    /// Declared incidents still open at or after `since` (unresolved, or resolved since),
    /// newest declaration first, at most `limit`.
    pub fn declared_incidents(
        &self,
        since: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DeclaredIncident>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT provider, page, incident_id, name, status, impact, declared_ms, started_ms,
                    resolved_ms, url, components, seen_ms
             FROM declared_incidents
             WHERE resolved_ms IS NULL OR resolved_ms >= ?1
             ORDER BY declared_ms DESC, incident_id
             LIMIT ?2",
        )?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![to_ms(since), limit], |r| {
            Ok((
                (
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, Option<String>>(5)?,
                ),
                (
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, Option<i64>>(8)?,
                    r.get::<_, Option<String>>(9)?,
                    r.get::<_, String>(10)?,
                    r.get::<_, i64>(11)?,
                ),
            ))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (
                (provider, page, id, name, status, impact),
                (declared, started, resolved, url, components, seen),
            ) = r?;
            out.push(DeclaredIncident {
                provider,
                page,
                id,
                name,
                status,
                impact,
                declared_at: from_ms(declared)?,
                started_at: from_ms(started)?,
                resolved_at: resolved.map(from_ms).transpose()?,
                url,
                components: components
                    .lines()
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                seen_at: from_ms(seen)?,
            });
        }
        Ok(out)
    }
}
