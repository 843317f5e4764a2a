//! The integration tests that need nothing but the crate (and the `probeok` binary it
//! builds), in one test binary: one link instead of one per file, and one copy of the
//! harness. Modules by subject:
//!
//! - [`alert`]: the alert engine, its outbox and every channel against fake receivers;
//! - [`config`]: the config contract, its property tests and hot reload;
//! - [`health`]: detection, confirmations, the scheduler, weights, heartbeats, error budgets;
//! - [`proxy`]: the routing proxy against fake upstreams: failover, safeguards, spend, traces;
//! - [`store`]: the store's tables on both engines, migrations and `migrate-store`;
//! - [`web`]: the monitor's HTTP surface: JSON API, pages, badges, the weights feed;
//! - [`product`]: the whole product as a user runs it: CLI, demo, drills, vantages, docs.
//!
//! Tests that need a program from outside (Chromium, Prometheus, the openai SDK, Envoy,
//! HAProxy) or run the
//! monitor pair and the proxy fleet as separate processes on PostgreSQL are binaries of their
//! own beside this one. Every test here that needs the PostgreSQL server of
//! `PROBEOK_TEST_PG_URL` says `postgres` in its name (the `…::postgres` halves of
//! `on_both_engines!`, and a few more), so `scripts/test --fast` can skip them.

#[path = "../common/mod.rs"]
mod common;

mod alert;
mod config;
mod health;
mod product;
mod proxy;
mod store;
mod web;
