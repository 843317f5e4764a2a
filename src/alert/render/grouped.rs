//! Gathered messages (one kind of alert about many routes of a provider: burn rates, route
//! faults, drift) and folded ones (what a rate-limited channel could not take in time).

use std::collections::BTreeSet;

use super::{route_url, Line, Words};
use crate::alert::{Lang, Member, Message, RenderCtx, Status, Subject};

/// Routes named in a gathered message; the rest are counted ("and N more").
pub const GROUP_LISTED: usize = 10;
/// Folded messages whose titles a summary shows.
pub const FOLDED_LISTED: usize = 10;

/// The headline of a gathered message.
pub(super) fn headline(w: &Words, m: &Message, provider: &str, kind: &str, n: usize) -> String {
    let resolved = m.status == Status::Resolved;
    let members = match &m.subject {
        Subject::Grouped { members, .. } => members.as_slice(),
        _ => &[],
    };
    match (kind, resolved, w.lang) {
        ("burn_rate", false, Lang::En) => {
            let page = if m.severity == crate::alert::Severity::Critical {
                "page"
            } else {
                "ticket"
            };
            format!("{provider}: {n} routes burn their error budget too fast ({page})")
        }
        ("burn_rate", false, Lang::Zh) => {
            let page = if m.severity == crate::alert::Severity::Critical {
                "紧急"
            } else {
                "工单"
            };
            format!("{provider}：{n} 条线路错误预算消耗过快({page})")
        }
        ("burn_rate", true, Lang::En) => {
            format!("{provider}: {n} routes no longer burn their error budget too fast")
        }
        ("burn_rate", true, Lang::Zh) => format!("{provider}：{n} 条线路错误预算消耗已恢复正常"),
        ("route_fault", false, lang) => {
            let statuses: BTreeSet<u16> = members
                .iter()
                .filter_map(|x| match x.subject {
                    Subject::RouteFault { status, .. } => status,
                    _ => None,
                })
                .collect();
            let s = statuses
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join("/");
            match lang {
                Lang::En => format!(
                    "{provider}: {n} routes answer HTTP {s} — our key, account or model name is wrong"
                ),
                Lang::Zh => {
                    format!("{provider}：{n} 条线路上游返回 HTTP {s} —— 我方密钥、账户或模型名有误")
                }
            }
        }
        ("route_fault", true, Lang::En) => format!("{provider}: {n} routes answer normally again"),
        ("route_fault", true, Lang::Zh) => format!("{provider}：{n} 条线路已恢复正常应答"),
        (_, false, Lang::En) => {
            format!("{provider}: behaviour changed on {n} routes (regression sets)")
        }
        (_, false, Lang::Zh) => format!("{provider}：{n} 条线路回归集上行为变化"),
        (_, true, Lang::En) => format!("{provider}: drift findings closed on {n} routes"),
        (_, true, Lang::Zh) => format!("{provider}：{n} 条线路的漂移发现已关闭"),
    }
}

/// One member in a few words.
fn member_line(w: &Words, x: &Member, resolved: bool) -> String {
    let route = x.route().map(ToString::to_string).unwrap_or_default();
    match &x.subject {
        Subject::BurnRate(b) if !resolved => format!(
            "{route}: {:.1}× / {}, {:.1}× / {}",
            b.burn_long,
            w.dur(b.long_window_s),
            b.burn_short,
            w.dur(b.short_window_s)
        ),
        Subject::RouteFault {
            status: Some(s), ..
        } => format!("{route}: HTTP {s}"),
        Subject::Drift(d) if !resolved => format!("{route}: {} ({})", d.set, d.kind),
        _ => route,
    }
}

/// The body of a gathered message: since when, the first routes (with links), how many more,
/// and for burn rates how much of the budget is left at the worst route's rate.
pub(super) fn lines(w: &Words, ctx: &RenderCtx, m: &Message, lines: &mut Vec<Line>) {
    let Subject::Grouped { members, kind, .. } = &m.subject else {
        return;
    };
    let resolved = m.status == Status::Resolved;
    lines.push(Line::Field(
        w.t("Since", "开始时间").into(),
        w.time(ctx, m.at),
    ));
    for x in members.iter().take(GROUP_LISTED) {
        let url = x.route().map(|r| route_url(ctx, r));
        lines.push(Line::Bullet(member_line(w, x, resolved), url));
    }
    if members.len() > GROUP_LISTED {
        let more = members.len() - GROUP_LISTED;
        lines.push(Line::Para(match w.lang {
            Lang::En => format!("… and {more} more routes"),
            Lang::Zh => format!("… 另有 {more} 条线路"),
        }));
    }
    if kind == "burn_rate" && !resolved {
        let worst = members
            .iter()
            .filter_map(|x| match &x.subject {
                Subject::BurnRate(b) => Some(b),
                _ => None,
            })
            .max_by(|a, b| a.burn_long.total_cmp(&b.burn_long));
        if let Some(b) = worst {
            lines.push(Line::Field(
                w.t("Error budget left", "剩余错误预算").into(),
                budget_left(w, b),
            ));
        }
    }
}

