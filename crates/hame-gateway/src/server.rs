//! The HTTP/1.1 server under the routes: slow clients cannot hold it.
//!
//! - **Header timeout** ([`GatewayOptions::header_timeout`]): a connection whose request
//!   headers are not complete within it — from the moment the server waits for them, so an
//!   idle keep-alive connection or one that sends nothing at all too — is closed (hyper's
//!   `header_read_timeout`).
//! - **Body timeout** ([`GatewayOptions::body_timeout`]): a request body that has not
//!   arrived whole within it after the headers is answered 408 `body_timeout` and the
//!   connection closed ([`read_body_within`]).
//! - **Connection limit** ([`GatewayOptions::max_connections`]): with that many connections
//!   open, the server stops accepting; new connections wait in the listener's backlog
//!   (the kernel's; tokio asks for 1,024) until one closes — at the latest when the header
//!   timeout closes an idle one.
//!
//! HTTP/1.1 only: HTTP/2 has no header-read timeout in hyper, and the clients of the
//! gateway (browsers over `http://`, the OpenAI SDKs, curl) speak HTTP/1.1 to it.
//!
//! [`GatewayOptions::header_timeout`]: crate::GatewayOptions::header_timeout
//! [`GatewayOptions::body_timeout`]: crate::GatewayOptions::body_timeout
//! [`GatewayOptions::max_connections`]: crate::GatewayOptions::max_connections

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// Limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_timeout: Duration,
    pub(crate) max_connections: usize,
}

/// The body limits of [`limit_body`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    /// Every route's but an upload's.
    pub(crate) body: usize,
    /// `PUT` of a file (`crate::files::FILE_ROUTE`).
    pub(crate) upload: usize,
}

/// Limits the request body to the route's limit: 413 at once for a `Content-Length` over
/// it, else the body is cut there and [`read_body_within`] answers 413.
pub(crate) async fn limit_body(
    State(limits): State<BodyLimits>,
    req: Request,
    next: Next,
) -> Response {
    let upload = req.method() == axum::http::Method::PUT
        && req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .is_some_and(|p| p.as_str().ends_with(crate::files::FILE_ROUTE));
    let limit = if upload { limits.upload } else { limits.body };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let (parts, body) = req.into_parts();
    let body = Body::new(http_body_util::Limited::new(body, limit));
    next.run(Request::from_parts(parts, body)).await
}

/// A plain-text 413: [`crate::error::json_errors`] gives it the route's error shape
/// (OpenAI's `body_too_large`, or a JSON-RPC error on an A2A endpoint).
fn too_large(limit: usize) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than this route takes ({limit} bytes)"),
    )
        .into_response()
}

/// Reads the whole request body within `limit` (the routes take bodies of at most
/// `body_limit` bytes whole anyway); past it, 408 `body_timeout` with `Connection: close`.
/// A body over the size limit is 413, one that cannot be read 400.
pub(crate) async fn read_body_within(
    State(limit): State<Duration>,
    req: Request,
    next: Next,
) -> Response {
    let (parts, body) = req.into_parts();
    match tokio::time::timeout(limit, axum::body::to_bytes(body, usize::MAX)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let too_large = {
                let inner = e.into_inner();
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
                let mut found = false;
                while let Some(c) = cause {
                    if c.is::<http_body_util::LengthLimitError>() {
                        found = true;
                        break;
                    }
                    cause = c.source();
                }
                found
            };
            if too_large {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than the server accepts",
                )
                    .into_response()
            } else {
                ApiError::bad_request("the request body could not be read").into_response()
            }
        }
        Err(_) => {
            let mut resp = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    limit.as_secs_f64()
                ),
            )
            .into_response();
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            resp
        }
    }
}

/// Whether an accept error is about one connection (go on at once) rather than the
/// process (out of file descriptors: wait a little).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves `app` on `listener` until `stop` is cancelled; then stops accepting and waits
/// for the open connections to finish their requests (idle ones close at once).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            () = stop.cancelled() => break,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
