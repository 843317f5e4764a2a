//! Our incidents beside the provider's, pure: which of the provider's declared incidents
//! match one of ours (a status page maps the route, the incident names one of the route's
//! components or none at all, and the two overlap in time), the lead time between our
//! detection and their declaration, and the month's summary of it.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde::Serialize;

use crate::config::Config;
use crate::glob::glob_match;
use crate::route::RouteId;
use crate::state::Incident;
use crate::store::declared::DeclaredIncident;

/// Which status page components cover which routes, from `[[provider.status_page]]`.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    pages: Vec<PageMap>,
}

#[derive(Debug, Clone)]
struct PageMap {
    provider: String,
    page: String,
    components: BTreeMap<String, Vec<String>>,
}

impl Mapping {
    pub fn from_config(config: &Config) -> Self {
        Self {
            pages: config
                .providers
                .iter()
                .flat_map(|p| p.status_pages.iter())
                .map(|s| PageMap {
                    provider: s.provider.clone(),
                    page: s.url.clone(),
                    components: s.components.clone(),
                })
                .collect(),
        }
    }

    /// A status page maps this route.
    pub fn covers(&self, route: &RouteId) -> bool {
        self.pages.iter().any(|p| p.maps(route, None))
    }

    /// The page's component `component` (or, with `None`, any of the page's components) maps
    /// `route`.
    pub fn maps(&self, page: &str, component: Option<&str>, route: &RouteId) -> bool {
        self.pages
            .iter()
            .any(|p| p.page == page && p.maps(route, component))
    }

    /// The declared incident concerns `route`: its page maps the route through a component
    /// the incident names, or through any component when it names none (feeds often don't).
    pub fn concerns(&self, d: &DeclaredIncident, route: &RouteId) -> bool {
        if d.components.is_empty() {
            return self.maps(&d.page, None, route);
        }
        d.components
            .iter()
            .any(|c| self.maps(&d.page, Some(c), route))
    }

    /// The mapped component names of a page.
    pub fn component_names(&self, page: &str) -> Vec<&str> {
        self.pages
            .iter()
            .filter(|p| p.page == page)
            .flat_map(|p| p.components.keys().map(String::as_str))
            .collect()
    }

    /// `(provider, page)` of every mapped page.
    pub fn pages(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pages
            .iter()
            .map(|p| (p.provider.as_str(), p.page.as_str()))
    }
}

impl PageMap {
    fn maps(&self, route: &RouteId, component: Option<&str>) -> bool {
        if route.split().0 != self.provider {
            return false;
        }
        self.components
            .iter()
            .filter(|(name, _)| component.is_none_or(|c| c == name.as_str()))
            .any(|(_, globs)| globs.iter().any(|g| glob_match(g, route.as_str())))
    }
}

/// How one of our incidents stands against the provider's word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Lead {
    /// The provider declared a matching incident. `lead_seconds` > 0: we detected it that
    /// long before they declared it; < 0: they declared first.
    Declared {
        lead_seconds: i64,
        declared_at: String,
        incident: String,
        name: String,
        url: Option<String>,
    },
    /// Ours is open and the provider has declared nothing matching yet.
    NotDeclared,
    /// Ours closed and the provider never declared a matching incident.
    NeverDeclared,
}

/// `ours` against the declared incidents; `None` when no status page maps its route.
pub fn lead(map: &Mapping, ours: &Incident, declared: &[DeclaredIncident]) -> Option<Lead> {
    if !map.covers(&ours.route) {
        return None;
    }
    let overlaps = |d: &DeclaredIncident| {
        let ours_end = ours.closed_at.unwrap_or(DateTime::<Utc>::MAX_UTC);
        let theirs_end = d.resolved_at.unwrap_or(DateTime::<Utc>::MAX_UTC);
        d.started_at.min(d.declared_at) <= ours_end && ours.opened_at <= theirs_end
    };
    let first = declared
        .iter()
        .filter(|d| map.concerns(d, &ours.route) && overlaps(d))
        .min_by_key(|d| (d.declared_at, d.id.clone()));
    Some(match first {
        Some(d) => Lead::Declared {
            lead_seconds: (d.declared_at - ours.opened_at).num_seconds(),
            declared_at: crate::clock::rfc3339(d.declared_at),
            incident: d.id.clone(),
            name: d.name.clone(),
            url: d.url.clone(),
        },
        None if ours.closed_at.is_none() => Lead::NotDeclared,
        None => Lead::NeverDeclared,
    })
}

