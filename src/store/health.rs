//! Detection's tables (migration 3): `route_health` (each route's `RouteHealth` as JSON, so
//! state, counters, windows and the open incident survive a restart), `transitions` (every
//! change of state with its evidence) and `incidents`.
//!
//! Writes go through the single writer like everything else. One [`HealthWrite`] is applied
//! inside one transaction, and a failed batch is retried command by command, so a transition,
//! the incident it opened or closed and the route's state after it always land together (or
//! not at all): a restart never finds an incident without the transition that opened it.
//!
//! JSON is encoded on the caller's side (an encoding error is the caller's), decoded by the
//! readers. An incident is stored without its transitions: they are rows of `transitions`
//! (all of them, not only the first ones the in-memory incident keeps), and the readers put
//! them back.

use std::collections::HashMap;

use super::sql::{params, value_tuples, Connection, OptionalExtension, Row, ValueRef};
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use super::writer::Command;
use super::{from_ms, to_ms, Reader, StoreError, Writer};
use crate::evidence::Evidence;
use crate::route::RouteId;
use crate::state::{FailureMode, Incident, PersistedHealth, Reason, State, Transition};

/// One route's state, encoded.
#[derive(Debug)]
pub(crate) struct StateRow {
    route: RouteId,
    state: &'static str,
    json: String,
    at_ms: i64,
}

#[derive(Debug)]
pub(crate) struct IncidentRow {
    id: String,
    route: RouteId,
    opened_at_ms: i64,
    closed_at_ms: Option<i64>,
    peak: &'static str,
    failure_mode: Option<&'static str>,
    json: String,
}

#[derive(Debug)]
pub(crate) struct TransitionRow {
    route: RouteId,
    at_ms: i64,
    from: &'static str,
    to: &'static str,
    code: String,
    text: String,
    failure_mode: Option<&'static str>,
    evidence: String,
    incident_id: Option<String>,
}

/// What one health command writes, in one transaction: incidents first, then transitions,
/// then states.
#[derive(Debug, Default)]
pub(crate) struct HealthWrite {
    pub(crate) states: Vec<StateRow>,
    pub(crate) incidents: Vec<IncidentRow>,
    pub(crate) transitions: Vec<TransitionRow>,
}

fn encode<T: serde::Serialize>(what: &str, v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid(format!("{what}: {e}")))
}

fn state_row<H: PersistedHealth>(h: &H, at: DateTime<Utc>) -> Result<StateRow, StoreError> {
    Ok(StateRow {
        route: h.route().clone(),
        state: h.state().as_str(),
        json: encode("route health", h)?,
        at_ms: to_ms(at),
    })
}

fn incident_row(i: &Incident) -> Result<IncidentRow, StoreError> {
    // The transitions have their own rows; storing them twice would grow each upsert.
    let bare = Incident {
        transitions: Vec::new(),
        ..i.clone()
    };
    Ok(IncidentRow {
        id: i.id.clone(),
        route: i.route.clone(),
        opened_at_ms: to_ms(i.opened_at),
        closed_at_ms: i.closed_at.map(to_ms),
        peak: i.peak.as_str(),
        failure_mode: i.failure_mode.map(FailureMode::as_str),
        json: encode("incident", &bare)?,
    })
}

fn transition_row(t: &Transition) -> Result<TransitionRow, StoreError> {
    Ok(TransitionRow {
        route: t.route.clone(),
        at_ms: to_ms(t.at),
        from: t.from.as_str(),
        to: t.to.as_str(),
        code: t.reason.code.clone(),
        text: t.reason.text.clone(),
        failure_mode: t.failure_mode.map(FailureMode::as_str),
        evidence: encode("evidence", &t.evidence)?,
        incident_id: t.incident_id.clone(),
    })
}

