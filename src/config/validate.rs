//! Stage two's checks over the typed config: every problem is collected (none stops the
//! others), located through the [`SourceMap`], and sorted into file order.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::NaiveTime;

use super::{Behaviour, Buckets, Config, ConfigErrors, Diagnostic, SourceMap};

mod alerting;
mod embeddings;
mod routes;

pub(crate) struct Checker<'a> {
    file: String,
    map: &'a SourceMap,
    /// Keys whose value did not convert (reported already, replaced by the default): checks
    /// that combine them with other keys are skipped, so one typo is one error.
    failed: HashSet<String>,
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(file: &str, map: &'a SourceMap) -> Self {
        Self {
            file: file.to_owned(),
            map,
            failed: HashSet::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn diagnostic(&self, path: String, message: String) -> Diagnostic {
        let (line, col) = self.map.locate(&path);
        Diagnostic {
            file: self.file.clone(),
            line,
            col,
            path,
            message,
        }
    }

    pub(crate) fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let d = self.diagnostic(path.into(), message.into());
        self.errors.push(d);
    }

    /// An error in converting a value: also marks the key failed.
    pub(crate) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let path = path.into();
        self.mark_failed(&path);
        self.error(path, message);
    }

    pub(crate) fn mark_failed(&mut self, path: &str) {
        self.failed.insert(path.to_owned());
    }

    pub(crate) fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        let d = self.diagnostic(path.into(), message.into());
        self.warnings.push(d);
    }

    fn converted(&self, paths: &[&str]) -> bool {
        paths.iter().all(|p| !self.failed.contains(*p))
    }

    /// The warnings when there is no error; every error otherwise. Both in file order.
    pub(crate) fn finish(mut self) -> Result<Vec<Diagnostic>, ConfigErrors> {
        let order = |d: &Diagnostic| (d.line, d.col);
        self.errors.sort_by_key(order);
        self.warnings.sort_by_key(order);
        if self.errors.is_empty() {
            Ok(self.warnings)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }

    pub(crate) fn check(&mut self, c: &Config) {
        self.server(c);
        self.storage(c);
        self.probe(c);
        self.detection(c);
        if let Some(url) = &c.egress.control_url {
            self.url("egress.control_url", url, false);
        }
        self.providers(c);
        self.routes(c);
        self.embeddings(c);
        self.positive("slo.latency_threshold", c.slo.latency_threshold);
        self.open_unit("slo.availability", c.slo.availability);
        if c.drift.sets.as_os_str().is_empty() {
            self.error("drift.sets", "must not be empty");
        }
        self.alerting(c);
        self.maintenance(c);
        self.proxy(c);
        self.switch_and_budget(c);
        self.contracts(c);
        self.positive("heartbeat.stale_after", c.heartbeat.stale_after);
        if c.heartbeat.stale_after < Duration::from_secs(60) && !c.heartbeat.stale_after.is_zero() {
            self.warn(
                "heartbeat.stale_after",
                "below 1m: jobs beat every 10-30 s, so a busy moment would look like a stall",
            );
        }
        if let Some(name) = &c.heartbeat.ping_url_env {
            self.env_name("heartbeat.ping_url_env", name);
        }
        self.positive("drill.max_duration", c.drill.max_duration);
        self.env_name("tracing.otlp_endpoint_env", &c.tracing.otlp_endpoint_env);
        if c.tracing.service_name.trim().is_empty() {
            self.error("tracing.service_name", "must not be empty");
        }
        let ratio = c.tracing.sample_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            self.error("tracing.sample_ratio", "must be between 0 and 1");
        }
        let subs = &c.subscriptions;
        if subs.enabled && subs.email && c.alert.email.is_empty() {
            self.error(
                "subscriptions.email",
                "subscriptions by email need an [[alert.email]] table (its SMTP setting sends them); add one or set email = false",
            );
        }
        if subs.enabled && !subs.email && !subs.webhook {
            self.error(
                "subscriptions.enabled",
                "neither email nor webhook is on: nothing could be subscribed to",
            );
        }
        super::vantage::check(self, c);
        super::profile::check(self, c);
        super::shadow::check(self, c);
        super::routers::check(self, c);
        super::sync::check(self, c);
        super::status_page::check(self, c);
        super::clients::check(self, c);
    }

    fn contracts(&mut self, c: &Config) {
        let models: std::collections::BTreeSet<&str> =
            c.routes.iter().map(|r| r.serves.as_str()).collect();
        let mut seen = std::collections::BTreeSet::new();
        for (i, k) in c.contracts.iter().enumerate() {
            let at = format!("contract[{i}]");
            let feature_ok = !k.feature.is_empty()
                && k.feature.len() <= 64
                && k.feature
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.'));
            if !feature_ok {
                self.error(
                    format!("{at}.feature"),
                    "must be 1-64 characters of a-z, A-Z, 0-9, \"_\", \"-\", \".\" (it travels in the x-probeok-feature header)",
                );
            } else if !seen.insert(k.feature.as_str()) {
                self.error(
                    format!("{at}.feature"),
                    format!("feature {:?} already has a contract", k.feature),
                );
            }
            if k.degraded.is_none()
                && k.critical.is_none()
                && self.converted(&[&format!("{at}.degraded"), &format!("{at}.critical")])
            {
                self.error(at.clone(), "set degraded, critical or both");
            }
            for (state, b) in [("degraded", &k.degraded), ("critical", &k.critical)] {
                let path = format!("{at}.{state}.{}", b.as_ref().map_or("", |b| b.name()));
                match b {
                    Some(Behaviour::FallbackModel(m)) if !models.contains(m.as_str()) => {
                        self.error(
                            path,
                            format!("{m:?} is not a logical model: no route serves it"),
                        );
                    }
                    Some(Behaviour::AsyncQueue { ttl })
                        if ttl.is_zero() || *ttl > Duration::from_secs(7 * 86400) =>
                    {
                        self.error(path, "must be greater than 0 and at most 7d");
                    }
                    Some(Behaviour::CachedResponse { max_age })
                        if max_age.is_zero() || *max_age > Duration::from_secs(86400) =>
                    {
                        self.error(path, "must be greater than 0 and at most 24h");
                    }
                    Some(Behaviour::Reject { message })
                        if message.trim().is_empty() || message.len() > 1000 =>
                    {
                        self.error(path, "must be a message of 1 to 1000 bytes");
                    }
                    _ => {}
                }
            }
            if k.user_message.as_ref().is_some_and(|m| m.len() > 1000) {
                self.error(format!("{at}.user_message"), "must be at most 1000 bytes");
            }
            self.positive(&format!("{at}.retry_after"), k.retry_after);
        }
    }

    fn switch_and_budget(&mut self, c: &Config) {
        let s = &c.switch;
        for (key, d) in [
            ("switch.min_dwell", s.min_dwell),
            ("switch.return_after", s.return_after),
            ("switch.return_healthy_for", s.return_healthy_for),
            ("switch.canary_stage", s.canary_stage),
        ] {
            self.positive(key, d);
        }
        self.at_least("switch.max_switches_per_hour", s.max_switches_per_hour, 1);
        if s.canary.is_empty() {
            self.error(
                "switch.canary",
                "must list at least one ratio, ending at 1.0",
            );
        } else if s
            .canary
            .iter()
            .any(|r| !(r.is_finite() && *r > 0.0 && *r <= 1.0))
        {
            self.error("switch.canary", "every ratio must be in (0, 1]");
        } else if s.canary.windows(2).any(|w| w[1] <= w[0]) {
            self.error(
                "switch.canary",
                "ratios must increase, e.g. [0.05, 0.25, 1.0]",
            );
        } else if s.canary.last().is_some_and(|r| *r != 1.0) {
            self.error(
                "switch.canary",
                "the last ratio must be 1.0 (all traffic back)",
            );
        }
        let b = &c.budget;
        if !(b.max_extra_cost_per_hour.is_finite() && b.max_extra_cost_per_hour >= 0.0) {
            self.error(
                "budget.max_extra_cost_per_hour",
                format!("must be a number ≥ 0, got {}", b.max_extra_cost_per_hour),
            );
        }
        self.rate("budget.degrade_at", b.degrade_at);
    }

    fn proxy(&mut self, c: &Config) {
        let p = &c.proxy;
        for (key, d) in [
            ("proxy.first_byte_timeout", p.first_byte_timeout),
            ("proxy.total_timeout", p.total_timeout),
            ("proxy.stream_idle_timeout", p.stream_idle_timeout),
            ("proxy.max_stream_duration", p.max_stream_duration),
            ("proxy.idempotency_ttl", p.idempotency_ttl),
            ("proxy.breaker.window", p.breaker.window),
            ("proxy.breaker.open_for", p.breaker.open_for),
        ] {
            self.positive(key, d);
        }
        self.at_least("proxy.max_attempts", p.max_attempts, 1);
        self.at_least("proxy.max_connections", p.max_connections, 1);
        self.at_least("proxy.workers", p.workers, 1);
        if p.workers > super::MAX_WORKERS {
            let max = super::MAX_WORKERS;
            self.error(
                "proxy.workers",
                format!("must be at most {max}, got {}", p.workers),
            );
        }
        self.at_least("proxy.breaker.min_requests", p.breaker.min_requests, 1);
        self.rate("proxy.breaker.failure_ratio", p.breaker.failure_ratio);
        if p.max_body == 0 {
            self.error("proxy.max_body", "must be greater than 0");
        }
        self.env_name("proxy.client_keys_env", &p.client_keys_env);
        if self.converted(&["proxy.first_byte_timeout", "proxy.total_timeout"])
            && !p.total_timeout.is_zero()
            && p.first_byte_timeout > p.total_timeout
        {
            self.error(
                "proxy.first_byte_timeout",
                format!(
                    "first_byte_timeout ({}) must not exceed total_timeout ({})",
                    humantime::format_duration(p.first_byte_timeout),
                    humantime::format_duration(p.total_timeout)
                ),
            );
        }
        if p.enabled
            && self.converted(&["proxy.listen", "server.listen"])
            && p.listen == c.server.listen
        {
            self.error(
                "proxy.listen",
                format!(
                    "{} is also server.listen: the proxy needs its own address",
                    p.listen
                ),
            );
        }
    }

    fn server(&mut self, c: &Config) {
        let s = &c.server;
        self.url("server.public_url", &s.public_url, false);
        self.env_name("server.admin_token_env", &s.admin_token_env);
        self.env_name("server.ingest_token_env", &s.ingest_token_env);
        self.at_least("server.max_connections", s.max_connections, 1);
    }

    fn storage(&mut self, c: &Config) {
        let s = &c.storage;
        if s.path.as_os_str().is_empty() {
            self.error("storage.path", "must not be empty");
        }
        if let Some(name) = &s.url_env {
            self.env_name("storage.url_env", name);
        }
        self.at_least("storage.retention_days", s.retention_days, 1);
        self.at_least("storage.rollup_retention_days", s.rollup_retention_days, 1);
        // The lease is checked every second: under 2 s one slow answer would end a term.
        if c.cluster.lease < Duration::from_secs(2) {
            self.error(
                "cluster.lease",
                "must be at least 2s (the lease is checked every second)",
            );
        }
    }

    fn probe(&mut self, c: &Config) {
        let p = &c.probe;
        self.positive("probe.interval", p.interval);
        self.positive("probe.first_byte_timeout", p.first_byte_timeout);
        self.positive("probe.stall_timeout", p.stall_timeout);
        self.positive("probe.timeout", p.timeout);
        self.positive("probe.throughput_every", p.throughput_every);
        if !(0.0..=0.5).contains(&p.jitter) {
            self.error(
                "probe.jitter",
                format!("must be in [0, 0.5], got {}", p.jitter),
            );
        }
        self.at_least("probe.max_tokens", p.max_tokens, 1);
        self.at_least("probe.throughput_max_tokens", p.throughput_max_tokens, 1);
        for (key, v) in [
            ("probe.throughput_prompt", &p.throughput_prompt),
            ("probe.user", &p.user),
            ("probe.expect", &p.expect),
        ] {
            if v.trim().is_empty() {
                self.error(key, "must not be empty");
            }
        }
        if self.converted(&["probe.first_byte_timeout", "probe.timeout"])
            && !p.timeout.is_zero()
            && p.first_byte_timeout > p.timeout
        {
            self.error(
                "probe.first_byte_timeout",
                exceeds(p.first_byte_timeout, p.timeout),
            );
        }
        // Said once for the defaults, and only if some route actually runs on both of them.
        let inherited = c
            .routes
            .iter()
            .any(|r| r.interval.is_none() && r.timeout.is_none());
        if inherited
            && self.converted(&["probe.interval", "probe.timeout"])
            && !p.interval.is_zero()
            && p.timeout >= p.interval
        {
            self.warn("probe.timeout", overrun(p.timeout, p.interval));
        }
    }

    fn detection(&mut self, c: &Config) {
        let d = &c.detection;
        if !(d.sigma.is_finite() && d.sigma > 0.0) {
            self.error(
                "detection.sigma",
                format!("must be greater than 0, got {}", d.sigma),
            );
        }
        if !(d.latency_floor_ratio.is_finite() && d.latency_floor_ratio >= 0.0) {
            self.error(
                "detection.latency_floor_ratio",
                format!("must be 0 or more, got {}", d.latency_floor_ratio),
            );
        }
        self.positive("detection.latency_floor", d.latency_floor);
        self.at_least("detection.baseline_window", d.baseline_window, 1);
        self.at_least("detection.min_samples", d.min_samples, 1);
        if self.converted(&["detection.min_samples", "detection.baseline_window"])
            && d.min_samples > d.baseline_window
        {
            self.error(
                "detection.min_samples",
                format!(
                    "must not exceed baseline_window ({}), got {}: routes would never leave UNKNOWN",
                    d.baseline_window, d.min_samples
                ),
            );
        }
        if let Buckets::Windows(windows) = &d.buckets {
            self.windows(windows);
        }
        self.at_least("detection.degraded_after", d.degraded_after, 1);
        self.rate("detection.critical_error_rate", d.critical_error_rate);
        self.positive("detection.error_window", d.error_window);
        self.at_least("detection.min_error_samples", d.min_error_samples, 1);
        self.at_least("detection.min_failures", d.min_failures, 1);
        self.positive("detection.critical_after", d.critical_after);
        self.positive("detection.critical_degraded_for", d.critical_degraded_for);
        self.positive("detection.recover_after", d.recover_after);
        self.rate("detection.recover_error_rate", d.recover_error_rate);
        let critical_ok = d.critical_error_rate > 0.0 && d.critical_error_rate <= 1.0;
        if critical_ok && d.recover_error_rate > d.critical_error_rate {
            self.error(
                "detection.recover_error_rate",
                format!(
                    "must not exceed critical_error_rate ({}), got {}: recovery needs a lower error rate than escalation",
                    d.critical_error_rate, d.recover_error_rate
                ),
            );
        }
        self.rate("detection.tps_floor", d.tps_floor);
    }

    fn windows(&mut self, windows: &[(NaiveTime, NaiveTime)]) {
        if windows.is_empty() {
            self.error(
                "detection.buckets",
                "no windows: use \"none\", \"hour\" or at least one [\"HH:MM\", \"HH:MM\"] window",
            );
        }
        let show =
            |(s, e): (NaiveTime, NaiveTime)| format!("{}-{}", s.format("%H:%M"), e.format("%H:%M"));
        for (j, &(start, end)) in windows.iter().enumerate() {
            let path = format!("detection.buckets[{j}]");
            if start >= end {
                self.error(
                    path,
                    format!(
                        "window {} is empty or reversed: start must be before end (windows cannot cross midnight)",
                        show((start, end))
                    ),
                );
                continue;
            }
            let earlier = windows[..j]
                .iter()
                .enumerate()
                .find(|(_, &(s, e))| s < e && s < end && start < e);
            if let Some((i, &w)) = earlier {
                self.error(
                    path,
                    format!(
                        "window {} overlaps window {} (detection.buckets[{i}])",
                        show((start, end)),
                        show(w)
                    ),
                );
            }
        }
    }

    fn positive(&mut self, path: &str, d: Duration) {
        if d.is_zero() {
            self.error(path, "must be greater than 0");
        }
    }

    fn at_least(&mut self, path: &str, v: u32, min: u32) {
        if v < min {
            self.error(path, format!("must be at least {min}, got {v}"));
        }
    }

    /// A rate in (0, 1].
    fn rate(&mut self, path: &str, v: f64) {
        if !(v > 0.0 && v <= 1.0) {
            self.error(path, format!("must be in (0, 1], got {v}"));
        }
    }

    /// A target in (0, 1): 1 would leave no error budget at all.
    fn open_unit(&mut self, path: &str, v: f64) {
        if !(v > 0.0 && v < 1.0) {
            self.error(path, format!("must be in (0, 1), e.g. 0.999, got {v}"));
        }
    }

    fn id(&mut self, path: &str, what: &str, id: &str) {
        if !is_id(id) {
            self.error(
                path,
                format!("invalid {what} id {id:?}: use only a-z, 0-9, \"_\" and \"-\""),
            );
        }
    }

    /// The value is not echoed: a `*_env` key holding the secret itself is the classic mistake.
    pub(crate) fn env_name(&mut self, path: &str, name: &str) {
        let mut chars = name.chars();
        let ok = chars
            .next()
            .is_some_and(|ch| ch.is_ascii_alphabetic() || ch == '_')
            && chars.all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !ok {
            self.error(
                path,
                "must name an environment variable (letters, digits and \"_\"), not hold the secret itself",
            );
        }
    }

    /// http(s) with a host. The URL is not echoed: it may embed credentials.
    pub(crate) fn url(&mut self, path: &str, value: &str, base: bool) {
        let url = match reqwest::Url::parse(value) {
            Ok(url) => url,
            Err(e) => {
                self.error(path, format!("must be an http(s) URL with a host ({e})"));
                return;
            }
        };
        if !matches!(url.scheme(), "http" | "https") {
            self.error(
                path,
                format!("must be an http(s) URL with a host, not {}:", url.scheme()),
            );
        } else if url.host_str().is_none_or(|h| h.is_empty()) {
            self.error(path, "must be an http(s) URL with a host");
        } else if !url.username().is_empty() || url.password().is_some() {
            self.error(
                path,
                "must not embed credentials: name them by environment variable instead",
            );
        } else if base && (url.query().is_some() || url.fragment().is_some()) {
            self.error(path, "must not have a query or fragment");
        }
    }
}

fn exceeds(first_byte_timeout: Duration, timeout: Duration) -> String {
    format!(
        "first_byte_timeout ({}) must not exceed timeout ({})",
        humantime::format_duration(first_byte_timeout),
        humantime::format_duration(timeout)
    )
}

fn overrun(timeout: Duration, interval: Duration) -> String {
    format!(
        "timeout ({}) >= interval ({}): such probes overrun and are skipped",
        humantime::format_duration(timeout),
        humantime::format_duration(interval)
    )
}

/// `[a-z0-9_-]+`.
pub(crate) fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_' || ch == '-')
}

/// `local@domain`, loosely: enough to catch a typo, not an RFC 5322 parser.
fn is_address(s: &str) -> bool {
    match s.rsplit_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && !domain.is_empty()
                && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        }
        None => false,
    }
}
