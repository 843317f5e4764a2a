//! `GET /`: the status page — banner, incidents, maintenance and findings on top, routes
//! grouped by logical model with their day bars and figures.

use super::*;

/// One day bar; its tooltip is `{date} {up} · {state}`.
pub struct Bar {
    pub class: &'static str,
    pub date: Arc<str>,
    pub up: i18n::DayUptime,
    pub state: &'static str,
}

/// The [`DAYS`] UTC dates ending today, oldest first, formatted once per page.
pub fn day_dates(now: DateTime<Utc>) -> Vec<Arc<str>> {
    let first = Granularity::Day.bucket_start(now) - TimeDelta::days(DAYS - 1);
    (0..DAYS)
        .map(|i| Arc::from((first + TimeDelta::days(i)).format("%Y-%m-%d").to_string()))
        .collect()
}

/// One route as the pages show it (`/` cards and the head of `/routes/{id}`).
pub struct RouteCard {
    pub id: String,
    pub anchor: String,
    pub href: String,
    pub tier: &'static str,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub since: String,
    pub reason: Option<String>,
    pub mode: Option<&'static str>,
    pub days: Vec<Bar>,
    pub days_summary: String,
    pub uptime_24h: String,
    pub uptime_7d: String,
    pub uptime_30d: String,
    pub p50: String,
    pub p95: String,
    pub baseline: String,
    pub ttft: String,
    pub tps: String,
    pub slo: String,
    pub budget: String,
}

/// A logical model on `/`: its state and the lines of its routes (those the filter kept,
/// within the page's [`MAX_LINES`]).
pub struct Group {
    pub name: String,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub routes: Vec<RouteLine>,
    /// The model's routes the filter kept that have no line here (past [`MAX_LINES`]), and
    /// the page that lists them.
    pub more: usize,
    pub more_href: String,
    /// What the link says (empty when `more` is 0).
    pub more_text: String,
}

/// Route lines on `/` at most, the worst first: at ten thousand routes a line for each is
/// megabytes that nobody reads at 4 a.m.; the page shows the worst thousand and a link to
/// each model's own list for the rest.
pub const MAX_LINES: usize = 1000;
/// Active incidents listed on top of `/` at most, the oldest first (a provider-wide outage
/// opens one per route; the incidents page has them all).
pub const MAX_INCIDENT_LINES: usize = 50;
/// Models with no line shown (all past [`MAX_LINES`]) listed on `/` at most, as one line each;
/// beyond them the page gives their count.
pub const MAX_FOLDED_MODELS: usize = 200;

/// How many routes are in one state (the summary line on top).
pub struct StateCount {
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub count: usize,
}

pub struct IncidentLine {
    pub route: String,
    pub href: String,
    pub state_class: &'static str,
    pub state_text: &'static str,
    pub mode: &'static str,
    pub opened: String,
    pub running: String,
    /// The lead over the provider's declaration, in words (empty where no status page maps
    /// the route).
    pub declared: String,
}

#[derive(Template)]
#[template(path = "status.html")]
pub struct StatusPage {
    pub c: Chrome,
    /// The subscribe form (HTML), empty when subscriptions are off.
    pub subscribe_form: String,
    pub overall_class: &'static str,
    pub overall_text: &'static str,
    pub incidents: Vec<IncidentLine>,
    /// How many active incidents are past [`MAX_INCIDENT_LINES`], said in words.
    pub incidents_more: Option<String>,
    /// What the providers' own status pages declare (filled by the handler).
    pub declared: Vec<String>,
    pub maintenance: Vec<String>,
    pub findings: Vec<String>,
    pub groups: Vec<Group>,
    /// Routes per state, worst first (all routes, whatever the filter).
    pub counts: Vec<StateCount>,
    /// `?q=` as given (trimmed), and how many routes it kept of how many.
    pub q: String,
    /// `?serves=`: one logical model's routes only (empty: every model).
    pub serves: String,
    pub shown: usize,
    pub total: usize,
    /// Models kept by the filter that are neither drawn nor listed (past
    /// [`MAX_FOLDED_MODELS`]), said in words.
    pub hidden_models: Option<String>,
    /// `?serves=` said in words.
    pub serves_text: Option<String>,
    /// The hourly extra-cost budget of serving off the primaries, when it is in force.
    pub budget: Option<String>,
    /// Logical models whose traffic the switch controller moved (switched, canary, probing).
    pub switches: Vec<String>,
    /// Monitoring jobs silent for `[heartbeat] stale_after`: the figures may be stale.
    pub stale_jobs: Vec<String>,
    /// Active drills (route, reason, stage, end).
    pub drills: Vec<String>,
}

