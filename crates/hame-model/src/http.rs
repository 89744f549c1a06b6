//! What both providers share: the settings every config has ([`Common`]), one client that
//! sends with retries and maps every failure to a [`ModelError`] ([`Client`]), the SSE
//! driver, and the check that a reply cut off at the output limit is not taken for an
//! empty answer. A provider adds only its URL path, headers, request body and event parsing.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use futures::stream::BoxStream;
use hame_core::secrets;
use hame_core::{
    ModelError, ModelEvent, ModelInfo, ModelResponse, ModelStream, ResponseAssembler, StopReason,
};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::classify::{HttpFailure, classify_http, error_message};
use crate::config::{CONNECT_RETRY_DELAY, MAX_CONNECT_RETRIES, RetryConfig};
use crate::endpoint::{parse_base_url, redact, redact_str};

/// Longest wait before retrying a failed connection.
const CONNECT_RETRY_MAX_WAIT: Duration = Duration::from_secs(1);

/// The settings every provider config has, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Common<'a> {
    /// Provider name reported by `Model::info`.
    pub provider: &'a str,
    /// Base URL as configured.
    pub base_url: &'a str,
    /// Where the base URL comes from (`OPENAI_BASE_URL`), named in errors.
    pub base_url_name: &'a str,
    /// The key, if any.
    pub api_key: Option<&'a str>,
    /// Where the key comes from (`OPENAI_API_KEY`), named in errors.
    pub api_key_name: &'a str,
    /// Model name sent to the server.
    pub model: &'a str,
    /// Context window in tokens.
    pub context_window: u64,
    /// Idle timeout.
    pub timeout: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// First-byte timeout.
    pub first_byte_timeout: Duration,
    /// Retry policy.
    pub retry: &'a RetryConfig,
}

impl Common<'_> {
    /// Adds the shared fields to a config's `Debug`, without the key or URL credentials.
    pub fn debug_fields(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("provider", &self.provider)
            .field("base_url", &redact_str(self.base_url))
            .field("base_url_name", &self.base_url_name)
            .field("api_key", &self.api_key.map(|_| "<redacted>"))
            .field("api_key_name", &self.api_key_name)
            .field("model", &self.model)
            .field("context_window", &self.context_window)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("retry", self.retry);
    }

    /// What `Model::info` reports.
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: self.provider.to_owned(),
            model: self.model.to_owned(),
            context_window: self.context_window,
        }
    }

    /// Checks the model name and parses the base URL.
    pub fn base_url(&self) -> Result<Url, ModelError> {
        if self.model.trim().is_empty() {
            return Err(ModelError::Config("the model name is empty".into()));
        }
        parse_base_url(self.base_url, self.base_url_name)
    }
}

/// The [`Common`] view of a provider config, whose shared fields have the same names in
/// every provider: `common_of!(config, provider_name)`.
macro_rules! common_of {
    ($c:expr, $provider:expr) => {
        $crate::http::Common {
            provider: $provider,
            base_url: &$c.base_url,
            base_url_name: &$c.base_url_name,
            api_key: $c.api_key.as_deref(),
            api_key_name: &$c.api_key_name,
            model: &$c.model,
            context_window: $c.context_window,
            timeout: $c.timeout,
            connect_timeout: $c.connect_timeout,
            first_byte_timeout: $c.first_byte_timeout,
            retry: &$c.retry,
        }
    };
}
pub(crate) use common_of;

/// Reads `var` through `env`; blank counts as unset.
pub(crate) fn env_value(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<String> {
    env(var).filter(|v| !v.trim().is_empty())
}

/// A duration as people write it: `250 ms`, `1.5 s`, `2 min 5 s`, `27 h 46 min`.
pub(crate) fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        format!("{} ms", d.as_millis())
    } else if secs < 60 {
        let tenths = d.as_millis().div_ceil(100);
        if tenths.is_multiple_of(10) {
            format!("{} s", tenths / 10)
        } else {
            format!("{}.{} s", tenths / 10, tenths % 10)
        }
    } else if secs < 3600 {
        match secs % 60 {
            0 => format!("{} min", secs / 60),
            s => format!("{} min {s} s", secs / 60),
        }
    } else {
        match (secs % 3600) / 60 {
            0 => format!("{} h", secs / 3600),
            m => format!("{} h {m} min", secs / 3600),
        }
    }
}

