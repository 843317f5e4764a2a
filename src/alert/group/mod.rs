//! From health events to messages: what fired together within `group_wait` goes out together.
//!
//! Pure: [`Grouper::push`] takes events with their arrival time, [`Grouper::flush`] turns what
//! was gathered into [`Draft`]s. The rules, in order:
//!
//! - **Transitions** become route items: to WARNING (`info`, `warning` for a behaviour change),
//!   DEGRADED (`warning`), CRITICAL/SWITCHED (`critical`) fire; back to NORMAL/UNKNOWN with the
//!   incident closed resolves it (peak severity, duration). WARNING → NORMAL says nothing.
//! - **Flapping**: a route with [`FLAP_TRANSITIONS`] or more transitions in [`FLAP_WINDOW`] gets
//!   one summary per window instead of its firing items (resolutions still go through, so what
//!   was announced is closed).
//! - **Egress** inhibits: while an `egress` finding holds, firing items of the routes it names
//!   are dropped — the one egress message explains them.
//! - **Grouping**: a route is one item, at its latest state, however often it changed inside
//!   the window (its path `NORMAL → WARNING → DEGRADED` kept for the text); two or more routes
//!   of one provider (firing, or resolved) make one message listing them; a lone route makes
//!   a route message. Messages count routes, never state changes.
//!
//! Every draft carries the firing-state keys it opens or closes (`incident:<id>`, `egress`):
//! the engine records them in the store and only sends a resolution for what is firing.

use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::{DateTime, Utc};

use super::render::key_digest;
use super::{EvidenceLine, Message, RouteItem, Severity, Status, Subject};
use crate::health::{FailureMode, Finding, FindingKind, HealthEvent, Incident, State, Transition};
use crate::route::{Route, RouteId};

// Alerts with a state of their own about several routes of a provider, gathered.
pub mod batch;
// The drafts of alerts with a firing state of their own (faults, drift, gateways, rate
// limits, the model catalog, vantages).
mod drafts;
use drafts::{
    drift_draft, keyed_warning, model_retiring_draft, model_withdrawn_draft, ratelimit_low_draft,
    route_fault_draft, sync_failed_draft, vantage_stale_draft,
};
pub use drafts::{model_withdrawn_key, ratelimit_low_key, route_fault_key, sync_failed_key};

/// Transitions within [`FLAP_WINDOW`] that make a route "flapping".
pub const FLAP_TRANSITIONS: usize = 6;
/// The flapping window (also: at most one flapping summary per route per window).
pub const FLAP_WINDOW: chrono::Duration = chrono::Duration::minutes(30);

/// A message and the firing state it touches.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub message: Message,
    /// Per item (same order): the state key it fires or resolves (`None`: no state, e.g. a
    /// WARNING without an incident).
    pub item_keys: Vec<Option<String>>,
    /// A message-level state key (egress).
    pub key: Option<String>,
}

impl Draft {
    fn new(message: Message, item_keys: Vec<Option<String>>, key: Option<String>) -> Self {
        Self {
            message,
            item_keys,
            key,
        }
    }
}

/// Gathers events and decides what to say.
#[derive(Debug)]
pub struct Grouper {
    group_wait: chrono::Duration,
    /// `serves (tier)` per route, for "affected logical models".
    serves: HashMap<RouteId, Vec<String>>,
    pending: Vec<HealthEvent>,
    first_at: Option<DateTime<Utc>>,
    egress: Option<Finding>,
    flaps: HashMap<RouteId, VecDeque<DateTime<Utc>>>,
    flap_summarised: HashMap<RouteId, DateTime<Utc>>,
}

