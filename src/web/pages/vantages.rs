//! Vantages on the pages, for routes agents probe too: one dot per vantage on `/`'s route
//! line (its state in the dot's colour and title), and on the route page each vantage's
//! state, median latency and last report, with the `vantage_local` finding when one place
//! fails alone. Routes judged by this monitor alone show none of it.

use super::*;
use crate::health::{FindingKind, VantageView};

/// One dot on a route line.
pub struct VantageDot {
    pub class: &'static str,
    pub title: String,
}

/// One vantage on the route page.
pub struct VantageRow {
    pub id: String,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub p50: String,
    pub last_seen: String,
    pub stale: bool,
}

fn stale_word(lang: Lang) -> &'static str {
    match lang {
        Lang::En => "stale",
        Lang::Zh => "已失联",
    }
}

/// The dots of `id`'s vantages (none when the monitor judges it alone).
pub fn dots(view: &VantageView, id: &RouteId, lang: Lang) -> Vec<VantageDot> {
    let Some(vs) = view.route(id) else {
        return Vec::new();
    };
    vs.iter()
        .map(|(v, s)| VantageDot {
            class: if s.stale {
                "stale"
            } else {
                state_class(s.state)
            },
            title: if s.stale {
                format!("{v}: {}", stale_word(lang))
            } else {
                format!("{v}: {}", i18n::state(lang, s.state))
            },
        })
        .collect()
}

/// The rows of `id`'s vantages for its page.
pub fn rows(
    view: &VantageView,
    id: &RouteId,
    lang: Lang,
    when: &dyn Fn(DateTime<Utc>) -> String,
) -> Vec<VantageRow> {
    let Some(vs) = view.route(id) else {
        return Vec::new();
    };
    let no_data = lang.text().no_data;
    vs.iter()
        .map(|(v, s)| VantageRow {
            id: v.clone(),
            state_class: state_class(s.state),
            state_text: i18n::state(lang, s.state),
            p50: s.p50_ms.map_or_else(|| no_data.to_owned(), fmt_ms),
            last_seen: s.last_seen.map_or_else(|| no_data.to_owned(), when),
            stale: s.stale,
        })
        .collect()
}

/// The `vantage_local` sentence for `id`, while one holds.
pub fn local(health: &HealthSnapshot, id: &RouteId) -> Option<String> {
    health
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::VantageLocal && f.routes.contains(id))
        .map(|f| scrub(&f.text))
}

/// The words of the route page's vantage table.
pub struct VantageWords {
    pub heading: &'static str,
    pub vantage: &'static str,
    pub state: &'static str,
    pub latency: &'static str,
    pub last_seen: &'static str,
    pub stale: &'static str,
}

pub fn words(lang: Lang) -> VantageWords {
    match lang {
        Lang::En => VantageWords {
            heading: "Vantages",
            vantage: "Vantage",
            state: "State",
            latency: "Latency p50",
            last_seen: "Last report",
            stale: "stale",
        },
        Lang::Zh => VantageWords {
            heading: "探测点",
            vantage: "探测点",
            state: "状态",
            latency: "延迟 p50",
            last_seen: "最近上报",
            stale: "已失联",
        },
    }
}