/// How a failed attempt is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// No connection: refused, unknown host, TLS handshake. A few short retries.
    Connect,
    /// No connection within the connect timeout. Not retried (it already waited).
    ConnectTimeout,
    /// A failure that a retry cannot fix: the host name does not resolve, or a server on
    /// this machine (a loopback address) refused the connection. Never retried.
    Final,
    /// Everything else: by [`ModelError::is_retryable`] with the configured backoff.
    Other,
}

/// A failed attempt.
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: ModelError,
    pub kind: FailureKind,
}

impl From<ModelError> for Failure {
    fn from(error: ModelError) -> Self {
        Self {
            error,
            kind: FailureKind::Other,
        }
    }
}

/// The wait before the next attempt, or `None` to give up. `planned` is the backoff's next
/// delay (`None` when the retries are used up); `connect_retries` counts the connection
/// failures already retried.
pub(crate) fn next_wait(
    failure: &Failure,
    planned: Option<Duration>,
    connect_retries: usize,
    retry: &RetryConfig,
) -> Option<Duration> {
    let planned = planned?;
    match failure.kind {
        FailureKind::ConnectTimeout | FailureKind::Final => None,
        FailureKind::Connect if connect_retries >= MAX_CONNECT_RETRIES => None,
        FailureKind::Connect => {
            // The same backoff (doubling, jitter) scaled down to start at CONNECT_RETRY_DELAY.
            let ratio = if retry.initial_delay > CONNECT_RETRY_DELAY {
                CONNECT_RETRY_DELAY.as_secs_f64() / retry.initial_delay.as_secs_f64()
            } else {
                1.0
            };
            Some(planned.mul_f64(ratio).min(CONNECT_RETRY_MAX_WAIT))
        }
        FailureKind::Other => match &failure.error {
            ModelError::RateLimited {
                retry_after: Some(wait),
                ..
            } => (*wait <= retry.max_retry_after).then_some(*wait),
            _ => Some(planned),
        },
    }
}

/// One line about a failed attempt, for the retry log.
fn brief(e: &ModelError) -> String {
    match e {
        ModelError::Transport { message, .. } => message.clone(),
        ModelError::RateLimited { message, .. } => format!("429 rate limited: {message}"),
        ModelError::Provider { status, body } => format!("HTTP {status}: {}", error_message(body)),
        other => other.to_string(),
    }
}

/// Whether an error chain holds an I/O error of `kind`.
fn has_io_kind(e: &(dyn std::error::Error + 'static), kind: std::io::ErrorKind) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == kind)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Whether an error chain holds a failed name resolution (hyper-util's resolver error,
/// or an I/O error that says so), for clients where `is_dns()` does not see it.
fn has_dns_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        let text = err.to_string().to_ascii_lowercase();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Whether the URL's host is this machine: `localhost` (and `*.localhost`), 127.0.0.0/8
/// or `::1`.
pub(crate) fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => {
            let d = host.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
    }
}

/// An error and its causes as one line (for [`ModelError::Config`], which has no source).
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if parts.last() != Some(&s) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ")
}

/// The HTTP client of one model: endpoint, headers, timeouts and retry policy.
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    url: Url,
    /// The base URL without credentials, named in errors.
    base_shown: String,
    /// Whether the endpoint's host is this machine (`localhost`, 127.0.0.0/8, `::1`): a
    /// refused connection there is not retried.
    loopback: bool,
    /// The endpoint URL without credentials, named in errors and logs.
    url_shown: String,
    base_url_name: String,
    /// Whether the base URL is a provider's default endpoint (its variable was likely never
    /// set): what to check is then the network, not the variable.
    default_endpoint: bool,
    /// Why no request can succeed (no key for an endpoint that needs one), said before any
    /// request is sent.
    missing_key: Option<String>,
    key_name: String,
    key_sent: bool,
    headers: HeaderMap,
    timeout: Duration,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    retry: RetryConfig,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url_shown)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

