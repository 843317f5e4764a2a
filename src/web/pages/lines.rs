//! The compact lines of `/`: one line per route (state, the 90-day bar, uptime 24h/30d,
//! latency p50), the routes of a logical model worst first, the models worst first, and the
//! `?q=` filter.
//!
//! **Page weight.** At a thousand routes the page must stay small (about a kilobyte a route),
//! so a route's 90 days are drawn as runs of equal days (`<i class="d-normal s84">`, the span
//! a class of the stylesheet: the CSP allows no inline style) and only the days that are not
//! normal carry a tooltip. The full per-day bars stay on the route page. Past a thousand
//! routes only the worst [`super::MAX_LINES`] get a line (see [`super::status_page`]).

use super::*;
use crate::glob::glob_match;

/// Longest `?q=` accepted (a route id is far shorter).
pub const MAX_QUERY: usize = 200;

/// A run of consecutive days in the same state.
pub struct Run {
    pub class: &'static str,
    /// Days in the run (1..=[`DAYS`]); the stylesheet's `s{span}` class.
    pub span: usize,
    /// The tooltip; empty for normal days (most days, and page weight counts).
    pub title: String,
}

/// One route on `/`.
pub struct RouteLine {
    pub id: String,
    pub href: String,
    pub tier: &'static str,
    pub state_class: &'static str,
    pub state_text: &'static str,
    /// Why the route is not normal, in plain words.
    pub reason: Option<String>,
    pub runs: Vec<Run>,
    pub days_summary: String,
    pub uptime_24h: String,
    pub uptime_30d: String,
    pub p50: String,
    /// One dot per vantage, for routes agents probe too (filled by the page handler).
    pub vantages: Vec<super::VantageDot>,
    /// What the provider's status page declares, while it declares trouble (filled by the
    /// page handler).
    pub declared: Option<String>,
}

/// The runs of equal days of `bars` (oldest first).
pub fn runs(bars: &[Bar]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for b in bars {
        // Normal and no-data days merge into runs; a day that is not normal keeps its own
        // tooltip (date, uptime, state), so it merges only with nothing.
        let plain = b.state.is_empty();
        match out.last_mut() {
            Some(r) if plain && r.class == b.class && r.title.is_empty() => r.span += 1,
            _ => out.push(Run {
                class: b.class,
                span: 1,
                title: if plain {
                    String::new()
                } else {
                    format!("{} {} · {}", b.date, b.up, b.state)
                },
            }),
        }
    }
    out
}

/// Whether the route matches the `?q=` filter: a glob over the route id when it has `*` or
/// `?`, else a case-insensitive substring of the route id (which starts with the provider).
pub fn matches(route: &RouteId, q: &str) -> bool {
    if q.contains(['*', '?']) {
        return glob_match(q, route.as_str());
    }
    route
        .as_str()
        .to_lowercase()
        .contains(q.to_lowercase().as_str())
}

/// A route's compact line.
#[allow(clippy::too_many_arguments)] // the line's sources, each different
pub fn route_line(
    lang: Lang,
    route: &Route,
    status: Option<&RouteStatus>,
    figures: &Figures,
    data: &PageData,
    incidents: &[&Incident],
    dates: &[Arc<str>],
    now: DateTime<Utc>,
) -> RouteLine {
    let t = lang.text();
    let id = &route.id;
    let state = status.map_or(St::Unknown, |s| s.state);
    let latency = figures.latency.get(id);
    let p50 = latency.and_then(|l| l.p50);
    let reason = status
        .filter(|s| s.state != St::Normal)
        .and_then(|s| s.reason.as_ref().map(|r| (s, r)))
        .map(|(s, r)| {
            let baseline = s.baseline.as_ref();
            let f = ReasonFigures {
                p95: latency.and_then(|l| l.p95).map(fmt_ms),
                normal: baseline.map(|b| fmt_spread(b.mean_ms, b.stddev_ms)),
                bucket: baseline.map(|b| b.bucket.clone()),
                success_ratio: s.success_ratio,
                tps: None,
                tps_normal: baseline.and_then(|b| b.tps_mean),
            };
            i18n::reason(lang, &r.code, &f, &scrub(&r.text))
        });
    let (bars, days_summary) = day_bars(lang, now, dates, &data.days_of(id), incidents, route.slo);
    RouteLine {
        id: id.as_str().to_owned(),
        href: route_href(id, lang),
        tier: i18n::tier(lang, route.tier),
        state_class: state_class(state),
        state_text: i18n::state(lang, state),
        reason,
        runs: runs(&bars),
        days_summary,
        uptime_24h: ratio(&figures.uptime_24h, id, t),
        uptime_30d: ratio(&figures.uptime_30d, id, t),
        p50: p50.map_or_else(|| t.no_data.to_owned(), fmt_ms),
        vantages: Vec::new(),
        declared: None,
    }
}

