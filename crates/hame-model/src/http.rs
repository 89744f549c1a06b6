//! The shared HTTP transport: one POST with retries, and an SSE driver.

use std::collections::VecDeque;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use futures::stream::BoxStream;
use hame_core::{ModelError, ModelEvent, ModelStream};
use serde_json::Value;

use crate::classify::{HttpFailure, classify_http};
use crate::config::{DEFAULT_CONNECT_TIMEOUT, RetryConfig};

/// Who we talk to, for error messages and auth.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// Full URL of the POST.
    pub url: String,
    /// Base URL as configured (named in auth errors).
    pub base_url: String,
    /// Env var (or other source) of the key.
    pub key_name: String,
    /// Whether a key is sent.
    pub key_sent: bool,
    /// Headers of every request.
    pub headers: Vec<(String, String)>,
}

/// A reqwest client plus retry policy.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    timeout: Duration,
    retry: RetryConfig,
}

pub(crate) fn transport(message: String, source: reqwest::Error) -> ModelError {
    ModelError::Transport {
        message,
        source: Some(Box::new(source)),
    }
}

impl Http {
    pub fn new(timeout: Duration, retry: RetryConfig) -> Result<Self, ModelError> {
        let client = reqwest::Client::builder()
            .connect_timeout(DEFAULT_CONNECT_TIMEOUT.min(timeout))
            .read_timeout(timeout)
            .build()
            .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            client,
            timeout,
            retry,
        })
    }

    /// POSTs `body`, retrying retryable failures; returns a 2xx response.
    pub async fn post(&self, ep: &Endpoint, body: &Value) -> Result<reqwest::Response, ModelError> {
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
        let max_retry_after = r.max_retry_after;
        let attempt = || self.post_once(ep, bytes.clone());
        attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(ModelError::is_retryable)
            .adjust(move |err, planned| match (err, planned) {
                (_, None) => None,
                (
                    ModelError::RateLimited {
                        retry_after: Some(wait),
                        ..
                    },
                    Some(_),
                ) => (*wait <= max_retry_after).then_some(*wait),
                (_, planned) => planned,
            })
            .notify(|err, wait| {
                tracing::warn!(url = %ep.url, error = %err, ?wait, "model request failed; retrying");
            })
            .await
    }

    async fn post_once(
        &self,
        ep: &Endpoint,
        body: Vec<u8>,
    ) -> Result<reqwest::Response, ModelError> {
        let mut req = self
            .client
            .post(&ep.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (k, v) in &ep.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = match tokio::time::timeout(self.timeout, req.send()).await {
            Err(_) => {
                return Err(ModelError::Transport {
                    message: format!(
                        "no response from {} within {:?} (raise the timeout for slow models)",
                        ep.url, self.timeout
                    ),
                    source: None,
                });
            }
            Ok(Err(e)) => return Err(send_error(&ep.url, e)),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        if status.is_success() {
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
        let text = resp.text().await.map_err(|e| send_error(&ep.url, e))?;
        Err(classify_http(HttpFailure {
            status: status.as_u16(),
            body: &text,
            retry_after: retry_after.as_deref(),
            retry_after_ms: retry_after_ms.as_deref(),
            key_name: &ep.key_name,
            key_sent: ep.key_sent,
            url: &ep.base_url,
        }))
    }
}

/// Maps a reqwest failure while sending or reading to [`ModelError::Transport`].
pub(crate) fn send_error(url: &str, e: reqwest::Error) -> ModelError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "failed while reading the response"
    } else {
        "failed"
    };
    transport(format!("request to {url} {what}: {e}"), e)
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
    pending: VecDeque<Result<ModelEvent, ModelError>>,
    finished: bool,
    url: String,
}

/// Streams model events out of an SSE response.
pub(crate) fn drive_sse<P: SseParser>(
    resp: reqwest::Response,
    parser: P,
    url: String,
) -> ModelStream {
    let sse = resp
        .bytes_stream()
        .eventsource()
        .map(|r| r.map_err(|e| e.to_string()))
        .boxed();
    let state = Drive {
        sse,
        parser,
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
                Some(Ok(ev)) => match st.parser.on_event(&ev.event, &ev.data) {
                    Ok(events) => {
                        st.pending.extend(events.into_iter().map(Ok));
                        if st.parser.is_done() {
                            st.finish();
                        }
                    }
                    Err(e) => {
                        st.pending.push_back(Err(e));
                        st.finished = true;
                    }
                },
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
    fn finish(&mut self) {
        match self.parser.finish() {
            Ok(events) => self.pending.extend(events.into_iter().map(Ok)),
            Err(e) => self.pending.push_back(Err(e)),
        }
        self.finished = true;
    }
}

/// Reads a whole JSON response body.
pub(crate) async fn read_json(resp: reqwest::Response, url: &str) -> Result<Value, ModelError> {
    let text = resp.text().await.map_err(|e| send_error(url, e))?;
    serde_json::from_str(&text).map_err(|e| {
        ModelError::InvalidResponse(format!(
            "{url} answered with non-JSON ({e}): {}",
            crate::classify::error_message(&text)
        ))
    })
}
