//! probeok keeps the instability of third-party LLM providers outside your system boundary:
//! it probes every provider × region × model, stores and judges the results, and publishes a
//! status page, a JSON API, metrics and a weights feed that routers follow.
//!
//! # Layout
//!
//! Data flows one way: outcomes come in (probes, passive traffic), are stored, judged and
//! published. The modules sit in six layers; a module imports only modules of the layers
//! below it, and of its own layer where that layer allows it (`tests/it/product/architecture.rs` reads
//! `src/` and holds these rules).
//!
//! **Base** — the shared nouns every layer persists or passes; they import only each other.
//!
//! - [`route`]: `RouteId` (`provider/region/model`), `Route` with its effective probe settings,
//!   tiers, capabilities, prices.
//! - [`clock`]: the `Clock` trait, `SystemClock`, `ManualClock` for tests, and
//!   [`clock::rfc3339`], how every time is written.
//! - [`secret`]: `Secret`, an environment-sourced value that never prints; `Env`, where the
//!   variables a config names are read (the process environment, or values given in code so
//!   no test changes the environment of a running process); and the one bearer token check
//!   (SHA-256 digests compared in constant time) for the admin token, the ingest token and
//!   the proxy's client keys.
//! - [`outcome`]: `ProbeOutcome`/`ProbeError`/`OutcomeKind`, the classified result of one call
//!   (also `probe::outcome`).
//! - [`state`]: route states, reasons, failure modes, transitions, incidents, and
//!   [`state::PersistedHealth`], what the store needs of detection's per-route state.
//! - [`evidence`]: what a transition was decided on (signals, baselines, thresholds, the
//!   error-rate window).
//! - [`severity`], [`lang`]: alert severity and message language (the config names both).
//! - [`silence`]: an admin-created alert silence.
//! - [`records`]: regression-set runs, drills and switch records as the store keeps them.
//! - [`glob`]: the one route-id glob dialect (`*` any run, `?` one character).
//! - [`listen`]: serving a router on a TCP listener, one way for the monitor and the proxy
//!   (header read timeout, 431 past a 32 KiB head, bounded open connections, graceful
//!   shutdown).
//! - [`slo`]: the error budget, one definition (time: bad outcomes × interval against
//!   `(1 − target) × window`) for the route page, the API, the incidents page and the
//!   burn-rate alerts.
//! - [`stdout`]: the command line's own output (a closed pipe ends it quietly).
//! - [`gather`]: draining a queue the request path feeds in gatherings (one wake-up per
//!   short pause, not one per item).
//! - [`lag`]: how far the store is behind the probes (`probeok_store_lag_seconds`, `/readyz`).
//! - [`malloc`]: the process's allocators (jemalloc for Rust, glibc's malloc tuned once at
//!   start for SQLite: two arenas, a fixed mmap threshold), trimmed every minute in `serve`.
//! - [`supervise`]: no task dies quietly — a long-lived task that panics or ends before
//!   shutdown is logged by name, counted, and stops the process with a non-zero code.
//! - [`ratelimit`]: the rate-limit headroom providers announce in their answers' headers
//!   (`x-ratelimit-*`, `anthropic-ratelimit-*`), read defensively into remaining/limit pairs.
//! - [`vantage`]: the places probes run from (the monitor's own scheduler and remote agents),
//!   vantage ids, and an agent's outcome as it travels (`VantageOutcome`).
//!
//! **Config** — imports base only.
//!
//! - [`config`]: the TOML config — serde structs, two-stage validation, errors located as
//!   `file:line:col: key.path: message`; resolves [`route::Route`]s.
//!
//! **Store** — imports base only: it keeps its own row types and converts them.
//!
//! - [`store`]: SQLite — migrations, the single batching writer thread (WAL checkpoints on a
//!   thread of their own, `store::checkpoint`), rollups, retention,
//!   detection's route states, transitions and incidents, read queries on their own
//!   connections; the spend ledger (`store::spend`: reservations checked and booked in one
//!   transaction, on connections of its own).
//!
//! **Domain** — imports base, config, store and each other; never a surface or the wiring.
//! Pure where possible, each with a thin I/O shell.
//!
//! - [`probe`]: the streaming probe client (OpenAI-compatible and Anthropic).
//! - [`scheduler`]: fires each route's probe on its jittered interval, never stacking overruns.
//! - [`health`]: the pure detection core — time-of-day baselines, the per-route state machine
//!   (`UNKNOWN NORMAL WARNING DEGRADED CRITICAL` + `SWITCHED`), failure modes, incidents,
//!   egress and request-side findings, shared causes (routes failing alike at one endpoint,
//!   confirmed on a few and judged together, `health::cause`); functions of (state, outcome,
//!   baseline, config, now).
//!   Its I/O shell is `health::service` (restores state from the store, rebuilds baselines
//!   from the history in the background while it runs, `health::service::warm`; feeds
//!   every outcome and a 1 s tick through the detector, persists transitions, incidents and
//!   states, publishes the `HealthSnapshot` watch and `HealthEvent` broadcast) with
//!   `health::control` (the `[egress] control_url` probe).
//! - [`drift`]: offline regression sets (`probes/*.toml`) run per route on a schedule and
//!   compared with the route's own history (Fisher's exact test, Mann–Whitney U): drift
//!   findings with evidence (served at `GET /api/v1/drift`), the quality gate for backup routes;
//!   real traffic's structured-output validity against the route's own past (`drift::traffic`).
//! - [`weights`]: health (with drift, switch overrides, proxy breakers and drill caps: one
//!   `weights::Inputs`) → integer traffic weights per logical model by tier (the pure
//!   `weights::compute`), versioned only on real change, serialised once per version,
//!   published on a `watch` channel by `weights::spawn_publisher`.
//! - [`switch`]: the switch controller — a pure per-model machine (CRITICAL → pre-probe the
//!   backup → budget → switch; min dwell, hourly cap, hysteresis; canary return through the
//!   weights), its thin driver (`switch::driver`), the published status and list
//!   (`switch::view`); records in SQLite, `GET /api/v1/switches`.
//! - [`sync`]: `[[sync]]` — new-api / one-api channels kept in step with their routes' weights
//!   from the leader (read the channel, change `weight`/`status`, write it back; only channels
//!   probeok disabled are enabled again, remembered in the store; one write per channel per
//!   10 s; refusals retried with backoff and alerted as `sync_failed`); the pure decisions in
//!   `sync::plan`, the gateways' admin API in `sync::client`.
//! - [`capability`]: capability probes — each route's declared `tools` and `json_schema`
//!   probed every `[capability] every` with a forced function call and a fixed JSON schema
//!   (`capability::wire`, pure, per provider dialect), spread and bounded by the leader's task;
//!   results in `store::capabilities`; two failures in a row while chat answers are a
//!   `capability_lost` drift finding (`capability::judge`, pure): alerted, never an outage,
//!   never a weight change. `capability::long_prompt` (`[capability] long_prompt`, off by
//!   default): a long prompt streamed through the chat probe's client, its TTFT judged against
//!   the route's own baseline (`long_prompt_slow`, a warning) and its code word checked.
//! - [`catalog`]: the providers' model lists, read by the leader every `[catalog] every` per
//!   provider region (`catalog::client`, OpenAI-compatible and Anthropic, bounded): first and
//!   last seen per model in `store::catalog`, a routed model missing from two answers in a row
//!   alerted as `model_withdrawn`, `route.retires` dates as `model_retiring` 30, 7 and 1 day(s)
//!   before; the pure decisions in `catalog::plan`; `GET /api/v1/catalog`.
//! - [`drill`]: drills — planned, time-limited moves of traffic off a route, ramped
//!   in stages (`drill::plan`, pure), refused outside the off-peak windows unless forced,
//!   persisted and ended by themselves (`drill::service`, caps into the weights), with a
//!   report against the backup's own history (`drill::report`, pure, its text form in
//!   `drill::report::text`); `probeok drill start|stop|report` (`drill::client`).
//! - [`extra_cost`]: the extra-cost budget of non-primary serving per clock hour — reserve
//!   the estimated maximum before a request, settle with the metered usage; `degrade_at`
//!   stops new switches. Shared through the store's spend ledger, one budget for every
//!   process on the database.
//! - [`spend`]: the one booking interface of money on the request path (`Spend`: reserve,
//!   settle, release, batched into one transaction per wave), used by the extra-cost budget
//!   and by client spend limits alike. (The *error* budget is [`slo`]'s.)
//! - [`heartbeat`]: which scheduled jobs the service expects and which are stale (pure), the
//!   in-memory [`heartbeat::Pulse`] of loops that must not wait on the store, the monitor that
//!   persists them with the store writer's own beat, and the dead-man's switch
//!   (`[heartbeat] ping_url_env`).
//! - [`reload`]: hot reload (SIGHUP, `POST /api/v1/admin/reload`): `serve`'s checks on the new
//!   file, the live sections published on the live-config `watch` channel
//!   ([`reload::LiveConfig`]), the rest reported as `restart_required`. The checks and
//!   counters of the layers above (alert channels, metrics) are handed in by the wiring.
//! - [`cluster`]: the monitor pair on one PostgreSQL database — the leader lease (an
//!   advisory lock on a session of its own, checked every second, `[cluster] lease`), the
//!   role watch, and [`cluster::terms`], which runs the wiring's leader-only and follower work
//!   one term at a time. With SQLite the monitor always leads.
//! - [`trace`]: OpenTelemetry traces — W3C trace context and head sampling
//!   (`trace::context`, pure), spans built from what a request or probe recorded
//!   (`trace::span`), the bounded OTLP/HTTP export queue with its drop count (`trace::export`).
//! - [`agent`]: `probeok agent` — the same probe client and scheduler for the routes a
//!   `[[vantage]]` assigns to it, every outcome into its own SQLite outbox (`agent::outbox`,
//!   bounded, oldest dropped and counted), pushed in batches to the monitor's ingest with
//!   backoff and jitter (`agent::push`), `/healthz` and `/metrics` (`agent::metrics`).
//! - [`declared`]: the provider's own word — `[[provider.status_page]]` pages (Statuspage v2
//!   JSON, RSS/Atom feeds) read by the leader with conditional, bounded requests
//!   (`declared::fetch`, `declared::parse`), kept in the store (`store::declared`), each
//!   route's declared state and the `provider_declared` alert (`declared::judge`, pure), and
//!   the lead time between our incidents and the provider's declarations with its monthly
//!   summary (`declared::lead`, pure).
//! - [`embed`]: embeddings routes (`kind = "embeddings"`) — the prober the scheduler calls
//!   (the embeddings probe for them, the chat probe for the rest), each route's first good
//!   vector kept as its reference (`store::embeddings`), later vectors compared by cosine
//!   similarity: below 0.999 an `embedding_changed` finding (critical), published with the
//!   drift findings.
//! - [`sim`]: simulated OpenAI-compatible providers with scripted fault scenarios (demo, tests),
//!   and past hours of probing them as outcomes without the wire (`sim::history`).
//! - [`demo`]: the built-in demo: a config of simulated routes for `probeok serve` without one,
//!   and on its first start 30 days of simulated history judged by the real detector and
//!   written through the store (`demo::history`, marked in `store_meta`).
//!
//! **Surfaces** — import every layer below. Among themselves only `web` imports the others
//! (it mounts the proxy's request log and shows alert and proxy metrics); `alert` and `proxy`
//! never import another surface.
//!
//! - [`alert`]: alerts to DingTalk, Feishu/Lark, WeCom, email, webhooks, Slack, Teams, Telegram,
//!   PagerDuty and Opsgenie (`alert::slack` … `alert::opsgenie`, shared pieces in
//!   `alert::oncall`) — grouping, egress
//!   inhibition, flapping summaries, maintenance windows and silences (admin API), SLO
//!   burn-rate alerts, a persisted SQLite outbox (at-least-once, dedup keys, backoff),
//!   messages in zh/en; `probeok alert test`. Status page subscribers
//!   (`alert::subscribers`: signed links, scopes, public notices; `alert::subscribers::deliver`,
//!   the leader's grouping and subscriber outbox), their form and admin API in `web::subscribe`.
//! - [`web`]: the monitor's whole HTTP surface, every endpoint one entry of `web::table`
//!   (method, path, handler, OpenAPI operation) from which the router and `/api/openapi.json`
//!   are built — JSON API (status, probes, incidents, ingest, drift, switches, requests), the
//!   weights feed (ETag, long-poll, SSE), the admin API (drills, silences, reload; one file
//!   each), `/metrics` (OpenMetrics), `/healthz`, `/readyz`, and the public HTML pages
//!   (`web::pages`, one file per page and the SVG chart: `/`, `/routes/{id}`, `/incidents`,
//!   askama templates in `templates/`, zh/en words in `web::i18n`, the stylesheet
//!   `static/style.css` served at `/static/style.css`; `/`'s compact route lines in
//!   `web::pages::lines`), the SVG badges (`web::badges`) and the incident Atom feed
//!   (`web::atom`). Store figures shared by requests are read off their path
//!   (`web::refresh`); what answers derive from one snapshot is kept for it (`web::memo`).
//!   Domain modules never import it.
//! - [`proxy`]: the OpenAI-compatible routing proxy — served by `[proxy] workers` threads,
//!   each a single-threaded runtime with its own socket and upstream pool (`proxy::server`;
//!   the monitor stays on the multi-thread runtime); candidates from the weights
//!   (`proxy::select`, pure), attempts with per-candidate budgets, the stream watchdog and
//!   the documented failover classes (`proxy::attempt`), committed streams (`proxy::stream`),
//!   its own view of the weights feed (`proxy::weights`); every attempt is a passive outcome.
//!   The user's in-flight limits per route and provider (`proxy::inflight`: none unless
//!   configured; past one the next candidate, else 429 naming it; `probeok_proxy_in_flight`).
//!   Circuit breakers and backoff (`proxy::breaker`), metering (`proxy::meter`), idempotency
//!   keys claimed in the store so every proxy on one database honours them
//!   (`proxy::idempotency`), the standalone proxy's monitor link (`proxy::remote`), and
//!   read-only mode while the database is unreachable (`proxy::readonly`: the store check,
//!   `x-probeok-store`, the proxy's `/readyz`; the mode itself is `store::StoreHealth`).
//!   Route observables from real traffic (`proxy::observe`: minute and hour rollups off the
//!   request path) with the structured-output check (`proxy::structured`, pure).
//!   Degradation contracts: the pure decision (`proxy::contract`: feature header, model
//!   state, cache keys, `user_message`), applying it (`proxy::degrade`), cached answers
//!   (`proxy::cache`), async-queue jobs with their worker and `GET /v1/jobs/{id}`
//!   (`proxy::jobs`); their tables in `store::contracts`. Route profiles
//!   (`proxy::profile`), the `"probeok"` object of degraded answers (`proxy::notice`), and
//!   `[[shadow]]` copies compared with the real answers (`proxy::shadow`, pure comparison in
//!   `proxy::shadow::compare`); named clients and
//!   their spend limits (`proxy::clients`: booked before any upstream call, settled to every
//!   attempt's usage).
//! - [`haproxy`]: HAProxy's agent-check answered from the weights (`[haproxy]
//!   agent_listen`): `up ready N%`, `drain`, `down #reason`, `maint #unknown route`, one
//!   bounded line per connection. (Envoy's endpoint discovery is `web::xds`.)
//!
//! **Wiring** — may import anything; nothing imports it.
//!
//! - [`app`]: wires the tasks together under one `CancellationToken`: scheduler → recorder →
//!   store → health service; passive queue (proxy, ingest) → store → health service; health →
//!   weights (with drift and switch overrides) → feed and in-process proxy; health events →
//!   alerts. Leader-only work runs in the cluster's leader terms (`app::terms`).
//! - [`cli`]: the subcommands behind the binary (serve, check-config, probe, regress, alert
//!   test, proxy, simulate).
//!
//! The library names itself `crate::`, never `probeok::` (that is the binary's name for it).

// Base: the shared nouns.
pub mod clock;
pub mod evidence;
pub mod gather;
pub mod glob;
pub mod lag;
pub mod lang;
pub mod listen;
pub mod malloc;
pub mod outcome;
pub mod ratelimit;
pub mod records;
pub mod route;
pub mod secret;
pub mod severity;
pub mod silence;
pub mod slo;
pub mod state;
pub mod stdout;
pub mod supervise;
pub mod vantage;

// Config and store.
pub mod config;
pub mod store;

// Domain: probing from another place.
pub mod agent;

// Domain.
pub mod capability;
pub mod catalog;
pub mod cluster;
pub mod declared;
pub mod demo;
pub mod drift;
pub mod drill;
pub mod embed;
pub mod extra_cost;
pub mod health;
pub mod heartbeat;
pub mod probe;
pub mod reload;
pub mod scheduler;
pub mod sim;
pub mod spend;
pub mod switch;
pub mod sync;
pub mod trace;
pub mod weights;

// Surfaces.
pub mod alert;
pub mod haproxy;
pub mod proxy;
pub mod web;

// Wiring.
pub mod app;
pub mod cli;
