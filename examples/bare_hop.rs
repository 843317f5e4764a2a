//! The floor under the proxy's figures: a forwarder on the proxy's own stack (the same
//! listener, axum and hyper-util's pooled client) that does nothing of the proxy's work — no
//! parsing, choosing, metering or headers. `scripts/bench-gateway` measures it beside the
//! proxy when `BENCH_BARE=1`, so the part of the gap to nginx that is the stack's shows apart
//! from the part that is the proxy's.
//!
//! `cargo run --release --example bare_hop -- 127.0.0.1:PORT http://127.0.0.1:UPSTREAM [hyper]`
//! (`hyper`: hyper's HTTP/1 server and a bare service instead of the listener and axum, to
//! show what those two cost.)

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, Request, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio_util::sync::CancellationToken;

type Upstream = Client<HttpConnector, Full<Bytes>>;

#[derive(Clone)]
struct Hop {
    client: Upstream,
    url: String,
}

async fn forward(State(hop): State<Hop>, body: Bytes) -> Response<Body> {
    let req = Request::post(&hop.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("a fixed request");
    match hop.client.request(req).await {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            match body.collect().await {
                Ok(b) => Response::from_parts(parts, Body::from(b.to_bytes())),
                Err(_) => bad_gateway(),
            }
        }
        Err(_) => bad_gateway(),
    }
}

fn bad_gateway() -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_hop LISTEN_ADDR UPSTREAM_BASE_URL");
        std::process::exit(1);
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let hop = Hop {
        client,
        url: format!("{}/v1/chat/completions", upstream.trim_end_matches('/')),
    };
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    if args.next().as_deref() == Some("hyper") {
        return plain(listener, hop).await;
    }
    let router = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(hop);
    probeok::listen::serve(
        listener,
        router,
        probeok::listen::Limits::default(),
        CancellationToken::new(),
        "bare_hop",
    )
    .await
}

/// hyper's HTTP/1 server with a service that forwards every request, one task a connection.
async fn plain(listener: tokio::net::TcpListener, hop: Hop) -> std::io::Result<()> {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let hop = hop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let hop = hop.clone();
                async move {
                    let body = match req.into_body().collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(_) => return Ok::<_, std::convert::Infallible>(bad_gateway()),
                    };
                    Ok(forward(State(hop), body).await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
