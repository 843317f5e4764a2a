//! The sentences the pages build with numbers and names: reasons, evidence, findings, the
//! switch, drill, budget and maintenance lines.

use super::*;

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
        "capability_lost" if en => {
            format!("the declared {detail} capability fails while chat still answers")
        }
        "capability_lost" => format!("对话正常，但声明的 {detail} 能力失效"),
        "answer_changed" if en => "answers are no longer exactly PROBE_OK".into(),
        "answer_changed" => "回答不再是 PROBE_OK".into(),
        "max_tokens_exhausted" if en => {
            "max_tokens ran out before any answer (the model spent it reasoning): raise max_tokens for this route".into()
        }
        "max_tokens_exhausted" => "max_tokens 在给出回答前耗尽（模型用在了推理上）：请调高该线路的 max_tokens".into(),
        "recovered" if en => "recovered: recent observations are normal".into(),
        "recovered" => "已恢复：最近的观测都正常".into(),
        "baseline_ready" if en => "enough samples to judge latency".into(),
        "baseline_ready" => "样本已足够，开始按基线判断延迟".into(),
        "ttft_above_baseline" if en => "the first token comes later than its baseline".into(),
        "ttft_above_baseline" => "首个 token 比基线来得晚".into(),
        "ttft_and_tps_off_baseline" if en => {
            "the first token is late and output is slower than normal".into()
        }
        "ttft_and_tps_off_baseline" => "首个 token 来得晚，输出速度也低于正常".into(),
        "abnormal" if en => "observations are abnormal".into(),
        "abnormal" => "观测异常".into(),
        "shared_cause" if en => detail.to_owned(),
        "shared_cause" => match crate::health::cause::parts(detail) {
            Some((class, host, routes, on)) => format!(
                "{host} 的 {routes} 条线路同样{}（已由其中 {on} 条确认）：按共同原因判定",
                crate::health::cause::class_zh(class)
            ),
            None => "与同一端点的多条线路同因失败：按共同原因判定".into(),
        },
        // The quorum's own codes: the English detail names the vantages and their count.
        "quorum_normal" | "vantages_unknown" | "quorum" if en => detail.to_owned(),
        "quorum_normal" => match quorum_counts(detail) {
            Some((n, m, who)) if !who.is_empty() => {
                format!("{m} 个探测点中有 {n} 个（{who}）看到该线路正常")
            }
            _ => "多数探测点看到该线路正常".into(),
        },
        "vantages_unknown" => match quorum_counts(detail) {
            Some((n, m, _)) => {
                format!("{m} 个探测点中只有 {n} 个已判断该线路：不足以判定状态")
            }
            None => "还没有足够的探测点判断该线路".into(),
        },
        "quorum" => match quorum_counts(detail) {
            Some((n, m, who)) if !who.is_empty() => {
                format!("{m} 个探测点中有 {n} 个（{who}）看到该线路异常")
            }
            _ => "多个探测点一致看到该线路异常".into(),
        },
        _ => detail.to_owned(),
    }
}

/// Both latency signals against their normals, the one that moved named by what it reads:
/// "first token 13.0 s against a normal of 0.9 s · tokens/s 48 against 50". `None` when
/// neither was measured.
pub fn split(lang: Lang, s: &crate::health::Split) -> Option<String> {
    let en = lang == Lang::En;
    let ttft = s.ttft.as_ref().map(|t| {
        let (now, normal) = (fmt_ms(t.observed_ms), fmt_ms(t.mean_ms));
        if en {
            format!("first token {now} against a normal of {normal}")
        } else {
            format!("首 token {now}，正常水平为 {normal}")
        }
    });
    let tps = s.tps.as_ref().map(|t| {
        let (now, normal) = (t.observed.round(), t.mean.round());
        if en {
            format!("tokens/s {now:.0} against {normal:.0}")
        } else {
            format!("每秒 token {now:.0}，正常为 {normal:.0}")
        }
    });
    let parts: Vec<String> = ttft.into_iter().chain(tps).collect();
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// The uptime part of a day bar's tooltip, `100%`, `99.82%` or "no data", written where it is
/// shown: a page draws 90 of them a route, and only the days that are not normal show theirs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DayUptime {
    pub lang: Lang,
    pub ratio: Option<f64>,
}