impl Grouper {
    pub fn new(group_wait: std::time::Duration, routes: &[Route]) -> Self {
        let mut serves: HashMap<RouteId, Vec<String>> = HashMap::new();
        for r in routes {
            serves.entry(r.id.clone()).or_default().push(format!(
                "{} ({})",
                r.serves,
                r.tier.as_str()
            ));
        }
        Self {
            group_wait: chrono::Duration::from_std(group_wait).unwrap_or(chrono::Duration::MAX),
            serves,
            pending: Vec::new(),
            first_at: None,
            egress: None,
            flaps: HashMap::new(),
            flap_summarised: HashMap::new(),
        }
    }

    /// Adds an event that arrived at `now`.
    pub fn push(&mut self, event: HealthEvent, now: DateTime<Utc>) {
        if let HealthEvent::Transition { transition, .. } = &event {
            let q = self.flaps.entry(transition.route.clone()).or_default();
            q.push_back(transition.at);
            while q.len() > FLAP_TRANSITIONS * 4 {
                q.pop_front();
            }
        }
        self.first_at.get_or_insert(now);
        self.pending.push(event);
    }

    /// When what is gathered should go out (`None` with nothing gathered).
    pub fn deadline(&self) -> Option<DateTime<Utc>> {
        self.first_at.map(|t| t + self.group_wait)
    }

