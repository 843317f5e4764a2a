//! Converting what shapes serving: the proxy, degradation contracts, the switch controller
//! and drills.

use super::*;

pub(super) fn contract(ck: &mut Checker<'_>, i: usize, r: RawContract) -> ContractConfig {
    let at = format!("contract[{i}]");
    let d = Duration::from_secs(60);
    let retry_after = duration(ck, &format!("{at}.retry_after"), r.retry_after, d);
    let state = |ck: &mut Checker<'_>, name: &str, b: Option<RawBehaviour>| {
        let b = b?;
        let path = format!("{at}.{name}");
        let mut set: Vec<Behaviour> = Vec::new();
        if let Some(m) = b.fallback_model {
            set.push(Behaviour::FallbackModel(m));
        }
        if let Some(t) = b.async_queue {
            let Ok(ttl) = parse_duration(ck, &format!("{path}.async_queue"), &t) else {
                ck.mark_failed(&path);
                return None;
            };
            set.push(Behaviour::AsyncQueue { ttl });
        }
        if let Some(t) = b.cached_response {
            let Ok(max_age) = parse_duration(ck, &format!("{path}.cached_response"), &t) else {
                ck.mark_failed(&path);
                return None;
            };
            set.push(Behaviour::CachedResponse { max_age });
        }
        if let Some(message) = b.reject {
            set.push(Behaviour::Reject { message });
        }
        if set.len() != 1 {
            ck.fail(
                &path,
                format!(
                    "set exactly one of fallback_model, async_queue, cached_response, reject (got {})",
                    set.len()
                ),
            );
            return None;
        }
        set.pop()
    };
    ContractConfig {
        degraded: state(ck, "degraded", r.degraded),
        critical: state(ck, "critical", r.critical),
        feature: r.feature,
        user_message: r.user_message,
        retry_after,
    }
}

pub(super) fn drill(ck: &mut Checker<'_>, r: RawDrill) -> DrillConfig {
    let d = DrillConfig::default();
    let mut off_peak = Vec::new();
    for (i, w) in r.off_peak.unwrap_or_default().iter().enumerate() {
        let path = format!("drill.off_peak[{i}]");
        let (Some(start), Some(end)) = (
            w.first().and_then(|s| parse_hhmm(s)),
            w.get(1).and_then(|s| parse_hhmm(s)),
        ) else {
            ck.fail(
                &path,
                "a window is [\"HH:MM\", \"HH:MM\"] (00:00 to 23:59; it may cross midnight)",
            );
            continue;
        };
        if w.len() != 2 || start == end {
            ck.fail(
                &path,
                "a window is two different times [\"HH:MM\", \"HH:MM\"]",
            );
            continue;
        }
        off_peak.push((start, end));
    }
    DrillConfig {
        off_peak,
        max_duration: duration(ck, "drill.max_duration", r.max_duration, d.max_duration),
    }
}

pub(super) fn proxy(ck: &mut Checker<'_>, r: RawProxy) -> ProxyConfig {
    let d = ProxyConfig::default();
    let listen = match r.listen {
        None => d.listen,
        Some(s) => s.parse::<SocketAddr>().unwrap_or_else(|_| {
            ck.fail(
                "proxy.listen",
                format!("invalid address {s:?}: expected IP:PORT, e.g. \"127.0.0.1:9401\""),
            );
            d.listen
        }),
    };
    let max_body = match r.max_body {
        None => d.max_body,
        Some(s) => parse_size(&s).unwrap_or_else(|| {
            ck.fail(
                "proxy.max_body",
                format!("invalid size {s:?}: write e.g. \"10MiB\", \"512KiB\", \"1MB\" or a number of bytes"),
            );
            d.max_body
        }),
    };
    let b = r.breaker;
    let db = BreakerConfig::default();
    ProxyConfig {
        enabled: r.enabled.unwrap_or(d.enabled),
        listen,
        first_byte_timeout: duration(
            ck,
            "proxy.first_byte_timeout",
            r.first_byte_timeout,
            d.first_byte_timeout,
        ),
        total_timeout: duration(ck, "proxy.total_timeout", r.total_timeout, d.total_timeout),
        max_attempts: uint(ck, "proxy.max_attempts", r.max_attempts, d.max_attempts, 1),
        max_retry_wait: duration(
            ck,
            "proxy.max_retry_wait",
            r.max_retry_wait,
            d.max_retry_wait,
        ),
        stream_idle_timeout: duration(
            ck,
            "proxy.stream_idle_timeout",
            r.stream_idle_timeout,
            d.stream_idle_timeout,
        ),
        max_stream_duration: duration(
            ck,
            "proxy.max_stream_duration",
            r.max_stream_duration,
            d.max_stream_duration,
        ),
        max_body,
        idempotency_ttl: duration(
            ck,
            "proxy.idempotency_ttl",
            r.idempotency_ttl,
            d.idempotency_ttl,
        ),
        idempotency_wait: duration(
            ck,
            "proxy.idempotency_wait",
            r.idempotency_wait,
            d.idempotency_wait,
        ),
        idempotency_keys_per_client: uint(
            ck,
            "proxy.idempotency_keys_per_client",
            r.idempotency_keys_per_client,
            d.idempotency_keys_per_client,
            1,
        ),
        cached_answers_per_client: uint(
            ck,
            "proxy.cached_answers_per_client",
            r.cached_answers_per_client,
            d.cached_answers_per_client,
            1,
        ),
        client_keys_env: r.client_keys_env.unwrap_or(d.client_keys_env),
        allow_unauthenticated: r.allow_unauthenticated.unwrap_or(d.allow_unauthenticated),
        max_connections: uint(
            ck,
            "proxy.max_connections",
            r.max_connections,
            d.max_connections,
            1,
        ),
        workers: uint(ck, "proxy.workers", r.workers, d.workers, 1),
        clients: crate::config::clients::clients(ck, r.client),
        breaker: BreakerConfig {
            failure_ratio: b.failure_ratio.unwrap_or(db.failure_ratio),
            window: duration(ck, "proxy.breaker.window", b.window, db.window),
            min_requests: uint(
                ck,
                "proxy.breaker.min_requests",
                b.min_requests,
                db.min_requests,
                1,
            ),
            open_for: duration(ck, "proxy.breaker.open_for", b.open_for, db.open_for),
        },
    }
}

pub(super) fn switch(ck: &mut Checker<'_>, r: RawSwitch) -> SwitchConfig {
    let d = SwitchConfig::default();
    SwitchConfig {
        min_dwell: duration(ck, "switch.min_dwell", r.min_dwell, d.min_dwell),
        max_switches_per_hour: uint(
            ck,
            "switch.max_switches_per_hour",
            r.max_switches_per_hour,
            d.max_switches_per_hour,
            1,
        ),
        return_after: duration(ck, "switch.return_after", r.return_after, d.return_after),
        return_healthy_for: duration(
            ck,
            "switch.return_healthy_for",
            r.return_healthy_for,
            d.return_healthy_for,
        ),
        canary: r.canary.unwrap_or(d.canary),
        canary_stage: duration(ck, "switch.canary_stage", r.canary_stage, d.canary_stage),
    }
}