impl std::fmt::Display for DayUptime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ratio {
            Some(r) if r >= 1.0 => f.write_str("100%"),
            Some(r) => Percent(r).fmt(f),
            None => f.write_str(self.lang.text().no_data),
        }
    }
}

/// `99.95%`: two decimals, three when it would round to 100% without being it.
pub fn percent(ratio: f64) -> String {
    Percent(ratio).to_string()
}

/// [`percent`], written in place.
pub struct Percent(pub f64);

impl std::fmt::Display for Percent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.0 * 100.0;
        // In hundredths, away from a tie and from 100, integers say what `{:.2}` would, at a
        // fraction of its cost (a page writes thousands of these).
        let hundredths = p * 100.0;
        if (0.0..9999.0).contains(&hundredths) && (hundredths.fract() - 0.5).abs() > 1e-6 {
            let n = hundredths.round() as u32;
            return write!(f, "{}.{:02}%", n / 100, n % 100);
        }
        // Only values this close to 100 can round up to it; the text decides, as shown.
        if (99.99..100.0).contains(&p) && format!("{p:.2}") == "100.00" {
            write!(f, "{p:.3}%")
        } else {
            write!(f, "{p:.2}%")
        }
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

/// The counts in the quorum's English sentence ("2 of 3 vantages (a, b) see …", "1 of 2
/// vantages have judged …"): (agreeing, of, names joined with 、).
fn quorum_counts(detail: &str) -> Option<(u32, u32, String)> {
    let (n, rest) = detail.split_once(" of ")?;
    let (m, rest) = rest.split_once(" vantage")?;
    let rest = rest.strip_prefix('s').unwrap_or(rest);
    let who = (rest.strip_prefix(" ("))
        .and_then(|r| r.split_once(')'))
        .map(|(w, _)| w.replace(", ", "、"))
        .unwrap_or_default();
    Some((n.trim().parse().ok()?, m.trim().parse().ok()?, who))
}

/// Names shown in a finding before "and N more".
const FINDING_NAMES: usize = 5;

/// `names` joined, the first [`FINDING_NAMES`] of them and how many more.
fn name_list(lang: Lang, names: &[&str]) -> String {
    let shown = &names[..names.len().min(FINDING_NAMES)];
    let more = names.len() - shown.len();
    match (lang, more) {
        (Lang::En, 0) => shown.join(", "),
        (Lang::En, n) => format!("{} and {n} more", shown.join(", ")),
        (Lang::Zh, 0) => shown.join("、"),
        (Lang::Zh, n) => format!("{} 等 {} 个", shown.join("、"), shown.len() + n),
    }
}

