//! The demo agent's own network path: a TCP relay between the in-process agent and the
//! simulator that, for a while, cuts one region off — as a real vantage's egress or ISP
//! path breaks while the provider itself is fine. The monitor's own probes of that region
//! keep succeeding, so the quorum keeps the routes NORMAL and the page shows a
//! `vantage_local` finding naming the demo's agent instead of a provider incident.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The region the demo agent's path loses: both of its routes are healthy at the provider.
pub const EDGE_REGION: (&str, &str) = ("openai", "eu-west");

/// When the path is cut, counted from the relay's start: from `after`, for `lasts`, again
/// every `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeOutage {
    pub after: Duration,
    pub lasts: Duration,
    pub every: Duration,
}

impl EdgeOutage {
    /// The demo's: a newcomer sees it in the second minute, and it heals two and a half
    /// minutes later; then every ten minutes again.
    pub const DEMO: EdgeOutage = EdgeOutage {
        after: Duration::from_secs(60),
        lasts: Duration::from_secs(150),
        every: Duration::from_secs(600),
    };

    /// Whether the path is cut `elapsed` after the relay started.
    pub fn is_down(&self, elapsed: Duration) -> bool {
        self.until_down(elapsed) == Some(Duration::ZERO)
    }

    /// How long from `elapsed` until the path is cut (zero while it is); `None`: never again.
    pub fn until_down(&self, elapsed: Duration) -> Option<Duration> {
        if self.lasts.is_zero() {
            return None;
        }
        if elapsed < self.after {
            return Some(self.after - elapsed);
        }
        let into = elapsed - self.after;
        if self.every.is_zero() {
            return (into < self.lasts).then_some(Duration::ZERO);
        }
        let every = self.every.as_nanos();
        let at = into.as_nanos() % every;
        if at < self.lasts.as_nanos() {
            Some(Duration::ZERO)
        } else {
            Some(Duration::from_nanos((every - at) as u64))
        }
    }
}

/// Starts the relay on a free loopback port in front of `upstream`; returns its address.
/// While the outage holds, a new connection is closed at once, before any byte (the agent's
/// probe sees the connection fail, as behind a broken path); otherwise bytes pass both ways
/// until the next outage begins, which cuts the connections open then too (kept-alive ones
/// would otherwise ride through it).
pub async fn start(
    upstream: SocketAddr,
    outage: EdgeOutage,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let started = Instant::now();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((mut inbound, _)) = accepted else {
                continue;
            };
            let cut_in = outage.until_down(started.elapsed());
            if cut_in == Some(Duration::ZERO) {
                drop(inbound);
                continue;
            }
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                    return;
                };
                let cut = async {
                    match cut_in {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = cut => {}
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                }
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_cut_inside_each_window_only() {
        let o = EdgeOutage {
            after: Duration::from_secs(60),
            lasts: Duration::from_secs(150),
            every: Duration::from_secs(600),
        };
        let s = Duration::from_secs;
        assert!(!o.is_down(s(0)));
        assert!(!o.is_down(s(59)));
        assert!(o.is_down(s(60)));
        assert!(o.is_down(s(209)));
        assert!(!o.is_down(s(210)));
        assert!(!o.is_down(s(659)));
        assert!(o.is_down(s(660)));
        assert!(!o.is_down(s(810)));
        let once = EdgeOutage {
            every: Duration::ZERO,
            ..o
        };
        assert!(once.is_down(s(100)));
        assert!(!once.is_down(s(700)));
        let never = EdgeOutage {
            lasts: Duration::ZERO,
            ..o
        };
        assert!(!never.is_down(s(60)));
        assert_eq!(never.until_down(s(0)), None);
        // Open connections are cut when the next window begins.
        assert_eq!(o.until_down(s(10)), Some(s(50)));
        assert_eq!(o.until_down(s(100)), Some(s(0)));
        assert_eq!(o.until_down(s(210)), Some(s(450)));
        assert_eq!(once.until_down(s(300)), None);
    }

    #[tokio::test]
    async fn bytes_pass_outside_the_window_and_connections_close_inside_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let shutdown = CancellationToken::new();
        let open = start(
            echo_addr,
            EdgeOutage {
                after: Duration::from_secs(3600),
                ..EdgeOutage::DEMO
            },
            shutdown.clone(),
        )
        .await
        .unwrap();
        let mut c = TcpStream::connect(open).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        let cut = start(
            echo_addr,
            EdgeOutage {
                after: Duration::ZERO,
                ..EdgeOutage::DEMO
            },
            shutdown.clone(),
        )
        .await
        .unwrap();
        let mut c = TcpStream::connect(cut).await.unwrap();
        let _ = c.write_all(b"ping").await;
        let mut buf = Vec::new();
        let read = c.read_to_end(&mut buf).await;
        assert!(
            read.is_err() || buf.is_empty(),
            "nothing comes back through a cut path: {buf:?}"
        );
        shutdown.cancel();
    }
}
