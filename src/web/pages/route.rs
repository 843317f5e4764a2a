//! `GET /routes/{id}`: one route — its card, the 24 h latency chart, the state timeline with
//! each transition's evidence, its incidents and recent synthetic probe errors.

use super::*;
use crate::probe::outcome::{OutcomeKind, ProbeOutcome};

pub struct TimelineRow {
    pub at: String,
    pub from: &'static str,
    pub from_class: &'static str,
    pub to: &'static str,
    pub to_class: &'static str,
    pub reason: String,
    pub evidence: Vec<String>,
}

pub struct ErrorRow {
    pub at: String,
    pub text: String,
}

#[derive(Template)]
#[template(path = "route.html")]
pub struct RoutePage {
    pub c: Chrome,
    /// The subscribe form (HTML), empty when subscriptions are off.
    pub subscribe_form: String,
    pub r: RouteCard,
    pub provider: String,
    pub region: String,
    pub model: String,
    pub serves: String,
    pub model_reported: String,
    pub chart: Chart,
    pub timeline: Vec<TimelineRow>,
    pub incidents: Vec<IncidentLine>,
    pub errors: Vec<ErrorRow>,
    /// Active drills on this route.
    pub drills: Vec<String>,
    /// While in trouble: the first token and tokens/s against their normals.
    pub signals: Option<String>,
    /// The latest probe's first token and first answer token ("1.2 s / 4.8 s").
    pub first_answer: String,
    /// The long prompt's latest first token beside its baseline (`[capability] long_prompt`);
    /// `None` when off or on an embeddings route.
    pub long_prompt: Option<(String, String)>,
    /// What probing the route costs per month, as `/api/v1/status` gives it (`probe_cost`).
    pub probe_cost: String,
    /// An embeddings route's `kind` line; `None` for a chat route.
    pub embedding: Option<String>,
    /// Each vantage's view, when agents probe the route too.
    pub vantages: Vec<VantageRow>,
    pub vantage_local: Option<String>,
    pub vw: VantageWords,
    /// On a shadow route: its comparison with the pool's answers.
    pub shadow: Option<super::shadow::ShadowBox>,
    /// Real traffic's observables (1 h / 24 h).
    pub observed: super::observed::ObservedTable,
    /// The declared capabilities' probes.
    pub capabilities: super::capabilities::CapabilityTable,
    /// What the provider's status page declares of the route, while it declares trouble.
    pub declared: Option<String>,
    /// The declared incident's link (http(s) only).
    pub declared_url: Option<String>,
}

/// The long prompt's line: its label and "first token 3.1 s (baseline 1.2 s)", with why the
/// latest result was not good.
fn long_prompt_text(
    lang: Lang,
    tokens: u32,
    v: &crate::web::api::capabilities::LongPromptView,
) -> Option<(String, String)> {
    let zh = lang == Lang::Zh;
    let label = if zh {
        format!("长提示词首 token（{tokens} tokens）")
    } else {
        format!("Long prompt first token ({tokens} tokens)")
    };
    let ms = |m: Option<u64>| m.map_or_else(|| "-".to_owned(), |m| fmt_ms(m as f64));
    let mut text = if zh {
        format!("{}（基线 {}）", ms(v.ttft_ms), ms(v.baseline_ms))
    } else {
        format!("{} (baseline {})", ms(v.ttft_ms), ms(v.baseline_ms))
    };
    if let Some(note) = &v.note {
        text.push_str(" — ");
        text.push_str(&scrub(note));
    }
    Some((label, text))
}

/// "0.4 s / 3.9 s": a reasoning model answers well after its first (reasoning) token; a
/// probe whose `max_tokens` ran out says so instead of an answer time.
fn first_answer_text(lang: Lang, o: &ProbeOutcome) -> String {
    let first = o.ttft_ms.map_or_else(|| "-".to_owned(), fmt_ms);
    let answer = match (o.first_answer_ms, o.max_tokens_exhausted) {
        (_, true) => i18n::reason(lang, "max_tokens_exhausted", &ReasonFigures::default(), ""),
        (Some(ms), false) => fmt_ms(ms),
        (None, false) => "-".to_owned(),
    };
    format!("{first} / {answer}")
}