/// How much of the 30-day budget the long window spent, and how long the rest lasts at the
/// long window's rate.
pub(super) fn budget_left(w: &Words, b: &crate::alert::burn::BurnAlert) -> String {
    const MONTH_S: f64 = 30.0 * 86400.0;
    let spent = b.burn_long * b.long_window_s as f64 / MONTH_S * 100.0;
    let left = (100.0 - spent).clamp(0.0, 100.0);
    let lasts = if b.burn_long > 0.0 {
        w.dur((MONTH_S / b.burn_long * left / 100.0) as i64)
    } else {
        "-".to_owned()
    };
    match w.lang {
        Lang::En => format!(
            "{:.1}% spent in the last {} by the fastest route ({}, {:.1}×): at that rate the remaining {left:.1}% lasts {lasts}",
            spent,
            w.dur(b.long_window_s),
            b.route,
            b.burn_long
        ),
        Lang::Zh => format!(
            "消耗最快的线路({}，{:.1} 倍)在最近 {} 内用掉 {:.1}%：按此速率，剩余 {left:.1}% 将在 {lasts} 内耗尽",
            b.route,
            b.burn_long,
            w.dur(b.long_window_s),
            spent
        ),
    }
}

/// The headline of a folded summary.
pub(super) fn folded_headline(w: &Words, total: u32, per_minute: u32) -> String {
    match w.lang {
        Lang::En => format!(
            "{total} alerts folded into one: this channel takes {per_minute} messages a minute"
        ),
        Lang::Zh => format!("{total} 条告警合并为一条：本通道每分钟最多接收 {per_minute} 条"),
    }
}

/// The body of a folded summary: how many fire and resolve, the first titles, where the rest is.
pub(super) fn folded_lines(w: &Words, ctx: &RenderCtx, m: &Message, lines: &mut Vec<Line>) {
    let Subject::Folded {
        total,
        firing,
        resolved,
        shown,
        ..
    } = &m.subject
    else {
        return;
    };
    lines.push(Line::Field(
        w.t("Firing / resolved", "告警中 / 已恢复").into(),
        format!("{firing} / {resolved}"),
    ));
    for s in shown.iter().take(FOLDED_LISTED) {
        lines.push(Line::Bullet(super::render(s, w.lang, ctx).title, None));
    }
    let more = (*total as usize).saturating_sub(shown.len().min(FOLDED_LISTED));
    if more > 0 {
        lines.push(Line::Para(match w.lang {
            Lang::En => format!("… and {more} more"),
            Lang::Zh => format!("… 另有 {more} 条"),
        }));
    }
    lines.push(Line::Link(
        w.t("Everything", "完整情况").into(),
        ctx.public_url.clone(),
    ));
}

#[cfg(test)]
mod tests {
    use super::super::render;
    use crate::alert::burn::BurnAlert;
    use crate::alert::{Lang, Member, Message, RenderCtx, Severity, Status, Subject};
    use crate::route::RouteId;

    fn page(n: usize, status: Status) -> Message {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let route = RouteId::parse(&format!("qwen/cn/m{i:02}")).unwrap();
                Member {
                    key: format!("burn:{route}"),
                    subject: Subject::BurnRate(BurnAlert {
                        route,
                        page: true,
                        slo: 0.999,
                        factor: 14.4,
                        burn_long: 20.0 + i as f64,
                        burn_short: 30.0,
                        long_window_s: 3600,
                        short_window_s: 300,
                        failures: 12,
                        total: 60,
                    }),
                }
            })
            .collect();
        Message {
            key: "burn_rate:qwen:page@0.x".into(),
            severity: Severity::Critical,
            status,
            subject: Subject::Grouped {
                provider: "qwen".into(),
                kind: "burn_rate".into(),
                members,
            },
            at: chrono::DateTime::UNIX_EPOCH,
            items: Vec::new(),
            related: Vec::new(),
            note: None,
            resolves: None,
        }
    }

    fn ctx() -> RenderCtx {
        RenderCtx {
            public_url: "http://status.example.com".into(),
            runbook_url: None,
            timezone: chrono_tz::Asia::Shanghai,
        }
    }

    #[test]
    fn a_grouped_burn_page_names_the_first_routes_and_the_budget_in_both_languages() {
        let m = page(25, Status::Firing);
        let en = render(&m, Lang::En, &ctx());
        assert_eq!(
            en.title,
            "[CRITICAL] qwen: 25 routes burn their error budget too fast (page)"
        );
        assert!(en.text.contains("qwen/cn/m09") && !en.text.contains("qwen/cn/m10"));
        assert!(en.text.contains("… and 15 more routes"), "{}", en.text);
        // The fastest route, 44× over an hour: 6.1 % of the 30-day budget spent.
        assert!(
            en.text.contains("6.1% spent in the last 1h0m"),
            "{}",
            en.text
        );
        let zh = render(&m, Lang::Zh, &ctx());
        assert!(
            zh.title.contains("qwen：25 条线路错误预算消耗过快(紧急)"),
            "{}",
            zh.title
        );
        assert!(zh.text.contains("另有 15 条线路") && zh.text.contains("剩余错误预算"));
        let ok = render(&page(25, Status::Resolved), Lang::Zh, &ctx());
        assert!(
            ok.title.contains("qwen：25 条线路错误预算消耗已恢复正常"),
            "{}",
            ok.title
        );
    }
}