/// Applies one [`HealthWrite`] inside the writer's open transaction; `route_id` interns ids.
pub(crate) fn apply(
    conn: &Connection,
    w: &HealthWrite,
    mut route_id: impl FnMut(&RouteId) -> Result<i64, StoreError>,
) -> Result<(), StoreError> {
    for i in &w.incidents {
        let id = route_id(&i.route)?;
        conn.prepare_cached(
            "INSERT INTO incidents (id, route_id, opened_at_ms, closed_at_ms, peak, failure_mode, incident)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (id) DO UPDATE SET closed_at_ms = excluded.closed_at_ms,
                 peak = excluded.peak, failure_mode = excluded.failure_mode,
                 incident = excluded.incident",
        )?
        .execute(params![
            i.id,
            id,
            i.opened_at_ms,
            i.closed_at_ms,
            i.peak,
            i.failure_mode,
            i.json
        ])?;
    }
    for t in &w.transitions {
        let id = route_id(&t.route)?;
        conn.prepare_cached(
            "INSERT INTO transitions (route_id, at_ms, from_state, to_state, reason_code,
                 reason_text, failure_mode, evidence, incident_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            id,
            t.at_ms,
            t.from,
            t.to,
            t.code,
            t.text,
            t.failure_mode,
            t.evidence,
            t.incident_id
        ])?;
    }
    // Several states per statement (a save of every route is one of the writer's biggest
    // writes). A route twice in one write keeps its last state, as one upsert after another
    // would; PostgreSQL refuses an upsert that touches one row twice.
    let mut last: HashMap<i64, usize> = HashMap::with_capacity(w.states.len());
    for (n, s) in w.states.iter().enumerate() {
        last.insert(route_id(&s.route)?, n);
    }
    let mut rows: Vec<(usize, i64)> = last.into_iter().map(|(id, n)| (n, id)).collect();
    rows.sort_unstable();
    let mut values = Vec::with_capacity(rows.len() * STATE_COLUMNS);
    for (n, id) in rows {
        let s = &w.states[n];
        values.extend([
            ValueRef::Integer(id),
            ValueRef::Text(s.state),
            ValueRef::Text(&s.json),
            ValueRef::Integer(s.at_ms),
        ]);
    }
    conn.execute_rows(
        |n| {
            format!(
                "INSERT INTO route_health (route_id, state, health, updated_at_ms) VALUES {}
                 ON CONFLICT (route_id) DO UPDATE SET state = excluded.state,
                     health = excluded.health, updated_at_ms = excluded.updated_at_ms",
                value_tuples(n, STATE_COLUMNS)
            )
        },
        STATE_COLUMNS,
        &values,
        STATE_CHUNK,
    )?;
    Ok(())
}

/// Columns of one `route_health` row as [`apply`] writes it.
const STATE_COLUMNS: usize = 4;

/// States per upsert at most.
const STATE_CHUNK: usize = 256;

impl Writer {
    async fn health(&self, write: HealthWrite) -> Result<(), StoreError> {
        self.request(|ack| Command::Health { write, ack }).await
    }

    /// Saves each route's state, and its open incident when it has one (its failure mode may
    /// have moved without a transition), in one transaction; `at` is the save time.
    pub async fn save_health<H: PersistedHealth>(
        &self,
        states: &[H],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if states.is_empty() {
            return Ok(());
        }
        let mut w = HealthWrite::default();
        for h in states {
            w.states.push(state_row(h, at)?);
            if let Some(i) = h.incident() {
                w.incidents.push(incident_row(i)?);
            }
        }
        self.health(w).await
    }

    /// Stores a transition, the incident it opened, changed or closed (if any) and the route's
    /// state after it — atomically.
    pub async fn record_transition<H: PersistedHealth>(
        &self,
        t: &Transition,
        incident: Option<&Incident>,
        health: &H,
    ) -> Result<(), StoreError> {
        let mut w = HealthWrite::default();
        w.transitions.push(transition_row(t)?);
        if let Some(i) = incident {
            w.incidents.push(incident_row(i)?);
        }
        w.states.push(state_row(health, t.at)?);
        self.health(w).await
    }