/// `GET /routes/{id}` (the id's slashes raw or percent-encoded).
pub async fn route(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let req = PageRequest::new(&state, &q, &headers);
    let (lang, now, config) = (req.lang, req.now, req.config.clone());
    let fail = |error: PageError| req.fail(error);
    let Some(route) = RouteId::parse(&raw)
        .and_then(|id| state.routes.iter().find(|r| r.id == id))
        .cloned()
    else {
        return Err(fail(PageError::NotFound));
    };
    let health = state.health.borrow().clone();
    let (figures, data) = state
        .figures
        .figures_and_pages(
            &state.store,
            &state.clock,
            ErrorBudgetSource::from_config(&config),
        )
        .await
        .map_err(fail)?;
    let store = state.store.clone();
    let id = route.id.clone();
    let read = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let reader = store.reader()?;
        let since = now - TimeDelta::hours(24);
        let until = now + TimeDelta::milliseconds(1);
        let buckets = reader.rollups(
            &id,
            Granularity::FiveMinutes,
            since,
            until,
            api::LATENCY_KINDS,
        )?;
        let transitions = reader.transitions(&id, now - TimeDelta::days(30), 100)?;
        let incidents = reader.incidents(Some(&id), now - TimeDelta::days(DAYS), 100)?;
        let recent = reader.recent_outcomes_of(&id, PROBE_KINDS, 50)?;
        Ok((buckets, transitions, incidents, recent))
    })
    .await
    .map_err(|e| fail(PageError::Internal(format!("blocking task: {e}"))))?
    .map_err(|e| fail(e.into()))?;
    let (buckets, transitions, incidents, recent) = read;
    let status = health.route(&route.id);
    let view = state
        .vantages
        .as_ref()
        .map(|v| v.view.borrow().clone())
        .unwrap_or_default();
    let shadow_report = (state.metrics.proxy())
        .map(|p| p.shadow_report())
        .unwrap_or_default();
    let word = super::declared::Word::of(&state, &config).and_then(|w| w.route(&route.id));
    let mut incident_lines: Vec<IncidentLine> = incidents
        .iter()
        .map(|i| incident_line(lang, i, now))
        .collect();
    super::declared::fill_leads(&state, &config, lang, &incidents, &mut incident_lines).await;
    let body = RoutePage {
        declared: word
            .as_ref()
            .and_then(|d| super::declared::trouble_line(lang, d)),
        declared_url: word
            .filter(|d| d.troubled())
            .and_then(|d| d.url)
            .filter(|u| u.starts_with("https://") || u.starts_with("http://")),
        subscribe_form: crate::web::subscribe::form(
            &state.config.current().subscriptions,
            lang == Lang::Zh,
            &state.routes,
            Some(&route),
        ),
        shadow: super::shadow::shadow_box(lang, &shadow_report, &route.id),
        vantages: rows(&view, &route.id, lang, &when),
        vantage_local: local(&health, &route.id),
        vw: words(lang),
        observed: super::observed::table(lang, &route, &figures),
        capabilities: super::capabilities::table(
            lang,
            &route,
            &figures,
            state.drift.as_ref().map(|d| d.borrow().clone()).as_deref(),
        ),
        c: Chrome::new(
            lang,
            route.id.as_str(),
            &config.server.title,
            &format!(
                "/routes/{}",
                utf8_percent_encode(route.id.as_str(), SEGMENT)
            ),
            now,
        )
        .with_history(lang, &data, Some(&figures)),
        r: route_card(
            lang,
            &route,
            status,
            &figures,
            &data,
            &data
                .incidents
                .iter()
                .filter(|i| i.route == route.id)
                .collect::<Vec<_>>(),
            &day_dates(now),
            now,
        ),
        provider: route.provider.clone(),
        region: route.region.clone(),
        model: route.model.clone(),
        serves: route.serves.clone(),
        model_reported: recent
            .iter()
            .find_map(|o| o.model_reported.as_deref())
            .map_or_else(|| lang.text().no_data.to_owned(), scrub),
        chart: chart(
            lang,
            &buckets
                .iter()
                .map(|b| (b.bucket_start, b.p50(), b.p95()))
                .collect::<Vec<_>>(),
            status.and_then(|s| s.baseline.as_ref()).map(|b| {
                (
                    b.mean_ms,
                    b.stddev_ms,
                    b.p95_ms.max(b.mean_ms + b.stddev_ms),
                )
            }),
            now,
        ),
        timeline: transitions
            .iter()
            .map(|tr| TimelineRow {
                at: when(tr.at),
                from: i18n::state(lang, tr.from),
                from_class: state_class(tr.from),
                to: i18n::state(lang, tr.to),
                to_class: state_class(tr.to),
                reason: i18n::reason(
                    lang,
                    &tr.reason.code,
                    &ReasonFigures::default(),
                    &scrub(&tr.reason.text),
                ),
                evidence: i18n::evidence(lang, &tr.evidence),
            })
            .collect(),
        incidents: incident_lines,
        errors: recent
            .iter()
            .filter(|o| !o.success)
            .take(10)
            .map(|o| ErrorRow {
                at: o.started_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                text: format!(
                    "{} · {}",
                    o.kind.as_str(),
                    o.error
                        .as_ref()
                        .map_or_else(String::new, |e| scrub(&e.to_string()))
                ),
            })
            .collect(),
        drills: drill_lines(&state, lang, now, Some(&route.id)),
        signals: status
            .and_then(|s| s.open_split())
            .and_then(|s| i18n::split(lang, s)),
        first_answer: recent
            .iter()
            .find(|o| o.kind == OutcomeKind::Probe && o.success)
            .map_or_else(
                || lang.text().no_data.to_owned(),
                |o| first_answer_text(lang, o),
            ),
        long_prompt: config.capability.long_prompt.and_then(|lp| {
            long_prompt_text(lang, lp.tokens, &figures.capabilities.long_prompt(&route)?)
        }),
        probe_cost: i18n::probe_cost(
            lang,
            &crate::probe::cost::ProbeCostView::of_route(&route, &config.capability),
        ),
        embedding: route.embedding.map(|d| i18n::embedding_kind(lang, d)),
    }
    .render()
    .map_err(|e| fail(PageError::Internal(format!("rendering a route page: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}
