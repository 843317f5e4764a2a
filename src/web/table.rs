//! The monitor's HTTP table: every endpoint once, with its method, path, handler and OpenAPI
//! operation. [`router`] builds the router from a table and nothing else, and
//! `/api/openapi.json`'s paths are generated from the same table ([`super::openapi`]), so an
//! endpoint cannot be served without being described, nor described without being served.

use axum::extract::DefaultBodyLimit;
use axum::http::Method;
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use serde_json::Value;

use super::{
    api, atom, badges, catalog, clients, drift, drills, embeddings, feed, ingest, metrics, openapi,
    pages, reload, requests, shadow, silences, subscribe, switches, xds, AppState, Endpoint,
};

/// One endpoint: where it is, what serves it, and how the OpenAPI document describes it.
pub struct Entry {
    pub endpoint: Endpoint,
    pub handler: MethodRouter<AppState>,
    /// The OpenAPI operation object (summary, parameters, responses, …).
    pub doc: Value,
    /// A public read: served under [`super::guards::bounded_read`].
    pub public_read: bool,
}

impl Entry {
    /// An endpoint whose documented path is the path axum matches.
    pub fn new(
        method: Method,
        path: &'static str,
        handler: MethodRouter<AppState>,
        doc: Value,
    ) -> Self {
        Self::documented_as(method, path, path, handler, doc)
    }

    /// An endpoint matched by a wildcard (`/routes/{*rest}`) and documented as the paths it
    /// stands for (`/routes/{id}`).
    pub fn documented_as(
        method: Method,
        path: &'static str,
        doc_path: &'static str,
        handler: MethodRouter<AppState>,
        doc: Value,
    ) -> Self {
        Self {
            endpoint: Endpoint {
                method,
                path,
                doc_path,
            },
            handler,
            doc,
            public_read: false,
        }
    }

    /// Marks a public read (pages, status API, badges, feeds): bounded with the others.
    pub fn public_read(mut self) -> Self {
        self.public_read = true;
        self
    }
}

