//! Every word the HTML pages show, per language, in one place: the fixed labels ([`Text`],
//! [`EN`] and [`ZH`]) and the few sentences built with numbers (durations, reasons, day titles).
//!
//! Choosing the language ([`Lang::pick`]): `?lang=zh|en` first, then the best `zh`/`en`
//! entry of `Accept-Language` (by `q`), else English.

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
    pub finding_egress: &'static str,
    pub finding_request_side: &'static str,
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
    pub when: &'static str,
    pub change: &'static str,
    pub back: &'static str,
    pub not_found: &'static str,
    pub not_found_text: &'static str,
    pub server_error: &'static str,
    pub server_error_text: &'static str,
    pub days_note: &'static str,
}

pub static EN: Text = Text {
    lang_name: "English",
    switch_to: "中文",
    nav_status: "Status",
    nav_incidents: "Incident history",
    updated: "Updated",
    refresh_note: "This page refreshes itself every 30 seconds.",
    overall_operational: "All systems operational",
    overall_degraded: "Some routes are degraded",
    overall_outage: "Outage: a model has no usable route",
    active_incidents: "Active incidents",
    maintenance: "Maintenance",
    switches: "Traffic moved by the switch controller",
    drills: "Drills in progress",
    maintenance_now: "in progress",
    maintenance_next: "scheduled",
    findings: "Network findings",
    finding_egress: "Several providers fail together and our control check fails too: our own network (egress) is the likely cause, not the providers.",
    finding_request_side: "Probes are fine while real traffic fails: the requests themselves are the likely cause.",
    routes_heading: "Models and routes",
    logical_model: "Model",
    since: "since",
    reason: "Why",
    failure_mode: "Failure mode",
    last_90_days: "Last 90 days",
    days_ago_90: "90 days ago",
    today: "today",
    uptime: "Uptime",
    latency: "Latency (last hour)",
    baseline: "baseline",
    normal_is: "normal",
    ttft: "Time to first token",
    tokens_per_second: "Tokens/s",
    slo: "SLO target",
    budget_left: "Error budget left",
    budget_rolling: "rolling 30 days",
    no_data: "no data",
    details: "Details",
    last_hour: "last hour",
    legend: "Legend",
    chart_heading: "Latency, last 24 hours (per 5 minutes)",
    chart_note: "Lines: p50 and p95 of probe latency per 5 minutes. Shaded band: the current baseline (mean ± σ); dashed: the anomaly threshold.",
    baseline_band: "baseline",
    timeline: "State timeline",
    no_transitions: "No state changes in the last 30 days.",
    evidence: "Evidence",
    route_incidents: "Incidents of this route",
    no_incidents: "No incidents.",
    recent_errors: "Recent probe errors",
    no_recent_errors: "No recent probe errors.",
    model_reported: "Model reported by the provider",
    provider: "Provider",
    region: "Region",
    model: "Upstream model",
    tier: "Tier",
    history: "Incident history (90 days)",
    opened: "Opened",
    closed: "Closed",
    duration: "Duration",
    peak: "Peak",
    route: "Route",
    ongoing: "ongoing",
    budget_heading: "Where this month's error budget went",
    budget_note: "Each route's monthly budget is (1 − SLO target) of the calendar month (UTC). An incident spends the time its route was DEGRADED or worse within the month.",
    budget_month: "Budget this month",
    budget_spent: "spent",
    budget_of_route: "of the route's budget",
    budget_nothing: "No incident has spent any error budget this month.",
    when: "When",
    change: "Change",
    back: "Back to the status page",
    not_found: "Not found",
    not_found_text: "There is no such page or route.",
    server_error: "Something went wrong",
    server_error_text: "The page could not be built. Please try again shortly.",
    days_note: "One bar per UTC day, coloured by the day's worst: its good-outcome ratio below the SLO target is a warning, a success ratio below 99% degraded, below 95% critical; an incident open that day counts with its peak state. Hover a bar for the day's uptime.",
};