/// A day's state from its synthetic outcome counts (see the module doc).
pub fn day_state(c: &Counts, target: f64) -> Option<St> {
    let success = c.success_ratio()?;
    let good = c.good_ratio()?;
    Some(if success < 0.95 {
        St::Critical
    } else if success < 0.99 {
        St::Degraded
    } else if good < target {
        St::Warning
    } else {
        St::Normal
    })
}

/// The [`DAYS`] bars of one route, oldest first, ending today (UTC).
pub fn day_bars(
    lang: Lang,
    now: DateTime<Utc>,
    dates: &[Arc<str>],
    days: &[(DateTime<Utc>, Counts)],
    incidents: &[&Incident],
    target: f64,
) -> (Vec<Bar>, String) {
    let today = Granularity::Day.bucket_start(now);
    let first = today - TimeDelta::days(DAYS - 1);
    let n = DAYS as usize;
    let mut worst: Vec<Option<St>> = vec![None; n];
    let mut ratio: Vec<Option<f64>> = vec![None; n];
    let index = |t: DateTime<Utc>| -> Option<usize> {
        let d = (t - first).num_days();
        (0..DAYS).contains(&d).then_some(d as usize)
    };
    for (start, c) in days {
        if let Some(i) = index(*start) {
            ratio[i] = c.success_ratio();
            worst[i] = day_state(c, target);
        }
    }
    for inc in incidents {
        let end = inc.closed_at.unwrap_or(now).min(now);
        let from = inc.opened_at.max(first);
        if end < first {
            continue;
        }
        let (Some(a), Some(b)) = (
            index(Granularity::Day.bucket_start(from)),
            index(Granularity::Day.bucket_start(end)),
        ) else {
            continue;
        };
        for w in worst.iter_mut().take(b + 1).skip(a) {
            *w = Some(worse(*w, inc.peak));
        }
    }
    let mut tally: Vec<(Option<St>, usize)> = Vec::new();
    let bars = (0..n)
        .map(|i| {
            match tally.iter_mut().find(|(s, _)| *s == worst[i]) {
                Some((_, k)) => *k += 1,
                None => tally.push((worst[i], 1)),
            }
            Bar {
                class: day_class(worst[i]),
                date: dates.get(i).cloned().unwrap_or_else(|| Arc::from("")),
                up: i18n::DayUptime {
                    lang,
                    ratio: ratio[i],
                },
                // A normal day's tooltip says only its uptime: it is most days, and page weight counts.
                state: worst[i]
                    .filter(|s| *s != St::Normal)
                    .map_or("", |s| i18n::state(lang, s)),
            }
        })
        .collect();
    tally.sort_by_key(|(s, _)| std::cmp::Reverse(s.map_or(0, severity)));
    let summary = tally
        .iter()
        .map(|(s, k)| match s {
            Some(s) => format!("{} {k}", i18n::state(lang, *s)),
            None => format!("{} {k}", lang.text().no_data),
        })
        .collect::<Vec<_>>()
        .join(", ");
    (bars, summary)
}

fn opt_ms(v: Option<f64>, t: &Text) -> String {
    v.map_or_else(|| t.no_data.to_owned(), fmt_ms)
}

