//! The providers' and routes' checks.

use super::*;

impl Checker<'_> {
    pub(super) fn providers(&mut self, c: &Config) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, p) in c.providers.iter().enumerate() {
            let path = format!("provider[{i}]");
            self.id(&format!("{path}.id"), "provider", &p.id);
            if let Some(first) = seen.get(p.id.as_str()) {
                self.error(
                    format!("{path}.id"),
                    format!(
                        "duplicate provider id {:?} (first defined at provider[{first}])",
                        p.id
                    ),
                );
            } else {
                seen.insert(&p.id, i);
            }
            if let Some(var) = &p.api_key_env {
                self.env_name(&format!("{path}.api_key_env"), var);
            }
            if let Some(n) = p.max_in_flight {
                self.at_least(&format!("{path}.max_in_flight"), n, 1);
            }
            if p.regions.is_empty() {
                self.error(
                    path.clone(),
                    format!("provider {:?} has no regions: add a [[provider.region]] with id and base_url", p.id),
                );
            }
            let mut regions: HashMap<&str, usize> = HashMap::new();
            for (j, r) in p.regions.iter().enumerate() {
                let rpath = format!("{path}.region[{j}]");
                self.id(&format!("{rpath}.id"), "region", &r.id);
                if let Some(first) = regions.get(r.id.as_str()) {
                    self.error(
                        format!("{rpath}.id"),
                        format!(
                            "duplicate region id {:?} in provider {:?} (first defined at {path}.region[{first}])",
                            r.id, p.id
                        ),
                    );
                } else {
                    regions.insert(&r.id, j);
                }
                self.url(&format!("{rpath}.base_url"), &r.base_url, true);
            }
        }
    }

    pub(super) fn routes(&mut self, c: &Config) {
        if c.routes.is_empty() {
            self.error("route", "no routes configured: add at least one [[route]]");
        }
        let known = |ids: &mut dyn Iterator<Item = &str>| {
            let ids: Vec<&str> = ids.collect();
            if ids.is_empty() {
                "none".to_owned()
            } else {
                ids.join(", ")
            }
        };
        let mut seen: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut currency: Option<(&str, usize)> = None;
        for (i, r) in c.routes.iter().enumerate() {
            let p = format!("route[{i}]");
            let key = |k: &str| format!("{p}.{k}");
            match c.providers.iter().find(|x| x.id == r.provider) {
                None => self.error(
                    key("provider"),
                    format!(
                        "unknown provider {:?} (known: {})",
                        r.provider,
                        known(&mut c.providers.iter().map(|x| x.id.as_str()))
                    ),
                ),
                Some(provider) if !provider.regions.iter().any(|g| g.id == r.region) => self.error(
                    key("region"),
                    format!(
                        "unknown region {:?} of provider {:?} (known: {})",
                        r.region,
                        r.provider,
                        known(&mut provider.regions.iter().map(|g| g.id.as_str()))
                    ),
                ),
                Some(_) => {}
            }
            if r.model.is_empty() {
                self.error(key("model"), "must not be empty");
            } else if r
                .model
                .chars()
                .any(|ch| ch.is_whitespace() || ch.is_control())
            {
                self.error(
                    key("model"),
                    format!(
                        "invalid model {:?}: no whitespace or control characters",
                        r.model
                    ),
                );
            }
            if r.serves.is_empty() {
                self.error(key("serves"), "must not be empty");
            } else if !r
                .serves
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "._:/-".contains(ch))
            {
                self.error(
                    key("serves"),
                    format!(
                        "invalid serves {:?}: use only letters, digits and . _ : / -",
                        r.serves
                    ),
                );
            }
            let triple = (r.provider.as_str(), r.region.as_str(), r.model.as_str());
            if let Some(first) = seen.get(&triple) {
                self.error(
                    p.clone(),
                    format!(
                        "duplicate route \"{}/{}/{}\" (same provider/region/model as route[{first}])",
                        r.provider, r.region, r.model
                    ),
                );
            } else {
                seen.insert(triple, i);
            }
            if r.weight > 100 {
                self.error(
                    key("weight"),
                    format!("must be in 0..=100, got {}", r.weight),
                );
            }
            if let Some(price) = &r.price {
                for (k, v) in [
                    ("price.input_per_mtok", price.input_per_mtok),
                    ("price.output_per_mtok", price.output_per_mtok),
                ] {
                    if !(v.is_finite() && v >= 0.0) {
                        self.error(key(k), format!("must be 0 or more, got {v}"));
                    }
                }
                if price.currency.trim().is_empty() {
                    self.error(key("price.currency"), "must not be empty");
                } else {
                    match currency {
                        None => currency = Some((&price.currency, i)),
                        Some((cur, first)) if cur != price.currency => self.error(
                            key("price.currency"),
                            format!(
                                "currency {:?} differs from {cur:?} (route[{first}]): use one currency per config",
                                price.currency
                            ),
                        ),
                        Some(_) => {}
                    }
                }
            }
            if let Some(cw) = r.context_window {
                self.at_least(&key("context_window"), cw, 1);
            }
            if let Some(tag) = &r.residency {
                if !is_id(tag) {
                    self.error(
                        key("residency"),
                        format!(
                            "invalid residency tag {tag:?}: use only a-z, 0-9, \"_\" and \"-\""
                        ),
                    );
                }
            }
            for (k, d) in [
                ("interval", r.interval),
                ("timeout", r.timeout),
                ("first_byte_timeout", r.first_byte_timeout),
                ("stall_timeout", r.stall_timeout),
            ] {
                if let Some(d) = d {
                    self.positive(&key(k), d);
                }
            }
            if let Some(n) = r.max_tokens {
                self.at_least(&key("max_tokens"), n, 1);
            }
            if let Some(n) = r.max_in_flight {
                self.at_least(&key("max_in_flight"), n, 1);
            }
            if let Some(slo) = r.slo {
                self.open_unit(&key("slo"), slo);
            }
            self.route_timeouts(c, i);
        }
    }

    /// The route's effective timeouts, checked only where the route overrides one (the
    /// `[probe]` defaults are checked once, in [`Self::probe`]).
    fn route_timeouts(&mut self, c: &Config, i: usize) {
        let r = &c.routes[i];
        let eff = c.probe_settings(r);
        let p = format!("route[{i}]");
        let (interval, timeout, fbt) = (
            format!("{p}.interval"),
            format!("{p}.timeout"),
            format!("{p}.first_byte_timeout"),
        );
        // A key that did not convert (here or in [probe]) was reported already: comparing the
        // default that stands in for it would only add a confusing second error.
        let failed = ["interval", "timeout", "first_byte_timeout"]
            .iter()
            .any(|k| !self.converted(&[&format!("{p}.{k}"), &format!("probe.{k}")]));
        if failed {
            return;
        }
        // A zero timeout is reported on its own; comparing with it would only repeat that.
        if (r.first_byte_timeout.is_some() || r.timeout.is_some())
            && !eff.timeout.is_zero()
            && eff.first_byte_timeout > eff.timeout
        {
            let at = if r.first_byte_timeout.is_some() {
                fbt
            } else {
                timeout.clone()
            };
            self.error(at, exceeds(eff.first_byte_timeout, eff.timeout));
        }
        if (r.interval.is_some() || r.timeout.is_some())
            && !eff.interval.is_zero()
            && eff.timeout >= eff.interval
        {
            let at = if r.timeout.is_some() {
                timeout
            } else {
                interval
            };
            self.warn(at, overrun(eff.timeout, eff.interval));
        }
    }
}