pub static ZH: Text = Text {
    lang_name: "中文",
    switch_to: "English",
    nav_status: "状态",
    nav_incidents: "事故历史",
    updated: "更新于",
    refresh_note: "本页每 30 秒自动刷新。",
    overall_operational: "所有服务运行正常",
    overall_degraded: "部分线路性能下降",
    overall_outage: "服务中断：有模型没有可用线路",
    active_incidents: "进行中的事故",
    maintenance: "维护",
    switches: "自动切换中的流量",
    drills: "进行中的演练",
    maintenance_now: "进行中",
    maintenance_next: "已计划",
    findings: "网络诊断",
    finding_egress: "多家供应商同时失败，且对照探测也失败：更可能是我们自己的出口网络问题，而不是供应商。",
    finding_request_side: "探测正常而真实流量失败：更可能是请求本身的问题。",
    routes_heading: "模型与线路",
    logical_model: "模型",
    since: "自",
    reason: "原因",
    failure_mode: "故障类型",
    last_90_days: "最近 90 天",
    days_ago_90: "90 天前",
    today: "今天",
    uptime: "可用率",
    latency: "延迟（最近一小时）",
    baseline: "基线",
    normal_is: "正常水平",
    ttft: "首 token 时间",
    tokens_per_second: "每秒 token 数",
    slo: "SLO 目标",
    budget_left: "剩余错误预算",
    budget_rolling: "滚动 30 天",
    no_data: "无数据",
    details: "详情",
    last_hour: "最近一小时",
    legend: "图例",
    chart_heading: "最近 24 小时延迟（每 5 分钟）",
    chart_note: "折线：每 5 分钟探测延迟的 p50 与 p95。阴影带：当前基线（均值 ± σ）；虚线：异常阈值。",
    baseline_band: "基线",
    timeline: "状态时间线",
    no_transitions: "最近 30 天没有状态变化。",
    evidence: "证据",
    route_incidents: "本线路的事故",
    no_incidents: "没有事故。",
    recent_errors: "最近的探测错误",
    no_recent_errors: "最近没有探测错误。",
    model_reported: "供应商返回的模型名",
    provider: "供应商",
    region: "区域",
    model: "上游模型",
    tier: "层级",
    history: "事故历史（90 天）",
    opened: "开始",
    closed: "结束",
    duration: "持续时间",
    peak: "最严重状态",
    route: "线路",
    ongoing: "进行中",
    budget_heading: "本月错误预算花在了哪里",
    budget_note: "每条线路的月度预算 = (1 − SLO 目标) × 本自然月（UTC）时长。每次事故花掉的是该线路在本月处于降级或更差状态的时间。",
    budget_month: "本月预算",
    budget_spent: "已用",
    budget_of_route: "占该线路预算",
    budget_nothing: "本月还没有事故消耗错误预算。",
    when: "时间",
    change: "变化",
    back: "返回状态页",
    not_found: "页面不存在",
    not_found_text: "没有这个页面或线路。",
    server_error: "出错了",
    server_error_text: "页面生成失败，请稍后再试。",
    days_note: "每根柱代表一个 UTC 自然日，颜色取当天最差的情况：达标率低于 SLO 目标为警告，成功率低于 99% 为降级、低于 95% 为严重；当天有事故则按事故的最严重状态计。鼠标悬停可看当天可用率。",
};

/// A state as the page names it: the SPEC code, with the Chinese word in front in Chinese.
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

/// The numbers a reason sentence may use (all optional: a sentence leaves out what is missing).
#[derive(Debug, Default, Clone)]
pub struct ReasonFigures {
    /// "p95 4.2 s" of the last hour.
    pub p95: Option<String>,
    /// "1.1 s ± 0.3 s".
    pub normal: Option<String>,
    /// "14:00-15:00".
    pub bucket: Option<String>,
    /// Success ratio in the error window, 0..=1.
    pub success_ratio: Option<f64>,
    /// Tokens/s now and normal.
    pub tps: Option<f64>,
    pub tps_normal: Option<f64>,
}

