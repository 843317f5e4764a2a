//! Every word the HTML pages show, per language, in one place: the fixed labels ([`Text`],
//! [`EN`] and [`ZH`]) and the few sentences built with numbers (durations, reasons, day titles).
//!
//! The labels are in `words`, the sentences in `sentences`.
//!
//! Choosing the language ([`Lang::pick`]): `?lang=zh|en` first, then the best `zh`/`en`
//! entry of `Accept-Language` (by `q`), else English.

mod sentences;
mod words;

pub use sentences::*;
pub use words::{EN, ZH};

use crate::health::{fmt_ms, fmt_spread, Evidence, FailureMode, FindingKind, State};
use crate::route::Tier;
use State as St;

/// The languages the pages speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Zh,
}

impl Lang {
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }

    /// The `lang` attribute of `<html>`.
    pub fn html_lang(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh-CN",
        }
    }

    pub fn text(self) -> &'static Text {
        match self {
            Lang::En => &EN,
            Lang::Zh => &ZH,
        }
    }

    /// `?lang=` wins; then `Accept-Language` by quality; English by default.
    pub fn pick(query: Option<&str>, accept_language: Option<&str>) -> Lang {
        match query.map(str::trim) {
            Some("zh") => return Lang::Zh,
            Some("en") => return Lang::En,
            _ => {}
        }
        let Some(header) = accept_language else {
            return Lang::En;
        };
        let mut best: Option<(f64, Lang)> = None;
        for item in header.split(',') {
            let mut parts = item.split(';');
            let tag = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            let lang = if tag == "zh" || tag.starts_with("zh-") {
                Lang::Zh
            } else if tag == "en" || tag.starts_with("en-") {
                Lang::En
            } else {
                continue;
            };
            // The first of equal qualities wins (the header's order is the tie-break).
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, lang));
            }
        }
        best.map_or(Lang::En, |(_, l)| l)
    }
}

/// The fixed words of the pages.
#[derive(Debug)]
pub struct Text {
    pub lang_name: &'static str,
    pub switch_to: &'static str,
    pub nav_status: &'static str,
    pub nav_incidents: &'static str,
    pub updated: &'static str,
    pub refresh_note: &'static str,
    pub overall_operational: &'static str,
    pub overall_degraded: &'static str,
    pub overall_outage: &'static str,
    pub active_incidents: &'static str,
    pub maintenance: &'static str,
    pub switches: &'static str,
    pub drills: &'static str,
    pub maintenance_now: &'static str,
    pub maintenance_next: &'static str,
    pub findings: &'static str,
    pub declared_heading: &'static str,
    pub declared_link: &'static str,
    pub finding_egress: &'static str,
    pub finding_request_side: &'static str,
    pub finding_vantage_local: &'static str,
    pub finding_vantage_stale: &'static str,
    pub routes_heading: &'static str,
    pub logical_model: &'static str,
    pub since: &'static str,
    pub reason: &'static str,
    pub failure_mode: &'static str,
    pub last_90_days: &'static str,
    pub days_ago_90: &'static str,
    pub today: &'static str,
    pub uptime: &'static str,
    pub latency: &'static str,
    pub baseline: &'static str,
    pub normal_is: &'static str,
    pub ttft: &'static str,
    pub tokens_per_second: &'static str,
    pub slo: &'static str,
    pub budget_left: &'static str,
    pub budget_rolling: &'static str,
    /// Which latency signal moved (first token, tokens/s), each against its normal.
    pub signals: &'static str,
    /// The latest probe's first generated token and first answer token.
    pub first_answer: &'static str,
    /// What probing this route costs per month (probes, throughput and confirmation probes).
    pub probe_cost: &'static str,
    /// What an embeddings route is (its page's `kind` line).
    pub route_kind: &'static str,
    /// Says the day bars of past days are still being read after a start.
    pub days_warming: &'static str,
    /// Says the uptimes and error budgets are still being read after a start.
    pub figures_warming: &'static str,
    /// Says both are.
    pub all_warming: &'static str,
    /// Says the latencies are too (nothing of the store is read yet).
    pub latest_warming: &'static str,
    /// Marks the built-in demo's simulated past.
    pub demo_history: &'static str,
    pub no_data: &'static str,
    pub details: &'static str,
    pub last_hour: &'static str,
    pub legend: &'static str,
    pub chart_heading: &'static str,
    pub chart_note: &'static str,
    pub baseline_band: &'static str,
    pub timeline: &'static str,
    pub no_transitions: &'static str,
    pub evidence: &'static str,
    pub route_incidents: &'static str,
    pub no_incidents: &'static str,
    pub recent_errors: &'static str,
    pub no_recent_errors: &'static str,
    pub model_reported: &'static str,
    pub provider: &'static str,
    pub region: &'static str,
    pub model: &'static str,
    pub tier: &'static str,
    pub history: &'static str,
    pub opened: &'static str,
    pub closed: &'static str,
    pub duration: &'static str,
    pub peak: &'static str,
    pub route: &'static str,
    pub ongoing: &'static str,
    pub budget_heading: &'static str,
    pub budget_note: &'static str,
    pub budget_month: &'static str,
    pub budget_spent: &'static str,
    pub budget_of_route: &'static str,
    pub budget_nothing: &'static str,
    pub budget_outside: &'static str,
    pub budget_unretained: &'static str,
    pub when: &'static str,
    pub change: &'static str,
    pub back: &'static str,
    pub not_found: &'static str,
    pub not_found_text: &'static str,
    pub server_error: &'static str,
    pub server_error_text: &'static str,
    pub days_note: &'static str,
    pub bad_request: &'static str,
    pub bad_request_text: &'static str,
    /// `/`'s filter form.
    pub filter_label: &'static str,
    pub filter_hint: &'static str,
    pub filter_button: &'static str,
    pub filter_clear: &'static str,
    pub routes_word: &'static str,
    pub no_match: &'static str,
    /// The short note under the filter: what a line shows.
    pub lines_note: &'static str,
    pub col_state: &'static str,
    pub col_days: &'static str,
    pub feed: &'static str,
    pub badges: &'static str,
}

