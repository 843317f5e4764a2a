//! The config contract: bad files → exact located diagnostics; good files → every default.
//! Key paths use 0-based indices (`route[0]` is the first `[[route]]`).

use std::path::Path;
use std::time::Duration;

use chrono::NaiveTime;
use probeok::config::{Buckets, Config, ProviderConfig, RegionConfig, RouteConfig, ServerConfig};
use probeok::route::{Capability, ProviderKind, RouteId, Tier};
use probeok::secret::Env;

/// Lines 1–11.
const PROVIDERS: &str = r#"[[provider]]
id = "qwen"
api_key_env = "DASHSCOPE_API_KEY"
  [[provider.region]]
  id = "cn-beijing"
  base_url = "https://dashscope.aliyuncs.com/compatible-mode/v1"
[[provider]]
id = "deepseek"
  [[provider.region]]
  id = "cn"
  base_url = "https://api.deepseek.com/"
"#;

/// Lines 12–16 after [`PROVIDERS`]; whatever follows starts on line 17 inside this route.
const ROUTE: &str = r#"[[route]]
provider = "qwen"
region = "cn-beijing"
model = "qwen-max"
serves = "chat-main"
"#;

fn with_route(tail: &str) -> String {
    format!("{PROVIDERS}{ROUTE}{tail}")
}