pub(super) fn ratio(m: &api::RouteMap<Counts>, id: &RouteId, t: &Text) -> String {
    m.get(id)
        .and_then(Counts::success_ratio)
        .map_or_else(|| t.no_data.to_owned(), i18n::percent)
}

/// One route's card from the snapshot and the cached figures.
#[allow(clippy::too_many_arguments)] // the card's sources, each different
pub fn route_card(
    lang: Lang,
    route: &Route,
    status: Option<&RouteStatus>,
    figures: &Figures,
    data: &PageData,
    incidents: &[&Incident],
    dates: &[Arc<str>],
    now: DateTime<Utc>,
) -> RouteCard {
    let t = lang.text();
    let id = &route.id;
    let state = status.map_or(St::Unknown, |s| s.state);
    let latency = figures.latency.get(id);
    let baseline = status.and_then(|s| s.baseline.as_ref());
    let p50 = latency.and_then(|l| l.p50);
    let p95 = latency.and_then(|l| l.p95);
    let tps_now = figures.tps.get(id).and_then(|p| p.p50);
    let ttfb_now = figures.ttfb.get(id).and_then(|p| p.p50);
    let reason = status.and_then(|s| s.reason.as_ref()).map(|r| {
        let f = ReasonFigures {
            p95: p95.map(fmt_ms),
            normal: baseline.map(|b| fmt_spread(b.mean_ms, b.stddev_ms)),
            bucket: baseline.map(|b| b.bucket.clone()),
            success_ratio: status.and_then(|s| s.success_ratio),
            tps: tps_now,
            tps_normal: baseline.and_then(|b| b.tps_mean),
        };
        i18n::reason(lang, &r.code, &f, &scrub(&r.text))
    });
    let (days, days_summary) = day_bars(lang, now, dates, &data.days_of(id), incidents, route.slo);
    let budget = api::budget_30d(route, figures)
        .map_or_else(|| t.no_data.to_owned(), |b| i18n::budget_left(lang, &b));
    let since = status.map_or_else(
        || t.no_data.to_owned(),
        |s| {
            format!(
                "{} ({})",
                when(s.since),
                i18n::for_duration(lang, (now - s.since).num_seconds())
            )
        },
    );
    RouteCard {
        id: id.as_str().to_owned(),
        anchor: anchor(id),
        href: route_href(id, lang),
        tier: i18n::tier(lang, route.tier),
        state_class: state_class(state),
        state_text: i18n::state(lang, state),
        since,
        reason,
        mode: status
            .and_then(|s| s.failure_mode)
            .map(|m| i18n::mode(lang, m)),
        days,
        days_summary,
        uptime_24h: ratio(&figures.uptime_24h, id, t),
        uptime_7d: ratio(&figures.uptime_7d, id, t),
        uptime_30d: ratio(&figures.uptime_30d, id, t),
        p50: opt_ms(p50, t),
        p95: opt_ms(p95, t),
        baseline: baseline.map_or_else(
            || t.no_data.to_owned(),
            |b| {
                format!(
                    "{} ({}, p95 {})",
                    fmt_spread(b.mean_ms, b.stddev_ms),
                    b.bucket,
                    fmt_ms(b.p95_ms)
                )
            },
        ),
        ttft: match (baseline.and_then(|b| b.ttft_p50_ms), ttfb_now) {
            (Some(ttft), Some(ttfb)) => format!("{} (TTFB {})", fmt_ms(ttft), fmt_ms(ttfb)),
            (Some(ttft), None) => fmt_ms(ttft),
            (None, Some(ttfb)) => format!("TTFB {}", fmt_ms(ttfb)),
            (None, None) => t.no_data.to_owned(),
        },
        tps: match (tps_now, baseline.and_then(|b| b.tps_mean)) {
            (Some(now), Some(normal)) => format!("{now:.1} ({} {normal:.1})", t.normal_is),
            (Some(now), None) => format!("{now:.1}"),
            (None, Some(normal)) => format!("{} ({} {normal:.1})", t.no_data, t.normal_is),
            (None, None) => t.no_data.to_owned(),
        },
        slo: i18n::percent(route.slo),
        budget,
    }
}

