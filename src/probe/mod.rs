//! The probe client: one fixed tiny prompt, streamed, measured honestly.
//!
//! - [`client`]: `ProbeClient` — HTTP, timeouts, timing, outcome assembly; `chat` sends any
//!   conversation (regression sets) through the same code.
//! - [`outcome`]: `ProbeOutcome` and the `ProbeError` classification (defined in
//!   [`crate::outcome`], below the store).
//! - [`embed`]: the embeddings probe (`POST {base_url}/embeddings`, one fixed text), its
//!   outcome and vector.
//! - [`cost`]: probe and regression-set tokens and cost per month, before they are spent.
//! - [`measure`]: answer verification, token estimate, tokens/s (pure).
//! - `openai`, `anthropic`: request bodies and decoders for each wire dialect (pure);
//!   `answer` reads a non-streamed OpenAI answer without building its JSON tree.
//! - `sse`: body reading under the stall and deadline clocks; SSE framing.
//! - `upstream`: upstream error bodies and `Retry-After` → classification (pure).
//!
//! `answer`, `openai`, `sse`, `upstream` and `wire` are crate-visible: the proxy reads
//! upstream answers with the same framing, end-of-stream rules and error classification as
//! the probes.

pub(crate) mod answer;
mod anthropic;
pub mod client;
pub(crate) mod cost;
pub mod embed;
pub mod measure;
pub(crate) mod openai;
pub(crate) mod sse;
pub(crate) mod upstream;
pub(crate) mod wire;

/// The outcome types live in the base layer ([`crate::outcome`]) so the store can keep them;
/// this path stays for callers that know them as the probe's.
pub use crate::outcome;

pub use client::{
    probe_json, ChatMessage, ChatOutcome, ChatRequest, ProbeClient, ProbeSetupError, Role,
};
pub use outcome::{OutcomeKind, ProbeError, ProbeOutcome};
