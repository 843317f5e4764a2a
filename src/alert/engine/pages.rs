//! The enqueue side of gathered alerts ([`batch`]): burn rates, route faults and drift
//! findings of one provider written as one message per kind, each route keeping its own
//! firing state; and burn-rate pages for routes whose state alert already pages, folded into
//! that alert instead of paging again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::super::announced::Announced;
use super::super::burn::BurnAlert;
use super::super::group::{batch, Draft};
use super::super::{AlertError, Message, Severity, Status, Subject};
use super::{to_json, AlertService};
use crate::config::Config;
use crate::route::RouteId;
use crate::store::alerts::{FiringRow, NewEntry};

/// The firing text of a burn rate folded into its route's state alert: not a message, so it
/// is never reminded, never holds an incident tool's trigger open, and resolves silently.
pub(super) const FOLDED: &str = "folded into the route's state alert";

/// Gathered alerts of one enqueue, written after every draft was seen.
pub(super) struct Pages {
    firing: Vec<(Message, String, ())>,
    resolved: Vec<(Message, String, Arc<str>)>,
    folded: Vec<String>,
    /// Routes whose state alert fires, at its severity and since when (read once, when a
    /// burn rate fires).
    states: Option<HashMap<RouteId, (Severity, DateTime<Utc>)>>,
    /// How long a route's state alert may take to reach CRITICAL on its own once DEGRADED:
    /// the state machine's escalation, the grouping wait and one evaluation.
    escalates_within: chrono::Duration,
}

impl Pages {
    pub(super) fn new(config: &Config) -> Self {
        let d = &config.detection;
        let escalation = d.critical_after.max(d.critical_degraded_for)
            + config.alerting.group_wait
            + super::EVALUATE_EVERY;
        Self {
            firing: Vec::new(),
            resolved: Vec::new(),
            folded: Vec::new(),
            states: None,
            escalates_within: chrono::Duration::from_std(escalation)
                .unwrap_or(chrono::Duration::MAX),
        }
    }

    /// Whether `m` (a [`batch::batchable`] draft under `key`) is one of these.
    pub(super) fn wants(m: &Message, key: Option<&String>) -> bool {
        key.is_some() && batch::batchable(m).is_some()
    }

    /// A resolution: only what fires resolves; a folded burn rate resolves without a word.
    pub(super) fn resolved(
        &mut self,
        m: Message,
        key: String,
        firing: &mut Announced,
        resolve: &mut Vec<String>,
    ) {
        let Some(text) = firing.resolve(&key) else {
            return;
        };
        resolve.push(key.clone());
        if &*text != FOLDED {
            self.resolved.push((m, key, text));
        }
    }

    /// Whether a firing `m` is said already: a route fault announced once until the route
    /// answers normally, a burn rate whose route's state alert already pages at its severity
    /// (then folded into it). A burn-rate page for a route whose state alert went out as
    /// DEGRADED waits while the state machine may still make it CRITICAL: the same failures
    /// then page once, as the state alert's worsening.
    pub(super) fn said(&mut self, m: &Message, key: &str, firing: &mut Announced) -> bool {
        match &m.subject {
            Subject::RouteFault { .. } => firing.is_firing(key),
            Subject::BurnRate(b) => {
                let states = self.states.get_or_insert_with(|| firing.states_firing());
                match states.get(&b.route) {
                    Some((s, _)) if *s >= m.severity => {
                        self.folded.push(key.to_owned());
                        true
                    }
                    Some((s, since)) => {
                        *s >= Severity::Warning && m.at - *since < self.escalates_within
                    }
                    None => false,
                }
            }
            _ => false,
        }
    }

    pub(super) fn fire(&mut self, m: Message, key: String) {
        self.firing.push((m, key, ()));
    }

    /// Gathers what was taken into messages, records their firing state and writes their rows.
    pub(super) fn finish(
        self,
        service: &AlertService,
        firing: &mut Announced,
        fire: &mut Vec<FiringRow>,
        entries: &mut Vec<NewEntry>,
        now: DateTime<Utc>,
    ) -> Result<(), AlertError> {
        let folded: Arc<str> = Arc::from(FOLDED);
        for key in self.folded {
            tracing::debug!(%key, "burn rate folded into its route's state alert");
            firing.fire(&key, &folded);
            fire.push(FiringRow {
                key,
                message: folded.clone(),
                opened_at: now,
            });
        }
        for (m, keys) in batch::batch(self.firing) {
            // One text for the whole message, however many routes it names.
            let json: Arc<str> = Arc::from(to_json(&m)?);
            for (key, ()) in keys {
                firing.fire(&key, &json);
                fire.push(FiringRow {
                    key,
                    message: json.clone(),
                    opened_at: m.at,
                });
            }
            entries.extend(service.entries(&m, &[], firing, now)?);
        }
        for (m, keys) in batch::batch(self.resolved) {
            let announced_by: Vec<Arc<str>> = keys.into_iter().map(|(_, t)| t).collect();
            entries.extend(service.entries(&m, &announced_by, firing, now)?);
        }
        Ok(())
    }
}

/// Whether a resolution of `m` is sent to incident tools only for the triggers it closes.
pub(super) fn closes_by_announced(m: &Message, announced_by: &[Arc<str>]) -> bool {
    m.status == Status::Resolved && (!m.items.is_empty() || !announced_by.is_empty())
}

impl AlertService {
    /// Burn-rate pages for routes not paging yet — except a route the state machine put in an
    /// incident whose state alert is still being gathered (`group_wait`): its page is looked at
    /// again at the next evaluation, when the state alert is out and the page folds into it or
    /// waits for its escalation. A fast burn is measured over minutes, so it can be over its
    /// threshold before the state alert about the same failures has left.
    pub(super) async fn new_burn_pages(
        &self,
        fresh: Vec<(BurnAlert, String)>,
        firing: &HashMap<&str, &FiringRow>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Draft>, AlertError> {
        if fresh.is_empty() {
            return Ok(Vec::new());
        }
        let open = self.blocking(|r| r.open_incidents()).await?;
        let gathering = self.config().alerting.group_wait + 2 * super::EVALUATE_EVERY;
        let gathering = chrono::Duration::from_std(gathering).unwrap_or(chrono::Duration::MAX);
        let on_its_way: HashSet<&RouteId> = (open.iter())
            .filter(|(_, id, opened)| {
                now - *opened < gathering && !firing.contains_key(format!("incident:{id}").as_str())
            })
            .map(|(route, ..)| route)
            .collect();
        Ok(fresh
            .into_iter()
            .filter(|(b, _)| !on_its_way.contains(&b.route))
            .map(|(b, key)| super::burn_draft(b, key, now, Status::Firing))
            .collect())
    }
}
