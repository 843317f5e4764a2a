//! probeok keeps the instability of third-party LLM providers outside your system boundary:
//! it probes every provider × region × model, stores and judges the results, and publishes a
//! status page, a JSON API, metrics and a weights feed that routers follow.
//!
//! # Layout
//!
//! Data flows one way: outcomes come in (probes, passive traffic), are stored, judged and
//! published.
//!
//! - [`config`]: the TOML config — serde structs, two-stage validation, errors located as
//!   `file:line:col: key.path: message`; resolves [`route::Route`]s.
//! - [`route`]: `RouteId` (`provider/region/model`), `Route` with its effective probe settings,
//!   tiers, capabilities, prices.
//! - [`clock`]: the `Clock` trait, `SystemClock` and `ManualClock` for tests.
//! - [`secret`]: `Secret`, an environment-sourced value that never prints.
//! - [`probe`]: the streaming probe client (OpenAI-compatible and Anthropic) and
//!   `ProbeOutcome`/`ProbeError`, the classified result of one call.
//! - [`scheduler`]: fires each route's probe on its jittered interval, never stacking overruns.
//! - [`store`]: SQLite — migrations, the single batching writer thread, rollups, retention,
//!   read queries on their own connections.
//! - [`health`]: the pure detection core — time-of-day baselines, the per-route state machine
//!   (`UNKNOWN NORMAL WARNING DEGRADED CRITICAL` + `SWITCHED`), failure modes, incidents,
//!   egress and request-side findings; functions of (state, outcome, baseline, config, now).
//! - [`sim`]: simulated OpenAI-compatible providers with scripted fault scenarios (demo, tests).
//! - [`demo`]: the built-in demo: a config of simulated routes for `probeok serve` without one.
//! - [`weights`]: health → integer traffic weights per logical model by tier, versioned only
//!   on real change, serialised once per version, published on a `watch` channel.
//! - [`web`]: the monitor's HTTP router — JSON API (status, probes, incidents, ingest), the
//!   weights feed (ETag, long-poll, SSE), `/metrics` (OpenMetrics), `/api/openapi.json`,
//!   `/healthz`, `/readyz`.
//! - [`cli`]: the subcommands behind the binary (check-config, probe, serve, simulate).
//! - [`app`]: wires the tasks together under one `CancellationToken`.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod health;
pub mod probe;
pub mod route;
pub mod scheduler;
pub mod secret;
pub mod sim;
pub mod store;
pub mod web;
pub mod weights;