/// One calendar month (UTC) of our incidents on routes a status page maps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonthSummary {
    /// `YYYY-MM`.
    pub month: String,
    pub incidents: u64,
    pub declared: u64,
    pub never_declared: u64,
    /// Still open and not declared yet.
    pub not_declared_yet: u64,
    /// Declared incidents the provider declared before we detected ours.
    pub provider_first: u64,
    /// Median lead of the declared ones, seconds (positive: we were first).
    pub median_lead_seconds: Option<i64>,
    /// `never_declared / incidents`, 0..=1; `None` with no incident.
    pub never_declared_share: Option<f64>,
    /// `provider_first / incidents`.
    pub provider_first_share: Option<f64>,
}

/// The month's summary over `(incident, lead)` pairs (those without a lead are skipped).
pub fn month_summary(month: (i32, u32), leads: &[(&Incident, Option<Lead>)]) -> MonthSummary {
    let in_month = |t: DateTime<Utc>| t.year() == month.0 && t.month() == month.1;
    let mut s = MonthSummary {
        month: format!("{:04}-{:02}", month.0, month.1),
        incidents: 0,
        declared: 0,
        never_declared: 0,
        not_declared_yet: 0,
        provider_first: 0,
        median_lead_seconds: None,
        never_declared_share: None,
        provider_first_share: None,
    };
    let mut leads_s = Vec::new();
    for (i, l) in leads {
        let Some(l) = l else { continue };
        if !in_month(i.opened_at) {
            continue;
        }
        s.incidents += 1;
        match l {
            Lead::Declared { lead_seconds, .. } => {
                s.declared += 1;
                s.provider_first += u64::from(*lead_seconds < 0);
                leads_s.push(*lead_seconds);
            }
            Lead::NotDeclared => s.not_declared_yet += 1,
            Lead::NeverDeclared => s.never_declared += 1,
        }
    }
    leads_s.sort_unstable();
    s.median_lead_seconds = match leads_s.len() {
        0 => None,
        n if n % 2 == 1 => Some(leads_s[n / 2]),
        n => Some((leads_s[n / 2 - 1] + leads_s[n / 2]) / 2),
    };
    if s.incidents > 0 {
        let n = s.incidents as f64;
        s.never_declared_share = Some(s.never_declared as f64 / n);
        s.provider_first_share = Some(s.provider_first as f64 / n);
    }
    s
}

/// The first instant of the month and of the next one.
pub fn month_bounds(month: (i32, u32)) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let start = Utc
        .with_ymd_and_hms(month.0, month.1, 1, 0, 0, 0)
        .single()?;
    let (y, m) = if month.1 == 12 {
        (month.0 + 1, 1)
    } else {
        (month.0, month.1 + 1)
    };
    let end = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
    Some((start, end))
}

