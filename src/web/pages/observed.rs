//! The route page's "real traffic" table: `observed` of `/api/v1/status` for the last hour and
//! the last 24 h, one line per observable.

use crate::route::Route;
use crate::web::api::{Figures, Observed, ObservedView};
use crate::web::i18n::Lang;

/// One line of the table.
pub struct ObservedLine {
    pub label: &'static str,
    pub h1: String,
    pub h24: String,
}

/// The table, or the sentence saying there was no traffic.
pub struct ObservedTable {
    pub heading: &'static str,
    pub window: &'static str,
    pub empty: Option<&'static str>,
    pub lines: Vec<ObservedLine>,
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"))
}

pub fn table(lang: Lang, route: &Route, figures: &Figures) -> ObservedTable {
    let o = Observed::of(route, &figures.observed);
    let zh = lang == Lang::Zh;
    let (heading, window, empty) = if zh {
        ("真实流量", "窗口", "过去 24 小时没有经过代理的流量。")
    } else {
        (
            "Real traffic",
            "Window",
            "No proxy traffic in the last 24 h.",
        )
    };
    if o.h1.is_none() && o.h24.is_none() {
        return ObservedTable {
            heading,
            window,
            empty: Some(empty),
            lines: Vec::new(),
        };
    }
    let currency = o.currency.clone().unwrap_or_default();
    type Cell = Box<dyn Fn(&ObservedView) -> String>;
    let rows: Vec<(&'static str, &'static str, Cell)> = vec![
        ("请求", "Requests", Box::new(|v| v.requests.to_string())),
        ("成功率", "Success", Box::new(|v| pct(v.success_ratio))),
        ("429", "429", Box::new(|v| pct(v.rate_limited_ratio))),
        ("5xx", "5xx", Box::new(|v| pct(v.server_error_ratio))),
        ("拒答率", "Refusals", Box::new(|v| pct(v.refusal_ratio))),
        (
            "首 token p50 / p95",
            "TTFT p50 / p95",
            Box::new(|v| format!("{} / {}", ms(v.ttft_ms.p50), ms(v.ttft_ms.p95))),
        ),
        (
            "每 token 耗时 p50 / p95",
            "Time per token p50 / p95",
            Box::new(|v| format!("{} / {}", ms(v.tpot_ms.p50), ms(v.tpot_ms.p95))),
        ),
        (
            "结构化输出有效率",
            "Structured output valid",
            Box::new(|v| {
                let s = &v.structured;
                format!("{} ({}/{})", pct(s.validity_ratio), s.valid, s.checked)
            }),
        ),
        (
            "每次成功的成本",
            "Cost per success",
            Box::new(move |v| {
                v.cost_per_success
                    .map_or_else(|| "-".to_owned(), |c| format!("{c:.6} {currency}"))
            }),
        ),
    ];
    let cell = |w: &Option<ObservedView>, f: &Cell| w.as_ref().map_or_else(|| "-".to_owned(), f);
    ObservedTable {
        heading,
        window,
        empty: None,
        lines: rows
            .iter()
            .map(|(z, e, f)| ObservedLine {
                label: if zh { z } else { e },
                h1: cell(&o.h1, f),
                h24: cell(&o.h24, f),
            })
            .collect(),
    }
}
