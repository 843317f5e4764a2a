//! Parsing (stage one, serde) and the conversion of raw values into the typed config (the
//! first half of stage two). A value that does not convert is reported, replaced by its default
//! and marked failed, so the checks that follow still run without echoing it as a second error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use chrono::NaiveTime;
use toml_edit::ImDocument;

use super::raw::{
    RawAlert, RawAlerting, RawBehaviour, RawBuckets, RawConfig, RawContract, RawDrill,
    RawHeartbeat, RawMaintenance, RawOptions, RawProxy, RawRoute, RawSwitch,
};
use super::raw::{RawSubscriptions, RawTracing};
use super::validate::Checker;
use super::{
    AlertChannelsConfig, AlertingConfig, Behaviour, BreakerConfig, Buckets, ChannelOptions,
    ClusterConfig, Config, ConfigErrors, ConfirmAfter, ContractConfig, DetectionConfig, Diagnostic,
    DriftConfig, DrillConfig, EgressConfig, EmailConfig, ExtraCostConfig, HeartbeatConfig, Loaded,
    MaintenanceConfig, Mention, ProbeConfig, ProviderConfig, ProxyConfig, RegionConfig,
    RobotConfig, RouteConfig, ServerConfig, SloConfig, SourceMap, StorageConfig, SwitchConfig,
    WebhookConfig, WecomConfig,
};
use super::{ChatWebhookConfig, OpsgenieConfig, PagerDutyConfig, TelegramConfig};
use super::{SubscriptionsConfig, TracingConfig};
use crate::lang::Lang;
use crate::route::{Capability, ProviderKind};
use crate::severity::Severity;

mod alerting;
mod serving;
use alerting::{alert, alerting, maintenance};
use serving::{contract, drill, proxy, switch};

pub(super) fn parse(src: &str, label: &str) -> Result<Loaded, ConfigErrors> {
    let (raw, map): (RawConfig, SourceMap) = parse_located(src, label)?;

    let mut checker = Checker::new(label, &map);
    let config = convert(raw, &mut checker, label, &map);
    checker.check(&config);
    let warnings = checker.finish()?;
    Ok(Loaded { config, warnings })
}

/// Stage one for any TOML file checked like the config (regression sets): the span-keeping
/// [`SourceMap`] and the serde value, or the one located syntax/serde error.
pub(crate) fn parse_located<T: serde::de::DeserializeOwned>(
    src: &str,
    label: &str,
) -> Result<(T, SourceMap), ConfigErrors> {
    let doc = ImDocument::parse(src.to_owned()).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        let (line, col) = super::source_map::line_col(src, at);
        let mut message = one_line(e.message());
        // Some syntax errors come without words (a control character in a comment): name
        // what stands at the position instead.
        if message.is_empty() {
            message = match src.get(at..).and_then(|s| s.chars().next()) {
                Some(c) => format!("unexpected character {c:?}"),
                None => "unexpected end of file".to_owned(),
            };
        }
        ConfigErrors(vec![Diagnostic {
            file: label.to_owned(),
            line,
            col,
            path: String::new(),
            message,
        }])
    })?;
    let map = SourceMap::new(doc);
    let value: T = toml_edit::de::from_str(src)
        .map_err(|e| ConfigErrors(vec![serde_diagnostic(&e, &map, label)]))?;
    Ok((value, map))
}

/// Locates serde's error through its span and words it in TOML's terms (keys, not fields).
fn serde_diagnostic(e: &toml_edit::de::Error, map: &SourceMap, label: &str) -> Diagnostic {
    // Without a span there is nothing to point at: no position rather than a wrong one.
    let ((line, col), mut path) = match e.span() {
        Some(span) => (map.line_col(span.start), map.path_at(span.start)),
        None => ((0, 0), String::new()),
    };
    let mut message = one_line(e.message());
    // A missing key is reported at its table (there is nothing else to point at); name it in
    // the path like any other key.
    if let Some(key) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
        message = "missing required key".to_owned();
    } else if let Some(rest) = message.strip_prefix("unknown field") {
        message = format!("unknown key{rest}");
    } else if let Some(rest) = message.strip_prefix("unknown variant") {
        message = format!("unknown value{rest}");
    } else {
        message = toml_types(&message);
    }
    Diagnostic {
        file: label.to_owned(),
        line,
        col,
        path,
        message,
    }
}

