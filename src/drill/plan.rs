//! The pure side of drills: a start request checked against the config and the routes, the
//! stages of its ramp, the drilled route's weight at a stage, and the off-peak windows.
//!
//! **Ramp.** `ramp = [p1, …, pn]` (strictly increasing percentages ending at 100) splits the
//! duration into `n` stages of equal length. In stage `s` the route's weight is
//! `normal × (1 − ps/100) + target × ps/100` ([`drill_weight`]), `normal` being the weight the
//! publisher would give it without the drill (so it follows health while the drill runs). No
//! ramp is `[100]`: the whole move at once.
//!
//! **Off-peak.** `[drill] off_peak` windows in `detection.timezone` (a window may cross
//! midnight); with none configured, any time outside `detection.buckets` peak windows when
//! those are configured, else any time ([`OffPeak`]).

use chrono::{DateTime, NaiveTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::config::{Buckets, Config};
use crate::route::{Route, RouteId};

/// Longest reason kept (characters).
pub const MAX_REASON: usize = 500;
/// Longest `started_by` / `by` kept (characters).
pub const MAX_WHO: usize = 100;
/// Most ramp stages.
pub const MAX_STAGES: usize = 10;
/// Shortest stage: a stage shorter than the weights feed's reaction time is no stage.
pub const MIN_STAGE: TimeDelta = TimeDelta::seconds(1);

/// `POST /api/v1/admin/drills` as sent (every field optional here so each missing or wrong
/// one gets its own clear error).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    pub route: Option<String>,
    pub weight: Option<i64>,
    pub duration: Option<String>,
    pub reason: Option<String>,
    pub ramp: Option<Vec<i64>>,
    #[serde(default)]
    pub force: bool,
    pub started_by: Option<String>,
}

/// A checked start request.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub route: RouteId,
    pub serves: String,
    pub weight: u8,
    pub ramp: Vec<u8>,
    pub duration: TimeDelta,
    pub reason: String,
    pub started_by: Option<String>,
    pub forced: bool,
}

/// Why a request is refused: the HTTP status, a stable code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(422, code, message)
    }
}