pub(super) fn incident_line(lang: Lang, i: &Incident, now: DateTime<Utc>) -> IncidentLine {
    let t = lang.text();
    let end = i.closed_at.unwrap_or(now);
    let secs = (end - i.opened_at).num_seconds();
    IncidentLine {
        route: i.route.as_str().to_owned(),
        href: route_href(&i.route, lang),
        state_class: state_class(i.peak),
        state_text: i18n::state(lang, i.peak),
        mode: i.failure_mode.map_or("", |m| i18n::mode(lang, m)),
        opened: when(i.opened_at),
        running: if i.closed_at.is_some() {
            i18n::duration(lang, secs)
        } else {
            format!("{}, {}", t.ongoing, i18n::duration(lang, secs))
        },
        declared: String::new(),
    }
}

/// The window that is open now or opens next (within 7 days), as (start, end).
fn next_window(
    m: &MaintenanceConfig,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let len = TimeDelta::from_std(m.duration).ok()?;
    let every = m
        .every
        .and_then(|e| TimeDelta::from_std(e).ok())
        .filter(|e| *e > TimeDelta::zero());
    let start = match every {
        Some(e) if now > m.start => {
            let k = (now - m.start).num_milliseconds() / e.num_milliseconds().max(1);
            let cur = m.start + TimeDelta::milliseconds(e.num_milliseconds() * k);
            if window_active(m, now) {
                cur
            } else {
                cur + e
            }
        }
        _ => m.start,
    };
    let end = start + len;
    (end > now && start < now + TimeDelta::days(7)).then_some((start, end))
}

/// What `/` shows of the routes: `q` keeps the routes whose id matches ([`matches()`]),
/// `serves` those of one logical model; empty keeps all.
#[derive(Debug, Clone, Copy, Default)]
pub struct PageFilter<'a> {
    pub q: &'a str,
    pub serves: &'a str,
}