/// Serde names Rust types (`expected i64`); the reader wrote TOML.
fn toml_types(message: &str) -> String {
    let Some((head, expected)) = message.rsplit_once("expected ") else {
        return message.to_owned();
    };
    let expected = match expected {
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" => "an array",
        "a map" => "a table",
        e if e.starts_with("struct ") => "a table",
        e => e,
    };
    format!("{head}expected {expected}")
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn convert(raw: RawConfig, ck: &mut Checker<'_>, label: &str, map: &SourceMap) -> Config {
    let server = {
        let d = ServerConfig::default();
        let r = raw.server;
        let listen = match r.listen {
            None => d.listen,
            Some(s) => s.parse::<SocketAddr>().unwrap_or_else(|_| {
                ck.fail(
                    "server.listen",
                    format!("invalid address {s:?}: expected IP:PORT, e.g. \"127.0.0.1:9400\""),
                );
                d.listen
            }),
        };
        ServerConfig {
            listen,
            public_url: r.public_url.unwrap_or_else(|| format!("http://{listen}")),
            admin_token_env: r.admin_token_env.unwrap_or(d.admin_token_env),
            ingest_token_env: r.ingest_token_env.unwrap_or(d.ingest_token_env),
            title: r.title.unwrap_or(d.title),
            vantage: r.vantage.unwrap_or(d.vantage),
            max_connections: uint(
                ck,
                "server.max_connections",
                r.max_connections,
                d.max_connections,
                1,
            ),
        }
    };

    let storage = {
        let d = StorageConfig::default();
        let r = raw.storage;
        StorageConfig {
            path: r.path.map(PathBuf::from).unwrap_or(d.path),
            url_env: r.url_env.or(d.url_env),
            retention_days: uint(
                ck,
                "storage.retention_days",
                r.retention_days,
                d.retention_days,
                1,
            ),
            rollup_retention_days: uint(
                ck,
                "storage.rollup_retention_days",
                r.rollup_retention_days,
                d.rollup_retention_days,
                1,
            ),
        }
    };

    let probe = {
        let d = ProbeConfig::default();
        let r = raw.probe;
        ProbeConfig {
            interval: duration(ck, "probe.interval", r.interval, d.interval),
            first_byte_timeout: duration(
                ck,
                "probe.first_byte_timeout",
                r.first_byte_timeout,
                d.first_byte_timeout,
            ),
            stall_timeout: duration(ck, "probe.stall_timeout", r.stall_timeout, d.stall_timeout),
            timeout: duration(ck, "probe.timeout", r.timeout, d.timeout),
            jitter: r.jitter.unwrap_or(d.jitter),
            stream: r.stream.unwrap_or(d.stream),
            max_tokens: uint(ck, "probe.max_tokens", r.max_tokens, d.max_tokens, 1),
            throughput_every: duration(
                ck,
                "probe.throughput_every",
                r.throughput_every,
                d.throughput_every,
            ),
            throughput_prompt: r.throughput_prompt.unwrap_or(d.throughput_prompt),
            throughput_max_tokens: uint(
                ck,
                "probe.throughput_max_tokens",
                r.throughput_max_tokens,
                d.throughput_max_tokens,
                1,
            ),
            system: r.system.unwrap_or(d.system),
            user: r.user.unwrap_or(d.user),
            expect: r.expect.unwrap_or(d.expect),
            confirm_after: confirm_after(ck, "probe.confirm_after", r.confirm_after)
                .unwrap_or(d.confirm_after),
        }
    };

    let detection = {
        let d = DetectionConfig::default();
        let r = raw.detection;
        let p = "detection";
        DetectionConfig {
            sigma: r.sigma.unwrap_or(d.sigma),
            latency_floor_ratio: r.latency_floor_ratio.unwrap_or(d.latency_floor_ratio),
            latency_floor: duration(ck, &format!("{p}.latency_floor"), r.latency_floor, d.latency_floor),
            baseline_window: uint(ck, &format!("{p}.baseline_window"), r.baseline_window, d.baseline_window, 1),
            min_samples: uint(ck, &format!("{p}.min_samples"), r.min_samples, d.min_samples, 1),
            buckets: r.buckets.map_or(d.buckets.clone(), |b| buckets(ck, b, d.buckets)),
            timezone: match r.timezone {
                None => d.timezone,
                Some(s) => s.parse().unwrap_or_else(|_| {
                    ck.fail(
                        "detection.timezone",
                        format!(
                            "unknown timezone {s:?} (use an IANA name such as \"Asia/Shanghai\" or \"UTC\")"
                        ),
                    );
                    d.timezone
                }),
            },
            degraded_after: uint(ck, &format!("{p}.degraded_after"), r.degraded_after, d.degraded_after, 1),
            critical_error_rate: r.critical_error_rate.unwrap_or(d.critical_error_rate),
            error_window: duration(ck, &format!("{p}.error_window"), r.error_window, d.error_window),
            min_error_samples: uint(ck, &format!("{p}.min_error_samples"), r.min_error_samples, d.min_error_samples, 1),
            min_failures: uint(ck, &format!("{p}.min_failures"), r.min_failures, d.min_failures, 1),
            critical_after: duration(ck, &format!("{p}.critical_after"), r.critical_after, d.critical_after),
            critical_degraded_for: duration(
                ck,
                &format!("{p}.critical_degraded_for"),
                r.critical_degraded_for,
                d.critical_degraded_for,
            ),
            recover_after: duration(ck, &format!("{p}.recover_after"), r.recover_after, d.recover_after),
            recover_error_rate: r.recover_error_rate.unwrap_or(d.recover_error_rate),
            tps_floor: r.tps_floor.unwrap_or(d.tps_floor),
        }
    };

    let providers = raw
        .providers
        .into_iter()
        .enumerate()
        .map(|(i, p)| ProviderConfig {
            status_pages: super::status_page::status_pages(ck, i, &p.id, p.status_pages),
            id: p.id,
            kind: p.kind.unwrap_or(ProviderKind::Openai),
            api_key_env: p.api_key_env,
            max_in_flight: p
                .max_in_flight
                .and_then(|v| to_u32(ck, &format!("provider[{i}].max_in_flight"), v, 1)),
            regions: p
                .regions
                .into_iter()
                .map(|r| RegionConfig {
                    id: r.id,
                    base_url: r.base_url,
                })
                .collect(),
        })
        .collect();

    let catalog = super::catalog::catalog(ck, raw.catalog, &raw.routes);
    let capability = super::capability::capability(ck, raw.capability);
    let routes = raw
        .routes
        .into_iter()
        .enumerate()
        .map(|(i, r)| route(ck, i, r))
        .collect();

    let slo = {
        let d = SloConfig::default();
        SloConfig {
            availability: raw.slo.availability.unwrap_or(d.availability),
            latency_threshold: duration(
                ck,
                "slo.latency_threshold",
                raw.slo.latency_threshold,
                d.latency_threshold,
            ),
        }
    };

    let proxy = proxy(ck, raw.proxy);
    let switch = switch(ck, raw.switch);
    let budget = {
        let d = ExtraCostConfig::default();
        ExtraCostConfig {
            max_extra_cost_per_hour: raw
                .budget
                .max_extra_cost_per_hour
                .unwrap_or(d.max_extra_cost_per_hour),
            degrade_at: raw.budget.degrade_at.unwrap_or(d.degrade_at),
        }
    };

    Config {
        source: PathBuf::from(label),
        server,
        storage,
        probe,
        detection,
        egress: EgressConfig {
            control_url: raw.egress.control_url,
        },
        providers,
        routes,
        slo,
        alerting: alerting(ck, raw.alerting),
        alert: alert(ck, raw.alert),
        maintenance: raw
            .maintenance
            .into_iter()
            .enumerate()
            .map(|(i, m)| maintenance(ck, i, m))
            .collect(),
        drift: match raw.drift {
            None => DriftConfig::default(),
            Some(d) => DriftConfig {
                sets: d
                    .sets
                    .map(PathBuf::from)
                    .unwrap_or(DriftConfig::default().sets),
                on_drift: d.on_drift.unwrap_or_default(),
                explicit: true,
                run_sets: true,
            },
        },
        proxy,
        switch,
        budget,
        contracts: raw
            .contracts
            .into_iter()
            .enumerate()
            .map(|(i, c)| contract(ck, i, c))
            .collect(),
        heartbeat: heartbeat(ck, raw.heartbeat),
        drill: drill(ck, raw.drill),
        cluster: ClusterConfig {
            lease: duration(
                ck,
                "cluster.lease",
                raw.cluster.lease,
                ClusterConfig::default().lease,
            ),
        },
        tracing: tracing(raw.tracing),
        vantages: super::vantage::vantages(ck, raw.vantages),
        quorum: super::vantage::quorum(ck, raw.quorum),
        agent: super::vantage::agent(ck, raw.agent),
        shadows: super::shadow::shadows(raw.shadows),
        envoy: super::routers::envoy(raw.envoy),
        haproxy: super::routers::haproxy(ck, raw.haproxy),
        subscriptions: subscriptions(ck, raw.subscriptions),
        sync: super::sync::syncs(ck, raw.sync),
        catalog,
        capability,
        source_map: map.text_only(),
        env: crate::secret::Env::process(),
    }
}

fn heartbeat(ck: &mut Checker<'_>, r: RawHeartbeat) -> HeartbeatConfig {
    let d = HeartbeatConfig::default();
    HeartbeatConfig {
        stale_after: duration(ck, "heartbeat.stale_after", r.stale_after, d.stale_after),
        ping_url_env: r.ping_url_env,
    }
}

fn tracing(r: RawTracing) -> TracingConfig {
    let d = TracingConfig::default();
    TracingConfig {
        otlp_endpoint_env: r.otlp_endpoint_env.unwrap_or(d.otlp_endpoint_env),
        service_name: r.service_name.unwrap_or(d.service_name),
        sample_ratio: r.sample_ratio.unwrap_or(d.sample_ratio),
    }
}

fn subscriptions(ck: &mut Checker<'_>, r: RawSubscriptions) -> SubscriptionsConfig {
    let d = SubscriptionsConfig::default();
    let max_subscribers = match r.max_subscribers {
        None => d.max_subscribers,
        Some(n) if (1..=1_000_000).contains(&n) => n as u64,
        Some(_) => {
            ck.fail(
                "subscriptions.max_subscribers",
                "must be between 1 and 1000000",
            );
            d.max_subscribers
        }
    };
    SubscriptionsConfig {
        enabled: r.enabled.unwrap_or(d.enabled),
        email: r.email.unwrap_or(d.email),
        webhook: r.webhook.unwrap_or(d.webhook),
        max_subscribers,
        allow_private_webhooks: r.allow_private_webhooks.unwrap_or(d.allow_private_webhooks),
    }
}

/// `"10MiB"`, `"512KiB"`, `"1MB"`, `"2GiB"`, `"100B"` or plain digits (bytes). Binary units are
/// powers of 1024, decimal ones of 1000.
pub(super) fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1024,
        "MB" => 1000 * 1000,
        "MiB" => 1024 * 1024,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn route(ck: &mut Checker<'_>, i: usize, r: RawRoute) -> RouteConfig {
    let d = RouteConfig::default();
    let p = format!("route[{i}]");
    let opt_duration = |ck: &mut Checker<'_>, key: &str, v: Option<String>| {
        v.map(|s| parse_duration(ck, &format!("{p}.{key}"), &s))
            .and_then(Result::ok)
    };
    let opt_uint = |ck: &mut Checker<'_>, key: &str, v: Option<i64>, min: u32| {
        v.and_then(|v| to_u32(ck, &format!("{p}.{key}"), v, min))
    };
    let weight = match r.weight {
        None => d.weight,
        Some(w) => match u8::try_from(w) {
            Ok(w) if w <= 100 => w,
            _ => {
                ck.fail(
                    format!("{p}.weight"),
                    format!("must be in 0..=100, got {w}"),
                );
                d.weight
            }
        },
    };
    let mut capabilities: Vec<Capability> = Vec::new();
    for c in r.capabilities.unwrap_or(d.capabilities) {
        if !capabilities.contains(&c) {
            capabilities.push(c);
        }
    }
    RouteConfig {
        provider: r.provider,
        region: r.region,
        model: r.model,
        serves: r.serves,
        tier: r.tier.unwrap_or(d.tier),
        weight,
        price: r.price,
        capabilities,
        context_window: opt_uint(ck, "context_window", r.context_window, 1),
        residency: r.residency,
        interval: opt_duration(ck, "interval", r.interval),
        timeout: opt_duration(ck, "timeout", r.timeout),
        first_byte_timeout: opt_duration(ck, "first_byte_timeout", r.first_byte_timeout),
        stall_timeout: opt_duration(ck, "stall_timeout", r.stall_timeout),
        max_tokens: opt_uint(ck, "max_tokens", r.max_tokens, 1),
        slo: r.slo,
        confirm_after: confirm_after(ck, &format!("{p}.confirm_after"), r.confirm_after),
        request: (r.request).map(|q| super::profile::profile(ck, &format!("{p}.request"), q)),
        max_in_flight: opt_uint(ck, "max_in_flight", r.max_in_flight, 1),
        kind: r.kind.unwrap_or_default(),
        dimensions: opt_uint(ck, "dimensions", r.dimensions, 1),
    }
}

