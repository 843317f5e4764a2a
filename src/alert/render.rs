//! Messages as people read them, in Chinese or English: a title, then labelled lines — what
//! happened, since when, the evidence against the baseline, the failure mode, the affected
//! logical models, traffic, the route page and the runbook. One document model, written out
//! as Markdown (DingTalk, Feishu), plain text and HTML (email).

use chrono::{DateTime, Utc};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::Digest;

use super::{Lang, Message, RenderCtx, RouteItem, Severity, Status, Subject};
use crate::health::{FailureMode, State};
use crate::route::RouteId;

mod formats;
use formats::{html, markdown, text};
// What each kind of message says first.
mod headline;
// Gathered and folded messages.
mod grouped;
pub use grouped::{FOLDED_LISTED, GROUP_LISTED};

/// Path-segment encoding: everything but unreserved characters (so `/` in ids is `%2F`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Route items listed one by one in a grouped message; the rest are counted.
const MAX_LISTED: usize = 30;

/// A message written out for one channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// `[CRITICAL] qwen/cn-beijing/qwen-max unavailable`
    pub title: String,
    /// `[probeok][CRITICAL] qwen/cn-beijing/qwen-max unavailable`
    pub subject: String,
    pub markdown: String,
    pub text: String,
    pub html: String,
}

/// `{public_url}/routes/{percent-encoded id}`.
pub fn route_url(ctx: &RenderCtx, route: &RouteId) -> String {
    format!(
        "{}/routes/{}",
        ctx.public_url,
        utf8_percent_encode(route.as_str(), SEGMENT)
    )
}

/// The runbook link for a failure mode, when one is configured.
pub fn runbook_url(ctx: &RenderCtx, mode: Option<FailureMode>) -> Option<String> {
    let url = ctx.runbook_url.as_ref()?;
    let mode = mode.map_or("unknown", FailureMode::as_str);
    Some(url.replace("{failure_mode}", mode))
}

/// A short stable digest of a key (Message-IDs, grouped keys).
pub fn key_digest(key: &str) -> String {
    let d = sha2::Sha256::digest(key.as_bytes());
    d.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// `s` cut at a character boundary to at most `max` bytes, with a note when cut.
pub fn fit_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let note = "\n\n…";
    let mut end = max.saturating_sub(note.len());
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &s[..end])
}

enum Line {
    Field(String, String),
    Link(String, String),
    Bullet(String, Option<String>),
    Para(String),
}

struct Words {
    lang: Lang,
}

impl Words {
    fn t<'a>(&self, en: &'a str, zh: &'a str) -> &'a str {
        match self.lang {
            Lang::En => en,
            Lang::Zh => zh,
        }
    }

    fn state(&self, s: State) -> String {
        match self.lang {
            Lang::En => s.as_str().to_owned(),
            Lang::Zh => {
                let zh = match s {
                    State::Unknown => "未知",
                    State::Normal => "正常",
                    State::Warning => "警告",
                    State::Degraded => "降级",
                    State::Critical => "严重",
                    State::Switched => "已切换",
                };
                format!("{zh}({})", s.as_str())
            }
        }
    }