fn header(name: &str, value: &str, what: &str) -> Result<(HeaderName, HeaderValue), ModelError> {
    let bad = || {
        ModelError::Config(format!(
            "{what} cannot be sent in an HTTP header (a newline or another control character?)"
        ))
    };
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
    let value = HeaderValue::from_str(value).map_err(|_| bad())?;
    Ok((name, value))
}

/// Registers what this client must never let through (`hame_core::secrets`): the key, the
/// key header's value, the base URL's password (and its basic-auth form) and secret query
/// values as secrets; the base URL and the endpoint, without credentials, as endpoints
/// (named to the operator, never to API callers).
fn register_secrets(
    common: &Common<'_>,
    auth: &Option<(&str, String)>,
    base: &Url,
    endpoint: &Url,
) {
    if let Some(key) = common.api_key {
        secrets::add_secret(key);
    }
    if let Some((_, value)) = auth {
        secrets::add_authorization(value);
    }
    secrets::add_url(common.base_url.trim());
    for shown in [
        redact(base),
        redact(endpoint),
        redact_str(common.base_url.trim()),
    ] {
        secrets::add_endpoint(&shown);
    }
}

impl Client {
    /// Builds the client for `endpoint` (the base URL `base` plus the provider's path).
    /// `auth` is the key header (`authorization: Bearer …`, `x-api-key: …`), marked
    /// sensitive; `headers` are sent with every request.
    pub fn new(
        common: &Common<'_>,
        base: &Url,
        endpoint: Url,
        auth: Option<(&str, String)>,
        headers: &[(&str, &str)],
    ) -> Result<Self, ModelError> {
        register_secrets(common, &auth, base, &endpoint);
        let mut map = HeaderMap::new();
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (k, v) in headers {
            let (k, v) = header(k, v, &format!("header {k}"))?;
            map.insert(k, v);
        }
        if let Some((k, v)) = auth {
            let (k, mut v) = header(k, &v, common.api_key_name)?;
            v.set_sensitive(true);
            map.insert(k, v);
        }
        let connect_timeout = common.connect_timeout;
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(common.timeout)
            .build()
            .map_err(|e| {
                ModelError::Config(format!("cannot build the HTTP client: {}", chain_text(&e)))
            })?;
        Ok(Self {
            http,
            base_shown: redact(base),
            loopback: is_loopback(&endpoint),
            url_shown: redact(&endpoint),
            url: endpoint,
            base_url_name: common.base_url_name.to_owned(),
            default_endpoint: crate::is_default_endpoint(common.base_url),
            missing_key: (common.api_key.is_none() && crate::needs_key(common.base_url)).then(
                || {
                    format!(
                        "{} is not set: {} needs a key (export {}=...; for another compatible \
                         server, set {} instead)",
                        common.api_key_name,
                        redact(base),
                        common.api_key_name,
                        common.base_url_name
                    )
                },
            ),
            key_name: common.api_key_name.to_owned(),
            key_sent: common.api_key.is_some(),
            headers: map,
            timeout: common.timeout,
            connect_timeout,
            first_byte_timeout: common.first_byte_timeout,
            retry: common.retry.clone(),
        })
    }

    /// Sends `body` and streams the SSE answer through `parser`. `max_tokens` is the output
    /// limit of the request, named when a reply is cut off before any content.
    pub async fn stream<P: SseParser>(
        &self,
        body: &(impl serde::Serialize + Sync),
        parser: P,
        max_tokens: Option<u32>,
    ) -> Result<ModelStream, ModelError> {
        let resp = self.post(body).await?;
        Ok(drive_sse(
            resp,
            parser,
            OutputCheck::new(max_tokens),
            self.url_shown.clone(),
        ))
    }

