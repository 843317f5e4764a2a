//! `GET /incidents`: 90 days of incidents and where this calendar month's error budget went.

use super::*;

pub struct Spend {
    pub route: String,
    pub href: String,
    pub spent: String,
    pub share: String,
    pub what: String,
}

pub struct ErrorBudgetRow {
    pub route: String,
    pub href: String,
    pub budget: String,
    pub spent: String,
}

#[derive(Template)]
#[template(path = "incidents.html")]
pub struct IncidentsPage {
    pub c: Chrome,
    pub month: String,
    pub spends: Vec<Spend>,
    pub budgets: Vec<ErrorBudgetRow>,
    pub incidents: Vec<IncidentLine>,
    /// The incident each line shows (a shared cause's outage as one spanning its incidents),
    /// for the handler to add the providers' declarations to.
    pub shown: Vec<Incident>,
    /// This month's lead over the providers' declarations (filled by the handler).
    pub lead: Option<String>,
}

/// The first instant of `now`'s calendar month (UTC) and of the next one.
pub fn month_bounds(now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let (y, m) = (now.year(), now.month());
    let first = NaiveDate::from_ymd_opt(y, m, 1);
    let next = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    };
    let at = |d: Option<NaiveDate>| {
        d.and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|t| t.and_utc())
            .unwrap_or(now)
    };
    (at(first), at(next))
}

/// The part of incident `i` inside the month `[m0, m1)` and before `now`.
pub fn span_in_month(
    i: &Incident,
    m0: DateTime<Utc>,
    m1: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let from = i.opened_at.max(m0);
    let to = i.closed_at.unwrap_or(now).min(now).min(m1);
    (from, to)
}

/// The `/incidents` view model. Every figure is bad time in the sense of [`crate::slo`]:
/// bad probe outcomes × the route's probe interval. A route's month comes from the rollups;
/// an incident's share from the raw outcomes inside its span; what the route's incidents do
/// not account for is shown as its own line ("outside incidents").
pub fn incidents_page(
    lang: Lang,
    title: &str,
    routes: &[Route],
    data: &PageData,
    now: DateTime<Utc>,
) -> IncidentsPage {
    let t = lang.text();
    let (m0, m1) = month_bounds(now);
    let month = (m1 - m0).to_std().unwrap_or(slo::WINDOW);
    let by_id: HashMap<&RouteId, &Route> = routes.iter().map(|r| (&r.id, r)).collect();
    let mut spends: Vec<(f64, Spend)> = Vec::new();
    // Per route: budget, the month's bad seconds, the seconds its incidents account for.
    let mut per_route: Vec<(&Route, slo::ErrorBudget, f64)> = routes
        .iter()
        .filter_map(|r| {
            let b = api::route_budget(r, data.month.get(&r.id), month);
            (b.bad_seconds > 0.0).then_some((r, b, 0.0))
        })
        .collect();
    let share = |spent: f64, budget_s: f64| {
        format!(
            "{:.1}%",
            if budget_s > 0.0 {
                spent / budget_s * 100.0
            } else {
                100.0
            }
        )
    };
    for i in &data.incidents {
        let (from, to) = span_in_month(i, m0, m1, now);
        let Some(route) = by_id.get(&i.route).copied() else {
            continue;
        };
        if to <= from {
            continue;
        }
        let budget_s = slo::budget_seconds(route.slo, month);
        let opening = i.transitions.first().map_or_else(String::new, |tr| {
            i18n::reason(
                lang,
                &tr.reason.code,
                &ReasonFigures::default(),
                &scrub(&tr.reason.text),
            )
        });
        let what = format!(
            "{} · {}",
            when(i.opened_at),
            i18n::incident_what(lang, i.peak, i.failure_mode, &opening)
        );
        let Some(bad) = data.incident_bad.get(&i.id).copied() else {
            // Older than the raw outcomes kept: its bad time stays in the route's remainder.
            spends.push((
                0.0,
                Spend {
                    route: i.route.as_str().to_owned(),
                    href: route_href(&i.route, lang),
                    spent: t.no_data.to_owned(),
                    share: String::new(),
                    what: format!("{what} · {}", t.budget_unretained),
                },
            ));
            continue;
        };
        let spent = slo::bad_time(bad, route.probe.interval);
        if spent <= 0.0 {
            continue;
        }
        if let Some((_, _, inside)) = per_route.iter_mut().find(|(r, ..)| r.id == i.route) {
            *inside += spent;
        }
        spends.push((
            spent,
            Spend {
                route: i.route.as_str().to_owned(),
                href: route_href(&i.route, lang),
                spent: i18n::duration(lang, spent.round() as i64),
                share: share(spent, budget_s),
                what,
            },
        ));
    }
    for (r, b, inside) in &per_route {
        let rest = b.bad_seconds - inside;
        if rest > 0.0 {
            spends.push((
                rest,
                Spend {
                    route: r.id.as_str().to_owned(),
                    href: route_href(&r.id, lang),
                    spent: i18n::duration(lang, rest.round() as i64),
                    share: share(rest, b.budget_seconds),
                    what: t.budget_outside.to_owned(),
                },
            ));
        }
    }
    spends.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (shown, lines): (Vec<Incident>, Vec<IncidentLine>) =
        history(lang, &data.incidents, now).into_iter().unzip();
    per_route.sort_by(|a, b| b.1.bad_seconds.total_cmp(&a.1.bad_seconds));
    IncidentsPage {
        c: Chrome::new(lang, t.nav_incidents, title, "/incidents", now)
            .with_history(lang, data, None),
        month: m0.format("%Y-%m").to_string(),
        spends: spends.into_iter().map(|(_, s)| s).collect(),
        budgets: per_route
            .iter()
            .map(|(r, b, _)| ErrorBudgetRow {
                route: r.id.as_str().to_owned(),
                href: route_href(&r.id, lang),
                budget: i18n::duration(lang, b.budget_seconds as i64),
                spent: i18n::budget_spent(lang, b.bad_seconds.round() as i64, b.budget_seconds),
            })
            .collect(),
        incidents: lines,
        shown,
        lead: None,
    }
}