/// A state as the page names it: the state code, with the Chinese word in front in Chinese.
pub fn state(lang: Lang, s: St) -> &'static str {
    match (lang, s) {
        (Lang::En, s) => s.as_str(),
        (Lang::Zh, St::Unknown) => "未知 UNKNOWN",
        (Lang::Zh, St::Normal) => "正常 NORMAL",
        (Lang::Zh, St::Warning) => "警告 WARNING",
        (Lang::Zh, St::Degraded) => "降级 DEGRADED",
        (Lang::Zh, St::Critical) => "严重 CRITICAL",
        (Lang::Zh, St::Switched) => "已切换 SWITCHED",
    }
}

/// A failure mode in plain words.
pub fn mode(lang: Lang, m: FailureMode) -> &'static str {
    match (lang, m) {
        (Lang::En, FailureMode::Unavailable) => "unavailable: errors or timeouts",
        (Lang::En, FailureMode::Degraded) => "degraded: answers arrive, but slowly",
        (Lang::En, FailureMode::BehaviorChanged) => {
            "behaviour changed: answers are no longer PROBE_OK"
        }
        (Lang::Zh, FailureMode::Unavailable) => "不可用：报错或超时",
        (Lang::Zh, FailureMode::Degraded) => "变慢：能返回但很慢",
        (Lang::Zh, FailureMode::BehaviorChanged) => "行为变化：回答不再是 PROBE_OK",
    }
}

pub fn tier(lang: Lang, t: Tier) -> &'static str {
    match (lang, t) {
        (Lang::En, Tier::Primary) => "primary",
        (Lang::En, Tier::Backup) => "backup",
        (Lang::En, Tier::Fallback) => "fallback",
        (Lang::Zh, Tier::Primary) => "主线路",
        (Lang::Zh, Tier::Backup) => "备用",
        (Lang::Zh, Tier::Fallback) => "兜底",
    }
}

/// `3 m 12 s` / `3 分 12 秒`, two units at most.
pub fn duration(lang: Lang, secs: i64) -> String {
    let s = secs.max(0);
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let u = |n: i64, en: &str, zh: &str| match lang {
        Lang::En => format!("{n} {en}"),
        Lang::Zh => format!("{n} {zh}"),
    };
    let mut parts = if d > 0 {
        vec![u(d, "d", "天"), u(h, "h", "小时")]
    } else if h > 0 {
        vec![u(h, "h", "小时"), u(m, "m", "分")]
    } else if m > 0 {
        vec![u(m, "m", "分"), u(sec, "s", "秒")]
    } else {
        vec![u(sec, "s", "秒")]
    };
    // "45 m", not "45 m 0 s".
    if parts.len() == 2
        && [h, m, sec][if d > 0 {
            0
        } else if h > 0 {
            1
        } else {
            2
        }] == 0
    {
        parts.truncate(1);
    }
    parts.join(" ")
}