    /// Sends `body` and parses the whole JSON answer with `parse`.
    pub async fn complete(
        &self,
        body: &(impl serde::Serialize + Sync),
        parse: fn(&Value) -> Result<Vec<ModelEvent>, ModelError>,
        max_tokens: Option<u32>,
    ) -> Result<ModelResponse, ModelError> {
        let resp = self.post(body).await?;
        let status = resp.status().as_u16();
        let content_type = content_type(resp.headers());
        let text = resp.text().await.map_err(|e| self.send_failure(e).error)?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|_| self.not_a_model(status, content_type.as_deref(), &text))?;
        let mut check = OutputCheck::new(max_tokens);
        let mut asm = ResponseAssembler::default();
        for ev in parse(&value)? {
            check.see(&ev)?;
            asm.push(&ev);
        }
        Ok(asm.finish())
    }

    /// POSTs `body`, retrying retryable failures; returns a 2xx response.
    async fn post(
        &self,
        body: &(impl serde::Serialize + Sync),
    ) -> Result<reqwest::Response, ModelError> {
        if let Some(why) = &self.missing_key {
            return Err(ModelError::Config(why.clone()));
        }
        let bytes = serde_json::to_vec(body)
            .map_err(|e| ModelError::InvalidResponse(format!("cannot encode request: {e}")))?;
        let r = &self.retry;
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(r.initial_delay)
            .with_max_delay(r.max_delay)
            .with_max_times(r.max_retries);
        if r.jitter {
            backoff = backoff.with_jitter();
        }
        let started = Instant::now();
        let mut retries = 0usize;
        let mut connect_retries = 0usize;
        // Every attempt's wait for the response to begin ends by this deadline: a server
        // that accepts and answers nothing fails after the first-byte timeout, retries
        // included.
        let deadline = started + self.first_byte_timeout;
        let attempt = || self.post_once(bytes.clone(), deadline);
        let result = attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|f: &Failure| f.error.is_retryable())
            .adjust(|f, planned| {
                let wait = next_wait(f, planned, connect_retries, r);
                if wait.is_some() && f.kind == FailureKind::Connect {
                    connect_retries += 1;
                }
                wait
            })
            .notify(|f, wait| {
                retries += 1;
                let what = brief(&f.error);
                let wait = human(wait);
                if f.kind == FailureKind::Other {
                    tracing::warn!(url = %self.url_shown, retry = retries, "model request failed ({what}); retrying in {wait}");
                } else {
                    tracing::debug!(url = %self.url_shown, retry = retries, "model request failed ({what}); retrying in {wait}");
                }
            })
            .await;
        result.map_err(|f| self.give_up(f.error, retries + 1, started.elapsed()))
    }

    /// The error returned after the last attempt: says how many were made and, for a
    /// `Retry-After` over the limit, that it was not waited out.
    fn give_up(&self, error: ModelError, attempts: usize, elapsed: Duration) -> ModelError {
        let tried = (attempts > 1).then(|| format!(" ({attempts} attempts in {})", human(elapsed)));
        match error {
            ModelError::Transport { message, source } => ModelError::Transport {
                message: format!("{message}{}", tried.unwrap_or_default()),
                source,
            },
            ModelError::RateLimited {
                retry_after,
                message,
            } => {
                let limit = self.retry.max_retry_after;
                let note = match retry_after {
                    Some(wait) if wait > limit => format!(
                        "; the server asks to wait {}, longer than the {} this client waits \
                         (RetryConfig::max_retry_after), so it gave up at once",
                        human(wait),
                        human(limit)
                    ),
                    _ => tried.unwrap_or_default(),
                };
                ModelError::RateLimited {
                    retry_after,
                    message: format!("{message}{note}"),
                }
            }
            other => other,
        }
    }

    async fn post_once(
        &self,
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<reqwest::Response, Failure> {
        let mut headers = self.headers.clone();
        trace_context(&mut headers);
        let req = self.http.post(self.url.clone()).headers(headers).body(body);
        // The wait for the response to begin (connecting included): the idle timeout, cut
        // at the first-byte deadline.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wait = remaining.min(self.timeout);
        let resp = match tokio::time::timeout(wait, req.send()).await {
            Err(_) if wait == remaining => {
                return Err(Failure {
                    error: ModelError::Transport {
                        message: format!(
                            "no response from {} within {}; check {}, or for a slow model \
                             raise the first-byte timeout (model_timeout in hame.toml, \
                             --model-timeout)",
                            self.url_shown,
                            human(self.first_byte_timeout),
                            self.check_endpoint()
                        ),
                        source: None,
                    },
                    kind: FailureKind::Final,
                });
            }
            Err(_) => {
                return Err(ModelError::Transport {
                    message: format!(
                        "no response from {} within {} (the idle timeout)",
                        self.url_shown,
                        human(self.timeout)
                    ),
                    source: None,
                }
                .into());
            }
            Ok(Err(e)) => return Err(self.send_failure(e)),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        let content_type = content_type(resp.headers());
        if status.is_success() {
            if content_type.as_deref().is_some_and(is_html) {
                let text = resp.text().await.unwrap_or_default();
                return Err(Failure {
                    error: self.not_a_model(status.as_u16(), content_type.as_deref(), &text),
                    kind: FailureKind::Final,
                });
            }
            return Ok(resp);
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after");
        let retry_after_ms = header("retry-after-ms");
        let text = resp.text().await.map_err(|e| self.send_failure(e))?;
        // A web page or any other answer that is not a model API's JSON: one line, no
        // retry. Whatever their body, a 429 is a rate limit, a 401/403 a refused key, and a
        // text that says the prompt is too long an overflow.
        let html =
            content_type.as_deref().is_some_and(is_html) || text.trim_start().starts_with('<');
        let plain = serde_json::from_str::<Value>(&text).is_err()
            && !matches!(status.as_u16(), 401 | 403 | 429)
            && !crate::classify::is_context_overflow_body(&text);
        if html || plain {
            return Err(Failure {
                error: self.not_a_model(status.as_u16(), content_type.as_deref(), &text),
                kind: FailureKind::Final,
            });
        }
        Err(classify_http(HttpFailure {
            status: status.as_u16(),
            body: &text,
            retry_after: retry_after.as_deref(),
            retry_after_ms: retry_after_ms.as_deref(),
            key_name: &self.key_name,
            key_sent: self.key_sent,
            url: &self.base_shown,
        })
        .into())
    }

    /// Maps a reqwest failure while sending or reading. The message says what failed and
    /// what to check; the cause is the `source` (without the URL, which may hold
    /// credentials), never repeated in the message.
    fn send_failure(&self, e: reqwest::Error) -> Failure {
        let e = e.without_url();
        let (base, var, url) = (&self.base_shown, &self.base_url_name, &self.url_shown);
        let network = self.default_endpoint.then(|| self.check_endpoint());
        if e.is_builder() {
            return ModelError::Config(format!(
                "cannot build the request to {url}: {}",
                chain_text(&e)
            ))
            .into();
        }
        let (kind, message) = if e.is_connect() && e.is_timeout() {
            (
                FailureKind::ConnectTimeout,
                match &network {
                    Some(n) => format!(
                        "no connection to {base} within {}; check {n}",
                        human(self.connect_timeout)
                    ),
                    None => format!(
                        "no connection to {base} within {}; check that the host is reachable and {var}",
                        human(self.connect_timeout)
                    ),
                },
            )
        } else if e.is_connect() {
            if e.is_dns() || has_dns_failure(&e) {
                (
                    FailureKind::Final,
                    match &network {
                        Some(n) => format!("cannot resolve the host of {base}; check {n}"),
                        None => format!(
                            "cannot resolve the host of {base}; check the host name in {var}"
                        ),
                    },
                )
            } else if has_io_kind(&e, std::io::ErrorKind::ConnectionRefused) {
                let kind = if self.loopback {
                    FailureKind::Final
                } else {
                    FailureKind::Connect
                };
                (
                    kind,
                    match &network {
                        Some(n) => {
                            format!("cannot connect to {base} (connection refused); check {n}")
                        }
                        None => format!(
                            "cannot connect to {base} (connection refused); check that the \
                             server is running and that {var} has the right host and port"
                        ),
                    },
                )
            } else {
                (
                    FailureKind::Connect,
                    match &network {
                        Some(n) => format!("cannot connect to {base}; check {n}"),
                        None => format!("cannot connect to {base}; check {var}"),
                    },
                )
            }
        } else if e.is_timeout() {
            (
                FailureKind::Other,
                format!(
                    "no data from {url} for {} (the idle timeout)",
                    human(self.timeout)
                ),
            )
        } else if e.is_body() || e.is_decode() {
            (
                FailureKind::Other,
                format!("reading the response of {url} failed"),
            )
        } else {
            (FailureKind::Other, format!("the request to {url} failed"))
        };
        Failure {
            error: ModelError::Transport {
                message,
                source: Some(Box::new(e)),
            },
            kind,
        }
    }
}

/// The `content-type` of a response, without parameters (`text/html`), if any.
/// Adds the current span's W3C trace context (`traceparent`, `tracestate`) through the
/// global propagator: the provider's spans join the caller's trace. Without an
/// OpenTelemetry subscriber and propagator (the default) it adds nothing.
fn trace_context(headers: &mut HeaderMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
    });
}

