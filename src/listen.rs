//! Serving a router on a TCP listener, the same way for the monitor and the proxy: HTTP/1.1
//! (keep-alive) and HTTP/2, a header read timeout (a slow-loris client cannot hold a
//! connection by trickling its head), a request head of at most [`MAX_HEAD`] bytes (431
//! beyond, before any handler runs), a bound on open connections (the next connection waits
//! in the kernel's backlog until one closes), and graceful shutdown (stop accepting, close
//! idle connections, wait for in-flight requests).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The largest request head (request line and headers) accepted; hyper answers 431 beyond.
pub const MAX_HEAD: usize = 32 * 1024;
/// A request's head must arrive within this, or the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections at most, per listener.
pub const MAX_CONNECTIONS: usize = 1024;
/// After an accept error other than a peer's reset (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How a listener serves.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` (`name` is for the log).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
    name: &'static str,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    serve_with_slots(
        listener,
        router,
        limits.header_read_timeout,
        slots,
        shutdown,
        name,
    )
    .await
}

/// [`serve`], with the connection bound given: listeners that hold permits of one semaphore
/// (the proxy's workers, each on its own runtime) are bounded together.
pub async fn serve_with_slots(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    slots: Arc<Semaphore>,
    shutdown: CancellationToken,
    name: &'static str,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let service = TowerToHyperService::new(router);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD as u32);
    let graceful = GracefulShutdown::new();
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, server = name, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // The peer's address reaches handlers as `ConnectInfo` (the subscription form's
        // per-client limit).
        let svc = service.clone();
        let with_peer =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                hyper::service::Service::call(&svc, req)
            });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), with_peer)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, server = name, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server whose one handler counts its calls.
    async fn start(limits: Limits) -> (std::net::SocketAddr, Arc<AtomicUsize>, CancellationToken) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let router = Router::new().route(
            "/",
            axum::routing::get(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { "ok" }
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(listener, router, limits, shutdown.clone(), "test"));
        (addr, calls, shutdown)
    }

    /// Sends `head` and reads the answer until the server closes or 5 s pass.
    async fn exchange(stream: &mut TcpStream, head: &[u8]) -> String {
        stream.write_all(head).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.windows(2).any(|w| w == b"ok") {
                break;
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn request(extra: &str) -> Vec<u8> {
        format!("GET / HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n").into_bytes()
    }

    #[tokio::test]
    async fn a_head_over_32_kib_is_431_before_any_handler() {
        let (addr, calls, shutdown) = start(Limits::default()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let big = format!("x-big: {}\r\n", "a".repeat(MAX_HEAD));
        let answer = exchange(&mut s, &request(&big)).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Just under the limit is served.
        let mut s = TcpStream::connect(addr).await.unwrap();
        let fits = format!("x-big: {}\r\n", "a".repeat(MAX_HEAD - 1024));
        let answer = exchange(&mut s, &request(&fits)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_trickled_head_is_cut_off() {
        let (addr, calls, shutdown) = start(Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Default::default()
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let mut buf = [0u8; 1024];
        // The server closes the connection (EOF, perhaps after a 408) within the deadline.
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the slow connection was kept open");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn open_connections_are_bounded() {
        let (addr, calls, shutdown) = start(Limits {
            header_read_timeout: Duration::from_secs(60),
            max_connections: 2,
        })
        .await;
        let idle_a = TcpStream::connect(addr).await.unwrap();
        let _idle_b = TcpStream::connect(addr).await.unwrap();
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(&request("")).await.unwrap();
        let mut buf = [0u8; 1024];
        // Not served while both slots are held…
        let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf)).await;
        assert!(early.is_err(), "served past the connection bound");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // …and served once one closes.
        drop(idle_a);
        let answer = exchange(&mut third, b"").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        shutdown.cancel();
    }
}