/// `confirm_after`: `"off"`, `"interval/N"` or a duration; `None` when absent or invalid
/// (reported).
fn confirm_after(ck: &mut Checker<'_>, path: &str, raw: Option<String>) -> Option<ConfirmAfter> {
    let s = raw?;
    ConfirmAfter::parse(&s).map_err(|e| ck.fail(path, e)).ok()
}

fn parse_duration(ck: &mut Checker<'_>, path: &str, s: &str) -> Result<Duration, ()> {
    humantime::parse_duration(s).map_err(|e| {
        let e = e.to_string();
        let hint = if e.contains("for example") || e.contains("supported units") {
            ""
        } else {
            " (write e.g. \"500ms\", \"30s\", \"5m\")"
        };
        ck.fail(path, format!("invalid duration {s:?}: {e}{hint}"));
    })
}

pub(super) fn duration(
    ck: &mut Checker<'_>,
    path: &str,
    raw: Option<String>,
    default: Duration,
) -> Duration {
    match raw {
        None => default,
        Some(s) => parse_duration(ck, path, &s).unwrap_or(default),
    }
}

fn to_u32(ck: &mut Checker<'_>, path: &str, v: i64, min: u32) -> Option<u32> {
    match u32::try_from(v) {
        Ok(v) => Some(v),
        Err(_) => {
            let message = if v < 0 {
                format!("must be at least {min}, got {v}")
            } else {
                format!("must be at most {}, got {v}", u32::MAX)
            };
            ck.fail(path, message);
            None
        }
    }
}