fn content_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?.to_str().ok()?;
    let bare = value.split(';').next().unwrap_or(value).trim();
    Some(bare.to_ascii_lowercase())
}

/// Whether a content type is a web page.
fn is_html(content_type: &str) -> bool {
    content_type == "text/html" || content_type == "application/xhtml+xml"
}

/// The `<title>` of an HTML page, on one line and clipped, if it has one.
fn html_title(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let open_end = start + lower[start..].find('>')? + 1;
    let end = open_end + lower[open_end..].find("</title")?;
    let title: String = text
        .get(open_end..end)?
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    (!title.is_empty()).then(|| title.chars().take(80).collect())
}

impl Client {
    /// The one-line error for an answer that is not a model API's: a web page, a proxy's
    /// text, an empty body.
    fn not_a_model(&self, status: u16, content_type: Option<&str>, text: &str) -> ModelError {
        let kind = content_type.unwrap_or("no content type");
        let what = match html_title(&secrets::redact(text)) {
            Some(title) => format!("{kind}, {} bytes, title {title:?}", text.len()),
            None => format!("{kind}, {} bytes", text.len()),
        };
        ModelError::InvalidResponse(format!(
            "{} answered HTTP {status} ({what}), not a model API's JSON; check {}",
            self.url_shown,
            self.check_endpoint()
        ))
    }

