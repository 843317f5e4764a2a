//! The drafts of alerts that carry a firing state of their own, one builder each: route
//! faults, drift findings, refused gateway writes, low rate limits, withdrawn and retiring
//! models, silent vantages — most of them [`keyed_warning`]s.

use chrono::{DateTime, Utc};

use super::Draft;
use crate::alert::{Message, Severity, Status, Subject};
use crate::route::RouteId;

/// A drift finding opened (firing) or closed (resolved): `warning`, `info` for
/// `model_changed`, `critical` for `embedding_changed`; firing key `drift:<finding id>`, so a closing finding resolves only what
/// was announced.
pub(super) fn drift_draft(
    f: &crate::drift::DriftFinding,
    opened: bool,
    at: DateTime<Utc>,
) -> Draft {
    let severity = match f.severity {
        crate::drift::Severity::Info => Severity::Info,
        crate::drift::Severity::Warning => Severity::Warning,
        crate::drift::Severity::Critical => Severity::Critical,
    };
    let (status, tag) = if opened {
        (Status::Firing, "open")
    } else {
        (Status::Resolved, "resolved")
    };
    Draft::new(
        Message {
            // Opened: the detection time, stable if the same finding is announced twice.
            key: format!(
                "drift:{}:{tag}@{}",
                f.id,
                if opened { f.detected_at } else { at }.timestamp_millis()
            ),
            severity,
            status,
            subject: Subject::Drift(crate::alert::DriftAlert::from_finding(f)),
            at,
            items: Vec::new(),
            related: vec![f.route.clone()],
            note: Some(f.summary.clone()),
            resolves: None,
        },
        Vec::new(),
        Some(format!("drift:{}", f.id)),
    )
}

/// The alert for a route fault: keyed per route, so it fires once until the route answers
/// normally (the engine drops a second firing while the first is open) and then resolves.
pub(super) fn route_fault_draft(route: RouteId, status: Option<u16>, at: DateTime<Utc>) -> Draft {
    let tag = status.map_or_else(|| "resolved".to_owned(), |s| s.to_string());
    Draft::new(
        Message {
            key: format!("route_fault:{route}:{tag}@{}", at.timestamp_millis()),
            severity: Severity::Critical,
            status: if status.is_some() {
                Status::Firing
            } else {
                Status::Resolved
            },
            subject: Subject::RouteFault {
                route: route.clone(),
                status,
            },
            at,
            items: Vec::new(),
            related: vec![route.clone()],
            note: None,
            resolves: None,
        },
        Vec::new(),
        Some(route_fault_key(&route)),
    )
}

/// The firing-state key of a route's fault.
pub fn route_fault_key(route: &RouteId) -> String {
    format!("route_fault:{route}")
}

/// A `sync_failed` warning (with the gateway's answer) or its resolution (`error` none): keyed
/// per gateway, so one refusing gateway is one alert however many writes it refuses.
pub(super) fn sync_failed_draft(
    kind: String,
    gateway: String,
    error: Option<String>,
    at: DateTime<Utc>,
) -> Draft {
    let key = sync_failed_key(&gateway);
    let firing = error.is_some();
    let subject = Subject::SyncFailed { kind, gateway };
    keyed_warning(key, firing, subject, Vec::new(), error, at)
}

/// The firing-state key of a gateway's refused writes.
pub fn sync_failed_key(gateway: &str) -> String {
    format!("sync_failed:{gateway}")
}

/// A `ratelimit_low` warning or its resolution: keyed per route and limit, so a limit that
/// stays low is one alert.
pub(super) fn ratelimit_low_draft(
    route: RouteId,
    limit: String,
    quota: crate::ratelimit::Quota,
    firing: bool,
    at: DateTime<Utc>,
) -> Draft {
    let key = ratelimit_low_key(&route, &limit);
    let note = Some(format!(
        "{limit}: {} of {} left ({:.1}%)",
        quota.remaining,
        quota.limit,
        quota.ratio() * 100.0
    ));
    let related = vec![route.clone()];
    let subject = Subject::RateLimitLow { route, limit };
    keyed_warning(key, firing, subject, related, note, at)
}

/// The firing-state key of a route's low rate limit.
pub fn ratelimit_low_key(route: &RouteId, limit: &str) -> String {
    format!("ratelimit_low:{route}:{limit}")
}

/// A `model_withdrawn` alert (critical: the routes will answer 404 once the provider's
/// endpoint follows its list) or its resolution: keyed per provider region and model, so one
/// withdrawn model is one alert however many routes use it and however many answers lack it.
pub(super) fn model_withdrawn_draft(
    region: String,
    model: String,
    routes: Vec<RouteId>,
    withdrawn: bool,
    at: DateTime<Utc>,
) -> Draft {
    let key = model_withdrawn_key(&region, &model);
    let note = Some(format!(
        "routes: {}",
        routes
            .iter()
            .map(RouteId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let subject = Subject::ModelWithdrawn { region, model };
    let mut d = keyed_warning(key, withdrawn, subject, routes, note, at);
    d.message.severity = Severity::Critical;
    d
}

/// The firing-state key of a withdrawn model.
pub fn model_withdrawn_key(region: &str, model: &str) -> String {
    format!("model_withdrawn:{region}:{model}")
}

/// A `model_retiring` warning: one message, no firing state (nothing resolves it); its key
/// names the route, the date and the milestone, so the outbox takes it once.
pub(super) fn model_retiring_draft(
    route: RouteId,
    retires: chrono::NaiveDate,
    days_left: i64,
    days: u32,
    at: DateTime<Utc>,
) -> Draft {
    Draft::new(
        Message {
            key: format!("model_retiring:{route}:{retires}:{days}d"),
            severity: Severity::Warning,
            status: Status::Firing,
            subject: Subject::ModelRetiring {
                route: route.clone(),
                retires,
                days_left,
            },
            at,
            items: Vec::new(),
            related: vec![route],
            note: None,
            resolves: None,
        },
        Vec::new(),
        None,
    )
}

/// A `vantage_stale` warning (`firing`) or its resolution: once per silence of the vantage.
pub(super) fn vantage_stale_draft(
    finding: &crate::health::Finding,
    at: DateTime<Utc>,
    firing: bool,
) -> Draft {
    let vantage = finding.providers.first().cloned().unwrap_or_default();
    let key = format!("vantage_stale:{vantage}");
    let subject = Subject::VantageStale { vantage };
    let note = Some(finding.text.clone());
    keyed_warning(key, firing, subject, finding.routes.clone(), note, at)
}

/// A warning with a firing state of its own under `key` (firing, or its resolution).
pub(super) fn keyed_warning(
    key: String,
    firing: bool,
    subject: Subject,
    related: Vec<RouteId>,
    note: Option<String>,
    at: DateTime<Utc>,
) -> Draft {
    let (tag, status) = if firing {
        ("", Status::Firing)
    } else {
        (":resolved", Status::Resolved)
    };
    Draft::new(
        Message {
            key: format!("{key}{tag}@{}", at.timestamp_millis()),
            severity: Severity::Warning,
            status,
            subject,
            at,
            items: Vec::new(),
            related,
            note,
            resolves: None,
        },
        Vec::new(),
        Some(key),
    )
}