/// The reason in plain words, with the numbers the page has. `detail` (the detector's own
/// English sentence, already scrubbed) is used when a code has no sentence of its own here.
pub fn reason(lang: Lang, code: &str, f: &ReasonFigures, detail: &str) -> String {
    let errors = f
        .success_ratio
        .map(|r| format!("{:.1}%", (1.0 - r) * 100.0));
    let en = lang == Lang::En;
    let bucket = |b: &Option<String>| match (b, en) {
        (Some(b), true) => format!(" for {b}"),
        (Some(b), false) => format!("（{b} 时段）"),
        (None, _) => String::new(),
    };
    match code {
        "latency_above_baseline" => match (&f.p95, &f.normal) {
            (Some(p95), Some(normal)) if en => format!(
                "p95 {p95} against a normal of {normal}{}",
                bucket(&f.bucket)
            ),
            (Some(p95), Some(normal)) => {
                format!("p95 为 {p95}，正常水平为 {normal}{}", bucket(&f.bucket))
            }
            _ if en => "slower than its baseline".into(),
            _ => "比基线慢".into(),
        },
        "tps_below_baseline" => match (f.tps, f.tps_normal) {
            (Some(now), Some(normal)) if en => {
                format!("{now:.1} tokens/s against a normal of {normal:.1} tokens/s")
            }
            (Some(now), Some(normal)) => {
                format!("每秒 {now:.1} 个 token，正常水平为每秒 {normal:.1} 个")
            }
            _ if en => "output is slower than normal (tokens/s)".into(),
            _ => "输出速度（每秒 token 数）低于正常".into(),
        },
        "probe_failed" => match (&errors, en) {
            (Some(e), true) => format!("probes are failing ({e} of recent calls failed)"),
            (Some(e), false) => format!("探测失败（最近调用中 {e} 失败）"),
            (None, true) => "probes are failing".into(),
            (None, false) => "探测失败".into(),
        },
        "error_rate_high" => match (&errors, en) {
            (Some(e), true) => format!("error rate {e} over the last minutes, above the 5% limit"),
            (Some(e), false) => format!("最近几分钟错误率 {e}，超过 5% 上限"),
            (None, true) => "error rate above its limit".into(),
            (None, false) => "错误率超过上限".into(),
        },
        "degraded_too_long" if en => "degraded for too long without recovering".into(),
        "degraded_too_long" => "降级持续过久且未恢复".into(),
        "answer_changed" if en => "answers are no longer exactly PROBE_OK".into(),
        "answer_changed" => "回答不再是 PROBE_OK".into(),
        "recovered" if en => "recovered: recent observations are normal".into(),
        "recovered" => "已恢复：最近的观测都正常".into(),
        "baseline_ready" if en => "enough samples to judge latency".into(),
        "baseline_ready" => "样本已足够，开始按基线判断延迟".into(),
        _ => detail.to_owned(),
    }
}

/// The uptime part of a day bar's tooltip: `100%`, `99.82%`, or "no data".
pub fn day_uptime(lang: Lang, ratio: Option<f64>) -> std::borrow::Cow<'static, str> {
    match ratio {
        Some(r) if r >= 1.0 => "100%".into(),
        Some(r) => percent(r).into(),
        None => lang.text().no_data.into(),
    }
}

/// `99.95%`: two decimals, three when it would round to 100% without being it.
pub fn percent(ratio: f64) -> String {
    let p = ratio * 100.0;
    if p < 100.0 && format!("{p:.2}") == "100.00" {
        format!("{p:.3}%")
    } else {
        format!("{p:.2}%")
    }
}

fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e12 {
        format!("{v:.0}")
    } else if v.abs() < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