/// Checks a start request against the routes and `[drill]` (the off-peak windows are checked
/// separately, [`OffPeak::check`], so a forced start still gets every other check).
pub fn validate(req: &StartRequest, config: &Config, routes: &[Route]) -> Result<Planned, Refusal> {
    let raw = req
        .route
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Refusal::invalid("invalid_route", "route is required (provider/region/model)")
        })?;
    let route = RouteId::parse(raw)
        .and_then(|id| routes.iter().find(|r| r.id == id))
        .ok_or_else(|| {
            Refusal::new(404, "unknown_route", format!("no configured route {raw:?}"))
        })?;
    if !routes
        .iter()
        .any(|r| r.serves == route.serves && r.id != route.id)
    {
        return Err(Refusal::invalid(
            "no_alternative",
            format!(
                "{} is the only route of {}: a drill would have nowhere to move its traffic",
                route.id, route.serves
            ),
        ));
    }
    let weight = match req.weight {
        None => 0,
        Some(w) => u8::try_from(w).ok().filter(|w| *w <= 100).ok_or_else(|| {
            Refusal::invalid(
                "invalid_weight",
                format!("weight must be 0 to 100, got {w}"),
            )
        })?,
    };
    let text = req
        .duration
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Refusal::invalid("invalid_duration", "duration is required (e.g. \"15m\")")
        })?;
    let duration = humantime::parse_duration(text)
        .map_err(|e| Refusal::invalid("invalid_duration", format!("duration {text:?}: {e}")))?;
    let max = config.drill.max_duration;
    if duration.is_zero() {
        return Err(Refusal::invalid(
            "invalid_duration",
            "duration must be above 0",
        ));
    }
    if duration > max {
        return Err(Refusal::invalid(
            "duration_too_long",
            format!(
                "duration {text} is longer than [drill] max_duration {}",
                humantime::format_duration(max)
            ),
        ));
    }
    let duration = TimeDelta::from_std(duration).map_err(|_| {
        Refusal::invalid("invalid_duration", format!("duration {text:?} is too long"))
    })?;
    let ramp = parse_ramp(req.ramp.as_deref())?;
    if duration / (ramp.len() as i32) < MIN_STAGE {
        return Err(Refusal::invalid(
            "invalid_ramp",
            format!(
                "{} stages over {text} is under {}s a stage",
                ramp.len(),
                MIN_STAGE.num_seconds()
            ),
        ));
    }
    let reason = req.reason.as_deref().map(str::trim).unwrap_or_default();
    if reason.is_empty() {
        return Err(Refusal::invalid(
            "invalid_reason",
            "reason is required: say why traffic moves (it is recorded and shown)",
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(Refusal::invalid(
            "invalid_reason",
            format!("reason is longer than {MAX_REASON} characters"),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(Refusal::invalid(
            "invalid_reason",
            "reason may not contain control characters (one line)",
        ));
    }
    let started_by = who(req.started_by.as_deref(), "started_by")?;
    Ok(Planned {
        route: route.id.clone(),
        serves: route.serves.clone(),
        weight,
        ramp,
        duration,
        reason: reason.to_owned(),
        started_by,
        forced: req.force,
    })
}

/// An optional "who" field: trimmed, bounded, one line; empty counts as absent.
pub fn who(raw: Option<&str>, field: &str) -> Result<Option<String>, Refusal> {
    let Some(s) = raw.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    if s.chars().count() > MAX_WHO || s.chars().any(char::is_control) {
        return Err(Refusal::invalid(
            "invalid_who",
            format!("{field} must be one line of at most {MAX_WHO} characters"),
        ));
    }
    Ok(Some(s.to_owned()))
}

/// `ramp`: strictly increasing percentages in 1..=100 ending at 100; absent is `[100]`.
pub fn parse_ramp(raw: Option<&[i64]>) -> Result<Vec<u8>, Refusal> {
    let Some(raw) = raw else {
        return Ok(vec![100]);
    };
    let bad = |why: &str| {
        Refusal::invalid(
            "invalid_ramp",
            format!("ramp {raw:?}: {why} (e.g. [5, 25, 100])"),
        )
    };
    if raw.is_empty() || raw.len() > MAX_STAGES {
        return Err(bad(&format!("1 to {MAX_STAGES} stages")));
    }
    let mut out = Vec::with_capacity(raw.len());
    for &p in raw {
        let p = u8::try_from(p)
            .ok()
            .filter(|p| (1..=100).contains(p))
            .ok_or_else(|| bad("each stage is a percentage from 1 to 100"))?;
        if out.last().is_some_and(|last| *last >= p) {
            return Err(bad("percentages must strictly increase"));
        }
        out.push(p);
    }
    if out.last() != Some(&100) {
        return Err(bad("the last stage must be 100"));
    }
    Ok(out)
}

pub use crate::records::drill::Stage;

/// The drilled route's weight: `normal × (1 − p/100) + target × p/100`, rounded.
pub fn drill_weight(normal: u8, target: u8, percent: u8) -> u8 {
    let p = u32::from(percent.min(100));
    let w = u32::from(normal) * (100 - p) + u32::from(target) * p;
    u8::try_from((w + 50) / 100).unwrap_or(100)
}

/// Where the off-peak windows come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `[drill] off_peak`.
    Configured,
    /// Outside `detection.buckets` peak windows.
    OutsidePeak,
    /// Nothing configured: any time.
    Anytime,
}

/// When a drill may start without `force`.
#[derive(Debug, Clone, PartialEq)]
pub struct OffPeak {
    pub rule: Rule,
    /// The off-peak windows (`Configured`) or the peak windows (`OutsidePeak`), local times.
    pub windows: Vec<(NaiveTime, NaiveTime)>,
    pub tz: Tz,
}

fn within(t: NaiveTime, (start, end): (NaiveTime, NaiveTime)) -> bool {
    if start <= end {
        start <= t && t < end
    } else {
        // Crosses midnight.
        t >= start || t < end
    }
}

impl OffPeak {
    pub fn from_config(config: &Config) -> Self {
        let tz = config.detection.timezone;
        if !config.drill.off_peak.is_empty() {
            return Self {
                rule: Rule::Configured,
                windows: config.drill.off_peak.clone(),
                tz,
            };
        }
        match &config.detection.buckets {
            Buckets::Windows(w) if !w.is_empty() => Self {
                rule: Rule::OutsidePeak,
                windows: w.clone(),
                tz,
            },
            _ => Self {
                rule: Rule::Anytime,
                windows: Vec::new(),
                tz,
            },
        }
    }

    /// Whether `now` is off-peak.
    pub fn allows(&self, now: DateTime<Utc>) -> bool {
        let local = now.with_timezone(&self.tz).time();
        // Whole minutes, as the windows are written.
        let local = local
            .with_second(0)
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(local);
        match self.rule {
            Rule::Anytime => true,
            Rule::Configured => self.windows.iter().any(|w| within(local, *w)),
            Rule::OutsidePeak => !self.windows.iter().any(|w| within(local, *w)),
        }
    }

    fn list(&self) -> String {
        self.windows
            .iter()
            .map(|(s, e)| format!("{}–{}", s.format("%H:%M"), e.format("%H:%M")))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// "02:00–06:00 (Asia/Shanghai)", for errors and the API.
    pub fn describe(&self) -> String {
        match self.rule {
            Rule::Anytime => format!("any time ({})", self.tz.name()),
            Rule::Configured => format!("{} ({})", self.list(), self.tz.name()),
            Rule::OutsidePeak => {
                format!(
                    "outside the peak windows {} ({})",
                    self.list(),
                    self.tz.name()
                )
            }
        }
    }

    /// Refuses a start outside the off-peak windows unless `force`.
    pub fn check(&self, now: DateTime<Utc>, force: bool) -> Result<(), Refusal> {
        if force || self.allows(now) {
            return Ok(());
        }
        let local = now.with_timezone(&self.tz).format("%H:%M");
        Err(Refusal::new(
            409,
            "outside_off_peak",
            format!(
                "drills may start off-peak only: {}; it is {local} there now. Send \"force\": true to start anyway",
                self.describe()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::drill::stage_at;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn hm(h: u32, m: u32) -> NaiveTime {
        NaiveTime::from_hms_opt(h, m, 0).unwrap()
    }

    fn config() -> Config {
        Config::parse(
            r#"
[[provider]]
id = "a"
kind = "openai"
  [[provider.region]]
  id = "cn"
  base_url = "http://127.0.0.1:9/v1"
[[route]]
provider = "a"
region = "cn"
model = "m1"
serves = "chat"
tier = "primary"
[[route]]
provider = "a"
region = "cn"
model = "m2"
serves = "chat"
tier = "backup"
[[route]]
provider = "a"
region = "cn"
model = "solo"
serves = "lonely"
tier = "primary"
[drill]
off_peak = [["23:00", "06:00"]]
max_duration = "1h"
"#,
            "t.toml",
        )
        .unwrap()
        .config
    }

    fn req(route: &str) -> StartRequest {
        StartRequest {
            route: Some(route.into()),
            duration: Some("15m".into()),
            reason: Some("quarterly failover drill".into()),
            ..StartRequest::default()
        }
    }

    #[test]
    fn a_good_request_is_planned_with_defaults() {
        let c = config();
        let p = validate(&req("a/cn/m1"), &c, &c.routes()).unwrap();
        assert_eq!(p.weight, 0);
        assert_eq!(p.ramp, vec![100]);
        assert_eq!(p.duration, TimeDelta::minutes(15));
        assert_eq!(p.serves, "chat");
        assert!(!p.forced);
    }

    #[test]
    fn every_bad_field_has_its_own_code() {
        let c = config();
        let routes = c.routes();
        let code = |r: StartRequest| validate(&r, &c, &routes).unwrap_err();
        assert_eq!(code(StartRequest::default()).code, "invalid_route");
        let e = code(req("a/cn/nope"));
        assert_eq!((e.status, e.code), (404, "unknown_route"));
        assert_eq!(code(req("a/cn/solo")).code, "no_alternative");
        for w in [-1, 101] {
            assert_eq!(
                code(StartRequest {
                    weight: Some(w),
                    ..req("a/cn/m1")
                })
                .code,
                "invalid_weight"
            );
        }
        for d in ["", "0s", "soon"] {
            let e = code(StartRequest {
                duration: Some(d.into()),
                ..req("a/cn/m1")
            });
            assert_eq!(e.code, "invalid_duration", "{d}");
        }
        let e = code(StartRequest {
            duration: Some("2h".into()),
            ..req("a/cn/m1")
        });
        assert_eq!(e.code, "duration_too_long");
        assert!(e.message.contains("1h"), "{}", e.message);
        for r in [
            vec![],
            vec![5, 25],
            vec![25, 5, 100],
            vec![0, 100],
            vec![50, 50, 100],
            vec![5, 101],
        ] {
            let e = code(StartRequest {
                ramp: Some(r.clone()),
                ..req("a/cn/m1")
            });
            assert_eq!(e.code, "invalid_ramp", "{r:?}");
        }
        let e = code(StartRequest {
            ramp: Some(vec![50, 100]),
            duration: Some("1s".into()),
            ..req("a/cn/m1")
        });
        assert_eq!(e.code, "invalid_ramp");
        for r in ["", "   ", "two\nlines"] {
            let e = code(StartRequest {
                reason: Some(r.into()),
                ..req("a/cn/m1")
            });
            assert_eq!(e.code, "invalid_reason");
        }
        let long = "x".repeat(MAX_REASON + 1);
        assert_eq!(
            code(StartRequest {
                reason: Some(long),
                ..req("a/cn/m1")
            })
            .code,
            "invalid_reason"
        );
        let e = code(StartRequest {
            started_by: Some("y".repeat(MAX_WHO + 1)),
            ..req("a/cn/m1")
        });
        assert_eq!(e.code, "invalid_who");
    }

    #[test]
    fn stages_are_equal_slices_of_the_duration() {
        let start = t("2026-11-30T18:00:00Z");
        let end = start + TimeDelta::minutes(15);
        let ramp = [5, 25, 100];
        assert_eq!(
            stage_at(&ramp, start, end, start - TimeDelta::seconds(1)),
            None
        );
        let s = stage_at(&ramp, start, end, start).unwrap();
        assert_eq!((s.index, s.of, s.percent), (1, 3, 5));
        assert_eq!(s.until, start + TimeDelta::minutes(5));
        let s = stage_at(&ramp, start, end, start + TimeDelta::minutes(5)).unwrap();
        assert_eq!((s.index, s.percent), (2, 25));
        let s = stage_at(&ramp, start, end, end - TimeDelta::milliseconds(1)).unwrap();
        assert_eq!((s.index, s.percent, s.until), (3, 100, end));
        assert_eq!(stage_at(&ramp, start, end, end), None);
        // Uneven milliseconds: every instant is in exactly one stage, boundaries included.
        let end = start + TimeDelta::milliseconds(1001);
        for ms in 0..1001 {
            let now = start + TimeDelta::milliseconds(ms);
            let s = stage_at(&ramp, start, end, now).unwrap();
            assert!(s.from <= now && now < s.until, "{ms}: {s:?}");
        }
    }

    #[test]
    fn the_weight_moves_from_normal_to_target() {
        assert_eq!(drill_weight(60, 0, 5), 57);
        assert_eq!(drill_weight(60, 0, 25), 45);
        assert_eq!(drill_weight(60, 0, 100), 0);
        assert_eq!(drill_weight(0, 40, 50), 20);
        assert_eq!(drill_weight(100, 100, 50), 100);
        assert_eq!(drill_weight(33, 0, 50), 17);
    }

    #[test]
    fn off_peak_windows_may_cross_midnight() {
        let c = config();
        let o = OffPeak::from_config(&c);
        assert_eq!(o.rule, Rule::Configured);
        // Asia/Shanghai is UTC+8: 23:30 local = 15:30Z, 05:59 local = 21:59Z.
        assert!(o.allows(t("2026-11-30T15:30:00Z")));
        assert!(o.allows(t("2026-11-30T21:59:00Z")));
        assert!(!o.allows(t("2026-11-30T22:00:00Z")));
        assert!(!o.allows(t("2026-11-30T06:30:00Z")));
        let e = o.check(t("2026-11-30T06:30:00Z"), false).unwrap_err();
        assert_eq!((e.status, e.code), (409, "outside_off_peak"));
        assert!(
            e.message.contains("23:00–06:00 (Asia/Shanghai)"),
            "{}",
            e.message
        );
        assert!(e.message.contains("14:30"), "{}", e.message);
        assert!(o.check(t("2026-11-30T06:30:00Z"), true).is_ok());
    }

    #[test]
    fn without_windows_the_peak_buckets_or_any_time() {
        let mut c = config();
        c.drill.off_peak.clear();
        assert_eq!(OffPeak::from_config(&c).rule, Rule::Anytime);
        assert!(OffPeak::from_config(&c).allows(t("2026-11-30T06:30:00Z")));
        c.detection.buckets = Buckets::Windows(vec![(hm(9, 0), hm(12, 0)), (hm(14, 0), hm(18, 0))]);
        let o = OffPeak::from_config(&c);
        assert_eq!(o.rule, Rule::OutsidePeak);
        assert!(!o.allows(t("2026-11-30T06:30:00Z"))); // 14:30 local
        assert!(o.allows(t("2026-11-30T05:30:00Z"))); // 13:30 local
        assert!(o
            .describe()
            .starts_with("outside the peak windows 09:00–12:00, 14:00–18:00"));
    }
}