/// The `/` page's view model (a pure function of its inputs: the benchmark calls it).
#[allow(clippy::too_many_arguments)] // each input is a different source; a struct would only rename them
pub fn status_page(
    lang: Lang,
    title: &str,
    routes: &[Route],
    maintenance: &[MaintenanceConfig],
    health: &HealthSnapshot,
    figures: &Figures,
    data: &PageData,
    filter: PageFilter<'_>,
    now: DateTime<Utc>,
) -> StatusPage {
    let PageFilter { q, serves } = filter;
    let t = lang.text();
    let by_id: HashMap<&RouteId, &RouteStatus> =
        health.routes.iter().map(|s| (&s.route, s)).collect();
    let mut incidents_of: HashMap<&RouteId, Vec<&Incident>> = HashMap::new();
    for i in &data.incidents {
        incidents_of.entry(&i.route).or_default().push(i);
    }
    let state_of = |r: &Route| by_id.get(&r.id).map_or(St::Unknown, |s| s.state);
    let dates = day_dates(now);
    // Each model with the routes the filter keeps, and its members' (tier, state).
    let mut models: Vec<Model<'_>> = Vec::new();
    let mut members: Vec<Vec<(Tier, St)>> = Vec::new();
    let mut model_of: HashMap<&str, usize> = HashMap::new();
    let mut per_state: HashMap<St, usize> = HashMap::new();
    let mut shown = 0;
    for r in routes {
        let state = state_of(r);
        *per_state.entry(state).or_default() += 1;
        let mi = *model_of.entry(r.serves.as_str()).or_insert_with(|| {
            models.push(Model {
                name: r.serves.clone(),
                state: St::Unknown,
                picks: Vec::new(),
            });
            members.push(Vec::new());
            models.len() - 1
        });
        members[mi].push((r.tier, state));
        if (!q.is_empty() && !matches(&r.id, q)) || (!serves.is_empty() && r.serves != serves) {
            continue;
        }
        shown += 1;
        models[mi].picks.push(Pick::new(r, state));
    }
    for (m, members) in models.iter_mut().zip(members) {
        m.state = model_state(members);
    }
    let mut ordered: Vec<Model<'_>> = models.into_iter().filter(|m| !m.picks.is_empty()).collect();
    order(&mut ordered);
    // Lines for the worst MAX_LINES routes whatever their model (a WARNING model may have a
    // CRITICAL backup); within a model they are the first of its order. A model with none
    // folds into one line.
    let mut all: Vec<(u8, usize, usize)> = ordered
        .iter()
        .enumerate()
        .flat_map(|(gi, m)| {
            m.picks
                .iter()
                .enumerate()
                .map(move |(pi, p)| (p.rank, gi, pi))
        })
        .collect();
    all.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut takes = vec![0usize; ordered.len()];
    for &(_, gi, _) in all.iter().take(MAX_LINES) {
        takes[gi] += 1;
    }
    let mut folded = 0;
    let mut hidden_models = 0;
    let mut groups = Vec::new();
    for (Model { name, state, picks }, take) in ordered.into_iter().zip(takes) {
        if take == 0 {
            if folded == MAX_FOLDED_MODELS {
                hidden_models += 1;
                continue;
            }
            folded += 1;
        }
        let lines = picks[..take]
            .iter()
            .map(|p| {
                let status = by_id.get(&p.route.id).copied();
                let incidents = incidents_of.get(&p.route.id).map_or(&[][..], Vec::as_slice);
                route_line(lang, p.route, status, figures, data, incidents, &dates, now)
            })
            .collect();
        let more = picks.len() - take;
        groups.push(Group {
            more,
            more_text: if more > 0 {
                i18n::more_routes(lang, more, take)
            } else {
                String::new()
            },
            more_href: model_href(&name, lang),
            name,
            state_class: state_class(state),
            state_text: i18n::state(lang, state),
            routes: lines,
        });
    }
    let counts = [
        St::Critical,
        St::Switched,
        St::Degraded,
        St::Warning,
        St::Normal,
        St::Unknown,
    ]
    .into_iter()
    .filter_map(|s| {
        let count = per_state.get(&s).copied().filter(|n| *n > 0)?;
        Some(StateCount {
            state_class: state_class(s),
            state_text: i18n::state(lang, s),
            count,
        })
    })
    .collect();
    let (overall_class, overall_text) = match api::overall(routes, health) {
        "outage" => ("outage", t.overall_outage),
        "degraded" => ("degraded", t.overall_degraded),
        _ => ("operational", t.overall_operational),
    };
    let mut active: Vec<&RouteStatus> = health
        .routes
        .iter()
        .filter(|s| s.incident.is_some())
        .collect();
    active.sort_by_key(|s| s.incident.as_ref().map(|i| i.opened_at));
    // The routes of one shared cause are one outage: one line, at its oldest route's place.
    let mut per_cause: HashMap<&str, usize> = HashMap::new();
    for s in &active {
        if let Some(c) = s.cause.as_deref() {
            *per_cause.entry(c).or_default() += 1;
        }
    }
    let mut shown_causes: Vec<&str> = Vec::new();
    active.retain(|s| match s.cause.as_deref() {
        Some(c) if shown_causes.contains(&c) => false,
        Some(c) => {
            shown_causes.push(c);
            true
        }
        None => true,
    });
    let incidents_more = (active.len() > MAX_INCIDENT_LINES)
        .then(|| i18n::more_incidents(lang, active.len() - MAX_INCIDENT_LINES));
    let incidents = active
        .iter()
        .take(MAX_INCIDENT_LINES)
        .filter_map(|s| {
            let i = s.incident.as_ref()?;
            let full = Incident {
                id: i.id.clone(),
                route: s.route.clone(),
                opened_at: i.opened_at,
                closed_at: None,
                peak: i.peak,
                failure_mode: i.failure_mode,
                transitions: Vec::new(),
                cause: None,
            };
            let mut line = incident_line(lang, &full, now);
            line.state_class = state_class(s.state);
            line.state_text = i18n::state(lang, s.state);
            if let Some(c) = s.cause.as_deref() {
                line.route = i18n::cause_routes(lang, c, per_cause.get(c).copied().unwrap_or(1));
                line.href = format!("/incidents?lang={}", lang.code());
            }
            Some(line)
        })
        .collect();
    let maintenance = maintenance
        .iter()
        .filter_map(|m| {
            let (start, end) = next_window(m, now)?;
            Some(i18n::maintenance(
                lang,
                start <= now,
                &m.routes.join(", "),
                &when(start),
                &when(end),
            ))
        })
        .collect();
    let findings = health
        .findings
        .iter()
        .map(|f| i18n::finding(lang, f))
        .collect();
    StatusPage {
        subscribe_form: String::new(),
        c: Chrome {
            badge: routes
                .first()
                .map(|r| format!("/badges/{}/state.svg", r.id.as_str())),
            ..Chrome::new(lang, t.nav_status, title, "/", now).with_history(
                lang,
                data,
                Some(figures),
            )
        },
        overall_class,
        overall_text,
        incidents,
        incidents_more,
        declared: Vec::new(),
        maintenance,
        findings,
        groups,
        counts,
        q: q.to_owned(),
        serves: serves.to_owned(),
        serves_text: (!serves.is_empty()).then(|| i18n::model_filter(lang, serves)),
        shown,
        total: routes.len(),
        hidden_models: (hidden_models > 0).then(|| i18n::hidden_models(lang, hidden_models)),
        budget: None,
        switches: Vec::new(),
        stale_jobs: Vec::new(),
        drills: Vec::new(),
    }
}