/// The evidence of a transition as short lines (numbers only come from detection, never from
/// a provider's text; the error is its stable kind).
pub fn evidence(lang: Lang, e: &Evidence) -> Vec<String> {
    let en = lang == Lang::En;
    let mut out = Vec::new();
    if let Some(o) = &e.observed {
        let at = o.started_at.format("%H:%M:%S");
        let kind = o.kind.as_str();
        let took = fmt_ms(o.total_ms);
        out.push(match (o.success, en) {
            (true, true) => format!("{kind} at {at} UTC: succeeded in {took}"),
            (true, false) => format!("{kind} {at} UTC：成功，耗时 {took}"),
            (false, _) => {
                let what = match (&o.error, o.http_status) {
                    (Some(e), Some(s)) => format!("{e}, HTTP {s}"),
                    (Some(e), None) => e.clone(),
                    (None, Some(s)) => format!("HTTP {s}"),
                    (None, None) => "error".into(),
                };
                if en {
                    format!("{kind} at {at} UTC: failed ({what}) after {took}")
                } else {
                    format!("{kind} {at} UTC：失败（{what}），耗时 {took}")
                }
            }
        });
    }
    if let Some(b) = &e.baseline {
        let spread = fmt_spread(b.mean_ms, b.stddev_ms);
        let thr = fmt_ms(b.threshold_ms);
        out.push(if en {
            format!(
                "baseline {}: {spread} over {} samples; threshold {thr}",
                b.bucket, b.samples
            )
        } else {
            format!(
                "基线 {}：{spread}，{} 个样本；阈值 {thr}",
                b.bucket, b.samples
            )
        });
    }
    if let Some(t) = &e.tps_baseline {
        out.push(if en {
            format!(
                "tokens/s baseline {}: {:.1}, floor {:.1}",
                t.bucket, t.mean, t.floor
            )
        } else {
            format!(
                "每秒 token 基线 {}：{:.1}，下限 {:.1}",
                t.bucket, t.mean, t.floor
            )
        });
    }
    for t in &e.thresholds {
        out.push(if en {
            format!("{}: {} (limit {})", t.name, num(t.observed), num(t.limit))
        } else {
            format!("{}：{}（界限 {}）", t.name, num(t.observed), num(t.limit))
        });
    }
    let r = &e.error_rate;
    if r.total > 0 {
        let rate = r.rate * 100.0;
        out.push(if en {
            format!(
                "errors {}/{} ({rate:.1}%) over {} s",
                r.failures, r.total, r.window_s
            )
        } else {
            format!(
                "{} 秒内错误 {}/{}（{rate:.1}%）",
                r.window_s, r.failures, r.total
            )
        });
    }
    if e.consecutive_abnormal > 0 {
        out.push(if en {
            format!(
                "{} consecutive abnormal observations",
                e.consecutive_abnormal
            )
        } else {
            format!("连续 {} 次异常观测", e.consecutive_abnormal)
        });
    }
    out
}

/// A finding in plain words, with the providers it names.
pub fn finding(lang: Lang, kind: FindingKind, providers: &[String], routes: usize) -> String {
    let t = lang.text();
    let base = match kind {
        FindingKind::Egress => t.finding_egress,
        FindingKind::RequestSide => t.finding_request_side,
    };
    match lang {
        Lang::En => format!(
            "{base} ({routes} routes; providers: {})",
            providers.join(", ")
        ),
        Lang::Zh => format!(
            "{base}（{routes} 条线路；供应商：{}）",
            providers.join("、")
        ),
    }
}

/// A logical model the switch controller moved, in a sentence; `None` while it is on its
/// primaries.
pub fn switch_line(
    lang: Lang,
    m: &crate::switch::ModelSwitch,
    when: &dyn Fn(chrono::DateTime<chrono::Utc>) -> String,
) -> Option<String> {
    use crate::switch::Phase;
    let s = &m.serves;
    Some(match (&m.phase, lang) {
        (Phase::Primary, _) => return None,
        (Phase::Probing { backup, since }, Lang::En) => format!(
            "{s}: primaries CRITICAL, checking backup {backup} before switching (since {})",
            when(*since)
        ),
        (Phase::Probing { backup, since }, Lang::Zh) => format!(
            "{s}：主线路严重故障，切换前正在检测备用线路 {backup}（自 {}）",
            when(*since)
        ),
        (Phase::Switched { backup, since, .. }, Lang::En) => format!(
            "{s}: traffic switched to backup {backup} since {}",
            when(*since)
        ),
        (Phase::Switched { backup, since, .. }, Lang::Zh) => {
            format!("{s}：流量已切换到备用线路 {backup}（自 {}）", when(*since))
        }
        (Phase::Canary { backup, ratio, .. }, Lang::En) => format!(
            "{s}: returning to the primaries, canary at {:.0}% (the rest on backup {backup})",
            ratio * 100.0
        ),
        (Phase::Canary { backup, ratio, .. }, Lang::Zh) => format!(
            "{s}：正在灰度回切主线路，当前 {:.0}%（其余在备用线路 {backup}）",
            ratio * 100.0
        ),
    })
}