    /// [`Writer::record_transition`] for several, in order, in one transaction: a provider-wide
    /// outage moves thousands of routes at once, and one commit each would hold detection up.
    pub async fn record_transitions<H: PersistedHealth>(
        &self,
        items: &[(&Transition, Option<&Incident>, &H)],
    ) -> Result<(), StoreError> {
        let mut w = HealthWrite::default();
        for (t, incident, health) in items {
            w.transitions.push(transition_row(t)?);
            if let Some(i) = incident {
                w.incidents.push(incident_row(i)?);
            }
            w.states.push(state_row(*health, t.at)?);
        }
        if w.transitions.is_empty() {
            return Ok(());
        }
        self.health(w).await
    }

    /// Inserts or updates one incident (its transitions are stored with
    /// [`Writer::record_transition`]).
    pub async fn upsert_incident(&self, incident: &Incident) -> Result<(), StoreError> {
        let mut w = HealthWrite::default();
        w.incidents.push(incident_row(incident)?);
        self.health(w).await
    }
}

/// A route's stored state (`H` is detection's `RouteHealth`).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredHealth<H> {
    pub route: RouteId,
    pub health: H,
    pub updated_at: DateTime<Utc>,
}

fn decode<T: DeserializeOwned>(what: &str, s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// A state string back to [`State`].
fn state(s: &str) -> Result<State, StoreError> {
    decode(
        "state",
        &serde_json::Value::String(s.to_owned()).to_string(),
    )
}

fn failure_mode(s: Option<String>) -> Result<Option<FailureMode>, StoreError> {
    s.map(|s| decode("failure mode", &serde_json::Value::String(s).to_string()))
        .transpose()
}

const TRANSITION_COLUMNS: &str = "r.name, t.at_ms, t.from_state, t.to_state, t.reason_code,
    t.reason_text, t.failure_mode, t.evidence, t.incident_id";

/// Raw columns of a transition row, decoded outside `query_map`.
type RawTransition = (
    String,
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    Option<String>,
);

fn raw_transition(r: &Row<'_>) -> super::sql::Result<RawTransition> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

fn transition(raw: RawTransition) -> Result<Transition, StoreError> {
    let (route, at, from, to, code, text, mode, evidence, incident_id) = raw;
    Ok(Transition {
        route: RouteId::parse(&route)
            .ok_or_else(|| StoreError::Corrupt(format!("route id {route:?}")))?,
        from: state(&from)?,
        to: state(&to)?,
        at: from_ms(at)?,
        reason: Reason { code, text },
        failure_mode: failure_mode(mode)?,
        evidence: decode::<Evidence>("evidence", &evidence)?,
        incident_id,
    })
}

fn collect_transitions(
    stmt: &mut super::sql::Statement<'_>,
    params: impl super::sql::Params,
) -> Result<Vec<Transition>, StoreError> {
    let rows = stmt.query_map(params, raw_transition)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(transition(row?)?);
    }
    Ok(out)
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Reader {
    /// Every stored route state. A row that no longer decodes (written by an incompatible
    /// build) is left out with a warning: that route starts fresh rather than the service not
    /// starting at all.
    pub fn route_health_all<H: PersistedHealth>(&self) -> Result<Vec<StoredHealth<H>>, StoreError> {
        self.route_health_updated_since(i64::MIN)
    }

    /// The stored states saved at or after `since_ms` (their `updated_at`, the saving
    /// member's clock), by route: what a follower re-reads each second.
    pub fn route_health_updated_since<H: PersistedHealth>(
        &self,
        since_ms: i64,
    ) -> Result<Vec<StoredHealth<H>>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.name, h.health, h.updated_at_ms FROM route_health h
             JOIN routes r ON r.id = h.route_id WHERE h.updated_at_ms >= ?1 ORDER BY r.name",
        )?;
        let rows = stmt.query_map([since_ms], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, json, at) = row?;
            match decode::<H>("route health", &json) {
                Ok(health) => out.push(StoredHealth {
                    route: health.route().clone(),
                    health,
                    updated_at: from_ms(at)?,
                }),
                Err(e) => {
                    tracing::warn!(route = %name, error = %e, "stored route state unreadable; the route starts fresh");
                }
            }
        }
        Ok(out)
    }

    /// The route's transitions at or after `since`, newest first.
    pub fn transitions(
        &self,
        route: &RouteId,
        since: DateTime<Utc>,
        limit_n: usize,
    ) -> Result<Vec<Transition>, StoreError> {
        let Some(id) = self.route_id(route)? else {
            return Ok(Vec::new());
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {TRANSITION_COLUMNS} FROM transitions t JOIN routes r ON r.id = t.route_id
             WHERE t.route_id = ?1 AND t.at_ms >= ?2 ORDER BY t.at_ms DESC, t.id DESC LIMIT ?3"
        ))?;
        collect_transitions(&mut stmt, params![id, to_ms(since), limit(limit_n)])
    }

    /// Every transition of an incident, oldest first.
    pub fn incident_transitions(&self, incident_id: &str) -> Result<Vec<Transition>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {TRANSITION_COLUMNS} FROM transitions t JOIN routes r ON r.id = t.route_id
             WHERE t.incident_id = ?1 ORDER BY t.at_ms, t.id"
        ))?;
        collect_transitions(&mut stmt, params![incident_id])
    }

    /// Incidents open at or after `since` (still open, or closed at or after it) — of one
    /// route or of all — newest first, each with all its transitions.
    pub fn incidents(
        &self,
        route: Option<&RouteId>,
        since: DateTime<Utc>,
        limit_n: usize,
    ) -> Result<Vec<Incident>, StoreError> {
        let rows: Vec<String> = match route {
            Some(route) => {
                let Some(id) = self.route_id(route)? else {
                    return Ok(Vec::new());
                };
                let mut stmt = self.conn.prepare_cached(
                    "SELECT incident FROM incidents
                     WHERE route_id = ?1 AND (closed_at_ms IS NULL OR closed_at_ms >= ?2)
                     ORDER BY opened_at_ms DESC, id DESC LIMIT ?3",
                )?;
                let rows =
                    stmt.query_map(params![id, to_ms(since), limit(limit_n)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            }
            None => {
                let mut stmt = self.conn.prepare_cached(
                    "SELECT incident FROM incidents
                     WHERE closed_at_ms IS NULL OR closed_at_ms >= ?1
                     ORDER BY opened_at_ms DESC, id DESC LIMIT ?2",
                )?;
                let rows = stmt.query_map(params![to_ms(since), limit(limit_n)], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            }
        };
        rows.iter()
            .map(|json| self.with_transitions(json))
            .collect()
    }

    /// The open incidents, each as its route, id and opening time (no transitions read).
    pub fn open_incidents(&self) -> Result<Vec<(RouteId, String, DateTime<Utc>)>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.name, i.id, i.opened_at_ms FROM incidents i
             JOIN routes r ON r.id = i.route_id WHERE i.closed_at_ms IS NULL",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, id, at) = row?;
            let route = RouteId::parse(&name)
                .ok_or_else(|| StoreError::Corrupt(format!("route id {name:?}")))?;
            out.push((route, id, from_ms(at)?));
        }
        Ok(out)
    }

    /// One incident with all its transitions.
    pub fn incident(&self, id: &str) -> Result<Option<Incident>, StoreError> {
        let json: Option<String> = self
            .conn
            .prepare_cached("SELECT incident FROM incidents WHERE id = ?1")?
            .query_row(params![id], |r| r.get(0))
            .optional()?;
        json.map(|j| self.with_transitions(&j)).transpose()
    }

    fn with_transitions(&self, json: &str) -> Result<Incident, StoreError> {
        let mut i: Incident = decode("incident", json)?;
        i.transitions = self.incident_transitions(&i.id)?;
        Ok(i)
    }
}
