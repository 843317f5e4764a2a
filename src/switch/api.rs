//! The HTTP handler of `GET /api/v1/switches?limit=N`: a thin shell over [`super::list`],
//! merged into the monitor's web router by `app`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::SwitchRx;
use crate::store::Store;

#[derive(Clone)]
struct ApiState {
    status: SwitchRx,
    store: Store,
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<usize>,
}

/// The `GET /api/v1/switches` fragment.
pub fn router(status: SwitchRx, store: Store) -> Router {
    Router::new()
        .route("/api/v1/switches", get(list))
        .with_state(ApiState { status, store })
}

async fn list(State(s): State<ApiState>, Query(q): Query<ListQuery>) -> Response {
    let read = tokio::task::spawn_blocking(move || super::list(&s.status, &s.store, q.limit)).await;
    match read {
        Ok(Ok(body)) => Json(body).into_response(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "cannot read switch records");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{DateTime, Utc};
    use serde_json::Value;
    use tokio::sync::watch;

    use super::*;
    use crate::budget::tests::route;
    use crate::budget::Budget;
    use crate::clock::ManualClock;
    use crate::config::{BudgetConfig, SwitchConfig};
    use crate::route::{RouteId, Tier};
    use crate::store::StoreOptions;
    use crate::switch::{machines, status_of, Action, SwitchRecord};

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_714_557_600 + s, 0).unwrap()
    }

    fn record(action: Action, at: i64) -> SwitchRecord {
        SwitchRecord {
            serves: "chat".into(),
            action,
            at: t(at),
            trigger: "error_rate_high".into(),
            from: vec![RouteId::parse("a/cn/p").unwrap()],
            to: vec![RouteId::parse("b/cn/b").unwrap()],
            automatic: true,
            dwell_until: Some(t(at + 300)),
            ratio: None,
            episode: None,
            text: format!("{} at {at}", action.as_str()),
        }
    }

    #[tokio::test]
    async fn lists_the_phases_the_budget_and_the_newest_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db"), StoreOptions::default()).unwrap();
        for (a, at) in [
            (Action::Blocked, 0),
            (Action::Switch, 60),
            (Action::CanaryStage, 1860),
        ] {
            store.writer().record_switch(record(a, at)).await.unwrap();
        }
        let routes = vec![
            route("a/cn/p", Tier::Primary, 1.0, 1.0),
            route("b/cn/b", Tier::Backup, 2.0, 2.0),
        ];
        let clock = Arc::new(ManualClock::new(t(2000)));
        let budget = Budget::new(BudgetConfig::default(), &routes, clock, None);
        let ms = machines(&routes, &SwitchConfig::default());
        let (_tx, rx) = watch::channel(Arc::new(status_of(&ms, &budget, t(2000))));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = router(rx, store);
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let get = |q: &'static str| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                client
                    .get(format!("{base}/api/v1/switches{q}"))
                    .send()
                    .await
            }
        };

        let body: Value = get("?limit=2").await.unwrap().json().await.unwrap();
        assert_eq!(body["generated_at"], "2024-05-01T10:33:20Z");
        assert_eq!(body["models"][0]["serves"], "chat");
        assert_eq!(body["models"][0]["phase"], "primary");
        assert_eq!(body["models"][0]["primaries"][0], "a/cn/p");
        assert_eq!(body["budget"]["switching_allowed"], true);
        let records = body["records"].as_array().unwrap();
        let actions: Vec<&str> = records
            .iter()
            .map(|r| r["action"].as_str().unwrap())
            .collect();
        assert_eq!(actions, ["canary_stage", "switch"]);

        // No limit: all of them; a limit of 0 still lists one.
        let body: Value = get("").await.unwrap().json().await.unwrap();
        assert_eq!(body["records"].as_array().unwrap().len(), 3);
        let body: Value = get("?limit=0").await.unwrap().json().await.unwrap();
        assert_eq!(body["records"].as_array().unwrap().len(), 1);

        // A limit that is no number is the caller's mistake.
        let bad = get("?limit=many").await.unwrap();
        assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);
        server.abort();
    }
}
