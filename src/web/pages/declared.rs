//! The provider's own word on the pages: a mark on each route line and a line on the route
//! page where a status page declares trouble, a box on `/` with what the providers declare,
//! and each incident's lead over the provider's declaration.

use super::*;
use crate::declared::judge::RouteDeclared;
use crate::declared::lead::{Lead, Mapping};
use crate::web::AppState;

/// What the status pages say, as the page handlers need it.
pub struct Word {
    pub map: Mapping,
    pub view: Arc<crate::declared::judge::Declared>,
}

impl Word {
    /// `None` without status pages.
    pub fn of(state: &AppState, config: &Config) -> Option<Self> {
        let board = state.metrics.declared()?;
        (!board.pages().is_empty()).then(|| Self {
            map: Mapping::from_config(config),
            view: board.view(),
        })
    }

    pub fn route(&self, route: &RouteId) -> Option<RouteDeclared> {
        crate::declared::judge::route_view(&self.map, &self.view, route)
    }
}

/// A component state in words.
fn state_words(lang: Lang, status: &str) -> String {
    let (en, zh) = match status {
        "operational" => ("operational", "运行正常"),
        "under_maintenance" => ("under maintenance", "维护中"),
        "degraded_performance" => ("degraded performance", "性能下降"),
        "partial_outage" => ("partial outage", "部分中断"),
        "major_outage" => ("major outage", "严重中断"),
        "incident" => ("an open incident", "事件处理中"),
        other => (other, other),
    };
    match lang {
        Lang::En => en.to_owned(),
        Lang::Zh => zh.to_owned(),
    }
}

/// The route's declared trouble in one line, `None` while the provider declares none.
pub fn trouble_line(lang: Lang, d: &RouteDeclared) -> Option<String> {
    if !d.troubled() {
        return None;
    }
    let state = state_words(lang, &d.status);
    let since = d
        .since
        .as_deref()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| when(t.with_timezone(&Utc)))
        .unwrap_or_default();
    Some(match (lang, &d.incident) {
        (Lang::En, Some(i)) => format!(
            "provider's status page: {state} — {} (since {since})",
            scrub(i)
        ),
        (Lang::En, None) => format!("provider's status page: {state} (since {since})"),
        (Lang::Zh, Some(i)) => format!("服务商状态页：{state} —— {}(自 {since})", scrub(i)),
        (Lang::Zh, None) => format!("服务商状态页：{state}(自 {since})"),
    })
}

/// The lead of one of our incidents over the provider's declaration, in words.
pub fn lead_text(lang: Lang, lead: &Lead) -> String {
    match (lang, lead) {
        (Lang::En, Lead::Declared { lead_seconds, .. }) if *lead_seconds >= 0 => format!(
            "detected {} before the provider declared it",
            i18n::duration(lang, *lead_seconds)
        ),
        (Lang::En, Lead::Declared { lead_seconds, .. }) => format!(
            "the provider declared it {} before we detected it",
            i18n::duration(lang, -lead_seconds)
        ),
        (Lang::En, Lead::NotDeclared) => "not declared by the provider yet".to_owned(),
        (Lang::En, Lead::NeverDeclared) => "the provider never declared it".to_owned(),
        (Lang::Zh, Lead::Declared { lead_seconds, .. }) if *lead_seconds >= 0 => format!(
            "比服务商声明早 {} 发现",
            i18n::duration(lang, *lead_seconds)
        ),
        (Lang::Zh, Lead::Declared { lead_seconds, .. }) => format!(
            "服务商比我们早 {} 声明",
            i18n::duration(lang, -lead_seconds)
        ),
        (Lang::Zh, Lead::NotDeclared) => "服务商尚未声明".to_owned(),
        (Lang::Zh, Lead::NeverDeclared) => "服务商始终未声明".to_owned(),
    }
}

