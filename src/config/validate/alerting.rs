//! The alert channels' and maintenance windows' checks.

use super::*;

impl Checker<'_> {
    pub(super) fn alerting(&mut self, c: &Config) {
        if let Some(url) = &c.alerting.runbook_url {
            // The placeholder is filled in per message; what is around it must be a URL.
            let filled = url.replace("{failure_mode}", "unavailable");
            self.url("alerting.runbook_url", &filled, false);
        }
        let a = &c.alert;
        for (kind, robots) in [("dingtalk", &a.dingtalk), ("feishu", &a.feishu)] {
            for (i, r) in robots.iter().enumerate() {
                let p = format!("alert.{kind}[{i}]");
                self.env_name(&format!("{p}.webhook_env"), &r.webhook_env);
                if let Some(v) = &r.secret_env {
                    self.env_name(&format!("{p}.secret_env"), v);
                }
                if let Some(m) = &r.mention {
                    self.mention(&format!("{p}.mention"), m, kind == "feishu");
                }
            }
        }
        for (i, w) in a.wecom.iter().enumerate() {
            let p = format!("alert.wecom[{i}]");
            self.env_name(&format!("{p}.webhook_env"), &w.webhook_env);
            if let Some(m) = &w.mention {
                self.mention(&format!("{p}.mention"), m, false);
            }
        }
        for (kind, hooks) in [("slack", &a.slack), ("teams", &a.teams)] {
            for (i, w) in hooks.iter().enumerate() {
                let p = format!("alert.{kind}[{i}]");
                self.env_name(&format!("{p}.webhook_env"), &w.webhook_env);
                self.api_base(&p, w.api_base.as_deref());
                match (&w.mention, kind) {
                    (Some(_), "teams") => self.error(
                        format!("{p}.mention"),
                        "a Teams Workflows webhook cannot mention anyone: remove mention",
                    ),
                    (Some(m), _) => self.slack_mention(&format!("{p}.mention"), m),
                    (None, _) => {}
                }
            }
        }
        for (i, t) in a.telegram.iter().enumerate() {
            let p = format!("alert.telegram[{i}]");
            self.env_name(&format!("{p}.token_env"), &t.token_env);
            self.api_base(&p, t.api_base.as_deref());
            let id = t.chat_id.strip_prefix('-').unwrap_or(&t.chat_id);
            let numeric = !id.is_empty() && id.chars().all(|c| c.is_ascii_digit());
            let username = t.chat_id.strip_prefix('@').is_some_and(|u| {
                (5..=32).contains(&u.len())
                    && u.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if !numeric && !username {
                self.error(
                    format!("{p}.chat_id"),
                    format!(
                        "invalid chat id {:?}: expected a number (\"-1001234567890\") or \"@channelusername\"",
                        t.chat_id
                    ),
                );
            }
        }
        for (i, d) in a.pagerduty.iter().enumerate() {
            let p = format!("alert.pagerduty[{i}]");
            self.env_name(&format!("{p}.routing_key_env"), &d.routing_key_env);
            self.api_base(&p, d.api_base.as_deref());
        }
        for (i, o) in a.opsgenie.iter().enumerate() {
            let p = format!("alert.opsgenie[{i}]");
            self.env_name(&format!("{p}.api_key_env"), &o.api_key_env);
            self.api_base(&p, o.api_base.as_deref());
            if o.region != "us" && o.region != "eu" {
                self.error(
                    format!("{p}.region"),
                    format!("unknown region {:?}: expected \"us\" or \"eu\"", o.region),
                );
            }
        }
        let routes: Vec<String> = c.routes().iter().map(|r| r.id.to_string()).collect();
        for (name, o) in a.options() {
            let p = format!("alert.{name}");
            self.channel_options(&p, o);
            self.channel_routes(&p, &o.routes, &routes);
        }
        for (i, e) in a.email.iter().enumerate() {
            let p = format!("alert.email[{i}]");
            self.env_name(&format!("{p}.smtp_url_env"), &e.smtp_url_env);
            if !is_address(&e.from) {
                self.error(
                    format!("{p}.from"),
                    format!("invalid address {:?}: expected name@domain", e.from),
                );
            }
            if e.to.is_empty() {
                self.error(format!("{p}.to"), "no recipients: add at least one address");
            }
            for (j, to) in e.to.iter().enumerate() {
                if !is_address(to) {
                    self.error(
                        format!("{p}.to[{j}]"),
                        format!("invalid address {to:?}: expected name@domain"),
                    );
                }
            }
        }
        for (i, w) in a.webhook.iter().enumerate() {
            let p = format!("alert.webhook[{i}]");
            self.env_name(&format!("{p}.url_env"), &w.url_env);
            if let Some(v) = &w.secret_env {
                self.env_name(&format!("{p}.secret_env"), v);
            }
        }
    }

    /// A channel's `routes` globs: none empty; one that matches no configured route is a
    /// warning (likely a typo: the channel would never hear of it).
    fn channel_routes(&mut self, p: &str, globs: &[String], routes: &[String]) {
        if globs.is_empty() {
            return;
        }
        for (j, g) in globs.iter().enumerate() {
            let path = format!("{p}.routes[{j}]");
            if g.trim().is_empty() {
                self.error(path, "must not be empty (use \"*\" for every route)");
            } else if g.chars().any(char::is_whitespace) {
                self.error(
                    path,
                    format!("glob {g:?} has whitespace: route ids have none"),
                );
            } else if !routes.iter().any(|r| crate::glob::glob_match(g, r)) {
                self.warn(
                    path,
                    format!("glob {g:?} matches no configured route: this channel gets no alert from it"),
                );
            }
        }
    }

    /// `mention`: numbers that are phone numbers, user ids that are ids, and somebody named.
    /// A channel's `api_base`: an http(s) URL with a host.
    fn api_base(&mut self, p: &str, base: Option<&str>) {
        if let Some(b) = base {
            self.url(&format!("{p}.api_base"), b, true);
        }
    }

    /// Slack mentions: member ids `U…`/`W…` and user-group ids `S…`, no phone numbers.
    fn slack_mention(&mut self, p: &str, m: &crate::config::Mention) {
        if m.user_ids.is_empty() && !m.all {
            self.error(p.to_owned(), "names nobody: add user_ids or all = true");
        }
        if !m.mobiles.is_empty() {
            self.error(
                format!("{p}.mobiles"),
                "Slack mentions by member id (U…) or user-group id (S…): use user_ids",
            );
        }
        for (j, id) in m.user_ids.iter().enumerate() {
            let ok = id.len() >= 2
                && id.len() <= 32
                && matches!(id.as_bytes()[0], b'U' | b'W' | b'S')
                && id
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
            if !ok {
                self.error(
                    format!("{p}.user_ids[{j}]"),
                    format!("invalid Slack id {id:?}: expected a member id (U…, W…) or a user-group id (S…)"),
                );
            }
        }
    }

    fn mention(&mut self, p: &str, m: &crate::config::Mention, feishu: bool) {
        if m.mobiles.is_empty() && m.user_ids.is_empty() && !m.all {
            self.error(
                p.to_owned(),
                "names nobody: add mobiles, user_ids or all = true",
            );
        }
        for (j, mobile) in m.mobiles.iter().enumerate() {
            let path = format!("{p}.mobiles[{j}]");
            if feishu {
                self.error(
                    path,
                    "Feishu bots mention by user id only (open_id ou_… or user_id): use user_ids",
                );
            } else if !is_mobile(mobile) {
                self.error(
                    path,
                    format!("invalid mobile {mobile:?}: expected 6 to 15 digits, optionally after + (e.g. \"13800138000\")"),
                );
            }
        }
        for (j, id) in m.user_ids.iter().enumerate() {
            if !is_user_id(id) {
                self.error(
                    format!("{p}.user_ids[{j}]"),
                    format!("invalid user id {id:?}: 1 to 64 letters, digits or - _ . @ (no spaces, no <>\"')"),
                );
            }
        }
    }

    fn channel_options(&mut self, p: &str, o: &crate::config::ChannelOptions) {
        if let Some(d) = o.repeat_interval {
            self.positive(&format!("{p}.repeat_interval"), d);
        }
    }

    pub(super) fn maintenance(&mut self, c: &Config) {
        for (i, m) in c.maintenance.iter().enumerate() {
            let p = format!("maintenance[{i}]");
            if m.routes.is_empty() {
                self.error(
                    format!("{p}.routes"),
                    "no routes: add at least one route id or glob (e.g. \"qwen/*\")",
                );
            }
            for (j, g) in m.routes.iter().enumerate() {
                if g.trim().is_empty() {
                    self.error(format!("{p}.routes[{j}]"), "must not be empty");
                }
            }
            let dpath = format!("{p}.duration");
            if self.converted(&[&dpath]) {
                self.positive(&dpath, m.duration);
            }
            if let Some(every) = m.every {
                let epath = format!("{p}.every");
                if every < m.duration && self.converted(&[&dpath]) {
                    self.error(
                        epath,
                        format!(
                            "every ({}) is shorter than duration ({}): the window would never close",
                            humantime::format_duration(every),
                            humantime::format_duration(m.duration)
                        ),
                    );
                }
            }
        }
    }
}

/// A phone number as the robots take it: digits, optionally after `+`.
fn is_mobile(s: &str) -> bool {
    let digits = s.strip_prefix('+').unwrap_or(s);
    (6..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A user id that can go into robot markup (`<at id=…>`, `<@…>`) as it is.
fn is_user_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}
