//! Our incidents beside the providers' declarations: each incident's `provider_declared`
//! in `/api/v1/incidents`, and the month's summary at `/api/v1/incidents/lead`.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::{ApiError, AppState};
use crate::health::Incident;
use crate::store::Store;

/// Each incident against what its provider declared (`None` where no status page maps its
/// route, or without status pages). Called on a blocking thread.
pub fn leads(
    store: &Store,
    map: Option<&crate::declared::lead::Mapping>,
    list: &[Incident],
) -> Result<Vec<Option<crate::declared::lead::Lead>>, ApiError> {
    let Some(map) = map else {
        return Ok(vec![None; list.len()]);
    };
    let Some(since) = list.iter().map(|i| i.opened_at).min() else {
        return Ok(Vec::new());
    };
    let declared = store
        .reader()?
        .declared_incidents(since, crate::declared::MAX_DECLARED)?;
    Ok(list
        .iter()
        .map(|i| crate::declared::lead::lead(map, i, &declared))
        .collect())
}

#[derive(Debug, Deserialize)]
pub struct LeadParams {
    month: Option<String>,
}

/// `GET /api/v1/incidents/lead?month=YYYY-MM` (default: this month, UTC): how our incidents
/// on routes a status page maps stood against the providers' declarations — counts, the
/// median lead, the shares never declared and declared first by the provider.
pub async fn lead_summary(
    State(state): State<AppState>,
    q: Result<Query<LeadParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(p) = q.map_err(|e| ApiError::bad_request("bad_query", e.body_text()))?;
    let now = state.clock.now();
    let month = match p.month {
        None => (chrono::Datelike::year(&now), chrono::Datelike::month(&now)),
        Some(m) => crate::declared::lead::parse_month(&m).ok_or_else(|| {
            ApiError::bad_request("bad_query", format!("month must be YYYY-MM, got {m:?}"))
        })?,
    };
    let map = crate::declared::lead::Mapping::from_config(&state.config.current());
    let store = state.store.clone();
    let summary = tokio::task::spawn_blocking(move || {
        let (start, end) = crate::declared::lead::month_bounds(month)
            .ok_or_else(|| ApiError::bad_request("bad_query", "no such month"))?;
        let list: Vec<Incident> = store
            .reader()?
            .incidents(None, start, crate::declared::MAX_DECLARED)?
            .into_iter()
            .filter(|i| i.opened_at >= start && i.opened_at < end)
            .collect();
        let leads = leads(&store, Some(&map), &list)?;
        let pairs: Vec<_> = list.iter().zip(leads).collect();
        Ok::<_, ApiError>(crate::declared::lead::month_summary(month, &pairs))
    })
    .await??;
    Ok(Json(json!(summary)))
}
