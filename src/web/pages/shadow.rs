//! The "ready to enter the pool?" box on a shadow route's page: over the last day, the shadow's
//! success and structured-output validity against the real route's on the same requests.
//! Route pages are public, so the box shows counts and ratios only — never content.

use serde_json::Value;

use super::i18n::Lang;
use crate::route::RouteId;

pub struct ShadowBox {
    pub heading: &'static str,
    pub lines: Vec<String>,
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |x| format!("{:.1}%", x * 100.0))
}

fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |x| format!("{x:.0} ms"))
}

/// The box for `route` when a `[[shadow]]` names it (`report`: the proxy's shadow report).
pub fn shadow_box(lang: Lang, report: &[Value], route: &RouteId) -> Option<ShadowBox> {
    let entry = report
        .iter()
        .find(|e| e["route"].as_str() == Some(route.as_str()))?;
    let d = &entry["last_day"];
    let serves = entry["serves"].as_str().unwrap_or_default();
    let compared = d["compared"].as_u64().unwrap_or(0);
    let copied = d["copied"].as_u64().unwrap_or(0);
    let (sp, ss) = (
        pct(&d["success_ratio"]["primary"]),
        pct(&d["success_ratio"]["shadow"]),
    );
    let (vp, vs) = (
        pct(&d["validity"]["primary"]),
        pct(&d["validity"]["shadow"]),
    );
    let checked = d["validity"]["checked"].as_u64().unwrap_or(0);
    let (lp, ls) = (
        ms(&d["latency_ms_p50"]["primary"]),
        ms(&d["latency_ms_p50"]["shadow"]),
    );
    Some(match lang {
        Lang::En => ShadowBox {
            heading: "Shadow: ready to enter the pool?",
            lines: vec![
                format!(
                    "Shadows {serves}; last 24 h: {copied} requests copied, {compared} compared."
                ),
                format!("Success: shadow {ss} against the pool's {sp} on the same requests."),
                format!("Structured output valid ({checked} checked): shadow {vs} against {vp}."),
                format!("Latency p50: shadow {ls} against {lp}."),
            ],
        },
        Lang::Zh => ShadowBox {
            heading: "影子流量：可以进入路由池了吗？",
            lines: vec![
                format!(
                    "影子跟随 {serves}；最近 24 小时：复制 {copied} 个请求，比较 {compared} 个。"
                ),
                format!("成功率：影子 {ss}，同样请求下现有路由 {sp}。"),
                format!("结构化输出有效（检查 {checked} 个）：影子 {vs}，现有路由 {vp}。"),
                format!("延迟 p50：影子 {ls}，现有路由 {lp}。"),
            ],
        },
    })
}
