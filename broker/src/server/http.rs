//! The HTTP listener: `/metrics` (Prometheus text), `/` (the live view, a
//! page compiled into the binary), `/events` (its server-sent events) and
//! `/state` (the same snapshot as one JSON document).
//!
//! hyper's HTTP/1 connection alone, without a framework: four GET routes
//! don't need a router, and axum would add its own dependency tree to the
//! build for nothing the broker uses. Bounded: at most
//! `http_max_connections` connections (one more is closed at once), at
//! most `view_max_clients` event streams (one more gets 503), a request
//! head must arrive within 10 s, and a stream that reads too slowly is
//! dropped (see [`super::view::Hub`]).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use super::{metrics, view, Shared};

/// The page, served as is.
const PAGE: &str = include_str!("view.html");

type Body = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

/// An event stream: the client's bounded queue, ending when the hub drops it.
struct EventStream {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

async fn state_json(shared: &Arc<Shared>) -> Option<serde_json::Value> {
    let s = shared.clone();
    tokio::task::spawn_blocking(move || view::snapshot(&s.log, s.topology.recent()))
        .await
        .ok()
}

async fn route(req: Request<Incoming>, shared: Arc<Shared>) -> Response<Body> {
    if req.method() != Method::GET {
        return full(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET is served\n",
        );
    }
    match req.uri().path() {
        "/" | "/index.html" => full(StatusCode::OK, "text/html; charset=utf-8", PAGE),
        "/metrics" => {
            let Some(handle) = metrics::install() else {
                return full(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "this process installed its own metrics recorder: the broker's metrics go there\n",
                );
            };
            let s = shared.clone();
            let stats = shared.stats.snapshot();
            let _ = tokio::task::spawn_blocking(move || metrics::sample(&s.log, &stats)).await;
            full(StatusCode::OK, "text/plain; version=0.0.4", handle.render())
        }
        "/state" => match state_json(&shared).await {
            Some(v) => full(StatusCode::OK, "application/json", v.to_string()),
            None => full(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", ""),
        },
        "/events" => {
            let Some(v) = state_json(&shared).await else {
                return full(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "");
            };
            let Some(rx) = shared.hub.join(view::sse_frame("state", &v)) else {
                return full(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "too many live-view clients\n",
                );
            };
            let mut r = Response::new(EventStream { rx }.boxed());
            let h = r.headers_mut();
            h.insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/event-stream"),
            );
            h.insert(
                CACHE_CONTROL,
                hyper::header::HeaderValue::from_static("no-cache"),
            );
            r
        }
        _ => full(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Publishes a snapshot to the live view every `view_refresh`, and at
/// once after a topology change, while anyone watches.
async fn push_loop(shared: Arc<Shared>) {
    let mut changes = shared.topology.changes.subscribe();
    let mut stop = shared.shutdown.clone();
    let mut tick = tokio::time::interval(shared.config.view_refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.recv() => {
                if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                    return;
                }
            }
            _ = stopped(&mut stop) => return,
        }
        if shared.hub.clients() == 0 {
            continue;
        }
        if let Some(v) = state_json(&shared).await {
            shared.hub.publish(view::sse_frame("state", &v));
        }
    }
}

/// Resolves once the server shuts down (the watch guard is not held
/// across the caller's awaits).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves HTTP on `listener` until the server shuts down.
pub(crate) async fn run(listener: TcpListener, shared: Arc<Shared>) {
    metrics::install();
    let slots = Arc::new(Semaphore::new(shared.config.http_max_connections.max(1)));
    let mut conns = JoinSet::new();
    conns.spawn(push_loop(shared.clone()));
    let mut stop = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTP accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "HTTP connection limit: closed");
                    continue; // dropping the stream closes it
                };
                let shared = shared.clone();
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(route(req, shared).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(10))
                        .serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "HTTP connection ended");
                    }
                    drop(permit);
                });
            }
        }
    }
    // Event streams never end on their own: cut them.
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}
