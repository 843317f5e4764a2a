//! `GET /incidents`: 90 days of incidents and where this calendar month's error budget went.

use super::*;

pub struct Spend {
    pub route: String,
    pub href: String,
    pub spent: String,
    pub share: String,
    pub what: String,
}

pub struct BudgetRow {
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
    pub budgets: Vec<BudgetRow>,
    pub incidents: Vec<IncidentLine>,
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

/// The `/incidents` view model.
pub fn incidents_page(
    lang: Lang,
    title: &str,
    routes: &[Route],
    data: &PageData,
    now: DateTime<Utc>,
) -> IncidentsPage {
    let t = lang.text();
    let (m0, m1) = month_bounds(now);
    let month_s = (m1 - m0).num_seconds() as f64;
    let target: HashMap<&RouteId, f64> = routes.iter().map(|r| (&r.id, r.slo)).collect();
    let mut spends: Vec<(i64, Spend)> = Vec::new();
    let mut per_route: Vec<(RouteId, f64, i64)> = Vec::new();
    for i in &data.incidents {
        let from = i.opened_at.max(m0);
        let to = i.closed_at.unwrap_or(now).min(now).min(m1);
        let spent = (to - from).num_seconds();
        if spent <= 0 {
            continue;
        }
        let slo = target.get(&i.route).copied().unwrap_or(0.999);
        let budget_s = (1.0 - slo) * month_s;
        let opening = i.transitions.first().map_or_else(String::new, |tr| {
            i18n::reason(
                lang,
                &tr.reason.code,
                &ReasonFigures::default(),
                &scrub(&tr.reason.text),
            )
        });
        spends.push((
            spent,
            Spend {
                route: i.route.as_str().to_owned(),
                href: route_href(&i.route, lang),
                spent: i18n::duration(lang, spent),
                share: format!(
                    "{:.1}%",
                    if budget_s > 0.0 {
                        spent as f64 / budget_s * 100.0
                    } else {
                        100.0
                    }
                ),
                what: format!(
                    "{} · {}",
                    when(i.opened_at),
                    i18n::incident_what(lang, i.peak, i.failure_mode, &opening)
                ),
            },
        ));
        match per_route.iter_mut().find(|(r, ..)| r == &i.route) {
            Some((_, _, s)) => *s += spent,
            None => per_route.push((i.route.clone(), budget_s, spent)),
        }
    }
    spends.sort_by_key(|(s, _)| std::cmp::Reverse(*s));
    per_route.sort_by_key(|(_, _, s)| std::cmp::Reverse(*s));
    IncidentsPage {
        c: Chrome::new(lang, t.nav_incidents, title, "/incidents", now),
        month: m0.format("%Y-%m").to_string(),
        spends: spends.into_iter().map(|(_, s)| s).collect(),
        budgets: per_route
            .iter()
            .map(|(r, budget_s, spent)| BudgetRow {
                route: r.as_str().to_owned(),
                href: route_href(r, lang),
                budget: i18n::duration(lang, *budget_s as i64),
                spent: i18n::budget_spent(lang, *spent, *budget_s),
            })
            .collect(),
        incidents: data
            .incidents
            .iter()
            .map(|i| incident_line(lang, i, now))
            .collect(),
    }
}

/// `GET /incidents`.
pub async fn incidents(
    State(state): State<AppState>,
    q: Result<Query<LangQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let lang = pick_lang(&q, &headers);
    let now = state.clock.now();
    let config = state.config.current();
    let fail = |error: PageError| AppError {
        lang,
        error,
        title: config.server.title.clone(),
        now,
    };
    let data = state.figures.pages(&state.store, now).await.map_err(fail)?;
    let body = incidents_page(lang, &config.server.title, &state.routes, &data, now)
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