/// `YYYY-MM`.
pub fn parse_month(s: &str) -> Option<(i32, u32)> {
    let (y, m) = s.trim().split_once('-')?;
    let (y, m) = (y.parse().ok()?, m.parse().ok()?);
    ((1970..=9999).contains(&y) && (1..=12).contains(&m)).then_some((y, m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{StatusPageConfig, StatusPageKind};
    use crate::state::State;

    fn t(min: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap() + chrono::TimeDelta::minutes(min)
    }

    fn map() -> Mapping {
        let mut c = Config::default();
        c.providers.push(crate::config::ProviderConfig {
            id: "anthropic".into(),
            status_pages: vec![StatusPageConfig {
                provider: "anthropic".into(),
                kind: StatusPageKind::Statuspage,
                url: "https://status.example.com".into(),
                components: BTreeMap::from([
                    ("API".into(), vec!["anthropic/*/claude-*".into()]),
                    ("Console".into(), vec!["anthropic/eu/console".into()]),
                ]),
                every: std::time::Duration::from_secs(60),
                alert: true,
            }],
            ..Default::default()
        });
        Mapping::from_config(&c)
    }

    fn ours(route: &str, opened: i64, closed: Option<i64>) -> Incident {
        Incident {
            id: format!("{route}@{opened}"),
            route: RouteId::parse(route).unwrap(),
            opened_at: t(opened),
            closed_at: closed.map(t),
            peak: State::Degraded,
            failure_mode: None,
            transitions: Vec::new(),
            cause: None,
        }
    }

    fn theirs(
        id: &str,
        components: &[&str],
        declared: i64,
        resolved: Option<i64>,
    ) -> DeclaredIncident {
        DeclaredIncident {
            provider: "anthropic".into(),
            page: "https://status.example.com".into(),
            id: id.into(),
            name: format!("incident {id}"),
            status: if resolved.is_some() {
                "resolved"
            } else {
                "investigating"
            }
            .into(),
            impact: None,
            declared_at: t(declared),
            started_at: t(declared),
            resolved_at: resolved.map(t),
            url: None,
            components: components.iter().map(|c| (*c).to_owned()).collect(),
            seen_at: t(declared),
        }
    }

    #[test]
    fn a_declaration_twelve_minutes_after_our_detection_is_a_twelve_minute_lead() {
        let m = map();
        let i = ours("anthropic/us/claude-x", 0, Some(40));
        let d = [theirs("a", &["API"], 12, Some(45))];
        match lead(&m, &i, &d) {
            Some(Lead::Declared {
                lead_seconds,
                incident,
                ..
            }) => {
                assert_eq!(lead_seconds, 720);
                assert_eq!(incident, "a");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_overlapping_incidents_on_the_routes_components_match() {
        let m = map();
        let i = ours("anthropic/us/claude-x", 0, Some(40));
        let d = [
            theirs("other-component", &["Console"], 5, None),
            theirs("before", &["API"], -120, Some(-60)),
            theirs("after", &["API"], 50, None),
        ];
        assert_eq!(lead(&m, &i, &d), Some(Lead::NeverDeclared));
        let open = ours("anthropic/us/claude-x", 0, None);
        assert_eq!(lead(&m, &open, &d[..2]), Some(Lead::NotDeclared));
        // A page-wide incident (no component named) concerns every mapped route.
        let wide = [theirs("wide", &[], -3, None)];
        assert!(matches!(
            lead(&m, &i, &wide),
            Some(Lead::Declared {
                lead_seconds: -180,
                ..
            })
        ));
        // A route no page maps has no lead at all.
        let unmapped = ours("openai/us/gpt", 0, None);
        assert_eq!(lead(&m, &unmapped, &wide), None);
    }

    #[test]
    fn the_month_summary_counts_medians_and_shares() {
        let m = map();
        let a = ours("anthropic/us/claude-x", 0, Some(40));
        let b = ours("anthropic/us/claude-y", 100, Some(140));
        let c = ours("anthropic/us/claude-z", 200, Some(240));
        let d = ours("anthropic/us/claude-w", 300, Some(340));
        let declared = [
            theirs("1", &["API"], 12, Some(41)),
            theirs("2", &["API"], 98, Some(141)),
            theirs("3", &["API"], 230, Some(241)),
        ];
        let pairs: Vec<_> = [&a, &b, &c, &d]
            .into_iter()
            .map(|i| (i, lead(&m, i, &declared)))
            .collect();
        let s = month_summary((2026, 12), &pairs);
        assert_eq!((s.incidents, s.declared, s.never_declared), (4, 3, 1));
        assert_eq!(s.provider_first, 1);
        // Leads: 720, -120, 1800 → median 720.
        assert_eq!(s.median_lead_seconds, Some(720));
        assert_eq!(s.never_declared_share, Some(0.25));
        assert_eq!(month_summary((2026, 11), &pairs).incidents, 0);
        assert_eq!(parse_month("2026-12"), Some((2026, 12)));
        assert_eq!(parse_month("2026-13"), None);
    }
}