    /// What to check when the endpoint does not answer as a model: the base URL's
    /// variable, or for a provider's default endpoint the network.
    fn check_endpoint(&self) -> String {
        if self.default_endpoint {
            format!(
                "the network (this is the provider's default endpoint; {} sets another)",
                self.base_url_name
            )
        } else {
            self.base_url_name.clone()
        }
    }
}

/// Turns a reply cut off at the output limit before any text or tool call into an error,
/// so that it does not pass for a successful empty answer.
#[derive(Debug, Default)]
pub(crate) struct OutputCheck {
    max_tokens: Option<u32>,
    wrote: bool,
    reasoned: bool,
    output_tokens: Option<u64>,
}

impl OutputCheck {
    pub fn new(max_tokens: Option<u32>) -> Self {
        Self {
            max_tokens,
            ..Self::default()
        }
    }

    /// Watches one event; fails on `Stop(MaxTokens)` when nothing was written.
    pub fn see(&mut self, event: &ModelEvent) -> Result<(), ModelError> {
        match event {
            ModelEvent::TextDelta(t) if !t.trim().is_empty() => self.wrote = true,
            ModelEvent::ToolCallStart { .. } | ModelEvent::ToolCallDelta { .. } => {
                self.wrote = true;
            }
            ModelEvent::ReasoningDelta(t) if !t.is_empty() => self.reasoned = true,
            ModelEvent::Usage(u) => self.output_tokens = Some(u.output_tokens),
            ModelEvent::Stop(StopReason::MaxTokens) if !self.wrote => {
                return Err(self.error());
            }
            _ => {}
        }
        Ok(())
    }