/// `for 2 h 5 m` / `持续 2 小时 5 分`.
pub fn for_duration(lang: Lang, secs: i64) -> String {
    match lang {
        Lang::En => format!("for {}", duration(lang, secs)),
        Lang::Zh => format!("持续 {}", duration(lang, secs)),
    }
}

/// Minutes with one decimal: `21.6 min` / `21.6 分钟`.
pub fn minutes(lang: Lang, mins: f64) -> String {
    match lang {
        Lang::En => format!("{mins:.1} min"),
        Lang::Zh => format!("{mins:.1} 分钟"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_language() {
        assert_eq!(Lang::pick(Some("zh"), Some("en")), Lang::Zh);
        assert_eq!(Lang::pick(Some("en"), Some("zh-CN")), Lang::En);
        assert_eq!(Lang::pick(None, Some("zh-CN,zh;q=0.9,en;q=0.8")), Lang::Zh);
        assert_eq!(Lang::pick(None, Some("fr, en;q=0.5, zh;q=0.4")), Lang::En);
        assert_eq!(Lang::pick(None, Some("en-US;q=0.3, zh-TW;q=0.7")), Lang::Zh);
        assert_eq!(Lang::pick(Some("fr"), None), Lang::En);
        assert_eq!(Lang::pick(None, Some("zh;q=0")), Lang::En);
    }

    #[test]
    fn probe_cost_reads_in_both_languages() {
        use crate::probe::cost::ProbeCostView;
        let priced = |c: f64| ProbeCostView {
            tokens_per_month: 1_234_567,
            cost_per_month: Some(c),
            currency: Some("CNY".into()),
        };
        assert_eq!(
            probe_cost(Lang::En, &priced(0.4217)),
            "1,234,567 tokens · 0.42 CNY"
        );
        assert_eq!(
            probe_cost(Lang::Zh, &priced(0.0042)),
            "1,234,567 token · 0.0042 CNY"
        );
        let free = ProbeCostView {
            tokens_per_month: 999,
            cost_per_month: None,
            currency: None,
        };
        assert_eq!(
            probe_cost(Lang::En, &free),
            "999 tokens (no price configured)"
        );
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(Lang::En, 192), "3 m 12 s");
        assert_eq!(duration(Lang::Zh, 192), "3 分 12 秒");
        assert_eq!(duration(Lang::En, 7500), "2 h 5 m");
        assert_eq!(duration(Lang::En, 90_000), "1 d 1 h");
        assert_eq!(duration(Lang::En, 5), "5 s");
    }

    #[test]
    fn reasons_carry_the_numbers() {
        let f = ReasonFigures {
            p95: Some("4.2 s".into()),
            normal: Some("1.1 s ± 0.3 s".into()),
            bucket: Some("14:00-15:00".into()),
            ..Default::default()
        };
        assert_eq!(
            reason(Lang::En, "latency_above_baseline", &f, ""),
            "p95 4.2 s against a normal of 1.1 s ± 0.3 s for 14:00-15:00"
        );
        assert!(reason(Lang::Zh, "latency_above_baseline", &f, "").contains("4.2 s"));
        assert_eq!(reason(Lang::En, "mystery", &f, "detail"), "detail");
        assert_eq!(percent(0.99999), "99.999%");
        assert_eq!(percent(1.0), "100.00%");
    }

    #[test]
    fn an_overspent_budget_is_a_multiple_not_a_pile_of_minutes() {
        use crate::slo::{ErrorBudget, WINDOW};
        // 2.5× the 43.2 min budget: 108 min of bad time.
        let b = ErrorBudget::from_bad_seconds(2.5 * 2592.0, 0.999, WINDOW);
        let en = budget_left(Lang::En, &b);
        assert_eq!(en, "0% · 1 h 48 m bad, 2.5× the budget of 43.2 min");
        let zh = budget_left(Lang::Zh, &b);
        assert!(zh.contains("2.5 倍"), "{zh}");
        let half = ErrorBudget::from_bad_seconds(1296.0, 0.999, WINDOW);
        assert!(budget_left(Lang::En, &half).starts_with("50.0% · 21 m 36 s bad of 43.2 min"));
    }
}
