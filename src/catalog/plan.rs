//! The catalog's decisions, pure: which provider regions the routes use, what one successful
//! model list does to the remembered models (first/last seen, answers in a row without it,
//! withdrawn, back), and which `retires` warnings are due on a day.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};

use crate::route::{ProviderKind, Route, RouteId};
use crate::store::catalog::ModelRow;

/// A routed model missing from this many successful answers in a row is withdrawn: one answer
/// may come from a replica that lags, two an `every` apart are the provider's list.
pub const WITHDRAWN_AFTER: u32 = 2;

/// A model no route uses and no answer has listed for this long is forgotten (the table
/// stays the size of what providers list, not of everything they ever listed).
pub const FORGET_AFTER: TimeDelta = TimeDelta::days(90);

/// A model first seen this recently is marked new on `GET /api/v1/catalog`.
pub const NEW_FOR: TimeDelta = TimeDelta::days(7);

/// Days before `retires` a `model_retiring` warning goes out, most urgent last.
pub const RETIRE_MILESTONES: [u32; 3] = [30, 7, 1];

/// The distinct base URL and key a set of routes uses: one model list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// The store's key: the wire, the base URL and the key variable's name (never its value).
    pub key: String,
    /// `provider/region` of its first route, for people.
    pub name: String,
    pub kind: ProviderKind,
    pub base_url: String,
    pub api_key_env: Option<String>,
    /// Routed model → the routes that use it here.
    pub routed: BTreeMap<String, Vec<RouteId>>,
}

/// The provider regions of `routes`, in the order of their first route.
pub fn regions(routes: &[Route]) -> Vec<Region> {
    let mut out: Vec<Region> = Vec::new();
    for r in routes {
        let kind = match r.kind {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        };
        let base = r.base_url.trim_end_matches('/');
        let key = format!("{kind} {base} {}", r.api_key_env.as_deref().unwrap_or("-"));
        let i = match out.iter().position(|g| g.key == key) {
            Some(i) => i,
            None => {
                out.push(Region {
                    key,
                    name: format!("{}/{}", r.provider, r.region),
                    kind: r.kind,
                    base_url: base.to_owned(),
                    api_key_env: r.api_key_env.clone(),
                    routed: BTreeMap::new(),
                });
                out.len() - 1
            }
        };
        out[i]
            .routed
            .entry(r.model.clone())
            .or_default()
            .push(r.id.clone());
    }
    out
}

/// What one successful answer changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Every remembered model of the region after the answer (to be written).
    pub rows: Vec<ModelRow>,
    /// Models to forget (unrouted, unlisted for [`FORGET_AFTER`]).
    pub forget: Vec<String>,
    /// Routed models still withdrawn after this answer ([`WITHDRAWN_AFTER`] or more answers
    /// without them).
    pub withdrawn: Vec<String>,
    /// Routed models that were withdrawn and are listed again.
    pub returned: Vec<String>,
}

/// One successful answer listing `listed`, against the region's remembered `known` rows.
///
/// Only a model once listed can be withdrawn: a routed model the list never named (an alias,
/// a list that leaves some models out) is shown as never listed, not alerted — a catalog that
/// alerted on day one for models that work would be switched off.
pub fn observe(
    known: &[ModelRow],
    listed: &BTreeSet<String>,
    routed: &BTreeMap<String, Vec<RouteId>>,
    now: DateTime<Utc>,
) -> Observed {
    let mut out = Observed::default();
    let mut seen = BTreeSet::new();
    for k in known {
        seen.insert(k.model.as_str());
        let is_routed = routed.contains_key(&k.model);
        if listed.contains(&k.model) {
            if is_routed && k.missing >= WITHDRAWN_AFTER {
                out.returned.push(k.model.clone());
            }
            out.rows.push(ModelRow {
                last_seen: now,
                missing: 0,
                ..k.clone()
            });
            continue;
        }
        if !is_routed && now - k.last_seen >= FORGET_AFTER {
            out.forget.push(k.model.clone());
            continue;
        }
        let missing = k.missing.saturating_add(1);
        if is_routed && missing >= WITHDRAWN_AFTER {
            out.withdrawn.push(k.model.clone());
        }
        out.rows.push(ModelRow {
            missing,
            ..k.clone()
        });
    }
    for m in listed {
        if !seen.contains(m.as_str()) {
            out.rows.push(ModelRow {
                model: m.clone(),
                first_seen: now,
                last_seen: now,
                missing: 0,
            });
        }
    }
    out
}

/// A `model_retiring` warning due: `route` retires on `retires`, `days_left` whole days after
/// today, past the `days` milestone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retiring {
    pub route: RouteId,
    pub retires: NaiveDate,
    pub days_left: i64,
    pub days: u32,
}