/// `GET /`.
pub async fn status(
    State(state): State<AppState>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let req = PageRequest::new(&state, &q, &headers);
    let (lang, now, config) = (req.lang, req.now, req.config.clone());
    let fail = |error: PageError| req.fail(error);
    let param = |get: fn(&LangQuery) -> Option<&str>| {
        q.as_ref()
            .ok()
            .and_then(|q| get(q))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let (text, serves) = (param(|q| q.q.as_deref()), param(|q| q.serves.as_deref()));
    for (name, v) in [("q", &text), ("serves", &serves)] {
        if v.chars().count() > MAX_QUERY {
            return Err(fail(PageError::BadRequest(format!(
                "{name} is longer than {MAX_QUERY} characters"
            ))));
        }
    }
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
    let mut page = status_page(
        lang,
        &config.server.title,
        &state.routes,
        &config.maintenance,
        &health,
        &figures,
        &data,
        PageFilter {
            q: &text,
            serves: &serves,
        },
        now,
    );
    page.stale_jobs = stale_jobs(&state, config.heartbeat.stale_after, now)
        .await
        .iter()
        .map(|s| i18n::stale_job(lang, s))
        .collect();
    page.budget = state
        .metrics
        .budget()
        .map(|b| i18n::budget(lang, &b.snapshot()));
    if let Some(sw) = state.metrics.switch() {
        page.switches = sw
            .models
            .iter()
            .filter_map(|m| i18n::switch_line(lang, m, &when))
            .collect();
    }
    page.drills = drill_lines(&state, lang, now, None);
    page.subscribe_form =
        crate::web::subscribe::form(&config.subscriptions, lang == Lang::Zh, &state.routes, None);
    if let Some(word) = super::declared::Word::of(&state, &config) {
        page.declared = super::declared::status_box(lang, &word, &state.routes);
        for line in page.groups.iter_mut().flat_map(|g| g.routes.iter_mut()) {
            if let Some(id) = RouteId::parse(&line.id) {
                line.declared = word
                    .route(&id)
                    .and_then(|d| super::declared::trouble_line(lang, &d));
            }
        }
    }
    if let Some(link) = &state.vantages {
        let view = link.view.borrow().clone();
        if !view.routes.is_empty() {
            for line in page.groups.iter_mut().flat_map(|g| g.routes.iter_mut()) {
                if let Some(id) = RouteId::parse(&line.id) {
                    line.vantages = dots(&view, &id, lang);
                }
            }
        }
    }
    let body = page
        .render()
        .map_err(|e| fail(PageError::Internal(format!("rendering /: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}

/// The expected jobs silent for `stale_after`. A store that cannot be read shows no banner:
/// the page then fails on its own figures anyway.
async fn stale_jobs(
    state: &AppState,
    stale_after: std::time::Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<crate::heartbeat::Stale> {
    let store = state.store.clone();
    match tokio::task::spawn_blocking(move || store.reader()?.heartbeats()).await {
        Ok(Ok(beats)) => state.jobs.stale(&beats, now, stale_after),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "status page: cannot read heartbeats");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(error = %e, "status page: cannot read heartbeats");
            Vec::new()
        }
    }
}

/// The active drills as lines for people (only those on `route` when given).
pub(super) fn drill_lines(
    state: &AppState,
    lang: Lang,
    now: DateTime<Utc>,
    route: Option<&RouteId>,
) -> Vec<String> {
    state
        .metrics
        .drills()
        .map(|all| {
            all.iter()
                .filter(|d| route.is_none_or(|r| *r == d.route))
                .map(|d| i18n::drill_line(lang, d, now, &when))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn day_states_follow_the_thresholds() {
        let c = |count, successes, good| Counts {
            count,
            successes,
            good,
        };
        assert_eq!(day_state(&c(0, 0, 0), 0.999), None);
        assert_eq!(day_state(&c(1000, 1000, 1000), 0.999), Some(St::Normal));
        assert_eq!(day_state(&c(1000, 999, 998), 0.999), Some(St::Warning));
        assert_eq!(day_state(&c(1000, 980, 980), 0.999), Some(St::Degraded));
        assert_eq!(day_state(&c(1000, 900, 900), 0.999), Some(St::Critical));
    }

    #[test]
    fn incidents_colour_the_days_they_overlap() {
        let now = at("2026-05-20T12:00:00Z");
        let id = RouteId::parse("a/b/c").unwrap();
        let days = vec![
            (
                at("2026-05-18T00:00:00Z"),
                Counts {
                    count: 100,
                    successes: 100,
                    good: 100,
                },
            ),
            (
                at("2026-05-19T00:00:00Z"),
                Counts {
                    count: 100,
                    successes: 100,
                    good: 100,
                },
            ),
        ];
        let inc = Incident {
            id: "x".into(),
            route: id,
            opened_at: at("2026-05-18T23:00:00Z"),
            closed_at: Some(at("2026-05-19T01:00:00Z")),
            peak: St::Critical,
            failure_mode: None,
            transitions: Vec::new(),
            cause: None,
        };
        let (bars, summary) = day_bars(Lang::En, now, &day_dates(now), &days, &[&inc], 0.999);
        assert_eq!(bars.len(), 90);
        assert_eq!(bars[89].class, "d-none"); // today: no data
        assert_eq!(bars[88].class, "d-critical");
        assert_eq!(bars[87].class, "d-critical");
        assert_eq!(bars[86].class, "d-none");
        assert_eq!(&*bars[88].date, "2026-05-19");
        assert_eq!(bars[88].up.to_string(), "100%");
        assert_eq!(bars[88].state, "CRITICAL");
        assert!(summary.contains("CRITICAL 2"), "{summary}");
    }
}
