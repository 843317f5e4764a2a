//! The proxy's HTTP client for upstreams.
//!
//! Requests go through hyper's pooled client directly: reqwest, over the same hyper client,
//! also runs a redirect layer and parses each request's URL twice, even with redirects off,
//! which cost about an eighth of a proxied request. reqwest stays for upstreams that the
//! environment (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`) sends through an HTTP
//! proxy, which it knows how to reach; which way a route goes is decided once, at start.
//!
//! Neither follows redirects: a redirected POST would carry our key elsewhere, so a 3xx is
//! reported as the upstream's answer.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyDataStream, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::probe::sse::{describe_error, describe_reqwest};

/// Sent as `User-Agent` with every upstream request.
const USER_AGENT: &str = concat!("probeok-proxy/", env!("CARGO_PKG_VERSION"));
/// Idle pooled connections are closed after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle pooled connections kept per upstream host.
const POOL_MAX_IDLE_PER_HOST: usize = 256;
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// An upstream's answer: its head, and its body as it arrives (errors already told as one line).
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: BodyStream,
}

pub(crate) type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// The client could not be built (its TLS configuration).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the upstream HTTP client: {0}")]
pub struct TransportError(String);

/// Where one route's requests go.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub uri: Uri,
    /// Through the HTTP proxy the environment names for it.
    pub via_proxy: bool,
}

/// One pooled client per way out, shared by every route.
pub(crate) struct Transport {
    direct: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    proxied: reqwest::Client,
    proxies: Matcher,
}

impl Transport {
    pub(crate) fn new() -> Result<Self, TransportError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_keepalive(Some(TCP_KEEPALIVE));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| TransportError(e.to_string()))?
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http);
        let direct = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(https);
        let proxied = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .tcp_keepalive(TCP_KEEPALIVE)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| TransportError(describe_reqwest(e)))?;
        Ok(Self {
            direct,
            proxied,
            proxies: Matcher::from_env(),
        })
    }

    /// A route's target, when its URL parses.
    pub(crate) fn target(&self, url: &str) -> Option<Target> {
        let uri: Uri = url.parse().ok()?;
        let via_proxy = self.proxies.intercept(&uri).is_some();
        Some(Target { uri, via_proxy })
    }

    /// Sends `req` (its URI one of [`Transport::target`]'s) and waits for the answer's head.
    pub(crate) async fn send(
        &self,
        mut req: Request<Bytes>,
        via_proxy: bool,
    ) -> Result<Reply, String> {
        (req.headers_mut()).insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(USER_AGENT),
        );
        if via_proxy {
            let req = reqwest::Request::try_from(req).map_err(describe_reqwest)?;
            let res = self.proxied.execute(req).await.map_err(describe_reqwest)?;
            let (head, body) = http::Response::from(res).into_parts();
            let body = BodyDataStream::new(body).map(|r| r.map_err(describe_reqwest));
            return Ok(reply(head, Box::pin(body)));
        }
        let res =
            (self.direct.request(req.map(Full::new)).await).map_err(|e| describe_error(&e))?;
        let (head, body) = res.into_parts();
        let body = BodyDataStream::new(body).map(|r| r.map_err(|e| describe_error(&e)));
        Ok(reply(head, Box::pin(body)))
    }
}

fn reply(head: http::response::Parts, body: BodyStream) -> Reply {
    Reply {
        status: head.status,
        headers: head.headers,
        body,
    }
}
