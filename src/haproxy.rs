//! HAProxy's agent-check, answered from the weights (`[haproxy] agent_listen`).
//!
//! A server line `… agent-check agent-addr <monitor> agent-port 9403 agent-send "<route id>\n"`
//! makes HAProxy connect every `agent-inter`, send the route id and read one line back
//! (HAProxy's configuration manual, "agent-check"). The answer:
//!
//! - `up ready 70%`: the route's weight as a share of its model's largest weight (HAProxy
//!   applies it to the server's configured weight); `ready` because only the agent can take
//!   back a `drain` it gave;
//! - `drain` at weight 0 while the route is not CRITICAL (a standby, a drill, a deweighted
//!   route): no new traffic, and the server stays up;
//! - `down #<reason>` at weight 0 when CRITICAL (or SWITCHED, the switch controller's mark on
//!   a CRITICAL primary);
//! - `maint #unknown route` for an id the monitor does not know, `maint #bad request: …` for
//!   a line that is not one (too long, not UTF-8, no newline before the connection ends or
//!   within [`READ_TIMEOUT`]): MAINT shows on HAProxy's stats page, where a silent wrong
//!   answer would not.
//!
//! Every answer of a weights version is computed once, when the version is first asked
//! about; a connection costs a hash lookup. Input is bounded ([`MAX_LINE`] bytes, one line per
//! connection) and so are open connections ([`MAX_CONNECTIONS`]).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::state::State;
use crate::weights::{WeightsRx, WeightsSnapshot};

/// The longest request line, newline included.
pub const MAX_LINE: usize = 256;
/// A request line must arrive within this.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Open agent connections at most; the next waits in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// After an accept error other than a peer's reset (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Every route's answer under one weights version.
#[derive(Debug, Default)]
pub struct Answers {
    version: u64,
    by_route: HashMap<String, String>,
}

impl Answers {
    /// The answers for every route of `weights` (pure).
    pub fn build(weights: &WeightsSnapshot) -> Self {
        let mut by_route = HashMap::new();
        for model in weights.models.values() {
            let top = model.entries.iter().map(|e| e.weight).max().unwrap_or(0);
            for e in &model.entries {
                let line = if e.weight > 0 {
                    // Rounded, but never 0% for a route that has traffic.
                    let share = (u32::from(e.weight) * 100 + u32::from(top) / 2) / u32::from(top);
                    format!("up ready {}%\n", share.max(1))
                } else if matches!(e.state, State::Critical | State::Switched) {
                    format!("down #{}\n", clean(&e.reason))
                } else {
                    "drain\n".to_owned()
                };
                by_route.insert(e.route.as_str().to_owned(), line);
            }
        }
        Self {
            version: weights.version,
            by_route,
        }
    }

    /// The answer to one request line (its newline already removed).
    pub fn answer(&self, route: &str) -> &str {
        match self.by_route.get(route.trim()) {
            Some(a) => a,
            None if route.trim().is_empty() => "maint #bad request: no route id\n",
            None => "maint #unknown route\n",
        }
    }
}

/// A reason as one word of HAProxy's agent line: no separators, no newline.
fn clean(reason: &str) -> String {
    let s: String = reason
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "critical".to_owned()
    } else {
        s
    }
}

/// Serves agent checks on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, mut weights: WeightsRx, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut answers = Arc::new(Answers::build(&weights.borrow_and_update()));
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "agent-check: cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // A new version is built once, by the accept loop, never per connection.
        if weights.has_changed().unwrap_or(false) {
            let current = weights.borrow_and_update().clone();
            if current.version != answers.version {
                answers = Arc::new(Answers::build(&current));
            }
        }
        let answers = answers.clone();
        tokio::spawn(async move {
            if let Err(e) = exchange(stream, &answers).await {
                tracing::debug!(error = %e, "agent-check connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// Reads one line and writes its answer.
async fn exchange(mut stream: TcpStream, answers: &Answers) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let reply = match tokio::time::timeout(READ_TIMEOUT, read_line(&mut stream)).await {
        Ok(Ok(line)) => answers.answer(&line),
        Ok(Err(why)) => why,
        Err(_) => "maint #bad request: no newline within 2s\n",
    };
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await?;
    // What is still unread would turn the close into a reset that can overtake the answer:
    // read a bounded rest, briefly, before closing.
    let mut sink = [0u8; 4096];
    let mut left = 64 * 1024usize;
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
    Ok(())
}

/// One request line without its `\n` (or `\r\n`), or the answer that refuses it.
async fn read_line(stream: &mut TcpStream) -> Result<String, &'static str> {
    let mut buf = [0u8; MAX_LINE];
    let mut len = 0;
    loop {
        if let Some(end) = buf[..len].iter().position(|&b| b == b'\n') {
            let line =
                std::str::from_utf8(&buf[..end]).map_err(|_| "maint #bad request: not UTF-8\n")?;
            return Ok(line.trim_end_matches('\r').to_owned());
        }
        if len == MAX_LINE {
            return Err("maint #bad request: line longer than 256 bytes\n");
        }
        match stream.read(&mut buf[len..]).await {
            Ok(0) | Err(_) => return Err("maint #bad request: no newline\n"),
            Ok(n) => len += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_become_one_word() {
        assert_eq!(clean("error_rate_high"), "error_rate_high");
        assert_eq!(clean("a b\nc"), "a_b_c");
        assert_eq!(clean(""), "critical");
    }
}