/// One active drill: `Drill 3 on qwen/cn/qwen-max: traffic moving off, stage 2/3 (25% of the
/// move to weight 0); reason: quarterly failover drill; ends at 2026-11-30 19:00 UTC`.
pub fn drill_line(
    lang: Lang,
    d: &crate::drill::Drill,
    now: chrono::DateTime<chrono::Utc>,
    when: &dyn Fn(chrono::DateTime<chrono::Utc>) -> String,
) -> String {
    let stage = d.stage(now);
    let ends = when(d.ends_at);
    match (lang, stage) {
        (Lang::En, Some(s)) => format!(
            "Drill {} on {}: traffic moving off, stage {}/{} ({}% of the move to weight {}); reason: {}; ends at {ends}",
            d.id, d.route, s.index, s.of, s.percent, d.weight, d.reason
        ),
        (Lang::En, None) => format!(
            "Drill {} on {}: ending; reason: {}; ends at {ends}",
            d.id, d.route, d.reason
        ),
        (Lang::Zh, Some(s)) => format!(
            "演练 {}：线路 {} 的流量正在迁出，第 {}/{} 阶段（已完成 {}%，目标权重 {}）；原因：{}；结束于 {ends}",
            d.id, d.route, s.index, s.of, s.percent, d.weight, d.reason
        ),
        (Lang::Zh, None) => format!(
            "演练 {}：线路 {} 即将结束；原因：{}；结束于 {ends}",
            d.id, d.route, d.reason
        ),
    }
}

/// The extra-cost budget line: `Extra cost of serving off the primaries this hour: 12.00 of
/// 300.00 (4.0%); switching allowed`.
pub fn budget(lang: Lang, b: &crate::budget::BudgetSnapshot) -> String {
    let used = b.spent + b.reserved;
    let pct = b.used_ratio * 100.0;
    let max = b.max_extra_cost_per_hour;
    match (lang, b.switching_allowed) {
        (Lang::En, true) => format!(
            "Extra cost of serving off the primaries this hour: {used:.2} of {max:.2} ({pct:.1}%); switching to backups allowed"
        ),
        (Lang::En, false) => format!(
            "Extra cost of serving off the primaries this hour: {used:.2} of {max:.2} ({pct:.1}%); no new switch until the hour turns"
        ),
        (Lang::Zh, true) => format!(
            "本小时非主线路额外成本：{used:.2} / {max:.2}（{pct:.1}%）；允许切换到备用线路"
        ),
        (Lang::Zh, false) => format!(
            "本小时非主线路额外成本：{used:.2} / {max:.2}（{pct:.1}%）；本小时内不再切换"
        ),
    }
}

/// What a heartbeat job does, in `lang` ([`crate::heartbeat::what`]).
pub fn job_what(lang: Lang, job: &str) -> Option<&'static str> {
    crate::heartbeat::what(job).map(|(en, zh)| match lang {
        Lang::En => en,
        Lang::Zh => zh,
    })
}

