//! The SERVER span of each HTTP request (`hame.http`, exported as `{method} {route}`): it
//! continues the caller's W3C trace context (`traceparent`) through the global propagator,
//! so a turn's `invoke_agent`, `chat` and `execute_tool` spans are in the caller's trace
//! (ADR 0037).

use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use axum::http::{Request, Response};
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_http::trace::{DefaultOnRequest, TraceLayer};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

type MakeSpan = fn(&Request<Body>) -> Span;
type OnResponse = fn(&Response<Body>, Duration, &Span);

/// The trace layer of the gateway's routes.
pub(crate) fn layer()
-> TraceLayer<SharedClassifier<ServerErrorsAsFailures>, MakeSpan, DefaultOnRequest, OnResponse> {
    TraceLayer::new_for_http()
        .make_span_with(make_span as MakeSpan)
        .on_response(on_response as OnResponse)
}

fn make_span(req: &Request<Body>) -> Span {
    let method = req.method().as_str();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let name = match route {
        Some(r) => format!("{method} {r}"),
        None => method.to_owned(),
    };
    let span = tracing::info_span!(
        "hame.http",
        otel.name = %name,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = route,
        url.path = %req.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&opentelemetry_http::HeaderExtractor(req.headers()))
    });
    // Refused only when the span is already started or not an OpenTelemetry span (no
    // exporter): nothing to continue then.
    let _ = span.set_parent(parent);
    span
}

fn on_response(res: &Response<Body>, _latency: Duration, span: &Span) {
    span.record("http.response.status_code", res.status().as_u16());
    // Semantic conventions: a SERVER span is an error for 5xx only (4xx is the caller's).
    if res.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
}

/// The current span's W3C trace context, to store with work that another process or a
/// later task executes (a durable run): empty without a propagator (no exporter).
pub(crate) fn current_carrier() -> std::collections::BTreeMap<String, String> {
    let cx = Span::current().context();
    let mut carrier = std::collections::HashMap::<String, String>::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.into_iter().collect()
}

/// Makes `span` continue the trace context stored in `carrier` ([`current_carrier`]).
pub(crate) fn continue_trace(span: &Span, carrier: &std::collections::BTreeMap<String, String>) {
    if carrier.is_empty() {
        return;
    }
    let map: std::collections::HashMap<String, String> = carrier
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&map));
    // Refused only without an OpenTelemetry subscriber: nothing to continue then.
    let _ = span.set_parent(parent);
}