/// Each line's lead text, for incidents on routes a status page maps. Reads the declared
/// incidents once, on a blocking thread.
pub async fn fill_leads(
    state: &AppState,
    config: &Config,
    lang: Lang,
    incidents: &[Incident],
    lines: &mut [IncidentLine],
) {
    if state.metrics.declared().is_none() || incidents.is_empty() {
        return;
    }
    let map = Mapping::from_config(config);
    let store = state.store.clone();
    let list = incidents.to_vec();
    let leads =
        tokio::task::spawn_blocking(move || crate::web::api::leads(&store, Some(&map), &list))
            .await;
    let Ok(Ok(leads)) = leads else {
        tracing::warn!(
            "pages: cannot read the providers' declarations; incidents shown without their lead"
        );
        return;
    };
    for (line, lead) in lines.iter_mut().zip(leads) {
        if let Some(lead) = lead {
            line.declared = lead_text(lang, &lead);
        }
    }
}

/// This month's lead summary for the incidents page.
pub async fn month(
    state: &AppState,
    config: &Config,
    lang: Lang,
    now: DateTime<Utc>,
) -> Option<String> {
    state.metrics.declared()?;
    let month = (now.year(), now.month());
    let (start, end) = crate::declared::lead::month_bounds(month)?;
    let map = Mapping::from_config(config);
    let store = state.store.clone();
    let summary = tokio::task::spawn_blocking(move || {
        let list: Vec<Incident> = store
            .reader()?
            .incidents(None, start, crate::declared::MAX_DECLARED)?
            .into_iter()
            .filter(|i| i.opened_at >= start && i.opened_at < end)
            .collect();
        let leads = crate::web::api::leads(&store, Some(&map), &list)?;
        let pairs: Vec<_> = list.iter().zip(leads).collect();
        Ok::<_, crate::web::ApiError>(crate::declared::lead::month_summary(month, &pairs))
    })
    .await
    .ok()?
    .ok()?;
    month_line(lang, &summary)
}

/// The month's lead summary in one line (`None` without an incident on a mapped route).
pub fn month_line(lang: Lang, s: &crate::declared::lead::MonthSummary) -> Option<String> {
    if s.incidents == 0 {
        return None;
    }
    let pct = |x: Option<f64>| format!("{:.0}%", x.unwrap_or(0.0) * 100.0);
    let median = s.median_lead_seconds.map(|m| {
        if m >= 0 {
            i18n::duration(lang, m)
        } else {
            format!("-{}", i18n::duration(lang, -m))
        }
    });
    Some(match lang {
        Lang::En => format!(
            "{}: {} incidents on routes with a provider status page · median lead over the provider's declaration {} · never declared {} · declared first by the provider {}",
            s.month,
            s.incidents,
            median.unwrap_or_else(|| "-".to_owned()),
            pct(s.never_declared_share),
            pct(s.provider_first_share)
        ),
        Lang::Zh => format!(
            "{}：有服务商状态页的线路共 {} 次事故 · 比服务商声明提前(中位数){} · 服务商始终未声明 {} · 服务商先声明 {}",
            s.month,
            s.incidents,
            median.unwrap_or_else(|| "-".to_owned()),
            pct(s.never_declared_share),
            pct(s.provider_first_share)
        ),
    })
}

/// `/`'s box: each open declared incident (and troubled component without one) of a page,
/// with how many of our routes it concerns.
pub fn status_box(lang: Lang, word: &Word, routes: &[Route]) -> Vec<String> {
    let mut out = Vec::new();
    for i in &word.view.open {
        let n = routes
            .iter()
            .filter(|r| word.map.concerns(i, &r.id))
            .count();
        if n == 0 {
            continue;
        }
        let since = when(i.declared_at);
        out.push(match lang {
            Lang::En => format!(
                "{}: {} (declared {since}; {n} of our routes)",
                i.provider,
                scrub(&i.name)
            ),
            Lang::Zh => format!(
                "{}：{}(声明于 {since}；涉及我方 {n} 条线路)",
                i.provider,
                scrub(&i.name)
            ),
        });
    }
    for c in &word.view.components {
        let spoken = word
            .view
            .open
            .iter()
            .any(|i| i.page == c.page && i.components.contains(&c.component));
        let troubled = !matches!(c.status.as_str(), "operational" | "under_maintenance");
        let n = routes
            .iter()
            .filter(|r| word.map.maps(&c.page, Some(&c.component), &r.id))
            .count();
        if troubled && !spoken && n > 0 {
            out.push(format!(
                "{}: {} — {} ({n})",
                c.provider,
                scrub(&c.component),
                state_words(lang, &c.status)
            ));
        }
    }
    out
}