/// A logical model's state: the best among its primary routes (all its routes when it has
/// no primary), judged ones first; UNKNOWN when none is judged.
pub fn model_state(members: impl IntoIterator<Item = (Tier, St)> + Clone) -> St {
    let primaries: Vec<St> = members
        .clone()
        .into_iter()
        .filter(|(t, _)| *t == Tier::Primary)
        .map(|(_, s)| s)
        .collect();
    let pool = if primaries.is_empty() {
        members.into_iter().map(|(_, s)| s).collect()
    } else {
        primaries
    };
    pool.into_iter()
        .filter(|s| *s != St::Unknown)
        .min_by_key(|s| severity(*s))
        .unwrap_or(St::Unknown)
}

/// A route's place in `/`'s order before its line is drawn (lines are drawn only for the
/// routes the page shows).
#[derive(Debug, Clone, Copy)]
pub struct Pick<'a> {
    pub route: &'a Route,
    pub rank: u8,
    pub tier_order: u8,
}

impl<'a> Pick<'a> {
    pub fn new(route: &'a Route, state: St) -> Self {
        Self {
            route,
            rank: severity(state),
            tier_order: tier_order(route.tier),
        }
    }
}

fn tier_order(tier: Tier) -> u8 {
    match tier {
        Tier::Primary => 0,
        Tier::Backup => 1,
        Tier::Fallback => 2,
    }
}

/// A logical model on `/` before its lines are drawn: its state and the routes the filter
/// kept.
#[derive(Debug)]
pub struct Model<'a> {
    pub name: String,
    pub state: St,
    pub picks: Vec<Pick<'a>>,
}

/// Sorts each model's routes worst first (then primaries before backups, then by id) and the
/// models worst first: by the model's own state, then by its worst route, then by name.
pub fn order(groups: &mut [Model<'_>]) {
    for Model { picks, .. } in groups.iter_mut() {
        picks.sort_by(|a, b| {
            b.rank
                .cmp(&a.rank)
                .then_with(|| a.tier_order.cmp(&b.tier_order))
                .then_with(|| a.route.id.as_str().cmp(b.route.id.as_str()))
        });
    }
    groups.sort_by(|a, b| {
        let worst = |picks: &[Pick<'_>]| picks.first().map_or(0, |p| p.rank);
        severity(b.state)
            .cmp(&severity(a.state))
            .then_with(|| worst(&b.picks).cmp(&worst(&a.picks)))
            .then_with(|| a.name.cmp(&b.name))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(class: &'static str, state: &'static str) -> Bar {
        Bar {
            class,
            date: Arc::from("2026-05-19"),
            up: i18n::DayUptime {
                lang: Lang::En,
                ratio: Some(0.75),
            },
            state,
        }
    }

    #[test]
    fn equal_plain_days_merge_and_bad_days_stand_alone() {
        let bars = vec![
            bar("d-none", ""),
            bar("d-none", ""),
            bar("d-normal", ""),
            bar("d-normal", ""),
            bar("d-normal", ""),
            bar("d-critical", "CRITICAL"),
            bar("d-critical", "CRITICAL"),
            bar("d-normal", ""),
        ];
        let r = runs(&bars);
        let spans: Vec<(&str, usize)> = r.iter().map(|r| (r.class, r.span)).collect();
        assert_eq!(
            spans,
            [
                ("d-none", 2),
                ("d-normal", 3),
                ("d-critical", 1),
                ("d-critical", 1),
                ("d-normal", 1)
            ]
        );
        assert_eq!(r[2].title, "2026-05-19 75.00% · CRITICAL");
        assert!(r[1].title.is_empty());
        assert_eq!(r.iter().map(|r| r.span).sum::<usize>(), bars.len());
    }

    #[test]
    fn the_filter_is_a_substring_or_a_glob() {
        let id = RouteId::parse("qwen/cn-beijing/qwen-max").unwrap();
        assert!(matches(&id, "qwen"));
        assert!(matches(&id, "QWEN/CN"));
        assert!(matches(&id, "beijing"));
        assert!(!matches(&id, "openai"));
        assert!(matches(&id, "qwen/*"));
        assert!(!matches(&id, "qwen/*/gpt-*"));
        assert!(!matches(&id, "*/us-*/*"));
    }

    #[test]
    fn a_model_is_as_good_as_its_best_judged_primary() {
        use Tier::*;
        assert_eq!(
            model_state([
                (Primary, St::Critical),
                (Primary, St::Normal),
                (Backup, St::Critical)
            ]),
            St::Normal
        );
        assert_eq!(
            model_state([(Primary, St::Unknown), (Primary, St::Degraded)]),
            St::Degraded
        );
        assert_eq!(model_state([(Backup, St::Warning)]), St::Warning);
        assert_eq!(model_state([(Primary, St::Unknown)]), St::Unknown);
    }
}
