//! `probeok drill start|stop|report`: the admin API from the command line. The admin token
//! comes from `PROBEOK_ADMIN_TOKEN` (never an argument, so it stays out of shell history and
//! process lists). Exit codes: 0 ok; 1 bad input or refused by the server (4xx); 2 runtime
//! (cannot connect, 5xx, an answer that cannot be read).

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::report::{render_text, Report};
use super::DrillView;

/// Why a drill command failed, shaped like the CLI's own error (which it converts into):
/// bad input or a refusal by the server (exit 1), or a runtime failure (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Every problem, one line each.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    #[error("error: {0}")]
    Runtime(String),
}

impl ClientError {
    /// The CLI's exit code for it: 1 bad input or refused, 2 runtime.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Invalid(_) => 1,
            ClientError::Runtime(_) => 2,
        }
    }
}

/// The variable the admin token is read from.
pub const TOKEN_ENV: &str = "PROBEOK_ADMIN_TOKEN";

const TIMEOUT: Duration = Duration::from_secs(30);

/// What `probeok drill start` asks for.
#[derive(Debug, Clone)]
pub struct StartArgs {
    pub server: String,
    pub route: String,
    pub weight: u8,
    pub duration: String,
    pub reason: String,
    pub ramp: Option<String>,
    pub force: bool,
    pub started_by: Option<String>,
}

fn invalid(s: impl Into<String>) -> ClientError {
    ClientError::Invalid(vec![s.into()])
}

fn token() -> Result<String, ClientError> {
    match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.is_empty() => Ok(t),
        _ => Err(invalid(format!(
            "error: {TOKEN_ENV} is not set (the monitor's admin token)"
        ))),
    }
}

fn url(server: &str, path: &str) -> Result<reqwest::Url, ClientError> {
    let base = server.trim_end_matches('/');
    reqwest::Url::parse(&format!("{base}{path}"))
        .map_err(|e| invalid(format!("error: --server {server:?}: {e}")))
}

/// `--ramp 5,25,100` → `[5, 25, 100]` (the server checks the rest).
pub fn parse_ramp(s: &str) -> Result<Vec<i64>, ClientError> {
    s.split(',')
        .map(|p| {
            p.trim().parse::<i64>().map_err(|_| {
                invalid(format!(
                    "error: --ramp {s:?}: comma-separated percentages, e.g. 5,25,100"
                ))
            })
        })
        .collect()
}

/// Sends the request; 2xx → the JSON body, 4xx → exit 1 with the server's message, the rest
/// → exit 2.
async fn call(req: reqwest::RequestBuilder, what: &str) -> Result<serde_json::Value, ClientError> {
    let resp = req
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| ClientError::Runtime(format!("{what}: cannot reach the server: {e}")))?;
    let status = resp.status();
    let body = resp
        .bytes()
        .await
        .map_err(|e| ClientError::Runtime(format!("{what}: reading the answer: {e}")))?;
    let value: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    if status.is_success() {
        return value.ok_or_else(|| {
            ClientError::Runtime(format!(
                "{what}: the server's answer is not JSON ({status})"
            ))
        });
    }
    let (code, message) = value
        .as_ref()
        .and_then(|v| v.get("error"))
        .map(|e| {
            (
                e["code"].as_str().unwrap_or("error").to_owned(),
                e["message"].as_str().unwrap_or("").to_owned(),
            )
        })
        .unwrap_or_else(|| {
            (
                "error".to_owned(),
                String::from_utf8_lossy(&body)
                    .trim()
                    .chars()
                    .take(200)
                    .collect(),
            )
        });
    let line = format!("error: {what}: {} {code}: {message}", status.as_u16());
    if status.is_client_error() {
        Err(invalid(line))
    } else {
        Err(ClientError::Runtime(
            line.trim_start_matches("error: ").to_owned(),
        ))
    }
}

fn client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .build()
        .map_err(|e| ClientError::Runtime(format!("http client: {e}")))
}

fn when(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `probeok drill start`.
pub async fn start(a: &StartArgs) -> Result<(), ClientError> {
    let ramp = a.ramp.as_deref().map(parse_ramp).transpose()?;
    let token = token()?;
    let body = json!({
        "route": a.route,
        "weight": a.weight,
        "duration": a.duration,
        "reason": a.reason,
        "ramp": ramp,
        "force": a.force,
        "started_by": a.started_by.clone().or_else(|| std::env::var("USER").ok()),
    });
    let v = call(
        client()?
            .post(url(&a.server, "/api/v1/admin/drills")?)
            .bearer_auth(token)
            .json(&body),
        "drill start",
    )
    .await?;
    let d: DrillView = serde_json::from_value(v)
        .map_err(|e| ClientError::Runtime(format!("drill start: unexpected answer: {e}")))?;
    let ramp: Vec<String> = d.drill.ramp.iter().map(|p| format!("{p}%")).collect();
    crate::stdout::println(format_args!(
        "drill {} started on {} ({}): weight → {} in {} stage(s) ({}), ends {}{}",
        d.drill.id,
        d.drill.route,
        d.drill.serves,
        d.drill.weight,
        d.drill.ramp.len(),
        ramp.join(", "),
        when(d.drill.ends_at),
        if d.drill.forced { " (forced)" } else { "" }
    ));
    Ok(())
}

/// `probeok drill stop`.
pub async fn stop(server: &str, route: Option<&str>) -> Result<(), ClientError> {
    let token = token()?;
    let body = json!({"route": route, "by": std::env::var("USER").ok()});
    let v = call(
        client()?
            .post(url(server, "/api/v1/admin/drills/stop")?)
            .bearer_auth(token)
            .json(&body),
        "drill stop",
    )
    .await?;
    #[derive(Deserialize)]
    struct Stopped {
        drills: Vec<DrillView>,
    }
    let s: Stopped = serde_json::from_value(v)
        .map_err(|e| ClientError::Runtime(format!("drill stop: unexpected answer: {e}")))?;
    if s.drills.is_empty() {
        crate::stdout::println(format_args!("no drill was running"));
    }
    for d in s.drills {
        crate::stdout::println(format_args!(
            "drill {} on {} stopped at {}",
            d.drill.id,
            d.drill.route,
            d.drill.ended_at.map(when).unwrap_or_default()
        ));
    }
    Ok(())
}

/// `probeok drill report`: the report for people, or the server's JSON with `--json`.
pub async fn report(server: &str, id: &str, json: bool) -> Result<(), ClientError> {
    if id.parse::<u64>().is_err() {
        return Err(invalid(format!("error: drill id {id:?} is not a number")));
    }
    let v = call(
        client()?.get(url(server, &format!("/api/v1/drills/{id}"))?),
        "drill report",
    )
    .await?;
    if json {
        crate::stdout::println(format_args!(
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
        ));
        return Ok(());
    }
    #[derive(Deserialize)]
    struct Answer {
        drill: DrillView,
        report: Report,
    }
    let a: Answer = serde_json::from_value(v)
        .map_err(|e| ClientError::Runtime(format!("drill report: unexpected answer: {e}")))?;
    crate::stdout::print(format_args!("{}", render_text(&a.drill.drill, &a.report)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramps_parse_or_say_how() {
        assert_eq!(parse_ramp("5, 25,100").unwrap(), vec![5, 25, 100]);
        let e = parse_ramp("5,x").unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("5,25,100"));
    }
}