    fn error(&self) -> ModelError {
        let limit = self.max_tokens.map_or_else(
            || "the server's default".to_owned(),
            |n| format!("max_tokens {n}"),
        );
        let used = self
            .output_tokens
            .map(|n| format!(", {n} output tokens used"))
            .unwrap_or_default();
        let why = if self.reasoned {
            " (its reasoning used them all)"
        } else {
            ""
        };
        ModelError::InvalidResponse(format!(
            "the model hit the output token limit ({limit}{used}) before writing any text or \
             tool call{why}; raise max_tokens"
        ))
    }
}

/// Turns SSE events into model events, one provider at a time.
pub(crate) trait SseParser: Send + 'static {
    /// Handles one SSE event (`event` is empty when the server names none).
    fn on_event(&mut self, event: &str, data: &str) -> Result<Vec<ModelEvent>, ModelError>;
    /// Whether the provider's end marker was seen.
    fn is_done(&self) -> bool;
    /// Called once at the end (marker seen or connection closed); flushes the stop reason
    /// or reports a truncated stream.
    fn finish(&mut self) -> Result<Vec<ModelEvent>, ModelError>;
}

struct Drive<P> {
    sse: BoxStream<'static, Result<eventsource_stream::Event, String>>,
    parser: P,
    check: OutputCheck,
    pending: VecDeque<Result<ModelEvent, ModelError>>,
    finished: bool,
    url: String,
}

/// Streams model events out of an SSE response.
fn drive_sse<P: SseParser>(
    resp: reqwest::Response,
    parser: P,
    check: OutputCheck,
    url: String,
) -> ModelStream {
    let sse = resp
        .bytes_stream()
        .map(|r| r.map_err(reqwest::Error::without_url))
        .eventsource()
        .map(|r| r.map_err(|e| e.to_string()))
        .boxed();
    let state = Drive {
        sse,
        parser,
        check,
        pending: VecDeque::new(),
        finished: false,
        url,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.pending.pop_front() {
                return Some((item, st));
            }
            if st.finished {
                return None;
            }
            match st.sse.next().await {
                Some(Ok(ev)) => {
                    let events = st.parser.on_event(&ev.event, &ev.data);
                    st.push(events);
                    if !st.finished && st.parser.is_done() {
                        st.finish();
                    }
                }
                Some(Err(e)) => {
                    st.pending.push_back(Err(ModelError::Transport {
                        message: format!("stream from {} broke: {e}", st.url),
                        source: None,
                    }));
                    st.finished = true;
                }
                None => st.finish(),
            }
        }
    })
    .boxed()
}

impl<P: SseParser> Drive<P> {
    /// Queues parsed events (through the output check); an error ends the stream.
    fn push(&mut self, events: Result<Vec<ModelEvent>, ModelError>) {
        let checked = events.and_then(|events| {
            for ev in events {
                self.check.see(&ev)?;
                self.pending.push_back(Ok(ev));
            }
            Ok(())
        });
        if let Err(e) = checked {
            self.pending.push_back(Err(e));
            self.finished = true;
        }
    }

    fn finish(&mut self) {
        let events = self.parser.finish();
        self.push(events);
        self.finished = true;
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