/// `min` only words the message; the range itself is checked on the typed value.
fn uint(ck: &mut Checker<'_>, path: &str, raw: Option<i64>, default: u32, min: u32) -> u32 {
    raw.and_then(|v| to_u32(ck, path, v, min))
        .unwrap_or(default)
}

fn buckets(ck: &mut Checker<'_>, raw: RawBuckets, default: Buckets) -> Buckets {
    const PATH: &str = "detection.buckets";
    match raw {
        RawBuckets::Mode(m) if m == "none" => Buckets::None,
        RawBuckets::Mode(m) if m == "hour" => Buckets::Hour,
        RawBuckets::Mode(m) => {
            ck.fail(
                PATH,
                format!(
                    "unknown buckets {m:?}: expected \"none\", \"hour\" or an array of [\"HH:MM\", \"HH:MM\"] peak windows"
                ),
            );
            default
        }
        RawBuckets::Windows(windows) => {
            let mut out = Vec::new();
            let mut ok = true;
            for (i, w) in windows.iter().enumerate() {
                let [start, end] = w.as_slice() else {
                    ck.error(
                        format!("{PATH}[{i}]"),
                        format!(
                            "a window is [\"HH:MM\", \"HH:MM\"], got {} value{}",
                            w.len(),
                            if w.len() == 1 { "" } else { "s" }
                        ),
                    );
                    ok = false;
                    continue;
                };
                let mut time = |j: usize, s: &str| {
                    let t = parse_hhmm(s);
                    if t.is_none() {
                        ck.error(
                            format!("{PATH}[{i}][{j}]"),
                            format!("invalid time {s:?}: expected \"HH:MM\" (00:00 to 23:59)"),
                        );
                    }
                    t
                };
                match (time(0, start), time(1, end)) {
                    (Some(s), Some(e)) => out.push((s, e)),
                    _ => ok = false,
                }
            }
            if ok {
                Buckets::Windows(out)
            } else {
                ck.mark_failed(PATH);
                default
            }
        }
    }
}