fn errors(src: &str) -> Vec<String> {
    match Config::parse(src, "p.toml") {
        Ok(_) => vec!["(loaded)".to_owned()],
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const SEVERAL: &str = r#"[probe]
jitter = 0.7
interval = "0s"
[detection]
sigma = 0
timezone = "Europe/Atlantis"
[[provider]]
id = "Qwen"
  [[provider.region]]
  id = "cn"
  base_url = "ftp://example.com"
[[route]]
provider = "qwn"
region = "cn"
model = "m"
serves = "chat main"
weight = 120
[[route]]
provider = "qwn"
region = "cn"
model = "m"
serves = "s"
[slo]
availability = 1.0
"#;

#[test]
fn bad_configs_give_exact_located_diagnostics() {
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "several errors, all reported in file order",
            SEVERAL.to_owned(),
            vec![
                "p.toml:2:10: probe.jitter: must be in [0, 0.5], got 0.7",
                "p.toml:3:12: probe.interval: must be greater than 0",
                "p.toml:5:9: detection.sigma: must be greater than 0, got 0",
                r#"p.toml:6:12: detection.timezone: unknown timezone "Europe/Atlantis" (use an IANA name such as "Asia/Shanghai" or "UTC")"#,
                r#"p.toml:8:6: provider[0].id: invalid provider id "Qwen": use only a-z, 0-9, "_" and "-""#,
                "p.toml:11:14: provider[0].region[0].base_url: must be an http(s) URL with a host, not ftp:",
                r#"p.toml:13:12: route[0].provider: unknown provider "qwn" (known: Qwen)"#,
                r#"p.toml:16:10: route[0].serves: invalid serves "chat main": use only letters, digits and . _ : / -"#,
                "p.toml:17:10: route[0].weight: must be in 0..=100, got 120",
                r#"p.toml:18:1: route[1]: duplicate route "qwn/cn/m" (same provider/region/model as route[0])"#,
                r#"p.toml:19:12: route[1].provider: unknown provider "qwn" (known: Qwen)"#,
                "p.toml:24:16: slo.availability: must be in (0, 1), e.g. 0.999, got 1",
            ],
        ),
        (
            "syntax error",
            with_route("[probe\ninterval = \"30s\"\n"),
            vec!["p.toml:17:7: invalid table header; expected `.`, `]`"],
        ),
        (
            "syntax error: duplicate key",
            with_route("weight = 1\nweight = 2\n"),
            vec!["p.toml:18:1: duplicate key `weight` in table `route`"],
        ),
        (
            "type error",
            with_route("weight = \"80\"\n"),
            vec![r#"p.toml:17:10: route[0].weight: invalid type: string "80", expected an integer"#],
        ),
        (
            "unknown key, named with the valid ones",
            with_route("intervall = \"30s\"\n"),
            vec!["p.toml:17:1: route[0].intervall: unknown key `intervall`, expected one of `provider`, `region`, `model`, `serves`, `tier`, `weight`, `price`, `capabilities`, `context_window`, `residency`, `interval`, `timeout`, `first_byte_timeout`, `stall_timeout`, `max_tokens`, `slo`, `confirm_after`, `request`, `max_in_flight`, `retires`, `kind`, `dimensions`"],
        ),
        (
            "unknown section, named with the valid ones",
            format!("[hearbeat]\nstale_after = \"3m\"\n{PROVIDERS}{ROUTE}"),
            vec!["p.toml:1:2: hearbeat: unknown key `hearbeat`, expected one of `server`, `storage`, `probe`, `detection`, `egress`, `provider`, `route`, `slo`, `alerting`, `alert`, `maintenance`, `drift`, `proxy`, `switch`, `budget`, `contract`, `heartbeat`, `drill`, `cluster`, `tracing`, `vantage`, `quorum`, `agent`, `shadow`, `envoy`, `haproxy`, `subscriptions`, `sync`, `catalog`, `capability`"],
        ),
        (
            "cluster: the URL itself instead of its variable, a lease too short to check",
            format!("[storage]\nurl_env = \"postgres://u:p@h/db\"\n[cluster]\nlease = \"1s\"\n{PROVIDERS}{ROUTE}"),
            vec![
                "p.toml:2:11: storage.url_env: must name an environment variable (letters, digits and \"_\"), not hold the secret itself",
                "p.toml:4:9: cluster.lease: must be at least 2s (the lease is checked every second)",
            ],
        ),
        (
            "contracts: unknown fallback model, two behaviours, duplicate feature, bad duration",
            format!("{PROVIDERS}{ROUTE}[[contract]]\nfeature = \"chat\"\ndegraded = {{ fallback_model = \"chat-lite\" }}\ncritical = {{ reject = \"off\", async_queue = \"1h\" }}\n[[contract]]\nfeature = \"chat\"\ndegraded = {{ cached_response = \"5x\" }}\n[[contract]]\nfeature = \"bad feature\"\n"),
            vec![
                "p.toml:19:31: contract[0].degraded.fallback_model: \"chat-lite\" is not a logical model: no route serves it",
                "p.toml:20:12: contract[0].critical: set exactly one of fallback_model, async_queue, cached_response, reject (got 2)",
                "p.toml:22:11: contract[1].feature: feature \"chat\" already has a contract",
                "p.toml:23:32: contract[1].degraded.cached_response: invalid duration \"5x\": unknown time unit \"x\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)",
                "p.toml:24:1: contract[2]: set degraded, critical or both",
                "p.toml:25:11: contract[2].feature: must be 1-64 characters of a-z, A-Z, 0-9, \"_\", \"-\", \".\" (it travels in the x-probeok-feature header)",
            ],
        ),
        (
            "route profiles: an empty prefix, mistyped and reserved parameters (unknown ones pass)",
            with_route("request = { system_prefix = \"\", set = { temperature = \"hot\", max_tokens = -1, stream = true, x_custom = \"ok\" }, drop = [\"logprobs\", \"messages\"] }\n"),
            vec![
                "p.toml:17:29: route[0].request.system_prefix: must be 1 to 16384 bytes of text",
                "p.toml:17:55: route[0].request.set.temperature: must be a number from 0 to 2, got \"hot\"",
                "p.toml:17:75: route[0].request.set.max_tokens: must be an integer of at least 1, got -1",
                "p.toml:17:88: route[0].request.set.stream: `stream` is the client's to choose: a profile may not set it",
                "p.toml:17:133: route[0].request.drop[1]: `messages` is the client's to choose: a profile may not drop it",
            ],
        ),
        (
            "shadows: unknown model and route, ratios outside (0, 1], a negative budget",
            with_route("[[shadow]]\nserves = \"nope\"\nroute = \"x/y/z\"\nratio = 0.0\n[[shadow]]\nserves = \"chat-main\"\nroute = \"qwen/cn-beijing/qwen-max\"\nratio = 1.5\nmax_cost_per_hour = -1.0\n"),
            vec![
                "p.toml:18:10: shadow[0].serves: \"nope\" is not a logical model: no route serves it",
                "p.toml:19:9: shadow[0].route: \"x/y/z\" is not a configured route (write provider/region/model)",
                "p.toml:20:9: shadow[0].ratio: must be in (0, 1], e.g. 0.05, got 0",
                "p.toml:24:9: shadow[1].ratio: must be in (0, 1], e.g. 0.05, got 1.5",
                "p.toml:25:21: shadow[1].max_cost_per_hour: must be 0 or more, got -1",
            ],
        ),
        (
            "heartbeat and drill values",
            format!("[heartbeat]\nstale_after = \"0s\"\nping_url_env = \"https://hc-ping.com/x\"\n[drill]\noff_peak = [[\"02:00\", \"24:00\"]]\n{PROVIDERS}{ROUTE}"),
            vec![
                "p.toml:2:15: heartbeat.stale_after: must be greater than 0",
                "p.toml:3:16: heartbeat.ping_url_env: must name an environment variable (letters, digits and \"_\"), not hold the secret itself",
                "p.toml:5:13: drill.off_peak[0]: a window is [\"HH:MM\", \"HH:MM\"] (00:00 to 23:59; it may cross midnight)",
            ],
        ),
        (
            "tracing values",
            format!("[tracing]\notlp_endpoint_env = \"http://collector:4318\"\nservice_name = \" \"\nsample_ratio = 1.5\n{PROVIDERS}{ROUTE}"),
            vec![
                "p.toml:2:21: tracing.otlp_endpoint_env: must name an environment variable (letters, digits and \"_\"), not hold the secret itself",
                "p.toml:3:16: tracing.service_name: must not be empty",
                "p.toml:4:16: tracing.sample_ratio: must be between 0 and 1",
            ],
        ),
        (
            "switch and budget values",
            format!("[switch]\ncanary = [0.25, 0.05, 1.0]\nmin_dwell = \"0s\"\n[budget]\ndegrade_at = 1.5\n{PROVIDERS}{ROUTE}"),
            vec![
                "p.toml:2:10: switch.canary: ratios must increase, e.g. [0.05, 0.25, 1.0]",
                "p.toml:3:13: switch.min_dwell: must be greater than 0",
                "p.toml:5:14: budget.degrade_at: must be in (0, 1], got 1.5",
            ],
        ),
        (
            "unknown tier",
            with_route("tier = \"primay\"\n"),
            vec!["p.toml:17:8: route[0].tier: unknown value `primay`, expected one of `primary`, `backup`, `fallback`"],
        ),
        (
            "unknown capability",
            with_route("capabilities = [\"stream\", \"audio\"]\n"),
            vec!["p.toml:17:27: route[0].capabilities[1]: unknown value `audio`, expected one of `stream`, `tools`, `json_schema`, `vision`"],
        ),
        (
            "missing key, located at its table",
            format!("{PROVIDERS}[[route]]\nprovider = \"qwen\"\nregion = \"cn-beijing\"\nserves = \"x\"\n"),
            vec!["p.toml:12:1: route[0].model: missing required key"],
        ),
        (
            "unknown provider",
            with_route("[[route]]\nprovider = \"qwn\"\nregion = \"cn\"\nmodel = \"m\"\nserves = \"s\"\n"),
            vec![r#"p.toml:18:12: route[1].provider: unknown provider "qwn" (known: qwen, deepseek)"#],
        ),
        (
            "unknown region",
            with_route("[[route]]\nprovider = \"deepseek\"\nregion = \"us\"\nmodel = \"m\"\nserves = \"s\"\n"),
            vec![r#"p.toml:19:10: route[1].region: unknown region "us" of provider "deepseek" (known: cn)"#],
        ),
        (
            "duplicate route",
            format!("{PROVIDERS}{ROUTE}{ROUTE}"),
            vec![r#"p.toml:17:1: route[1]: duplicate route "qwen/cn-beijing/qwen-max" (same provider/region/model as route[0])"#],
        ),
        (
            "bad durations",
            with_route("interval = \"30\"\n[probe]\ntimeout = \"half a minute\"\n"),
            vec![
                r#"p.toml:17:12: route[0].interval: invalid duration "30": time unit needed, for example 30sec or 30ms"#,
                r#"p.toml:19:11: probe.timeout: invalid duration "half a minute": expected number at 0 (write e.g. "500ms", "30s", "5m")"#,
            ],
        ),
        (
            "a value that does not convert is one error, not a cascade",
            with_route("timeout = \"3x\"\nfirst_byte_timeout = \"40s\"\n"),
            vec![r#"p.toml:17:11: route[0].timeout: invalid duration "3x": unknown time unit "x", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)"#],
        ),
        (
            "zero durations",
            with_route("timeout = \"0s\"\n[detection]\nerror_window = \"0ms\"\n"),
            vec![
                "p.toml:17:11: route[0].timeout: must be greater than 0",
                "p.toml:19:16: detection.error_window: must be greater than 0",
            ],
        ),
        (
            "first_byte_timeout > timeout, globally and per route after the merge",
            with_route("timeout = \"3s\"\n[probe]\nfirst_byte_timeout = \"40s\"\n"),
            vec![
                "p.toml:17:11: route[0].timeout: first_byte_timeout (40s) must not exceed timeout (3s)",
                "p.toml:19:22: probe.first_byte_timeout: first_byte_timeout (40s) must not exceed timeout (20s)",
            ],
        ),
        (
            "bad weights and counts",
            with_route("weight = 300\nmax_tokens = 0\n[[route]]\nprovider = \"deepseek\"\nregion = \"cn\"\nmodel = \"m\"\nserves = \"s\"\nweight = -1\n"),
            vec![
                "p.toml:17:10: route[0].weight: must be in 0..=100, got 300",
                "p.toml:18:14: route[0].max_tokens: must be at least 1, got 0",
                "p.toml:24:10: route[1].weight: must be in 0..=100, got -1",
            ],
        ),
        (
            "in-flight limits that admit nothing",
            format!("{PROVIDERS}{ROUTE}max_in_flight = 0\n[[provider]]\nid = \"x\"\nmax_in_flight = -3\n  [[provider.region]]\n  id = \"r\"\n  base_url = \"https://x.example.com\"\n[proxy]\nmax_connections = 0\n"),
            vec![
                "p.toml:17:17: route[0].max_in_flight: must be at least 1, got 0",
                "p.toml:20:17: provider[2].max_in_flight: must be at least 1, got -3",
                "p.toml:25:19: proxy.max_connections: must be at least 1, got 0",
            ],
        ),
        (
            "a listener that admits no connection",
            format!("{PROVIDERS}{ROUTE}[server]\nmax_connections = 0\n"),
            vec!["p.toml:18:19: server.max_connections: must be at least 1, got 0"],
        ),
        (
            "bad urls",
            format!(
                "{PROVIDERS}  [[provider.region]]\n  id = \"intl\"\n  base_url = \"api.example.com/v1\"\n{ROUTE}[server]\npublic_url = \"https://user:pw@status.example.com\"\n"
            ),
            vec![
                "p.toml:14:14: provider[1].region[1].base_url: must be an http(s) URL with a host (relative URL without a base)",
                "p.toml:21:14: server.public_url: must not embed credentials: name them by environment variable instead",
            ],
        ),
        (
            "bad timezone",
            with_route("[detection]\ntimezone = \"Asia/Shangai\"\n"),
            vec![r#"p.toml:18:12: detection.timezone: unknown timezone "Asia/Shangai" (use an IANA name such as "Asia/Shanghai" or "UTC")"#],
        ),
        (
            "overlapping, reversed and malformed bucket windows",
            with_route("[detection]\nbuckets = [[\"09:00\", \"12:00\"], [\"11:30\", \"13:00\"], [\"14:00\", \"13:00\"]]\n"),
            vec![
                "p.toml:18:32: detection.buckets[1]: window 11:30-13:00 overlaps window 09:00-12:00 (detection.buckets[0])",
                "p.toml:18:52: detection.buckets[2]: window 14:00-13:00 is empty or reversed: start must be before end (windows cannot cross midnight)",
            ],
        ),
        (
            "malformed bucket windows",
            with_route("[detection]\nbuckets = [[\"9:00\", \"12:00\"], [\"18:00\"]]\n"),
            vec![
                r#"p.toml:18:13: detection.buckets[0][0]: invalid time "9:00": expected "HH:MM" (00:00 to 23:59)"#,
                r#"p.toml:18:31: detection.buckets[1]: a window is ["HH:MM", "HH:MM"], got 1 value"#,
            ],
        ),
        (
            "bad bucket mode",
            with_route("[detection]\nbuckets = \"hours\"\n"),
            vec![r#"p.toml:18:11: detection.buckets: unknown buckets "hours": expected "none", "hour" or an array of ["HH:MM", "HH:MM"] peak windows"#],
        ),
        (
            "bad jitter and rates",
            with_route("[probe]\njitter = -0.1\n[detection]\ncritical_error_rate = 0\ntps_floor = 1.5\n"),
            vec![
                "p.toml:18:10: probe.jitter: must be in [0, 0.5], got -0.1",
                "p.toml:20:23: detection.critical_error_rate: must be in (0, 1], got 0",
                "p.toml:21:13: detection.tps_floor: must be in (0, 1], got 1.5",
            ],
        ),
        (
            "missing key in a nested table",
            format!("{PROVIDERS}[[provider]]\nid = \"x\"\n  [[provider.region]]\n  id = \"a\"\n{ROUTE}"),
            vec!["p.toml:14:3: provider[2].region[0].base_url: missing required key"],
        ),
        (
            "bad id chars, duplicate ids",
            format!("{PROVIDERS}[[provider]]\nid = \"qwen\"\n  [[provider.region]]\n  id = \"us_East\"\n  base_url = \"https://a.example.com\"\n  [[provider.region]]\n  id = \"us_East\"\n  base_url = \"https://b.example.com\"\n{ROUTE}"),
            vec![
                r#"p.toml:13:6: provider[2].id: duplicate provider id "qwen" (first defined at provider[0])"#,
                r#"p.toml:15:8: provider[2].region[0].id: invalid region id "us_East": use only a-z, 0-9, "_" and "-""#,
                r#"p.toml:18:8: provider[2].region[1].id: invalid region id "us_East": use only a-z, 0-9, "_" and "-""#,
                r#"p.toml:18:8: provider[2].region[1].id: duplicate region id "us_East" in provider "qwen" (first defined at provider[2].region[0])"#,
            ],
        ),
        (
            "bad region ids, once the file parses",
            format!("{PROVIDERS}  [[provider.region]]\n  id = \"us East\"\n  base_url = \"https://a.example.com\"\n  [[provider.region]]\n  id = \"cn\"\n  base_url = \"https://b.example.com\"\n{ROUTE}"),
            vec![
                r#"p.toml:13:8: provider[1].region[1].id: invalid region id "us East": use only a-z, 0-9, "_" and "-""#,
                r#"p.toml:16:8: provider[1].region[2].id: duplicate region id "cn" in provider "deepseek" (first defined at provider[1].region[0])"#,
            ],
        ),
        (
            "no routes",
            PROVIDERS.to_owned(),
            vec!["p.toml:1:1: route: no routes configured: add at least one [[route]]"],
        ),
        (
            "bad listen address, retention, min_samples",
            with_route("[server]\nlisten = \"localhost:9400\"\n[storage]\nretention_days = 0\n[detection]\nmin_samples = 500\n"),
            vec![
                r#"p.toml:18:10: server.listen: invalid address "localhost:9400": expected IP:PORT, e.g. "127.0.0.1:9400""#,
                "p.toml:20:18: storage.retention_days: must be at least 1, got 0",
                "p.toml:22:15: detection.min_samples: must not exceed baseline_window (100), got 500: routes would never leave UNKNOWN",
            ],
        ),
        (
            "route values: model, slo, price currency",
            with_route("model = \"\"\n").replace("model = \"qwen-max\"\n", "")
                + "slo = 1.5\nprice = { input_per_mtok = 1.0, output_per_mtok = 2.0, currency = \"CNY\" }\n[[route]]\nprovider = \"deepseek\"\nregion = \"cn\"\nmodel = \"deepseek-ai/DeepSeek-V3\"\nserves = \"s\"\nprice = { input_per_mtok = -1, output_per_mtok = 2.0, currency = \"USD\" }\n",
            vec![
                "p.toml:16:9: route[0].model: must not be empty",
                "p.toml:17:7: route[0].slo: must be in (0, 1), e.g. 0.999, got 1.5",
                "p.toml:24:28: route[1].price.input_per_mtok: must be 0 or more, got -1",
                r#"p.toml:24:66: route[1].price.currency: currency "USD" differs from "CNY" (route[0]): use one currency per config"#,
            ],
        ),
        (
            "catalog: a route's retires date, the list interval",
            with_route("retires = \"2026-6-30\"\n[catalog]\nevery = \"10s\"\n"),
            vec![
                r#"p.toml:17:11: route[0].retires: invalid date "2026-6-30": write the day as YYYY-MM-DD, e.g. "2026-06-30""#,
                "p.toml:19:9: catalog.every: must be between 1m and 24h, got 10s",
            ],
        ),
    ];
    assert!(cases.len() >= 14);
    let mut failures = Vec::new();
    for (name, src, expected) in &cases {
        let got = errors(src);
        if &got != expected {
            failures.push(format!(
                "case {name:?}:\n  expected {expected:#?}\n  got {got:#?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_secret_in_an_env_key_is_never_echoed() {
    let src = with_route("").replace(
        "api_key_env = \"DASHSCOPE_API_KEY\"",
        "api_key_env = \"sk-live-0123456789abcdef\"",
    );
    let errs = errors(&src);
    assert_eq!(
        errs,
        vec![
            r#"p.toml:3:15: provider[0].api_key_env: must name an environment variable (letters, digits and "_"), not hold the secret itself"#
        ]
    );
    assert!(!errs.concat().contains("sk-live"));
}

#[test]
fn an_unreadable_file_is_one_clear_line() {
    let e = Config::load(Path::new("/nonexistent/probeok.toml")).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/probeok.toml: cannot read: "),
        "{e}"
    );
}

#[test]
fn a_minimal_config_gets_every_default() {
    let loaded = Config::parse(&with_route(""), "p.toml").unwrap();
    // The defaults (interval 30s, timeout 20s) do not overrun: no warning.
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = loaded.config;
    assert_eq!(c.source, Path::new("p.toml"));

    assert_eq!(c.server.listen.to_string(), "127.0.0.1:9400");
    assert_eq!(c.server.public_url, "http://127.0.0.1:9400");
    assert_eq!(c.server.admin_token_env, "PROBEOK_ADMIN_TOKEN");
    assert_eq!(c.server.ingest_token_env, "PROBEOK_INGEST_TOKEN");
    assert_eq!(c.server.title, "LLM provider status");

    assert_eq!(c.storage.path, Path::new("probeok.db"));
    assert_eq!(c.storage.retention_days, 14);
    assert_eq!(c.storage.rollup_retention_days, 400);

    let p = &c.probe;
    assert_eq!(p.interval, Duration::from_secs(30));
    assert_eq!(p.first_byte_timeout, Duration::from_secs(5));
    assert_eq!(p.timeout, Duration::from_secs(20));
    assert_eq!(p.jitter, 0.1);
    assert!(p.stream);
    assert_eq!(p.max_tokens, 16);
    assert_eq!(p.throughput_every, Duration::from_secs(300));
    assert_eq!(
        p.throughput_prompt,
        "Count from 1 to 40, separated by single spaces. Reply with the numbers only."
    );
    assert_eq!(p.throughput_max_tokens, 128);
    assert_eq!(p.system, "Reply with exactly: PROBE_OK");
    assert_eq!(p.user, "health check");
    assert_eq!(p.expect, "PROBE_OK");

    let d = &c.detection;
    assert_eq!(d.sigma, 2.0);
    assert_eq!(d.latency_floor_ratio, 0.2);
    assert_eq!(d.latency_floor, Duration::from_millis(100));
    assert_eq!(d.baseline_window, 100);
    assert_eq!(d.min_samples, 20);
    assert_eq!(d.buckets, Buckets::Hour);
    assert_eq!(d.timezone, chrono_tz::Asia::Shanghai);
    assert_eq!(d.degraded_after, 3);
    assert_eq!(d.critical_error_rate, 0.05);
    assert_eq!(d.error_window, Duration::from_secs(300));
    assert_eq!(d.min_error_samples, 20);
    assert_eq!(d.min_failures, 3);
    assert_eq!(d.critical_after, Duration::from_secs(60));
    assert_eq!(d.critical_degraded_for, Duration::from_secs(120));
    assert_eq!(d.recover_after, Duration::from_secs(300));
    assert_eq!(d.recover_error_rate, 0.01);
    assert_eq!(d.tps_floor, 0.3);

    assert_eq!(c.egress.control_url, None);
    assert_eq!(c.slo.availability, 0.999);
    assert_eq!(c.slo.latency_threshold, Duration::from_secs(10));

    assert_eq!(c.providers.len(), 2);
    assert_eq!(c.providers[1].kind, ProviderKind::Openai);
    assert_eq!(c.providers[1].api_key_env, None);
    let r = &c.routes[0];
    assert_eq!(r.tier, Tier::Primary);
    assert_eq!(r.weight, 100);
    assert_eq!(r.capabilities, vec![Capability::Stream]);
    assert_eq!(r.price, None);
    assert_eq!(
        (r.interval, r.timeout, r.first_byte_timeout),
        (None, None, None)
    );
    assert_eq!((r.max_tokens, r.slo, r.context_window), (None, None, None));

    // The code-built defaults are the same as the file's.
    let built = Config::default();
    assert_eq!(built.server, ServerConfig::default());
    assert_eq!(built.probe, c.probe);
    assert_eq!(built.detection, c.detection);
    assert_eq!(built.storage, c.storage);
    assert_eq!(built.slo, c.slo);
}

#[test]
fn public_url_follows_listen_unless_set() {
    let c = Config::parse(
        &with_route("[server]\nlisten = \"0.0.0.0:8080\"\n"),
        "p.toml",
    )
    .unwrap()
    .config;
    assert_eq!(c.server.public_url, "http://0.0.0.0:8080");
}

#[test]
fn routes_resolve_ids_overrides_and_base_urls() {
    let src = with_route(
        "interval = \"60s\"\nmax_tokens = 64\nslo = 0.99\n[[route]]\nprovider = \"deepseek\"\nregion = \"cn\"\nmodel = \"deepseek-ai/DeepSeek-V3\"\nserves = \"chat-main\"\ntier = \"backup\"\nfirst_byte_timeout = \"800ms\"\ntimeout = \"20s\"\n[probe]\ntimeout = \"25s\"\n[detection]\nbuckets = [[\"09:00\", \"12:00\"], [\"14:00\", \"18:00\"]]\ntimezone = \"UTC\"\n",
    );
    let loaded = Config::parse(&src, "p.toml").unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let c = loaded.config;
    let t = |h, m| NaiveTime::from_hms_opt(h, m, 0).unwrap();
    assert_eq!(
        c.detection.buckets,
        Buckets::Windows(vec![(t(9, 0), t(12, 0)), (t(14, 0), t(18, 0))])
    );
    assert_eq!(c.detection.timezone, chrono_tz::UTC);

    let routes = c.routes();
    assert_eq!(routes.len(), 2);
    let (q, d) = (&routes[0], &routes[1]);
    assert_eq!(q.id, RouteId::new("qwen", "cn-beijing", "qwen-max"));
    assert_eq!(
        q.base_url,
        "https://dashscope.aliyuncs.com/compatible-mode/v1"
    );
    assert_eq!(q.api_key_env.as_deref(), Some("DASHSCOPE_API_KEY"));
    assert_eq!(q.probe.interval, Duration::from_secs(60));
    assert_eq!(q.probe.timeout, Duration::from_secs(25));
    assert_eq!(q.probe.first_byte_timeout, Duration::from_secs(5));
    assert_eq!(q.probe.max_tokens, 64);
    assert_eq!(q.slo, 0.99);

    assert_eq!(d.id.as_str(), "deepseek/cn/deepseek-ai/DeepSeek-V3");
    assert_eq!(d.id.split(), ("deepseek", "cn", "deepseek-ai/DeepSeek-V3"));
    assert_eq!(
        d.base_url, "https://api.deepseek.com",
        "trailing slash dropped"
    );
    assert_eq!(d.kind, ProviderKind::Openai);
    assert_eq!(d.api_key_env, None);
    assert_eq!(d.tier, Tier::Backup);
    assert_eq!(d.serves, "chat-main");
    assert_eq!(d.probe.interval, Duration::from_secs(30));
    assert_eq!(d.probe.timeout, Duration::from_secs(20));
    assert_eq!(d.probe.first_byte_timeout, Duration::from_millis(800));
    assert_eq!(d.probe.max_tokens, 16);
    assert_eq!(d.probe.jitter, 0.1);
    assert_eq!(d.probe.expect, "PROBE_OK");
    assert_eq!(d.slo, 0.999);
}

#[test]
fn timeout_at_or_above_interval_is_a_warning_not_an_error() {
    let src = with_route("interval = \"10s\"\n[probe]\ntimeout = \"20s\"\n");
    let loaded = Config::parse(&src, "p.toml").expect("a warning is not an error");
    let warnings: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        vec!["p.toml:17:12: route[0].interval: timeout (20s) >= interval (10s): such probes overrun and are skipped"]
    );
    assert_eq!(loaded.config.routes().len(), 1);
}

#[test]
fn missing_secrets_name_the_variable_never_a_value() {
    let src = with_route("")
        .replace("DASHSCOPE_API_KEY", "PROBEOK_TEST_UNSET_KEY_7f3a")
        .replace(
            "id = \"deepseek\"\n",
            "id = \"deepseek\"\napi_key_env = \"PROBEOK_TEST_SET_KEY_7f3a\"\n",
        );
    let mut c = Config::parse(&src, "p.toml").unwrap().config;
    c.env = Env::given().with("PROBEOK_TEST_SET_KEY_7f3a", "sk-very-secret-value");
    let missing: Vec<String> = c
        .missing_secrets()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        missing,
        vec!["p.toml:3:15: provider[0].api_key_env: environment variable PROBEOK_TEST_UNSET_KEY_7f3a is not set (or empty): provider \"qwen\" has no API key"]
    );
    assert!(!format!("{missing:?} {c:?}").contains("sk-very-secret-value"));
}

#[test]
fn a_config_built_in_code_validates_with_the_same_rules() {
    let mut c = Config {
        providers: vec![ProviderConfig {
            id: "sim".into(),
            regions: vec![RegionConfig {
                id: "local".into(),
                base_url: "http://127.0.0.1:9500/v1/".into(),
            }],
            ..Default::default()
        }],
        routes: vec![RouteConfig {
            provider: "sim".into(),
            region: "local".into(),
            model: "sim-chat".into(),
            serves: "chat".into(),
            timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(c.validate().unwrap(), vec![]);
    assert_eq!(c.routes()[0].base_url, "http://127.0.0.1:9500/v1");

    c.routes[0].weight = 101;
    let e = c.validate().unwrap_err();
    assert_eq!(
        e.to_string(),
        "(built-in): route[0].weight: must be in 0..=100, got 101"
    );
}

#[test]
fn the_example_config_loads_cleanly() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("probeok.example.toml");
    let loaded = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let routes = loaded.config.routes();
    let ids: Vec<&str> = routes.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "qwen/cn-beijing/qwen-max",
            "qwen/intl/qwen-max",
            "deepseek/cn/deepseek-ai/DeepSeek-V3"
        ]
    );
}

#[test]
fn proxy_section_defaults_and_located_errors() {
    let loaded = Config::parse(&with_route(""), "p.toml").expect("valid");
    let p = &loaded.config.proxy;
    assert!(!p.enabled, "a real config opts in");
    assert_eq!(p.listen.to_string(), "127.0.0.1:9401");
    assert_eq!(p.first_byte_timeout, Duration::from_secs(2));
    assert_eq!(p.total_timeout, Duration::from_secs(540));
    assert_eq!(p.max_attempts, 5);
    assert_eq!(p.max_retry_wait, Duration::from_secs(30));
    assert_eq!(p.stream_idle_timeout, Duration::from_secs(30));
    assert_eq!(p.max_stream_duration, Duration::from_secs(30 * 60));
    assert_eq!(p.max_body, 10 * 1024 * 1024);
    assert_eq!(p.idempotency_ttl, Duration::from_secs(86_400));
    assert_eq!(p.idempotency_wait, Duration::from_secs(10));
    assert_eq!(p.idempotency_keys_per_client, 10_000);
    assert_eq!(p.cached_answers_per_client, 1_000);
    assert_eq!(p.client_keys_env, "PROBEOK_CLIENT_KEYS");
    assert_eq!(p.breaker.failure_ratio, 0.5);
    assert_eq!(p.breaker.window, Duration::from_secs(60));
    assert_eq!(p.breaker.min_requests, 20);
    assert_eq!(p.breaker.open_for, Duration::from_secs(30));

    let src = format!(
        "{PROVIDERS}{ROUTE}[proxy]\nenabled = true\nlisten = \"127.0.0.1:9500\"\nmax_body = \"1MB\"\nfirst_byte_timeout = \"800ms\"\n  [proxy.breaker]\n  open_for = \"1m\"\n"
    );
    let p = Config::parse(&src, "p.toml").expect("valid").config.proxy;
    assert!(p.enabled);
    assert_eq!(p.listen.to_string(), "127.0.0.1:9500");
    assert_eq!(p.max_body, 1_000_000);
    assert_eq!(p.first_byte_timeout, Duration::from_millis(800));
    assert_eq!(p.breaker.open_for, Duration::from_secs(60));

    let bad = format!(
        "{PROVIDERS}{ROUTE}[proxy]\nenabled = true\nlisten = \"127.0.0.1:9400\"\nmax_body = \"lots\"\nmax_attempts = 0\ntotal_timeout = \"1s\"\nfirst_byte_timeout = \"2s\"\n  [proxy.breaker]\n  failure_ratio = 1.5\n"
    );
    assert_eq!(
        errors(&bad),
        vec![
            "p.toml:19:10: proxy.listen: 127.0.0.1:9400 is also server.listen: the proxy needs its own address",
            "p.toml:20:12: proxy.max_body: invalid size \"lots\": write e.g. \"10MiB\", \"512KiB\", \"1MB\" or a number of bytes",
            "p.toml:21:16: proxy.max_attempts: must be at least 1, got 0",
            "p.toml:23:22: proxy.first_byte_timeout: first_byte_timeout (2s) must not exceed total_timeout (1s)",
            "p.toml:25:19: proxy.breaker.failure_ratio: must be in (0, 1], got 1.5",
        ]
    );
    assert_eq!(
        errors(&format!("{PROVIDERS}{ROUTE}[proxy]\nenable = true\n")),
        vec!["p.toml:18:1: proxy.enable: unknown key `enable`, expected one of `enabled`, `listen`, `first_byte_timeout`, `total_timeout`, `max_attempts`, `max_retry_wait`, `stream_idle_timeout`, `max_stream_duration`, `max_body`, `idempotency_ttl`, `idempotency_wait`, `idempotency_keys_per_client`, `cached_answers_per_client`, `client_keys_env`, `allow_unauthenticated`, `max_connections`, `workers`, `breaker`, `client`"]
    );
}

#[test]
fn proxy_workers_default_to_the_cores_and_are_located_when_out_of_range() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let p = Config::parse(&with_route(""), "p.toml")
        .expect("valid")
        .config
        .proxy;
    assert_eq!(p.workers, cores);
    let set = |n: &str| format!("{PROVIDERS}{ROUTE}[proxy]\nworkers = {n}\n");
    let p = Config::parse(&set("3"), "p.toml")
        .expect("valid")
        .config
        .proxy;
    assert_eq!(p.workers, 3);
    assert_eq!(
        errors(&set("0")),
        vec!["p.toml:18:11: proxy.workers: must be at least 1, got 0"]
    );
    assert_eq!(
        errors(&set("-2")),
        vec!["p.toml:18:11: proxy.workers: must be at least 1, got -2"]
    );
    assert_eq!(
        errors(&set("5000")),
        vec!["p.toml:18:11: proxy.workers: must be at most 1024, got 5000"]
    );
    // A config built in code is held to the same rule.
    let mut c = Config::parse(&with_route(""), "p.toml")
        .expect("valid")
        .config;
    c.proxy.workers = 0;
    let e = c.validate().expect_err("0 workers");
    assert!(
        e.to_string()
            .contains("proxy.workers: must be at least 1, got 0"),
        "{e}"
    );
}

#[test]
fn a_sync_table_names_configured_routes_and_new_api_needs_its_user() {
    let errs = errors(&with_route(
        r#"[[sync]]
kind = "new-api"
url = "http://new-api:3000"
token_env = "NEWAPI_ADMIN_TOKEN"
channels = { "qwen/cn-beijing/qwen-max" = 12, "qwen/cn-beijing/qwen-plus" = 13 }
"#,
    ));
    assert_eq!(
        errs,
        vec![
            "p.toml:17:1: sync[0].user_id: new-api needs the token's user id (sent as New-Api-User; its admin API refuses calls without it)",
            "p.toml:21:12: sync[0].channels: \"qwen/cn-beijing/qwen-plus\" is not a configured route (provider/region/model)",
        ]
    );
    let errs = errors(&with_route(
        r#"[[sync]]
kind = "higress"
url = "http://new-api:3000"
token_env = "T"
channels = { "qwen/cn-beijing/qwen-max" = 12 }
"#,
    ));
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("p.toml:18:8: sync[0].kind: "),
        "{errs:?}"
    );
    let ok = Config::parse(
        &with_route(
            r#"[[sync]]
kind = "one-api"
url = "http://one-api:3000"
token_env = "ONEAPI_ADMIN_TOKEN"
channels = { "qwen/cn-beijing/qwen-max" = 12 }
"#,
        ),
        "p.toml",
    )
    .unwrap();
    assert_eq!(ok.config.sync.len(), 1);
    assert_eq!(ok.config.sync[0].channels["qwen/cn-beijing/qwen-max"], 12);
}