/// The history as listed (newest first), each incident on its line — except a shared cause's
/// outage, one line at its newest incident's place ("1,999 routes with one cause: …") from its
/// first incident's opening to its last one's end.
fn history(lang: Lang, list: &[Incident], now: DateTime<Utc>) -> Vec<(Incident, IncidentLine)> {
    let outages = crate::health::outage::outages(list);
    let mut of: HashMap<&str, usize> = HashMap::new();
    for (k, o) in outages.iter().enumerate() {
        for i in &o.incidents {
            of.insert(i.id.as_str(), k);
        }
    }
    let mut shown = vec![false; outages.len()];
    let mut out = Vec::new();
    for i in list {
        let Some(&k) = of.get(i.id.as_str()) else {
            out.push((i.clone(), incident_line(lang, i, now)));
            continue;
        };
        if std::mem::replace(&mut shown[k], true) {
            continue;
        }
        let o = &outages[k];
        let first = o.incidents[0];
        let whole = Incident {
            id: first.id.clone(),
            route: first.route.clone(),
            opened_at: o.opened_at,
            closed_at: o.closed_at,
            peak: o.peak,
            failure_mode: o.failure_mode,
            transitions: Vec::new(),
            cause: Some(o.cause.to_owned()),
        };
        let mut line = incident_line(lang, &whole, now);
        if o.incidents.len() > 1 {
            line.route = i18n::cause_routes(lang, o.cause, o.incidents.len());
        }
        out.push((whole, line));
    }
    out
}

/// `GET /incidents`.
pub async fn incidents(
    State(state): State<AppState>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let req = PageRequest::new(&state, &q, &headers);
    let (lang, now, config) = (req.lang, req.now, req.config.clone());
    let fail = |error: PageError| req.fail(error);
    let data = state
        .figures
        .pages(
            &state.store,
            &state.clock,
            ErrorBudgetSource::from_config(&config),
        )
        .await
        .map_err(fail)?;
    let mut page = incidents_page(lang, &config.server.title, &state.routes, &data, now);
    super::declared::fill_leads(&state, &config, lang, &page.shown, &mut page.incidents).await;
    page.lead = super::declared::month(&state, &config, lang, now).await;
    let body = page
        .render()
        .map_err(|e| fail(PageError::Internal(format!("rendering /incidents: {e}"))))?;
    Ok(html(StatusCode::OK, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn month_bounds_wrap_the_year() {
        let (a, b) = month_bounds(at("2026-12-15T10:00:00Z"));
        assert_eq!(a, at("2026-12-01T00:00:00Z"));
        assert_eq!(b, at("2027-01-01T00:00:00Z"));
    }
}