/// Strictly `HH:MM`, 00:00 to 23:59.
fn parse_hhmm(s: &str) -> Option<NaiveTime> {
    let b = s.as_bytes();
    if b.len() != 5 || b[2] != b':' {
        return None;
    }
    let num = |x: &[u8]| -> Option<u32> {
        x.iter().try_fold(0u32, |acc, c| {
            c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
        })
    };
    NaiveTime::from_hms_opt(num(&b[..2])?, num(&b[3..])?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10MiB"), Some(10 * 1024 * 1024));
        assert_eq!(parse_size("1MB"), Some(1_000_000));
        assert_eq!(parse_size("512 KiB"), Some(512 * 1024));
        assert_eq!(parse_size("100"), Some(100));
        for bad in ["", "MiB", "10 mb", "-1MiB", "1.5MiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }

    #[test]
    fn hhmm_is_strict() {
        assert_eq!(parse_hhmm("09:30"), NaiveTime::from_hms_opt(9, 30, 0));
        assert_eq!(parse_hhmm("23:59"), NaiveTime::from_hms_opt(23, 59, 0));
        for bad in [
            "9:30", "24:00", "12:60", "12-00", "ab:cd", "12:000", "+1:00",
        ] {
            assert_eq!(parse_hhmm(bad), None, "{bad}");
        }
    }
}