    fn mode(&self, m: FailureMode) -> &'static str {
        match (self.lang, m) {
            (Lang::En, FailureMode::Unavailable) => "unavailable",
            (Lang::En, FailureMode::Degraded) => "degraded (slow)",
            (Lang::En, FailureMode::BehaviorChanged) => "behavior changed",
            (Lang::Zh, FailureMode::Unavailable) => "不可用",
            (Lang::Zh, FailureMode::Degraded) => "变慢",
            (Lang::Zh, FailureMode::BehaviorChanged) => "输出行为变化",
        }
    }

    fn mode_explained(&self, m: FailureMode) -> String {
        let why = match (self.lang, m) {
            (Lang::En, FailureMode::Unavailable) => {
                "connect errors, 5xx, timeouts or stalls: move traffic now"
            }
            (Lang::En, FailureMode::Degraded) => {
                "answers arrive but slowly: deweight, prepare to switch"
            }
            (Lang::En, FailureMode::BehaviorChanged) => {
                "transport fine, answers differ: possible model drift"
            }
            (Lang::Zh, FailureMode::Unavailable) => "连接错误、5xx、超时或卡住：应立即切走流量",
            (Lang::Zh, FailureMode::Degraded) => "有应答但变慢：降低权重，准备切换",
            (Lang::Zh, FailureMode::BehaviorChanged) => "网络正常但回答变了：可能是模型版本漂移",
        };
        format!("{} ({}) — {why}", self.mode(m), m.as_str())
    }

    fn time(&self, ctx: &RenderCtx, t: DateTime<Utc>) -> String {
        let local = t.with_timezone(&ctx.timezone);
        format!(
            "{} ({} UTC)",
            local.format("%Y-%m-%d %H:%M:%S %Z"),
            t.format("%H:%M:%S")
        )
    }

    fn dur(&self, secs: i64) -> String {
        let secs = secs.max(0);
        let (d, h, m, s) = (
            secs / 86400,
            secs % 86400 / 3600,
            secs % 3600 / 60,
            secs % 60,
        );
        let (ud, uh, um, us) = match self.lang {
            Lang::En => ("d", "h", "m", "s"),
            Lang::Zh => ("天", "小时", "分", "秒"),
        };
        if d > 0 {
            format!("{d}{ud}{h}{uh}")
        } else if h > 0 {
            format!("{h}{uh}{m}{um}")
        } else if m > 0 {
            format!("{m}{um}{s}{us}")
        } else {
            format!("{s}{us}")
        }
    }

    fn severity(&self, m: &Message) -> String {
        match m.status {
            Status::Resolved => self.t("RESOLVED", "已恢复").to_owned(),
            Status::Test => self.t("TEST", "测试").to_owned(),
            _ => {
                let s = m.severity.as_str().to_uppercase();
                match self.lang {
                    Lang::En => s,
                    Lang::Zh => {
                        let zh = match m.severity {
                            Severity::Critical => "严重",
                            Severity::Warning => "警告",
                            Severity::Info => "提示",
                        };
                        format!("{zh} {s}")
                    }
                }
            }
        }
    }
}

/// What a route item is in a few words: its failure mode, else its state.
fn what(w: &Words, i: &RouteItem) -> String {
    match i.failure_mode {
        Some(m) => w.mode(m).to_owned(),
        None => w.state(i.to),
    }
}

/// `NORMAL → WARNING → DEGRADED`: every state the item went through inside its window.
fn states(w: &Words, i: &RouteItem) -> String {
    i.states()
        .into_iter()
        .map(|s| w.state(s))
        .collect::<Vec<_>>()
        .join(" → ")
}