    /// A reloaded `[alerting] group_wait`; what is gathered keeps its first arrival time.
    pub fn set_group_wait(&mut self, group_wait: std::time::Duration) {
        self.group_wait = chrono::Duration::from_std(group_wait).unwrap_or(chrono::Duration::MAX);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn flapping(&self, route: &RouteId, now: DateTime<Utc>) -> usize {
        self.flaps
            .get(route)
            .map_or(0, |q| q.iter().filter(|t| now - **t < FLAP_WINDOW).count())
    }

    /// Turns everything gathered into drafts (possibly none) and starts a new group.
    pub fn flush(&mut self, now: DateTime<Utc>) -> Vec<Draft> {
        let events = std::mem::take(&mut self.pending);
        self.first_at = None;
        let mut drafts = Vec::new();
        let mut firing: Vec<Entry> = Vec::new();
        let mut resolved: Vec<Entry> = Vec::new();
        let mut flap_items: BTreeMap<RouteId, (Severity, RouteItem)> = BTreeMap::new();

        for event in events {
            match event {
                HealthEvent::Transition {
                    transition,
                    incident,
                } => {
                    let t = *transition;
                    let incident = incident.map(|b| *b);
                    match classify(&t, incident.as_ref()) {
                        Kind::Fire(sev) => {
                            let item = self.item(&t, incident.as_ref());
                            let key = t.incident_id.as_ref().map(|id| format!("incident:{id}"));
                            if self.flapping(&t.route, now) >= FLAP_TRANSITIONS {
                                let e = flap_items
                                    .entry(t.route.clone())
                                    .or_insert((sev, item.clone()));
                                e.0 = e.0.max(sev);
                                e.1 = item;
                            } else {
                                firing.push((sev, item, key));
                            }
                        }
                        Kind::Resolve(sev) => {
                            let item = self.item(&t, incident.as_ref());
                            let key = t.incident_id.as_ref().map(|id| format!("incident:{id}"));
                            resolved.push((sev, item, key));
                        }
                        Kind::Nothing => {}
                    }
                }
                HealthEvent::FindingOpened { finding, at } => match finding.kind {
                    FindingKind::Egress => {
                        drafts.push(Draft::new(
                            Message {
                                key: format!("egress@{}", at.timestamp_millis()),
                                severity: Severity::Critical,
                                status: Status::Firing,
                                subject: Subject::Egress {
                                    providers: finding.providers.clone(),
                                },
                                at,
                                items: Vec::new(),
                                related: finding.routes.clone(),
                                note: Some(finding.text.clone()),
                                resolves: None,
                            },
                            Vec::new(),
                            Some("egress".into()),
                        ));
                        self.egress = Some(finding);
                    }
                    FindingKind::RequestSide => {
                        let route = finding.routes.first().map(ToString::to_string);
                        drafts.push(Draft::new(
                            Message {
                                key: format!(
                                    "request_side:{}@{}",
                                    route.unwrap_or_default(),
                                    at.timestamp_millis()
                                ),
                                severity: Severity::Warning,
                                status: Status::Firing,
                                subject: Subject::RequestSide,
                                at,
                                items: Vec::new(),
                                related: finding.routes.clone(),
                                note: Some(finding.text.clone()),
                                resolves: None,
                            },
                            Vec::new(),
                            None,
                        ));
                    }
                    FindingKind::VantageStale => {
                        drafts.push(vantage_stale_draft(&finding, at, true))
                    }
                    // One place's network: shown on the route, never alerted as the provider's.
                    FindingKind::VantageLocal => {}
                },
                HealthEvent::DriftFinding {
                    finding,
                    opened,
                    at,
                } => drafts.push(drift_draft(&finding, opened, at)),
                HealthEvent::Switch { record } => {
                    let severity = match record.severity() {
                        "critical" => Severity::Critical,
                        "warning" => Severity::Warning,
                        _ => Severity::Info,
                    };
                    let mut related = record.from.clone();
                    related.extend(record.to.iter().cloned());
                    drafts.push(Draft::new(
                        Message {
                            key: format!(
                                "switch:{}:{}@{}",
                                record.serves,
                                record.action.as_str(),
                                record.at.timestamp_millis()
                            ),
                            severity,
                            status: Status::Firing,
                            subject: Subject::Switch {
                                serves: record.serves.clone(),
                                action: record.action.as_str().to_owned(),
                            },
                            at: record.at,
                            items: Vec::new(),
                            related,
                            note: Some(record.text.clone()),
                            resolves: None,
                        },
                        Vec::new(),
                        None,
                    ));
                }
                HealthEvent::BudgetCrossed {
                    used,
                    limit,
                    degrade_at,
                    hour_start,
                    at,
                } => {
                    drafts.push(Draft::new(
                        Message {
                            key: format!("budget@{}", hour_start.timestamp()),
                            severity: Severity::Warning,
                            status: Status::Firing,
                            subject: Subject::ExtraCost { used, limit },
                            at,
                            items: Vec::new(),
                            related: Vec::new(),
                            note: Some(format!(
                                "extra cost of non-primary serving {used:.2} ≥ {:.0}% of {limit:.2} per hour: switching stops until the hour turns",
                                degrade_at * 100.0
                            )),
                            resolves: None,
                        },
                        Vec::new(),
                        None,
                    ));
                }
                HealthEvent::RouteFault { route, status, at } => {
                    drafts.push(route_fault_draft(route, status, at));
                }
                HealthEvent::SyncFailed {
                    kind,
                    gateway,
                    error,
                    at,
                } => drafts.push(sync_failed_draft(kind, gateway, error, at)),
                HealthEvent::ProviderDeclared {
                    key,
                    provider,
                    what,
                    url,
                    routes,
                    firing,
                    at,
                } => {
                    let subject = Subject::ProviderDeclared { provider, what };
                    drafts.push(keyed_warning(key, firing, subject, routes, url, at));
                }
                HealthEvent::RateLimitLow {
                    route,
                    limit,
                    quota,
                    firing,
                    at,
                } => drafts.push(ratelimit_low_draft(route, limit, quota, firing, at)),
                HealthEvent::ModelWithdrawn {
                    region,
                    model,
                    routes,
                    withdrawn,
                    at,
                } => drafts.push(model_withdrawn_draft(region, model, routes, withdrawn, at)),
                HealthEvent::ModelRetiring {
                    route,
                    retires,
                    days_left,
                    days,
                    at,
                } => drafts.push(model_retiring_draft(route, retires, days_left, days, at)),
                HealthEvent::FindingClosed { finding, at } => {
                    if finding.kind == FindingKind::VantageStale {
                        drafts.push(vantage_stale_draft(&finding, at, false));
                    }
                    if finding.kind == FindingKind::Egress {
                        self.egress = None;
                        drafts.push(Draft::new(
                            Message {
                                key: format!("egress:resolved@{}", at.timestamp_millis()),
                                severity: Severity::Critical,
                                status: Status::Resolved,
                                subject: Subject::Egress {
                                    providers: finding.providers.clone(),
                                },
                                at,
                                items: Vec::new(),
                                related: finding.routes.clone(),
                                note: Some(finding.text.clone()),
                                resolves: None,
                            },
                            Vec::new(),
                            Some("egress".into()),
                        ));
                    }
                }
            }
        }

        // Egress inhibits the per-route messages it explains.
        if let Some(e) = &self.egress {
            firing.retain(|(_, item, _)| !e.routes.contains(&item.route));
            flap_items.retain(|route, _| !e.routes.contains(route));
        }

        // Flapping routes of one provider are one summary per flush.
        let mut flaps: BTreeMap<String, Vec<(usize, Severity, RouteItem)>> = BTreeMap::new();
        for (route, (sev, item)) in flap_items {
            let recent = self
                .flap_summarised
                .get(&route)
                .is_some_and(|t| now - *t < FLAP_WINDOW);
            if recent {
                continue;
            }
            self.flap_summarised.insert(route.clone(), now);
            let n = self.flapping(&route, now);
            let provider = route.split().0.to_owned();
            flaps.entry(provider).or_default().push((n, sev, item));
        }
        let window = (now.timestamp() / FLAP_WINDOW.num_seconds()).max(0);
        for (provider, mut routes) in flaps {
            routes.sort_by(|a, b| a.2.route.cmp(&b.2.route));
            let key = match routes.as_slice() {
                [(_, _, item)] => format!("flapping:{}@{window}", item.route),
                _ => {
                    let names: Vec<&str> = routes.iter().map(|r| r.2.route.as_str()).collect();
                    format!(
                        "flapping:{provider}:{}@{window}",
                        key_digest(&names.join("\n"))
                    )
                }
            };
            let n = routes.iter().map(|r| r.0).max().unwrap_or(0);
            let sev = routes
                .iter()
                .map(|r| r.1)
                .max()
                .unwrap_or(Severity::Warning);
            let at = routes.iter().map(|r| r.2.at).max().unwrap_or(now);
            let items: Vec<RouteItem> = routes.into_iter().map(|r| r.2).collect();
            let item_keys = vec![None; items.len()];
            drafts.push(Draft::new(
                Message {
                    key,
                    severity: sev.max(Severity::Warning),
                    status: Status::Firing,
                    subject: Subject::Flapping {
                        transitions: u32::try_from(n).unwrap_or(u32::MAX),
                        window_s: u64::try_from(FLAP_WINDOW.num_seconds()).unwrap_or(0),
                    },
                    at,
                    items,
                    related: Vec::new(),
                    note: None,
                    resolves: None,
                },
                item_keys,
                None,
            ));
        }
        drafts.extend(group(firing, Status::Firing));
        drafts.extend(group(resolved, Status::Resolved));
        drafts
    }

    fn item(&self, t: &Transition, incident: Option<&Incident>) -> RouteItem {
        let e = &t.evidence;
        let (observed_ms, error, http_status) = match &e.observed {
            Some(o) => (
                o.success.then_some(o.total_ms),
                o.error.clone(),
                o.http_status,
            ),
            None => (None, None, None),
        };
        let evidence = EvidenceLine {
            bucket: e.baseline.as_ref().map(|b| b.bucket.clone()),
            baseline_mean_ms: e.baseline.as_ref().map(|b| b.mean_ms),
            baseline_stddev_ms: e.baseline.as_ref().map(|b| b.stddev_ms),
            baseline_samples: e.baseline.as_ref().map(|b| b.samples),
            threshold_ms: e.baseline.as_ref().map(|b| b.threshold_ms),
            observed_ms,
            error,
            http_status,
            error_total: e.error_rate.total,
            error_failures: e.error_rate.failures,
            error_window_s: e.error_rate.window_s,
        };
        RouteItem {
            route: t.route.clone(),
            serves: self.serves.get(&t.route).cloned().unwrap_or_default(),
            from: t.from,
            to: t.to,
            at: t.at,
            reason_code: t.reason.code.clone(),
            reason_text: t.reason.text.clone(),
            failure_mode: t.failure_mode.or(incident.and_then(|i| i.failure_mode)),
            evidence: Some(evidence),
            incident_id: t.incident_id.clone(),
            opened_at: incident.map(|i| i.opened_at),
            closed_at: incident.and_then(|i| i.closed_at),
            peak: incident.map(|i| i.peak),
            shifted: None,
            path: Vec::new(),
            cause: incident.and_then(|i| i.cause.clone()),
        }
    }
}

enum Kind {
    Fire(Severity),
    Resolve(Severity),
    Nothing,
}

fn classify(t: &Transition, incident: Option<&Incident>) -> Kind {
    match t.to {
        State::Normal | State::Unknown => match incident {
            Some(i) if i.closed_at.is_some() => {
                Kind::Resolve(Severity::of_state(i.peak).unwrap_or(Severity::Warning))
            }
            _ => Kind::Nothing,
        },
        to => {
            let Some(mut sev) = Severity::of_state(to) else {
                return Kind::Nothing;
            };
            // A behaviour change is a drift signal: `warning` by the severity rules, though it stays WARNING.
            if t.failure_mode == Some(FailureMode::BehaviorChanged) {
                sev = sev.max(Severity::Warning);
            }
            // Stepping down inside an incident (e.g. CRITICAL → DEGRADED) is not news.
            let from = Severity::of_state(t.from);
            if t.from.is_incident() && from.is_some_and(|f| f > sev) {
                return Kind::Nothing;
            }
            Kind::Fire(sev)
        }
    }
}

fn item_key(status: Status, item: &RouteItem) -> String {
    match (&item.incident_id, status) {
        (Some(id), Status::Resolved) => format!("{id}:resolved"),
        (Some(id), _) => format!("{id}:{}", item.to),
        (None, _) => format!("{}@{}:{}", item.route, item.at.timestamp_millis(), item.to),
    }
}

/// One route item with its severity and the firing-state key it opens or closes.
type Entry = (Severity, RouteItem, Option<String>);

/// One entry per route, in route order: the route's latest item (its severity, and its key or
/// the latest earlier one), with the states it went through when it changed more than once.
/// `entries` are in arrival order.
fn latest_per_route(mut entries: Vec<Entry>) -> Vec<Entry> {
    // Stable: a route's entries stay in arrival order.
    entries.sort_by(|a, b| a.1.route.cmp(&b.1.route));
    let mut out: Vec<Entry> = Vec::new();
    for (sev, item, key) in entries {
        match out.last_mut() {
            Some(last) if last.1.route == item.route => {
                let key = key.or(last.2.take());
                // The same change reported twice is one change.
                if (last.1.from, last.1.to) == (item.from, item.to) {
                    last.2 = key;
                    continue;
                }
                let mut path = last.1.states();
                if path.last() != Some(&item.from) {
                    path.push(item.from);
                }
                path.push(item.to);
                *last = (sev, RouteItem { path, ..item }, key);
            }
            _ => out.push((sev, item, key)),
        }
    }
    out
}

/// Two or more routes of one provider → one message; else one message per route.
/// Resolutions for incidents whose own resolution was lost (`item`s as they fired, each with
/// its closed incident): grouped per provider as a live resolution is, each closing the
/// incident's firing state.
pub fn lost_resolutions(closed: Vec<(RouteItem, Incident)>) -> Vec<Draft> {
    let entries = closed
        .into_iter()
        .filter_map(|(mut item, incident)| {
            let closed_at = incident.closed_at?;
            item.from = item.to;
            item.to = State::Normal;
            item.at = closed_at;
            item.opened_at = Some(incident.opened_at);
            item.closed_at = Some(closed_at);
            item.peak = Some(incident.peak);
            let sev = Severity::of_state(incident.peak).unwrap_or(Severity::Warning);
            Some((sev, item, Some(format!("incident:{}", incident.id))))
        })
        .collect();
    group(entries, Status::Resolved)
}

fn group(items: Vec<Entry>, status: Status) -> Vec<Draft> {
    let mut by_provider: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
    for x in items {
        by_provider
            .entry(x.1.route.split().0.to_owned())
            .or_default()
            .push(x);
    }
    by_provider
        .into_iter()
        .filter_map(|(provider, items)| provider_draft(provider, latest_per_route(items), status))
        .collect()
}

/// The message for `items` (one per route, in route order) of one provider.
fn provider_draft(provider: String, mut items: Vec<Entry>, status: Status) -> Option<Draft> {
    if items.len() <= 1 {
        let (sev, item, key) = items.pop()?;
        return Some(Draft::new(
            Message {
                key: item_key(status, &item),
                severity: sev,
                status,
                subject: Subject::Route,
                at: item.at,
                items: vec![item],
                related: Vec::new(),
                note: None,
                resolves: None,
            },
            vec![key],
            None,
        ));
    }
    let severity = items.iter().map(|x| x.0).max().unwrap_or(Severity::Warning);
    let at = items.iter().map(|x| x.1.at).max().unwrap_or_default();
    let keys: Vec<String> = items.iter().map(|x| item_key(status, &x.1)).collect();
    let tag = if status == Status::Resolved {
        "resolved"
    } else {
        "firing"
    };
    let (item_keys, route_items): (Vec<_>, Vec<_>) = items.into_iter().map(|x| (x.2, x.1)).unzip();
    Some(Draft::new(
        Message {
            key: format!("provider:{provider}:{tag}:{}", key_digest(&keys.join("\n"))),
            severity,
            status,
            subject: Subject::Provider { provider },
            at,
            items: route_items,
            related: Vec::new(),
            note: None,
            resolves: None,
        },
        item_keys,
        None,
    ))
}

/// The severity one route item carries in a message of `status` (as [`classify`] gave it).
fn item_severity(status: Status, item: &RouteItem) -> Option<Severity> {
    if status == Status::Resolved {
        return item.peak.and_then(Severity::of_state);
    }
    let sev = Severity::of_state(item.to)?;
    Some(if item.failure_mode == Some(FailureMode::BehaviorChanged) {
        sev.max(Severity::Warning)
    } else {
        sev
    })
}

/// `m` restricted to the routes `keep` accepts, grouped as if only they had been gathered: a
/// provider message over the routes kept (its own key), a route message for a lone one, `None`
/// when nothing is kept. Messages without route items are returned whole or not at all.
pub fn restrict(m: &Message, keep: impl Fn(&RouteId) -> bool) -> Option<Message> {
    if m.items.is_empty() {
        return m.routes().into_iter().any(&keep).then(|| m.clone());
    }
    let kept: Vec<Entry> = m
        .items
        .iter()
        .filter(|i| keep(&i.route))
        .map(|i| {
            let sev = item_severity(m.status, i).unwrap_or(m.severity);
            (sev, i.clone(), None)
        })
        .collect();
    if kept.len() == m.items.len() {
        return Some(m.clone());
    }
    if !matches!(m.subject, Subject::Provider { .. }) {
        // A route or flapping message is about one route: kept whole or dropped.
        return (!kept.is_empty()).then(|| m.clone());
    }
    let provider = m.items[0].route.split().0.to_owned();
    let draft = provider_draft(provider, kept, m.status)?;
    Some(Message {
        note: m.note.clone(),
        ..draft.message
    })
}
