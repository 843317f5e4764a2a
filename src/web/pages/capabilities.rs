//! The route page's "capabilities" table: each declared `tools` / `json_schema` capability's
//! latest probe and 7-day success, as `capabilities` of `/api/v1/status` gives them, with the
//! open `capability_lost` finding in words.

use crate::drift::{DriftKind, DriftSnapshot};
use crate::probe::outcome::scrub;
use crate::route::Route;
use crate::web::api::Figures;
use crate::web::i18n::{self, Lang, ReasonFigures};

/// One capability's line.
pub struct CapabilityLine {
    pub name: &'static str,
    /// `ok`, `failed` or `never probed`, in the page's language.
    pub last: String,
    /// The badge's class (the states' colours).
    pub class: &'static str,
    pub checked_at: String,
    pub success_7d: String,
    /// The latest failure's reason, or the open finding in words.
    pub note: String,
}

/// The table; no lines when the route declares no probed capability.
pub struct CapabilityTable {
    pub heading: &'static str,
    pub capability: &'static str,
    pub last: &'static str,
    pub checked_at: &'static str,
    pub success_7d: &'static str,
    pub lines: Vec<CapabilityLine>,
}

pub fn table(
    lang: Lang,
    route: &Route,
    figures: &Figures,
    drift: Option<&DriftSnapshot>,
) -> CapabilityTable {
    let zh = lang == Lang::Zh;
    let lines = figures
        .capabilities
        .route(route)
        .into_iter()
        .map(|(name, v)| {
            let lost = drift.is_some_and(|d| {
                d.route_findings(&route.id)
                    .any(|f| f.kind == DriftKind::CapabilityLost && f.set == name)
            });
            let (last, class) = match (v.ok, zh) {
                (Some(true), false) => ("ok", "st-normal"),
                (Some(true), true) => ("正常", "st-normal"),
                (Some(false), false) => ("failed", "st-critical"),
                (Some(false), true) => ("失败", "st-critical"),
                (None, false) => ("not probed yet", "st-unknown"),
                (None, true) => ("尚未探测", "st-unknown"),
            };
            let mut note = v.error.as_deref().map(scrub).unwrap_or_default();
            if lost {
                let words = i18n::reason(lang, "capability_lost", &ReasonFigures::default(), name);
                note = if note.is_empty() {
                    format!("capability_lost: {words}")
                } else {
                    format!("capability_lost: {words} — {note}")
                };
            }
            CapabilityLine {
                name,
                last: last.to_owned(),
                class,
                checked_at: v
                    .checked_at
                    .as_deref()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map_or_else(|| "-".to_owned(), |t| super::when(t.to_utc())),
                success_7d: v
                    .success_7d
                    .map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0)),
                note,
            }
        })
        .collect();
    if zh {
        CapabilityTable {
            heading: "能力探测",
            capability: "能力",
            last: "最近结果",
            checked_at: "探测时间",
            success_7d: "7 天成功率",
            lines,
        }
    } else {
        CapabilityTable {
            heading: "Capabilities",
            capability: "Capability",
            last: "Latest",
            checked_at: "Checked",
            success_7d: "7-day success",
            lines,
        }
    }
}
