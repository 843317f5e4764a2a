//! Converting the alert channels and maintenance windows.

use super::*;

pub(super) fn alerting(ck: &mut Checker<'_>, r: RawAlerting) -> AlertingConfig {
    let d = AlertingConfig::default();
    AlertingConfig {
        group_wait: duration(ck, "alerting.group_wait", r.group_wait, d.group_wait),
        runbook_url: r.runbook_url,
    }
}

pub(super) fn alert(ck: &mut Checker<'_>, r: RawAlert) -> AlertChannelsConfig {
    let robots = |ck: &mut Checker<'_>, kind: &str, raw: Vec<crate::config::raw::RawRobot>| {
        raw.into_iter()
            .enumerate()
            .map(|(i, x)| RobotConfig {
                options: options(ck, &format!("alert.{kind}[{i}]"), x.options()),
                mention: x
                    .mention
                    .map(|m| mention(ck, &format!("alert.{kind}[{i}].mention"), m)),
                webhook_env: x.webhook_env,
                secret_env: x.secret_env,
            })
            .collect()
    };
    let hooks = |ck: &mut Checker<'_>, kind: &str, raw: Vec<crate::config::raw::RawChatWebhook>| {
        raw.into_iter()
            .enumerate()
            .map(|(i, x)| ChatWebhookConfig {
                options: options(ck, &format!("alert.{kind}[{i}]"), x.options()),
                mention: x
                    .mention
                    .map(|m| mention(ck, &format!("alert.{kind}[{i}].mention"), m)),
                webhook_env: x.webhook_env,
                api_base: x.api_base,
            })
            .collect()
    };
    AlertChannelsConfig {
        slack: hooks(ck, "slack", r.slack),
        teams: hooks(ck, "teams", r.teams),
        telegram: r
            .telegram
            .into_iter()
            .enumerate()
            .map(|(i, x)| TelegramConfig {
                options: options(ck, &format!("alert.telegram[{i}]"), x.options()),
                token_env: x.token_env,
                chat_id: x.chat_id,
                api_base: x.api_base,
            })
            .collect(),
        pagerduty: r
            .pagerduty
            .into_iter()
            .enumerate()
            .map(|(i, x)| PagerDutyConfig {
                options: options(ck, &format!("alert.pagerduty[{i}]"), x.options()),
                routing_key_env: x.routing_key_env,
                api_base: x.api_base,
            })
            .collect(),
        opsgenie: r
            .opsgenie
            .into_iter()
            .enumerate()
            .map(|(i, x)| OpsgenieConfig {
                options: options(ck, &format!("alert.opsgenie[{i}]"), x.options()),
                api_key_env: x.api_key_env,
                region: x.region.unwrap_or_else(|| "us".into()),
                api_base: x.api_base,
            })
            .collect(),
        dingtalk: robots(ck, "dingtalk", r.dingtalk),
        feishu: robots(ck, "feishu", r.feishu),
        email: r
            .email
            .into_iter()
            .enumerate()
            .map(|(i, x)| EmailConfig {
                options: options(ck, &format!("alert.email[{i}]"), x.options()),
                smtp_url_env: x.smtp_url_env,
                from: x.from,
                to: x.to,
            })
            .collect(),
        webhook: r
            .webhook
            .into_iter()
            .enumerate()
            .map(|(i, x)| WebhookConfig {
                options: options(ck, &format!("alert.webhook[{i}]"), x.options()),
                max_per_minute: x.max_per_minute.and_then(|n| match u32::try_from(n) {
                    Ok(n) if n >= 1 => Some(n),
                    _ => {
                        ck.fail(
                            format!("alert.webhook[{i}].max_per_minute"),
                            format!("{n}: expected a whole number of messages, at least 1"),
                        );
                        None
                    }
                }),
                url_env: x.url_env,
                secret_env: x.secret_env,
            })
            .collect(),
        wecom: r
            .wecom
            .into_iter()
            .enumerate()
            .map(|(i, x)| WecomConfig {
                options: options(ck, &format!("alert.wecom[{i}]"), x.options()),
                mention: x
                    .mention
                    .map(|m| mention(ck, &format!("alert.wecom[{i}].mention"), m)),
                webhook_env: x.webhook_env,
            })
            .collect(),
    }
}

fn severity(ck: &mut Checker<'_>, path: String, s: Option<&String>, d: Severity) -> Severity {
    match s {
        None => d,
        Some(s) => Severity::parse(s).unwrap_or_else(|| {
            ck.fail(
                path,
                format!("unknown severity {s:?}: expected \"info\", \"warning\" or \"critical\""),
            );
            d
        }),
    }
}

fn mention(ck: &mut Checker<'_>, p: &str, r: crate::config::raw::RawMention) -> Mention {
    let d = Mention::default();
    Mention {
        min_severity: severity(
            ck,
            format!("{p}.min_severity"),
            r.min_severity.as_ref(),
            d.min_severity,
        ),
        mobiles: r.mobiles,
        user_ids: r.user_ids,
        all: r.all.unwrap_or(d.all),
        resolved: r.resolved.unwrap_or(d.resolved),
    }
}

fn options(ck: &mut Checker<'_>, p: &str, r: RawOptions<'_>) -> ChannelOptions {
    let d = ChannelOptions::default();
    let min_severity = severity(
        ck,
        format!("{p}.min_severity"),
        r.min_severity.as_ref(),
        d.min_severity,
    );
    let lang = match r.lang {
        None => d.lang,
        Some(s) => Lang::parse(s).unwrap_or_else(|| {
            ck.fail(
                format!("{p}.lang"),
                format!("unknown language {s:?}: expected \"zh\" or \"en\""),
            );
            d.lang
        }),
    };
    let repeat_interval = r
        .repeat_interval
        .as_ref()
        .and_then(|s| parse_duration(ck, &format!("{p}.repeat_interval"), s).ok());
    ChannelOptions {
        min_severity,
        lang,
        send_resolved: r.send_resolved.unwrap_or(d.send_resolved),
        repeat_interval,
        routes: r.routes.clone().unwrap_or_default(),
    }
}

pub(super) fn maintenance(ck: &mut Checker<'_>, i: usize, r: RawMaintenance) -> MaintenanceConfig {
    let p = format!("maintenance[{i}]");
    let start = match chrono::DateTime::parse_from_rfc3339(&r.start) {
        Ok(t) => t.with_timezone(&chrono::Utc),
        Err(e) => {
            ck.fail(
                format!("{p}.start"),
                format!(
                    "invalid time {:?}: {e} (write RFC 3339 with an offset, e.g. \"2026-12-01T02:00:00+08:00\")",
                    r.start
                ),
            );
            chrono::DateTime::<chrono::Utc>::UNIX_EPOCH
        }
    };
    MaintenanceConfig {
        routes: r.routes,
        start,
        duration: duration(
            ck,
            &format!("{p}.duration"),
            Some(r.duration),
            Duration::ZERO,
        ),
        every: r
            .every
            .and_then(|s| parse_duration(ck, &format!("{p}.every"), &s).ok()),
    }
}