fn evidence(w: &Words, i: &RouteItem) -> Option<String> {
    let e = i.evidence.as_ref()?;
    let mut parts = Vec::new();
    if let (Some(mean), Some(sd)) = (e.baseline_mean_ms, e.baseline_stddev_ms) {
        let observed = e
            .observed_ms
            .map(|o| format!("{} {} ", w.t("latency", "延迟"), crate::health::fmt_ms(o)))
            .unwrap_or_default();
        let mut s = format!(
            "{observed}{} {}",
            w.t("vs baseline", "基线"),
            crate::health::fmt_spread(mean, sd)
        );
        let mut detail = Vec::new();
        if let Some(b) = &e.bucket {
            detail.push(format!("{} {b}", w.t("bucket", "时段")));
        }
        if let Some(n) = e.baseline_samples {
            detail.push(format!("{n} {}", w.t("samples", "个样本")));
        }
        if let Some(t) = e.threshold_ms {
            detail.push(format!(
                "{} {}",
                w.t("threshold", "阈值"),
                crate::health::fmt_ms(t)
            ));
        }
        if !detail.is_empty() {
            s.push_str(&format!(" ({})", detail.join(", ")));
        }
        parts.push(s);
    }
    if e.error_total > 0 {
        let pct = f64::from(e.error_failures) * 100.0 / f64::from(e.error_total);
        parts.push(format!(
            "{} {}/{} ({pct:.0}%) {} {}",
            w.t("failures", "失败"),
            e.error_failures,
            e.error_total,
            w.t("over", "于最近"),
            w.dur(i64::try_from(e.error_window_s).unwrap_or(i64::MAX))
        ));
    }
    if let Some(err) = &e.error {
        let status = e
            .http_status
            .map(|s| format!(" (HTTP {s})"))
            .unwrap_or_default();
        parts.push(format!("{} {err}{status}", w.t("last error", "最近错误")));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn traffic(w: &Words, items: &[RouteItem]) -> String {
    if items
        .iter()
        .any(|i| i.shifted == Some(true) || i.to == State::Switched)
    {
        w.t(
            "shifted to other routes (SWITCHED)",
            "已切换到其他线路(SWITCHED)",
        )
        .to_owned()
    } else if items.iter().any(|i| i.shifted == Some(false)) {
        w.t("not shifted", "未切换").to_owned()
    } else {
        w.t(
            "not shifted (unknown: no switch controller reports it yet)",
            "未切换(未知：尚无切换控制器上报)",
        )
        .to_owned()
    }
}

fn affects(items: &[RouteItem]) -> String {
    let mut all: Vec<&str> = items
        .iter()
        .flat_map(|i| i.serves.iter().map(String::as_str))
        .collect();
    all.sort_unstable();
    all.dedup();
    if all.is_empty() {
        "-".to_owned()
    } else {
        all.join(", ")
    }
}

/// Writes `m` for a channel in `lang`.
pub fn render(m: &Message, lang: Lang, ctx: &RenderCtx) -> Rendered {
    let w = Words { lang };
    let headline = headline::headline(&w, m);
    let reminder = if m.status == Status::Reminder {
        w.t(" (still firing)", "(仍在告警)")
    } else {
        ""
    };
    let tag = w.severity(m);
    let title = format!("[{tag}] {headline}{reminder}");
    let subject = match m.status {
        Status::Resolved => format!("[probeok][RESOLVED] {headline}"),
        Status::Test => format!("[probeok][TEST] {headline}"),
        Status::Reminder => format!(
            "[probeok][{}][REMINDER] {headline}",
            m.severity.as_str().to_uppercase()
        ),
        Status::Firing => format!(
            "[probeok][{}] {headline}",
            m.severity.as_str().to_uppercase()
        ),
    };

    let mut lines = Vec::new();
    if let Some(note) = &m.note {
        lines.push(Line::Para(note.clone()));
    }
    match (&m.subject, m.items.as_slice()) {
        (Subject::Test, _) => {
            lines.push(Line::Field(
                w.t("Sent at", "发送时间").into(),
                w.time(ctx, m.at),
            ));
        }
        (Subject::Heartbeat { silent_s, .. }, _) => {
            if m.status == Status::Resolved {
                lines.push(Line::Field(
                    w.t("Beating since", "恢复时间").into(),
                    w.time(ctx, m.at),
                ));
            } else {
                let since = m.at - chrono::Duration::seconds(i64::try_from(*silent_s).unwrap_or(0));
                lines.push(Line::Field(
                    w.t("Silent since", "无心跳起始").into(),
                    w.time(ctx, since),
                ));
                lines.push(Line::Para(
                    w.t(
                        "Until it beats again, what it feeds (status page, weights, alerts) may be out of date. Check the probeok log; GET /readyz names every silent job.",
                        "恢复心跳之前，它负责的内容（状态页、权重、告警）可能已过时。请查看 probeok 日志；GET /readyz 会列出所有无心跳的任务。",
                    )
                    .into(),
                ));
            }
        }
        (Subject::Grouped { .. }, _) => grouped::lines(&w, ctx, m, &mut lines),
        (Subject::Folded { .. }, _) => grouped::folded_lines(&w, ctx, m, &mut lines),
        (_, []) => {
            lines.push(Line::Field(
                w.t("Since", "开始时间").into(),
                w.time(ctx, m.at),
            ));
            for r in m.related.iter().take(MAX_LISTED) {
                lines.push(Line::Bullet(r.to_string(), Some(route_url(ctx, r))));
            }
            if m.related.len() > MAX_LISTED {
                lines.push(Line::Para(format!("… +{}", m.related.len() - MAX_LISTED)));
            }
            if matches!(m.subject, Subject::Egress { .. }) && m.status != Status::Resolved {
                lines.push(Line::Para(
                    w.t(
                        "Per-route alerts for these routes are held back: check our own network first.",
                        "这些线路的单独告警已被抑制：请先检查本机网络。",
                    )
                    .to_owned(),
                ));
            }
        }
        (_, [one]) => item_lines(&w, ctx, m, one, &mut lines),
        (_, items) => {
            let since = items
                .iter()
                .map(|i| i.opened_at.unwrap_or(i.at))
                .min()
                .unwrap_or(m.at);
            lines.push(Line::Field(
                w.t("Since", "开始时间").into(),
                w.time(ctx, since),
            ));
            for i in items.iter().take(MAX_LISTED) {
                let mut s = format!("{}: {}", i.route, states(&w, i));
                if m.status == Status::Resolved {
                    if let (Some(o), Some(c)) = (i.opened_at, i.closed_at) {
                        s.push_str(&format!(
                            ", {} {}",
                            w.t("lasted", "持续"),
                            w.dur((c - o).num_seconds())
                        ));
                    }
                } else {
                    if let Some(fm) = i.failure_mode {
                        s.push_str(&format!(", {}", w.mode(fm)));
                    }
                    if !i.reason_text.is_empty() {
                        s.push_str(&format!(" — {}", i.reason_text));
                    }
                }
                lines.push(Line::Bullet(s, Some(route_url(ctx, &i.route))));
            }
            if items.len() > MAX_LISTED {
                lines.push(Line::Para(match lang {
                    Lang::En => format!("… and {} more routes", items.len() - MAX_LISTED),
                    Lang::Zh => format!("… 另有 {} 条线路", items.len() - MAX_LISTED),
                }));
            }
            if let Some(fm) = items.iter().find_map(|i| i.failure_mode) {
                lines.push(Line::Field(
                    w.t("Failure mode", "故障类型").into(),
                    w.mode_explained(fm),
                ));
            }
            lines.push(Line::Field(
                w.t("Affects", "影响的逻辑模型").into(),
                affects(items),
            ));
            if m.status != Status::Resolved {
                lines.push(Line::Field(
                    w.t("Traffic", "流量").into(),
                    traffic(&w, items),
                ));
            }
            if let Some(url) = runbook_url(ctx, items.iter().find_map(|i| i.failure_mode)) {
                lines.push(Line::Link(w.t("Runbook", "处理手册").into(), url));
            }
        }
    }
    if let Subject::Drift(d) = &m.subject {
        drift_lines(&w, d, &mut lines);
    }
    if let Subject::BurnRate(b) = &m.subject {
        lines.push(Line::Field(
            w.t("Burn rate", "消耗速率").into(),
            format!(
                "{:.1}× / {} {} {:.1}× / {} ({} {:.3}%, {} {}/{})",
                b.burn_long,
                w.dur(b.long_window_s),
                w.t("and", "且"),
                b.burn_short,
                w.dur(b.short_window_s),
                w.t("SLO", "SLO"),
                b.slo * 100.0,
                w.t("failures", "失败"),
                b.failures,
                b.total
            ),
        ));
    }
    let markdown = markdown(&title, &lines);
    let text = text(&title, &lines);
    let html = html(&title, &lines);
    Rendered {
        title,
        subject,
        markdown,
        text,
        html,
    }
}

/// A drift finding's evidence: pass rates before/after with sample sizes, the test's p-value,
/// the model change, and a couple of example answers (bounded by [`super::DriftAlert`]).
fn drift_lines(w: &Words, d: &super::DriftAlert, lines: &mut Vec<Line>) {
    let rate = |passed: u64, total: u64| {
        if total == 0 {
            "-".to_owned()
        } else {
            format!(
                "{:.0}% ({passed}/{total})",
                100.0 * passed as f64 / total as f64
            )
        }
    };
    if d.kind == "capability_lost" {
        lines.push(Line::Field(
            w.t("Failed probes in a row", "连续失败的能力探测").into(),
            d.after_total.to_string(),
        ));
        lines.push(Line::Field(
            w.t("Chat", "对话").into(),
            w.t(
                "still answers: the route's state and weight are unchanged",
                "仍正常：线路状态与权重不变",
            )
            .into(),
        ));
        return;
    }
    if d.kind == "long_prompt_slow" {
        lines.push(Line::Field(
            w.t("Route state", "线路状态").into(),
            w.t(
                "unchanged: short requests answer as usual; only long contexts wait",
                "不变：短请求正常，仅长上下文等待变长",
            )
            .into(),
        ));
        return;
    }
    if d.kind == "embedding_changed" {
        lines.push(Line::Field(
            w.t("What to do", "处理建议").into(),
            w.t(
                "vectors from this route no longer match indexes built with it: re-index, or pin the old model; once the change is intended, replace the reference (POST /api/v1/admin/routes/{route}/embedding-reference)",
                "该线路的新向量与已建索引不再匹配：重建索引或固定旧模型；确认变更是预期的之后，替换基准（POST /api/v1/admin/routes/{route}/embedding-reference）",
            )
            .into(),
        ));
    } else if d.kind != "model_changed" {
        lines.push(Line::Field(
            w.t("Pass rate", "通过率").into(),
            format!(
                "{} {} → {} {}",
                w.t("before", "之前"),
                rate(d.before_passed, d.before_total),
                w.t("after", "之后"),
                rate(d.after_passed, d.after_total)
            ),
        ));
        if let Some(p) = d.p_value {
            lines.push(Line::Field(
                w.t("p-value", "p 值").into(),
                format!("{p:.2e} ({})", d.test),
            ));
        }
    }
    if d.before_model.is_some() || d.after_model.is_some() {
        lines.push(Line::Field(
            w.t("Reported model", "上报模型").into(),
            format!(
                "{} → {}",
                d.before_model.as_deref().unwrap_or("-"),
                d.after_model.as_deref().unwrap_or("-")
            ),
        ));
    }
    for x in &d.examples {
        lines.push(Line::Bullet(
            format!(
                "{}: {} {:?} → {} {:?}",
                x.case,
                w.t("before", "之前"),
                x.before.as_deref().unwrap_or("-"),
                w.t("after", "之后"),
                x.after.as_deref().unwrap_or("-")
            ),
            None,
        ));
    }
}

fn item_lines(w: &Words, ctx: &RenderCtx, m: &Message, i: &RouteItem, lines: &mut Vec<Line>) {
    let what_happened = if m.status == Status::Resolved || i.reason_text.is_empty() {
        states(w, i)
    } else {
        format!("{}: {}", states(w, i), i.reason_text)
    };
    lines.push(Line::Field(
        w.t("What happened", "发生了什么").into(),
        what_happened,
    ));
    if m.status == Status::Resolved {
        if let Some(o) = i.opened_at {
            let closed = i.closed_at.unwrap_or(i.at);
            lines.push(Line::Field(
                w.t("Duration", "持续时间").into(),
                format!(
                    "{} ({} → {})",
                    w.dur((closed - o).num_seconds()),
                    w.time(ctx, o),
                    w.time(ctx, closed)
                ),
            ));
        }
        if let Some(p) = i.peak {
            let sev = Severity::of_state(p).map_or("-", Severity::as_str);
            lines.push(Line::Field(
                w.t("Peak", "最严重状态").into(),
                format!("{} ({sev})", w.state(p)),
            ));
        }
    } else {
        let since = i.opened_at.unwrap_or(i.at);
        let mut s = w.time(ctx, since);
        let for_s = (m.at - since).num_seconds();
        if for_s > 0 {
            s.push_str(&format!(", {} {}", w.t("for", "已持续"), w.dur(for_s)));
        }
        lines.push(Line::Field(w.t("Since", "开始时间").into(), s));
        if let Some(e) = evidence(w, i) {
            lines.push(Line::Field(w.t("Evidence", "证据").into(), e));
        }
        if let Some(fm) = i.failure_mode {
            lines.push(Line::Field(
                w.t("Failure mode", "故障类型").into(),
                w.mode_explained(fm),
            ));
        }
    }
    lines.push(Line::Field(
        w.t("Affects", "影响的逻辑模型").into(),
        affects(std::slice::from_ref(i)),
    ));
    if m.status != Status::Resolved {
        lines.push(Line::Field(
            w.t("Traffic", "流量").into(),
            traffic(w, std::slice::from_ref(i)),
        ));
    }
    lines.push(Line::Link(
        w.t("Route", "线路详情").into(),
        route_url(ctx, &i.route),
    ));
    if let Some(url) = runbook_url(ctx, i.failure_mode) {
        lines.push(Line::Link(w.t("Runbook", "处理手册").into(), url));
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratelimit_low_is_one_keyed_warning_written_in_both_languages() {
        let route = RouteId::new("openai", "us", "gpt-4o");
        let at = chrono::DateTime::UNIX_EPOCH;
        let event = |firing| crate::health::HealthEvent::RateLimitLow {
            route: route.clone(),
            limit: "tokens".into(),
            quota: crate::ratelimit::Quota {
                remaining: 20,
                limit: 1000,
            },
            firing,
            at,
        };
        let mut g = super::super::group::Grouper::new(std::time::Duration::ZERO, &[]);
        g.push(event(true), at);
        g.push(event(false), at);
        let drafts = g.flush(at);
        assert_eq!(drafts.len(), 2);
        let key = super::super::group::ratelimit_low_key(&route, "tokens");
        assert!(drafts
            .iter()
            .all(|d| d.key.as_deref() == Some(key.as_str())));
        let (fire, resolve) = (&drafts[0].message, &drafts[1].message);
        assert_eq!(fire.severity, Severity::Warning);
        assert_eq!(fire.related, vec![route.clone()]);
        assert_eq!(fire.note.as_deref(), Some("tokens: 20 of 1000 left (2.0%)"));
        let ctx = RenderCtx {
            public_url: "http://status.example".into(),
            runbook_url: None,
            timezone: chrono_tz::UTC,
        };
        let title = |m, lang| render(m, lang, &ctx).title;
        assert_eq!(
            title(fire, Lang::En),
            "[WARNING] openai/us/gpt-4o: under 10% of the tokens rate limit left for 5 minutes (ratelimit_low)"
        );
        assert!(title(fire, Lang::Zh).contains("限流余量低于 10%"));
        assert!(title(resolve, Lang::En).contains("tokens rate limit has headroom again"));
        assert!(title(resolve, Lang::Zh).contains("限流余量已恢复"));
    }

    #[test]
    fn upstream_text_cannot_build_links_html_or_mentions_in_markdown() {
        let hostile =
            "boom [click](http://evil.example) <at id=all></at> **bold** `code`\n### heading";
        let md = markdown(
            "t",
            &[
                Line::Field("What".into(), hostile.into()),
                Line::Bullet(hostile.into(), Some("http://status.example/r".into())),
                Line::Para(hostile.into()),
            ],
        );
        assert!(!md.contains("[click]"), "{md}");
        assert!(!md.contains("<at"), "{md}");
        assert!(!md.contains("**bold**"), "{md}");
        assert!(!md.contains('`'), "{md}");
        assert!(!md.contains("\n### heading"), "{md}");
        // Our own formatting survives: the field's key and the bullet's link.
        assert!(md.contains("**What**: boom"), "{md}");
        assert!(md.contains("](http://status.example/r)"), "{md}");
    }
}
