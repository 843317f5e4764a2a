//! Silences made through the admin API (`/api/v1/admin/silences`): the request a caller sends and the checks that turn it into a
//! [`Silence`]. Silences suppress alerts only: probing and storage go on.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::maintenance::Silence;

/// Longest a silence may last.
pub const MAX_SILENCE: chrono::Duration = chrono::Duration::days(30);

/// `POST /api/v1/admin/silences`'s body: `{"routes":["qwen/*"], "duration":"2h" | "ends_at":"…",
/// "starts_at"?: "…", "comment": "…", "created_by"?: "…"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSilence {
    pub routes: Vec<String>,
    #[serde(default)]
    pub starts_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub ends_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub duration: Option<String>,
    #[serde(default)]
    pub comment: String,
    #[serde(default)]
    pub created_by: Option<String>,
}

/// Why a requested silence is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SilenceError {
    #[error("duration must look like \"30m\" or \"2h\"")]
    Duration,
    #[error("give exactly one of ends_at and duration")]
    EndOrDuration,
    #[error("routes must list at least one non-empty route id or glob")]
    NoRoutes,
    #[error("the silence must end after it starts and in the future")]
    EndsTooSoon,
    #[error("a silence lasts at most 30 days")]
    TooLong,
}

impl SilenceError {
    /// The stable code the API answers with.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Duration => "invalid_duration",
            _ => "invalid_silence",
        }
    }
}

impl NewSilence {
    /// The silence this request asks for at `now`, with a fresh id.
    pub fn build(self, now: DateTime<Utc>) -> Result<Silence, SilenceError> {
        let starts_at = self.starts_at.unwrap_or(now);
        let ends_at = match (self.ends_at, self.duration.as_deref()) {
            (Some(end), None) => end,
            // A duration past the calendar's end is an invalid duration, not an overflow.
            (None, Some(d)) => humantime::parse_duration(d)
                .ok()
                .and_then(|d| chrono::Duration::from_std(d).ok())
                .and_then(|d| starts_at.checked_add_signed(d))
                .ok_or(SilenceError::Duration)?,
            _ => return Err(SilenceError::EndOrDuration),
        };
        if self.routes.is_empty() || self.routes.iter().any(|r| r.trim().is_empty()) {
            return Err(SilenceError::NoRoutes);
        }
        if ends_at <= starts_at || ends_at <= now {
            return Err(SilenceError::EndsTooSoon);
        }
        if ends_at - starts_at > MAX_SILENCE {
            return Err(SilenceError::TooLong);
        }
        Ok(Silence {
            id: format!(
                "sil-{}",
                super::render::key_digest(&format!(
                    "{now:?}{:?}{}",
                    self.routes,
                    rand::random::<u64>()
                ))
            ),
            routes: self.routes,
            starts_at,
            ends_at,
            comment: self.comment,
            created_by: self.created_by.unwrap_or_else(|| "admin".to_owned()),
            created_at: now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn req(json: serde_json::Value) -> NewSilence {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_duration_counts_from_the_start() {
        let now = t("2026-03-04T10:00:00Z");
        let s = req(serde_json::json!({"routes": ["qwen/*"], "duration": "2h", "comment": "x"}))
            .build(now)
            .unwrap();
        assert_eq!((s.starts_at, s.ends_at), (now, t("2026-03-04T12:00:00Z")));
        assert_eq!(s.created_by, "admin");
        assert!(s.id.starts_with("sil-"));
    }

    #[test]
    fn bad_requests_are_refused_with_their_code() {
        let now = t("2026-03-04T10:00:00Z");
        let cases = [
            (
                serde_json::json!({"routes": ["a"], "duration": "soon"}),
                "invalid_duration",
            ),
            (serde_json::json!({"routes": ["a"]}), "invalid_silence"),
            (
                serde_json::json!({"routes": [" "], "duration": "1h"}),
                "invalid_silence",
            ),
            (
                serde_json::json!({"routes": ["a"], "ends_at": "2026-03-04T09:00:00Z"}),
                "invalid_silence",
            ),
            (
                serde_json::json!({"routes": ["a"], "duration": "31d"}),
                "invalid_silence",
            ),
            // Past the calendar's end: refused, never an overflow.
            (
                serde_json::json!({"routes": ["a"], "duration": "1000000y"}),
                "invalid_duration",
            ),
            (
                serde_json::json!({"routes": ["a"], "duration": "1y",
                    "starts_at": "+262142-12-31T00:00:00Z"}),
                "invalid_duration",
            ),
        ];
        for (body, code) in cases {
            let e = req(body.clone()).build(now).unwrap_err();
            assert_eq!(e.code(), code, "{body}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn any_duration_is_a_silence_or_a_refusal(d in ".{0,24}", n in proptest::prelude::any::<u64>()) {
            let now = t("2026-03-04T10:00:00Z");
            for text in [d.clone(), format!("{n}s"), format!("{n}y")] {
                let _ = req(serde_json::json!({"routes": ["a"], "duration": text})).build(now);
            }
        }
    }
}
