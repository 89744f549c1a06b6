//! The crate's error, and the HTTP error answers of the routes.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// What can go wrong setting up or running the gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The `--auth` file cannot be read or is not `{"tokens": {"<token>": {"user": "<id>"}}}`.
    #[error("auth file {path}: {message}")]
    Auth {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// The listen address is public and no auth is configured, or another setting is wrong.
    #[error("{0}")]
    Config(String),
    /// Binding or serving the socket failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is a usage or configuration error (the CLI exits 2 for those).
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Auth { .. } | Error::Config(_))
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `value` with every string redacted for API callers: no secret of the process, no model
/// endpoint (`hame::secrets::redact_for_callers`; ADR 0023). Every body the routes build
/// from stored or model text goes through here.
pub(crate) fn for_callers(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => match hame::secrets::redact_for_callers(&s) {
            std::borrow::Cow::Borrowed(_) => Value::String(s),
            std::borrow::Cow::Owned(clean) => Value::String(clean),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(for_callers).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, for_callers(v))).collect())
        }
        other => other,
    }
}

/// An error answer of a route: a status and, in OpenAI's error shape,
/// `{"error": {"message", "type", "param", "code"}}` (the session API's `code` and
/// `message` are the same fields).
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) retry_after: Option<u64>,
    /// `budget_exceeded`: the limit reached and what was spent under it, as `error.budget`.
    pub(crate) budget: Option<serde_json::Value>,
    /// The request field at fault, when there is one.
    pub(crate) param: Option<String>,
}

impl ApiError {
    /// An error answer; its message is redacted for API callers ([`for_callers`]).
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message: String = message.into();
        let message = match hame::secrets::redact_for_callers(&message) {
            std::borrow::Cow::Borrowed(_) => message,
            std::borrow::Cow::Owned(clean) => clean,
        };
        Self {
            status,
            code,
            message,
            retry_after: None,
            budget: None,
            param: None,
        }
    }

    /// The same error naming the request field at fault.
    pub(crate) fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }

    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn busy(retry_after: u64) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                "too many messages wait for this session; retry later",
            )
        }
    }

    pub(crate) fn draining() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The answer for an error of the harness.
    pub(crate) fn from_harness(e: &hame::harness::Error) -> Self {
        use hame::harness::Error as H;
        match e {
            H::InvalidId(m) => Self::new(StatusCode::BAD_REQUEST, "invalid_id", m.clone()),
            H::SessionBusy(_) => Self {
                retry_after: Some(1),
                ..Self::new(StatusCode::CONFLICT, "session_busy", e.to_string())
            },
            H::Call(hame::Error::NothingPending | hame::Error::UnknownResolution(_)) => {
                Self::new(StatusCode::CONFLICT, "not_pending", e.to_string())
            }
            // 429: the caller's spending, not the server, stops the turn; it takes calls
            // again when the limit allows (a new run, session or UTC day).
            H::Call(hame::Error::BudgetExceeded(b)) => Self {
                budget: serde_json::to_value(b).ok(),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "budget_exceeded",
                    e.to_string(),
                )
            },
            H::Call(_) => Self::new(StatusCode::BAD_GATEWAY, "call_failed", e.to_string()),
            _ => Self::internal(e.to_string()),
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}`.
    pub(crate) fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({"error": {
            "message": self.message,
            "type": error_type(self.status),
            "param": self.param,
            "code": self.code,
        }});
        if let Some(b) = &self.budget {
            body["error"]["budget"] = b.clone();
        }
        body
    }
}

/// `?` on a harness call: the answer [`ApiError::from_harness`] gives.
impl From<hame::harness::Error> for ApiError {
    fn from(e: hame::harness::Error) -> Self {
        Self::from_harness(&e)
    }
}

/// OpenAI's error `type` for a status.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// Every error answer in the one JSON shape: an answer of status 400 or above that is not
/// JSON (axum's plain-text rejections of a bad query string or path, the empty 405 of a
/// wrong method, the empty 408 of the request timeout) is replaced by an [`ApiError`] with
/// the same status, whose message is the original text (at most 300 characters).
pub(crate) async fn json_errors(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let rpc = crate::a2a::is_rpc_path(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let allow = resp.headers().get(header::ALLOW).cloned();
    let text = match axum::body::to_bytes(resp.into_body(), 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b)
            .trim()
            .chars()
            .take(300)
            .collect::<String>(),
        Err(_) => String::new(),
    };
    let (code, fallback) = match status.as_u16() {
        405 => ("method_not_allowed", "this route does not take that method"),
        408 => (
            "request_timeout",
            "the request took longer than the server allows",
        ),
        413 => (
            "body_too_large",
            "the request body is larger than the server accepts",
        ),
        404 => ("not_found", "no such route"),
        400..=499 => ("bad_request", "the request is not valid"),
        _ => ("internal", "the server failed"),
    };
    let message = if text.is_empty() {
        fallback.to_owned()
    } else {
        text
    };
    if rpc {
        // An A2A JSON-RPC endpoint answers JSON-RPC error objects, even for what the
        // layers refused (a body over the limit, a timeout).
        return crate::a2a::http_error(status, &message);
    }
    let mut out = ApiError::new(status, code, message).into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

/// Whether retrying the same request may get another answer: the request was refused
/// before its turn ran (`queue_full`, `session_busy`, `shutting_down`, `body_timeout`) or
/// the server failed (`internal`). Everything else — a bad request, a turn that ran and
/// failed — would get the same answer (a retry of a request is answered from its first
/// attempt: `replay`).
pub(crate) fn retry_may_help(code: &str) -> bool {
    matches!(
        code,
        "queue_full" | "session_busy" | "shutting_down" | "body_timeout" | "internal"
    )
}

/// Adds `x-should-retry: false` (honoured by the OpenAI SDKs) to an error answer a retry
/// cannot change ([`retry_may_help`]).
pub(crate) fn mark_retry(resp: &mut Response, code: &str) {
    if !retry_may_help(code) {
        resp.headers_mut()
            .insert("x-should-retry", HeaderValue::from_static("false"));
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        mark_retry(&mut resp, self.code);
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
