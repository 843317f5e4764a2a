//! The route page's 24 h latency chart, drawn as inline SVG data (no script): p50/p95 lines
//! over the baseline band, round grid steps, hour ticks.

use super::*;

/// One point of the chart's y axis.
pub struct GridLine {
    pub y: String,
    pub text_y: String,
    pub label: String,
}

pub struct XTick {
    pub x: String,
    pub label: String,
}

pub struct Band {
    pub y: String,
    pub h: String,
    pub thr: String,
}

/// The 24 h latency chart, as numbers for `route.html`'s inline SVG.
pub struct Chart {
    pub width: u32,
    pub height: u32,
    pub left: u32,
    pub left_label: u32,
    pub right: u32,
    pub plot_width: u32,
    pub axis_y: u32,
    pub grid: Vec<GridLine>,
    pub xticks: Vec<XTick>,
    pub band: Option<Band>,
    pub p50: String,
    pub p95: String,
    pub label: String,
}

/// One 5-minute bucket: its start, p50 and p95 (ms).
pub type ChartPoint = (DateTime<Utc>, Option<f64>, Option<f64>);

/// p50/p95 per 5-minute bucket over the last 24 h, the baseline (mean ± σ, and the anomaly
/// threshold) drawn behind as a band and a dashed line.
pub fn chart(
    lang: Lang,
    points: &[ChartPoint],
    baseline: Option<(f64, f64, f64)>,
    now: DateTime<Utc>,
) -> Chart {
    let (width, height, left, right, top, bottom) = (720u32, 220u32, 56u32, 692u32, 10u32, 190u32);
    let plot_w = f64::from(right - left);
    let plot_h = f64::from(bottom - top);
    let start = now - TimeDelta::hours(24);
    let mut max = points
        .iter()
        .filter_map(|(_, a, b)| b.or(*a))
        .fold(0.0f64, f64::max);
    if let Some((mean, sd, thr)) = baseline {
        max = max.max(thr).max(mean + sd);
    }
    let step = nice_step(max.max(1.0) / 4.0);
    let top_v = (max / step).ceil().max(1.0) * step;
    let x = |t: DateTime<Utc>| {
        let s = (t - start).num_seconds() as f64 + 150.0;
        f64::from(left) + (s / 86_400.0).clamp(0.0, 1.0) * plot_w
    };
    let y = |v: f64| f64::from(bottom) - (v / top_v).clamp(0.0, 1.0) * plot_h;
    let line = |pick: fn(&ChartPoint) -> Option<f64>| {
        points
            .iter()
            .filter_map(|p| pick(p).map(|v| format!("{:.1},{:.1}", x(p.0), y(v))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut grid = Vec::new();
    let mut v = 0.0;
    while v <= top_v + step / 2.0 {
        grid.push(GridLine {
            y: format!("{:.1}", y(v)),
            text_y: format!("{:.1}", y(v) + 4.0),
            label: fmt_ms(v),
        });
        v += step;
    }
    let xticks = (0..=4)
        .map(|k| {
            let t = start + TimeDelta::hours(6 * k);
            XTick {
                x: format!("{:.1}", f64::from(left) + plot_w * k as f64 / 4.0),
                label: t.format("%H:%M").to_string(),
            }
        })
        .collect();
    let band = baseline.map(|(mean, sd, thr)| {
        let hi = y(mean + sd);
        let lo = y((mean - sd).max(0.0));
        Band {
            y: format!("{hi:.1}"),
            h: format!("{:.1}", (lo - hi).max(1.0)),
            thr: format!("{:.1}", y(thr)),
        }
    });
    let latest = points.iter().rev().find_map(|p| p.2);
    let label = match (lang, latest) {
        (Lang::En, Some(p)) => format!(
            "p50 and p95 latency over the last 24 hours; latest p95 {}",
            fmt_ms(p)
        ),
        (Lang::Zh, Some(p)) => format!("最近 24 小时的 p50 与 p95 延迟；最新 p95 {}", fmt_ms(p)),
        (Lang::En, None) => "p50 and p95 latency over the last 24 hours: no data".to_owned(),
        (Lang::Zh, None) => "最近 24 小时的 p50 与 p95 延迟：无数据".to_owned(),
    };
    Chart {
        width,
        height,
        left,
        left_label: left - 6,
        right,
        plot_width: right - left,
        axis_y: height - 8,
        grid,
        xticks,
        band,
        p50: line(|p| p.1),
        p95: line(|p| p.2),
        label,
    }
}

/// 1, 2 or 5 × a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(300.0), 500.0);
        assert_eq!(nice_step(1200.0), 2000.0);
    }
}