/// The `retires` warnings due `today` (UTC) that `sent` does not hold yet.
///
/// A route is due the most urgent milestone it has reached (30, 7 or 1 day(s) before, up to
/// the day itself); milestones it passed unnoticed (configured late, the leader away) are not
/// sent after a later one, so a route never gets three warnings at once. Pure of the clock:
/// run it as often as you like, `sent` makes each milestone one warning.
pub fn retirements(
    retires: &BTreeMap<RouteId, NaiveDate>,
    today: NaiveDate,
    sent: &BTreeSet<(String, NaiveDate, u32)>,
) -> Vec<Retiring> {
    let mut out = Vec::new();
    for (route, &date) in retires {
        let days_left = (date - today).num_days();
        if days_left < 0 {
            continue;
        }
        let Some(days) = RETIRE_MILESTONES
            .iter()
            .rev()
            .copied()
            .find(|&m| days_left <= i64::from(m))
        else {
            continue;
        };
        if sent.contains(&(route.to_string(), date, days)) {
            continue;
        }
        out.push(Retiring {
            route: route.clone(),
            retires: date,
            days_left,
            days,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn row(model: &str, seen: &str, missing: u32) -> ModelRow {
        ModelRow {
            model: model.into(),
            first_seen: t(seen),
            last_seen: t(seen),
            missing,
        }
    }

    fn set(models: &[&str]) -> BTreeSet<String> {
        models.iter().map(|m| (*m).to_owned()).collect()
    }

    fn routed(models: &[&str]) -> BTreeMap<String, Vec<RouteId>> {
        models
            .iter()
            .map(|m| ((*m).to_owned(), vec![RouteId::new("p", "r", m)]))
            .collect()
    }

    #[test]
    fn a_routed_model_is_withdrawn_after_two_answers_without_it() {
        let now = t("2026-12-06T10:00:00Z");
        let known = vec![
            row("a", "2026-12-06T08:00:00Z", 0),
            row("b", "2026-12-06T08:00:00Z", 0),
        ];
        let one = observe(&known, &set(&["b"]), &routed(&["a"]), now);
        assert!(one.withdrawn.is_empty(), "{one:?}");
        assert_eq!(one.rows[0].missing, 1);
        assert_eq!(one.rows[0].last_seen, t("2026-12-06T08:00:00Z"));
        assert_eq!(one.rows[1].last_seen, now);
        let two = observe(&one.rows, &set(&["b"]), &routed(&["a"]), now);
        assert_eq!(two.withdrawn, vec!["a".to_owned()]);
        // Still withdrawn on the next answer (the engine keeps one alert).
        let three = observe(&two.rows, &set(&["b"]), &routed(&["a"]), now);
        assert_eq!(three.withdrawn, vec!["a".to_owned()]);
        let back = observe(&three.rows, &set(&["a", "b"]), &routed(&["a"]), now);
        assert!(back.withdrawn.is_empty());
        assert_eq!(back.returned, vec!["a".to_owned()]);
        assert_eq!(back.rows[0].missing, 0);
        assert_eq!(back.rows[0].first_seen, t("2026-12-06T08:00:00Z"));
    }

    #[test]
    fn an_unrouted_or_never_listed_model_is_never_withdrawn() {
        let now = t("2026-12-06T10:00:00Z");
        let known = vec![row("old", "2026-12-06T08:00:00Z", 5)];
        let o = observe(&known, &set(&["new"]), &routed(&["alias"]), now);
        assert!(o.withdrawn.is_empty() && o.returned.is_empty(), "{o:?}");
        assert_eq!(o.rows.len(), 2);
        assert_eq!(o.rows[1].first_seen, now);
    }

    #[test]
    fn an_unrouted_model_long_unlisted_is_forgotten() {
        let now = t("2026-12-06T10:00:00Z");
        let known = vec![
            row("gone", "2026-09-01T00:00:00Z", 400),
            row("kept", "2026-09-01T00:00:00Z", 400),
        ];
        let o = observe(&known, &set(&["x"]), &routed(&["kept"]), now);
        assert_eq!(o.forget, vec!["gone".to_owned()]);
        assert_eq!(o.withdrawn, vec!["kept".to_owned()]);
    }

    #[test]
    fn regions_are_the_distinct_base_url_and_key() {
        let src = r#"
[[provider]]
id = "a"
api_key_env = "K"
  [[provider.region]]
  id = "us"
  base_url = "http://x/v1"
[[provider]]
id = "b"
api_key_env = "K2"
  [[provider.region]]
  id = "us"
  base_url = "http://x/v1/"
[[route]]
provider = "a"
region = "us"
model = "m1"
serves = "m1"
[[route]]
provider = "a"
region = "us"
model = "m2"
serves = "m2"
[[route]]
provider = "b"
region = "us"
model = "m1"
serves = "m1"
"#;
        let config = crate::config::Config::parse(src, "t.toml").unwrap().config;
        let rs = regions(&config.routes());
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].name, "a/us");
        assert_eq!(rs[0].routed.len(), 2);
        assert_eq!(rs[1].routed["m1"], vec![RouteId::new("b", "us", "m1")]);
    }

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn retire_warnings_are_due_at_30_7_and_1_days_once_each() {
        let route = RouteId::new("p", "r", "m");
        let retires = BTreeMap::from([(route.clone(), day("2026-06-30"))]);
        let mut sent = BTreeSet::new();
        let mut got = Vec::new();
        let mut today = day("2026-05-20");
        while today <= day("2026-07-02") {
            // Many looks a day: each milestone still comes once.
            for _ in 0..3 {
                for r in retirements(&retires, today, &sent) {
                    sent.insert((r.route.to_string(), r.retires, r.days));
                    got.push((today, r.days, r.days_left));
                }
            }
            today = today.succ_opt().unwrap();
        }
        assert_eq!(
            got,
            vec![
                (day("2026-05-31"), 30, 30),
                (day("2026-06-23"), 7, 7),
                (day("2026-06-29"), 1, 1),
            ]
        );
    }

    #[test]
    fn a_late_configured_date_gets_only_the_most_urgent_milestone() {
        let route = RouteId::new("p", "r", "m");
        let retires = BTreeMap::from([(route, day("2026-06-30"))]);
        let due = retirements(&retires, day("2026-06-27"), &BTreeSet::new());
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].days, due[0].days_left), (7, 3));
        assert!(retirements(&retires, day("2026-07-01"), &BTreeSet::new()).is_empty());
    }
}