/// The status page's banner for a silent job: `monitoring job weights (weights publisher)
/// silent for 4 min — figures may be stale`.
pub fn stale_job(lang: Lang, s: &crate::heartbeat::Stale) -> String {
    let min = s.silent.as_secs() / 60;
    let job = match job_what(lang, &s.job) {
        Some(what) if lang == Lang::Zh => format!("{}（{what}）", s.job),
        Some(what) => format!("{} ({what})", s.job),
        None => s.job.clone(),
    };
    match lang {
        Lang::En => format!("Monitoring job {job} silent for {min} min — figures may be stale"),
        Lang::Zh => format!("监控任务 {job} 已 {min} 分钟无心跳 —— 数据可能已过时"),
    }
}

/// A maintenance window line: `in progress: qwen/* until 2026-05-01 04:00 UTC`.
pub fn maintenance(lang: Lang, active: bool, routes: &str, start: &str, end: &str) -> String {
    let t = lang.text();
    match (lang, active) {
        (Lang::En, true) => format!("{}: {routes} until {end}", t.maintenance_now),
        (Lang::En, false) => format!("{}: {routes} from {start} to {end}", t.maintenance_next),
        (Lang::Zh, true) => format!("{}：{routes}，至 {end}", t.maintenance_now),
        (Lang::Zh, false) => format!("{}：{routes}，{start} 至 {end}", t.maintenance_next),
    }
}

/// What an incident was, for the budget account: `CRITICAL, unavailable: … — probes are failing`.
pub fn incident_what(lang: Lang, peak: State, mode: Option<FailureMode>, reason: &str) -> String {
    let mut s = match lang {
        Lang::En => format!("peak {}", state(lang, peak)),
        Lang::Zh => format!("最严重 {}", state(lang, peak)),
    };
    if let Some(m) = mode {
        s.push_str(" · ");
        s.push_str(self::mode(lang, m));
    }
    if !reason.is_empty() {
        s.push_str(" · ");
        s.push_str(reason);
    }
    s
}

/// Budget left: `87.5% · 37.8 min of 43.2 min`. Overspent, the multiple of the budget spent
/// (`0% · 2.5× the budget spent`): converting an overspent fraction into minutes of a 30-day
/// window would claim thousands of minutes for a route with an hour of bad data.
pub fn budget_left(lang: Lang, fraction: f64, budget_min: f64) -> String {
    let left = fraction * budget_min;
    if fraction < 0.0 {
        let spent = 1.0 - fraction;
        return match lang {
            Lang::En => format!(
                "0% · {spent:.1}× the budget spent (budget {})",
                minutes(lang, budget_min)
            ),
            Lang::Zh => format!(
                "0% · 已用预算的 {spent:.1} 倍（预算 {}）",
                minutes(lang, budget_min)
            ),
        };
    }
    match lang {
        Lang::En => format!(
            "{:.1}% · {} of {}",
            fraction * 100.0,
            minutes(lang, left),
            minutes(lang, budget_min)
        ),
        Lang::Zh => format!(
            "{:.1}% · 剩 {}，共 {}",
            fraction * 100.0,
            minutes(lang, left),
            minutes(lang, budget_min)
        ),
    }
}

/// An incident's spend in the month: `3 m 12 s` and its share `14.8%`.
pub fn budget_spent(lang: Lang, spent_s: i64, budget_s: f64) -> String {
    let share = if budget_s > 0.0 {
        spent_s as f64 / budget_s * 100.0
    } else {
        0.0
    };
    match lang {
        Lang::En => format!("{} ({share:.1}%)", duration(lang, spent_s)),
        Lang::Zh => format!("{}（{share:.1}%）", duration(lang, spent_s)),
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
        // 25% bad against a 99.9% target: 250× the budget, not "10,756 minutes overspent".
        let fraction = 1.0 - 0.25 / 0.001;
        let en = budget_left(Lang::En, fraction, 43.2);
        assert!(en.starts_with("0% · 250.0× the budget spent"), "{en}");
        let zh = budget_left(Lang::Zh, fraction, 43.2);
        assert!(zh.contains("250.0 倍"), "{zh}");
        assert!(budget_left(Lang::En, 0.5, 43.2).starts_with("50.0% · "));
    }
}
