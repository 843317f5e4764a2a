//! `GET /api/v1/incidents`: the incident history, and each shared cause's incidents as one
//! outage.

use super::*;

/// What `GET /api/v1/incidents` asks for: `?limit=N` (bounded), `?route=ID`, `?since=RFC3339`.
#[derive(Debug, Clone, PartialEq)]
pub struct IncidentQuery {
    /// At most this many, newest first.
    pub limit: usize,
    /// Only this route's incidents.
    pub route: Option<RouteId>,
    /// Only incidents still open at or after this time (open now, or closed since).
    pub since: Option<DateTime<Utc>>,
}

impl IncidentQuery {
    pub fn latest(limit: usize) -> Self {
        Self {
            limit,
            route: None,
            since: None,
        }
    }
}

/// Where `/api/v1/incidents` reads from. Called on a blocking thread.
///
/// The service uses [`StoreIncidents`] (the incident history with every transition);
/// [`SnapshotIncidents`] (the open incidents of the health snapshot, without transitions)
/// serves harnesses that have no detection tables to read.
pub trait IncidentSource: Send + Sync + 'static {
    /// Newest first, at most `query.limit`, filtered by `query.route` / `query.since`.
    fn incidents(
        &self,
        store: &Store,
        health: &HealthSnapshot,
        query: &IncidentQuery,
    ) -> Result<Vec<Incident>, StoreError>;
}

/// The incident history of the store (`incidents` and `transitions` tables, written by the
/// health service): open and closed incidents, newest first, each with all its transitions
/// and their evidence.
#[derive(Debug, Default, Clone, Copy)]
pub struct StoreIncidents;

impl IncidentSource for StoreIncidents {
    fn incidents(
        &self,
        store: &Store,
        _health: &HealthSnapshot,
        query: &IncidentQuery,
    ) -> Result<Vec<Incident>, StoreError> {
        store.reader()?.incidents(
            query.route.as_ref(),
            query.since.unwrap_or(DateTime::UNIX_EPOCH),
            query.limit,
        )
    }
}

/// The open incidents of the health snapshot.
#[derive(Debug, Default, Clone, Copy)]
pub struct SnapshotIncidents;

impl IncidentSource for SnapshotIncidents {
    fn incidents(
        &self,
        _store: &Store,
        health: &HealthSnapshot,
        query: &IncidentQuery,
    ) -> Result<Vec<Incident>, StoreError> {
        let mut open: Vec<Incident> = health
            .routes
            .iter()
            .filter(|s| query.route.as_ref().is_none_or(|r| r == &s.route))
            .filter_map(|s| {
                s.incident.as_ref().map(|i| Incident {
                    id: i.id.clone(),
                    route: s.route.clone(),
                    opened_at: i.opened_at,
                    closed_at: None,
                    peak: i.peak,
                    failure_mode: i.failure_mode,
                    transitions: Vec::new(),
                    cause: None,
                })
            })
            .collect();
        open.sort_by_key(|i| std::cmp::Reverse(i.opened_at));
        open.truncate(query.limit);
        Ok(open)
    }
}

#[derive(Debug, Deserialize)]
pub struct IncidentsParams {
    limit: Option<String>,
    route: Option<String>,
    since: Option<String>,
}

/// The trace ids of failed requests an incident lists, at most (admin view).
pub const INCIDENT_TRACES: usize = 20;

/// `GET /api/v1/incidents?limit=N&route=ID&since=RFC3339`: `{"incidents":[{id, route,
/// opened_at, closed_at, peak, failure_mode, transitions:[{route, from, to, at, reason,
/// failure_mode, evidence, incident_id}]}]}`, newest first. An unknown route is 404, a bad
/// `limit` or `since` 400. With the admin token (a wrong one is 401), each incident also has
/// `trace_ids`: up to [`INCIDENT_TRACES`] traced requests that failed at its route inside it
/// (real client traffic, so never in the public view).
pub async fn incidents(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    q: Result<Query<IncidentsParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let admin = headers.contains_key(axum::http::header::AUTHORIZATION);
    if admin {
        crate::web::check_admin(&state.config.current(), &headers)?;
    }
    let Query(p) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let limit = limit(Ok(Query(LimitQuery { limit: p.limit })))?;
    let route = match p.route {
        None => None,
        Some(id) => Some(
            RouteId::parse(&id)
                .filter(|id| state.routes.iter().any(|r| &r.id == id))
                .ok_or_else(|| ApiError::NotFound(format!("unknown route {id:?}")))?,
        ),
    };
    let since = match p.since {
        None => None,
        Some(s) => Some(
            DateTime::parse_from_rfc3339(s.trim())
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    ApiError::bad_request(
                        "bad_query",
                        format!("since must be an RFC 3339 time, got {s:?}: {e}"),
                    )
                })?,
        ),
    };
    let query = IncidentQuery {
        limit,
        route,
        since,
    };
    let health = state.health.borrow().clone();
    let (source, store): (Arc<dyn IncidentSource>, Store) =
        (state.incidents.clone(), state.store.clone());
    let map = state
        .metrics
        .declared()
        .map(|_| crate::declared::lead::Mapping::from_config(&state.config.current()));
    let list = tokio::task::spawn_blocking(move || {
        let list = source.incidents(&store, &health, &query)?;
        let leads = leads(&store, map.as_ref(), &list)?;
        let reader = if admin { Some(store.reader()?) } else { None };
        let causes = causes_of(&list);
        let mut out = Vec::with_capacity(list.len());
        for (i, lead) in list.iter().zip(leads) {
            let mut v = json!(i);
            if let Some(lead) = lead {
                v["provider_declared"] = json!(lead);
            }
            if let Some(reader) = &reader {
                let traces = reader.failed_request_traces(
                    i.route.as_str(),
                    i.opened_at,
                    i.closed_at,
                    INCIDENT_TRACES,
                )?;
                v["trace_ids"] = json!(traces);
            }
            out.push(v);
        }
        Ok::<_, ApiError>((Value::Array(out), causes))
    })
    .await??;
    Ok(Json(json!({ "incidents": list.0, "causes": list.1 })))
}

/// The listed incidents of each shared cause as outages: `{cause, opened_at, closed_at (null
/// while one is open), failure_mode, routes}`, newest first.
fn causes_of(list: &[crate::state::Incident]) -> Vec<Value> {
    let mut out: Vec<Value> = crate::health::outage::outages(list)
        .into_iter()
        .map(|o| {
            json!({
                "cause": o.cause,
                "opened_at": rfc3339(o.opened_at),
                "closed_at": o.closed_at.map(rfc3339),
                "failure_mode": o.failure_mode.map(|m| m.as_str()),
                "routes": o.incidents.iter().map(|i| i.route.as_str()).collect::<Vec<_>>(),
            })
        })
        .collect();
    out.reverse();
    out
}
