//! The drill report for people (`probeok drill report`): the drill's record, the verdict and
//! its findings, then the figures of the proxy, the drilled route and each backup.

use chrono::{DateTime, Utc};

use super::{ms, pct, Report};
use crate::drill::Drill;

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "–".to_owned(), pct)
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The report for people (`probeok drill report`), with the drill's record on top.
pub fn render_text(drill: &Drill, r: &Report) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "drill {} on {} ({}): {}",
        drill.id, drill.route, drill.serves, drill.reason
    ));
    let ramp: Vec<String> = drill.ramp.iter().map(|p| format!("{p}%")).collect();
    line(format!(
        "  target weight {}, ramp {}, {}{}",
        drill.weight,
        ramp.join(" → "),
        drill
            .started_by
            .as_deref()
            .map_or_else(|| "started by ?".to_owned(), |w| format!("started by {w}")),
        if drill.forced { ", forced" } else { "" }
    ));
    let ended = match (drill.ended_at, drill.ended_by) {
        (Some(at), Some(by)) => format!(
            "ended {} ({}{})",
            when(at),
            by.as_str(),
            drill
                .stopped_by
                .as_deref()
                .map(|w| format!(" by {w}"))
                .unwrap_or_default()
        ),
        _ => format!("running, ends {}", when(drill.ends_at)),
    };
    line(format!(
        "  window {} → {}; {ended}",
        when(r.window.from),
        when(r.window.to)
    ));
    line(String::new());
    line(format!("verdict: {}", r.verdict.line));
    for f in &r.verdict.findings {
        line(format!("  - {f}"));
    }
    line(String::new());
    let q = &r.requests;
    line(format!(
        "proxy requests for {}: {} total, {} ok ({}), {} fallback(s)",
        r.serves,
        q.total,
        q.ok,
        rate(q.success_rate),
        q.fallbacks
    ));
    if !q.by_route.is_empty() {
        let by: Vec<String> = q.by_route.iter().map(|(k, v)| format!("{k} {v}")).collect();
        line(format!("  answered by: {}", by.join(", ")));
    }
    let contracts = if q.contracts.is_empty() {
        "none".to_owned()
    } else {
        q.contracts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    line(format!("  contract uses: {contracts}"));
    line(String::new());
    let d = &r.drilled;
    line(format!(
        "drilled route {}: {} probes, success {}, {} wrong answer(s), p50 {} p95 {}",
        d.route,
        d.probes,
        rate(d.success_rate),
        d.validation_failures,
        ms(d.latency_ms.p50),
        ms(d.latency_ms.p95)
    ));
    for b in &r.backups {
        let f = &b.figures;
        line(format!(
            "backup {}: {} probes, success {}, {} wrong answer(s)",
            f.route,
            f.probes,
            rate(f.success_rate),
            f.validation_failures
        ));
        let hours: Vec<String> = b
            .baseline
            .hours
            .iter()
            .map(|h| format!("{h:02}h"))
            .collect();
        line(format!(
            "  latency p50 {} p95 {}; baseline ({}, hours {}, {} samples) p50 {} p95 {}{}",
            ms(f.latency_ms.p50),
            ms(f.latency_ms.p95),
            b.baseline.source,
            hours.join(","),
            b.baseline.samples,
            ms(b.baseline.latency_ms.p50),
            ms(b.baseline.latency_ms.p95),
            b.p95_vs_baseline
                .map(|x| format!(" → p95 {x:.2}× baseline"))
                .unwrap_or_default()
        ));
        if b.regression.is_empty() {
            line("  regression sets: no run during the drill".to_owned());
        }
        for s in &b.regression {
            line(format!(
                "  regression set {}: {}/{} passed ({}) in {} run(s) vs {}/{} ({}) in {} run(s) before{}",
                s.set,
                s.during.passed,
                s.during.cases,
                rate(s.during.rate),
                s.during.runs,
                s.history.passed,
                s.history.cases,
                rate(s.history.rate),
                s.history.runs,
                s.p_value.map(|p| format!(", p = {p:.3}")).unwrap_or_default()
            ));
        }
    }
    out
}