/// A finding in plain words, naming its routes and who sees it: the vantages for a
/// vantage's finding, the providers for the others.
pub fn finding(lang: Lang, f: &crate::health::Finding) -> String {
    let t = lang.text();
    let base = match f.kind {
        FindingKind::Egress => t.finding_egress,
        FindingKind::RequestSide => t.finding_request_side,
        FindingKind::VantageLocal => t.finding_vantage_local,
        FindingKind::VantageStale => t.finding_vantage_stale,
    };
    let by_vantage = matches!(
        f.kind,
        FindingKind::VantageLocal | FindingKind::VantageStale
    );
    let who: Vec<&str> = f.providers.iter().map(String::as_str).collect();
    let routes: Vec<&str> = f.routes.iter().map(|r| r.as_str()).collect();
    let plural = |n: usize, one: &'static str, many: &'static str| if n == 1 { one } else { many };
    let mut parts = Vec::new();
    match lang {
        Lang::En => {
            if !who.is_empty() {
                let label = if by_vantage {
                    plural(who.len(), "vantage", "vantages")
                } else {
                    plural(who.len(), "provider", "providers")
                };
                parts.push(format!("{label} {}", name_list(lang, &who)));
            }
            if !routes.is_empty() {
                let label = plural(routes.len(), "route", "routes");
                parts.push(format!("{label} {}", name_list(lang, &routes)));
            }
            if parts.is_empty() {
                base.to_owned()
            } else {
                format!("{base} ({})", parts.join("; "))
            }
        }
        Lang::Zh => {
            if !who.is_empty() {
                let label = if by_vantage { "探测点" } else { "供应商" };
                parts.push(format!("{label}：{}", name_list(lang, &who)));
            }
            if !routes.is_empty() {
                parts.push(format!("线路：{}", name_list(lang, &routes)));
            }
            if parts.is_empty() {
                base.to_owned()
            } else {
                format!("{base}（{}）", parts.join("；"))
            }
        }
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
pub fn budget(lang: Lang, b: &crate::extra_cost::ExtraCostSnapshot) -> String {
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

/// Error budget left with the bad time it was measured by: `96.5% · 1 m 30 s bad of 43.2 min`.
/// Overspent, the multiple of the budget spent (`0% · 1 h 48 m bad, 2.5× the budget of
/// 43.2 min`): the bad time is what was measured, the multiple says how far past it that is.
pub fn budget_left(lang: Lang, b: &crate::slo::ErrorBudget) -> String {
    let bad = duration(lang, b.bad_seconds.round() as i64);
    let budget = minutes(lang, b.budget_seconds / 60.0);
    let fraction = b.error_budget_remaining;
    if fraction < 0.0 {
        let spent = b.spent();
        return match lang {
            Lang::En => format!("0% · {bad} bad, {spent:.1}× the budget of {budget}"),
            Lang::Zh => format!("0% · 不可用 {bad}，为预算 {budget} 的 {spent:.1} 倍"),
        };
    }
    match lang {
        Lang::En => format!("{:.1}% · {bad} bad of {budget}", fraction * 100.0),
        Lang::Zh => format!("{:.1}% · 不可用 {bad}，预算 {budget}", fraction * 100.0),
    }
}

/// Under a model on `/` whose routes are not all drawn (the page draws the worst lines only).
pub fn more_routes(lang: Lang, more: usize, drawn: usize) -> String {
    match (lang, drawn) {
        (Lang::En, 0) => {
            format!("{more} routes, none of them among the worst listed above: list them")
        }
        (Lang::En, _) => {
            format!("{more} more routes of this model, better than those above: list them all")
        }
        (Lang::Zh, 0) => format!("{more} 条线路，均不在上方列出的最差线路之中：查看"),
        (Lang::Zh, _) => format!("该模型另有 {more} 条线路，状态好于上方线路：查看全部"),
    }
}

/// Under the active incidents on `/` when it lists only the oldest.
pub fn more_incidents(lang: Lang, n: usize) -> String {
    match lang {
        Lang::En => format!("and {n} more active incidents: the incidents page lists them all"),
        Lang::Zh => format!("另有 {n} 个进行中的事件：事件页面列出全部"),
    }
}

/// One line of `/`'s active incidents for the routes of one shared cause.
pub fn cause_routes(lang: Lang, cause: &str, n: usize) -> String {
    match lang {
        Lang::En => format!("{n} routes with one cause: {cause}"),
        Lang::Zh => format!("{n} 条线路同因：{cause}"),
    }
}

/// At the end of `/` when more models than it lists are left out.
pub fn hidden_models(lang: Lang, n: usize) -> String {
    match lang {
        Lang::En => format!("{n} more models, all better than those listed: filter by route id or model to see them."),
        Lang::Zh => format!("另有 {n} 个模型未列出，状态均好于上方：按线路 ID 或模型筛选即可查看。"),
    }
}

/// `/` filtered to one logical model.
pub fn model_filter(lang: Lang, model: &str) -> String {
    match lang {
        Lang::En => format!("model {model} only"),
        Lang::Zh => format!("仅显示模型 {model}"),
    }
}

/// What the demo's simulated history is, on every page while the demo's database has one.
pub fn demo_history(lang: Lang, days: i64, to: &str) -> String {
    match lang {
        Lang::En => format!(
            "the {days} days before {to} are simulated: the built-in demo wrote them on its first start from its fault scenarios, sampled (a few minutes of probing per hour, twenty without a gap around each fault), so the day bars, uptime, incidents and error budget have a past. An incident of that past stays open until a later sample sees the route recover, so it can last an hour while the error budget it spends counts only the probes that failed. Everything after is live."
        ),
        Lang::Zh => format!(
            "{to} 之前的 {days} 天为模拟数据：内置演示在首次启动时按其故障场景抽样生成（每小时探测几分钟，故障前后连续探测二十分钟），让日线、可用率、事件和错误预算有历史可看。历史中的事件要等之后的抽样看到路由恢复才关闭，因此可能持续一小时，而它消耗的错误预算只计失败的探测。此后的数据均为实时。"
        ),
    }
}

/// A route's probing per month: `1,234,000 tokens · 0.42 CNY` (no price: the tokens alone).
pub fn probe_cost(lang: Lang, c: &crate::probe::cost::ProbeCostView) -> String {
    let tokens = thousands(c.tokens_per_month);
    let money = c
        .cost_per_month
        .zip(c.currency.as_deref())
        // Cents hide a probe budget of a few hundredths of a yuan: keep four places below 0.01.
        .map(|(m, cur)| {
            if m >= 0.01 || m == 0.0 {
                format!(" · {m:.2} {cur}")
            } else {
                format!(" · {m:.4} {cur}")
            }
        });
    match (lang, money) {
        (Lang::En, Some(m)) => format!("{tokens} tokens{m}"),
        (Lang::En, None) => format!("{tokens} tokens (no price configured)"),
        (Lang::Zh, Some(m)) => format!("{tokens} token{m}"),
        (Lang::Zh, None) => format!("{tokens} token（未配置价格）"),
    }
}

/// An embeddings route's `kind` line: what is probed and what a changed model looks like.
pub fn embedding_kind(lang: Lang, dimensions: u32) -> String {
    match lang {
        Lang::En => format!(
            "embeddings, {dimensions} dimensions: each probe's vector is compared with the route's reference; below cosine 0.999 the model changed under the same name (embedding_changed)"
        ),
        Lang::Zh => format!(
            "向量模型（embeddings），{dimensions} 维：每次探测的向量都与该线路的基准向量比对；余弦相似度低于 0.999 即同名之下模型已被更换（embedding_changed）"
        ),
    }
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
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

    /// What `percent` wrote before its integer path: the formatter's own rounding.
    fn by_the_formatter(ratio: f64) -> String {
        let p = ratio * 100.0;
        if p < 100.0 && format!("{p:.2}") == "100.00" {
            format!("{p:.3}%")
        } else {
            format!("{p:.2}%")
        }
    }

    #[test]
    fn percent_writes_what_the_formatter_rounds_to() {
        for n in 1..=1500u32 {
            for k in 0..=n {
                let r = f64::from(k) / f64::from(n);
                assert_eq!(percent(r), by_the_formatter(r), "{k}/{n}");
            }
        }
        for r in [
            0.0, 1.0, 0.99995, 0.999949, 0.00005, 0.000049, 0.125, 1.5e-9,
        ] {
            assert_eq!(percent(r), by_the_formatter(r), "{r}");
        }
        assert_eq!(percent(0.99996), "99.996%");
        assert_eq!(percent(0.5), "50.00%");
    }

    #[test]
    fn a_shared_cause_reads_in_both_languages() {
        let detail = "connection refused at api.example.com for 9,997 routes, confirmed on 3";
        let f = ReasonFigures::default();
        assert_eq!(reason(Lang::En, "shared_cause", &f, detail), detail);
        assert_eq!(
            reason(Lang::Zh, "shared_cause", &f, detail),
            "api.example.com 的 9,997 条线路同样连接被拒绝（已由其中 3 条确认）：按共同原因判定"
        );
        let auth = "HTTP 401 (key refused) at api.example.com for 20 routes, confirmed on 2";
        assert!(reason(Lang::Zh, "shared_cause", &f, auth).contains("返回 HTTP 401（密钥被拒）"));
    }
}