/// Every endpoint of the monitor. Route ids contain `/` (`qwen/cn/deepseek-ai/V3`), so the
/// per-route endpoints use one wildcard and split the tail (`{id}/probes`) themselves.
pub fn table() -> Vec<Entry> {
    use Method as M;
    let drill_body = || DefaultBodyLimit::max(drills::MAX_BODY);
    let silence_body = || DefaultBodyLimit::max(silences::MAX_BODY);
    vec![
        Entry::new(M::GET, "/healthz", get(super::healthz), openapi::healthz()),
        Entry::new(M::GET, "/readyz", get(super::readyz), openapi::readyz()),
        Entry::new(
            M::GET,
            "/metrics",
            get(metrics::handler),
            openapi::metrics(),
        ),
        Entry::new(
            M::GET,
            "/api/openapi.json",
            get(openapi::handler),
            openapi::openapi(),
        ),
        // Status, probes, incidents.
        Entry::new(
            M::GET,
            "/api/v1/status",
            get(api::status),
            openapi::status(),
        )
        .public_read(),
        Entry::documented_as(
            M::GET,
            "/api/v1/routes/{*rest}",
            "/api/v1/routes/{id}/probes",
            get(api::route_tail),
            openapi::route_probes(),
        )
        .public_read(),
        Entry::new(
            M::GET,
            "/api/v1/incidents",
            get(api::incidents),
            openapi::incidents(),
        )
        .public_read(),
        Entry::new(
            M::GET,
            "/api/v1/incidents/lead",
            get(api::lead_summary),
            openapi::incidents_lead(),
        )
        .public_read(),
        // The weights feed.
        Entry::new(
            M::GET,
            "/api/v1/weights",
            get(feed::weights),
            openapi::weights(),
        ),
        Entry::new(
            M::GET,
            "/api/v1/weights/stream",
            get(feed::stream),
            openapi::weights_stream(),
        ),
        // Envoy's endpoint discovery: the weights as ClusterLoadAssignments.
        Entry::new(
            M::POST,
            xds::PATH,
            post(xds::endpoints).layer(DefaultBodyLimit::max(xds::MAX_BODY)),
            xds::doc(),
        ),
        // Passive outcomes, drift, switching, metering.
        Entry::new(
            M::POST,
            "/api/v1/ingest",
            post(ingest::handler),
            openapi::ingest(),
        ),
        Entry::new(M::GET, "/api/v1/drift", get(drift::drift), drift::doc()).public_read(),
        Entry::new(
            M::GET,
            "/api/v1/switches",
            get(switches::list),
            switches::doc(),
        )
        .public_read(),
        Entry::new(M::GET, catalog::PATH, get(catalog::list), catalog::doc()).public_read(),
        Entry::new(M::GET, requests::PATH, get(requests::list), requests::doc()),
        Entry::new(M::GET, shadow::PATH, get(shadow::report), shadow::doc()),
        // Drills.
        Entry::new(
            M::GET,
            "/api/v1/drills",
            get(drills::list),
            drills::list_doc(),
        ),
        Entry::new(
            M::GET,
            "/api/v1/drills/{id}",
            get(drills::one),
            drills::one_doc(),
        ),
        Entry::new(
            M::POST,
            "/api/v1/admin/drills",
            post(drills::start).layer(drill_body()),
            drills::start_doc(),
        ),
        Entry::new(
            M::POST,
            "/api/v1/admin/drills/stop",
            post(drills::stop).layer(drill_body()),
            drills::stop_doc(),
        ),
        Entry::new(
            M::DELETE,
            "/api/v1/admin/drills/{id}",
            delete(drills::remove),
            drills::remove_doc(),
        ),
        // The other admin endpoints.
        Entry::new(
            M::GET,
            "/api/v1/admin/silences",
            get(silences::list),
            silences::list_doc(),
        ),
        Entry::new(
            M::POST,
            "/api/v1/admin/silences",
            post(silences::create).layer(silence_body()),
            silences::create_doc(),
        ),
        Entry::new(
            M::DELETE,
            "/api/v1/admin/silences/{id}",
            delete(silences::remove),
            silences::remove_doc(),
        ),
        Entry::new(
            M::GET,
            "/api/v1/admin/subscribers",
            get(subscribe::list),
            subscribe::list_doc(),
        ),
        Entry::new(
            M::DELETE,
            "/api/v1/admin/subscribers",
            delete(subscribe::remove),
            subscribe::remove_doc(),
        ),
        Entry::new(
            M::POST,
            "/subscribe",
            post(subscribe::subscribe).layer(DefaultBodyLimit::max(subscribe::MAX_FORM)),
            subscribe::subscribe_doc(),
        ),
        Entry::new(
            M::GET,
            "/subscribe/confirm",
            get(subscribe::confirm),
            subscribe::confirm_doc(),
        ),
        Entry::new(
            M::GET,
            "/subscribe/unsubscribe",
            get(subscribe::unsubscribe_page),
            subscribe::unsubscribe_page_doc(),
        ),
        Entry::new(
            M::POST,
            "/subscribe/unsubscribe",
            post(subscribe::unsubscribe).layer(DefaultBodyLimit::max(subscribe::MAX_FORM)),
            subscribe::unsubscribe_doc(),
        ),
        Entry::new(
            M::GET,
            "/api/v1/admin/clients",
            get(clients::list),
            clients::doc(),
        ),
        Entry::documented_as(
            M::POST,
            "/api/v1/admin/routes/{*rest}",
            "/api/v1/admin/routes/{id}/embedding-reference",
            post(embeddings::replace),
            embeddings::doc(),
        ),
        Entry::new(
            M::POST,
            "/api/v1/admin/reload",
            post(reload::reload),
            reload::doc(),
        ),
        // The HTML pages (text/html; tagged `pages` in the OpenAPI document).
        Entry::new(
            M::GET,
            "/",
            get(pages::status),
            openapi::html_page("Public status page", "statusPage", false),
        )
        .public_read(),
        Entry::documented_as(
            M::GET,
            "/routes/{*rest}",
            "/routes/{id}",
            get(pages::route),
            openapi::html_page(
                "One route: 24 h latency chart, state timeline, incidents",
                "routePage",
                true,
            ),
        )
        .public_read(),
        Entry::new(
            M::GET,
            "/incidents",
            get(pages::incidents),
            openapi::html_page(
                "Incident history and where this month's error budget went",
                "incidentsPage",
                false,
            ),
        )
        .public_read(),
        Entry::new(M::GET, "/incidents.atom", get(atom::handler), atom::doc()).public_read(),
        // Badges (image/svg+xml, tagged `pages`): a route's (one wildcard, the tail names the
        // badge) and a logical model's.
        Entry::documented_as(
            M::GET,
            "/badges/{*rest}",
            "/badges/{id}/{badge}",
            get(badges::route),
            badges::route_doc(),
        )
        .public_read(),
        Entry::documented_as(
            M::GET,
            "/badges/model/{*rest}",
            "/badges/model/{serves}/state.svg",
            get(badges::model),
            badges::model_doc(),
        )
        .public_read(),
        Entry::new(
            M::GET,
            "/static/style.css",
            get(pages::stylesheet),
            openapi::stylesheet(),
        ),
    ]
}

/// The router of `entries` (and the JSON 404 for every other path). Two entries on one path
/// with different methods share its route.
pub fn router(entries: Vec<Entry>, state: AppState) -> Router {
    let mut by_path: Vec<(&'static str, MethodRouter<AppState>)> = Vec::new();
    let bound = axum::middleware::from_fn_with_state(state.clone(), super::guards::bounded_read);
    for e in entries {
        let e = if e.public_read {
            Entry {
                handler: e.handler.layer(bound.clone()),
                ..e
            }
        } else {
            e
        };
        match by_path.iter_mut().find(|(p, _)| *p == e.endpoint.path) {
            Some((_, handlers)) => *handlers = std::mem::take(handlers).merge(e.handler),
            None => by_path.push((e.endpoint.path, e.handler)),
        }
    }
    by_path
        .into_iter()
        .fold(Router::new(), |r, (path, handler)| r.route(path, handler))
        .fallback(super::not_found)
        .with_state(state)
}
