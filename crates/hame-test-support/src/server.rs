//! The HTTP server.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::script::{Reply, Script, ScriptStep, ScriptStop, ScriptUsage};
use crate::wire::{self, Msg, Wire};

/// One request the server received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// Path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Headers, names lowercased (a repeated header keeps its last value).
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON (`null` when it was not JSON).
    pub body: Value,
}

impl RecordedRequest {
    /// A header value by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// Whether the request asked for a streamed answer.
    pub fn is_stream(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// Whether this is an Anthropic Messages request (path ends in `/messages`).
    pub fn is_anthropic(&self) -> bool {
        self.path.ends_with("/messages")
    }

    /// The system prompt (OpenAI: the `system` messages; Anthropic: `system`), joined.
    pub fn system_text(&self) -> String {
        fn text(v: &Value) -> String {
            match v {
                Value::String(s) => s.clone(),
                Value::Array(blocks) => blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            }
        }
        if let Some(sys) = self.body.get("system") {
            return text(sys);
        }
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|msgs| {
                msgs.iter()
                    .filter(|m| m.get("role").and_then(Value::as_str) == Some("system"))
                    .filter_map(|m| m.get("content").map(text))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    }

    /// The text of the last user turn (OpenAI or Anthropic shape), if any.
    pub fn last_user_text(&self) -> Option<String> {
        let msgs = self.body.get("messages")?.as_array()?;
        let last = msgs
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
        match last.get("content")? {
            Value::String(s) => Some(s.clone()),
            Value::Array(blocks) => Some(
                blocks
                    .iter()
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            _ => None,
        }
    }
}

/// Produces the answer for a request when the script queue is empty.
pub trait Responder: Send + Sync + 'static {
    /// The step to answer `request` with.
    fn respond(&self, request: &RecordedRequest) -> ScriptStep;
}

impl<F> Responder for F
where
    F: Fn(&RecordedRequest) -> ScriptStep + Send + Sync + 'static,
{
    fn respond(&self, request: &RecordedRequest) -> ScriptStep {
        self(request)
    }
}

#[derive(Default)]
struct Inner {
    queue: VecDeque<ScriptStep>,
    requests: Vec<RecordedRequest>,
    responder: Option<Arc<dyn Responder>>,
    /// Requests received (recorded or not).
    seen: usize,
    /// Whether requests are kept for [`ScriptedServer::requests`] (off for benchmarks).
    no_recording: bool,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    // A panic in a responder must not make every later request fail.
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Failure to start the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Binding the listener failed.
    #[error("cannot bind 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
}

/// A scripted model server on 127.0.0.1; dropping the handle shuts it down.
pub struct ScriptedServer {
    addr: SocketAddr,
    shared: Shared,
    shutdown: Option<oneshot::Sender<()>>,
}

impl fmt::Debug for ScriptedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = lock(&self.shared);
        f.debug_struct("ScriptedServer")
            .field("addr", &self.addr)
            .field("queued", &inner.queue.len())
            .field("requests", &inner.requests.len())
            .field("responder", &inner.responder.is_some())
            .finish()
    }
}

impl ScriptedServer {
    /// Starts an empty server on a random port.
    pub async fn start() -> Result<Self, Error> {
        Self::start_on(Script::default(), 0).await
    }

    /// Starts a server with a script (steps and fallback).
    pub async fn with_script(script: Script) -> Result<Self, Error> {
        Self::start_on(script, 0).await
    }

    /// Starts a server with a script on `port` (0 = random).
    pub async fn start_on(script: Script, port: u16) -> Result<Self, Error> {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(Error::Bind)?;
        let addr = listener.local_addr().map_err(Error::Bind)?;
        let shared: Shared = Arc::new(Mutex::new(Inner {
            queue: script.steps.into(),
            requests: Vec::new(),
            seen: 0,
            no_recording: false,
            responder: script.fallback.map(|step| {
                Arc::new(move |_: &RecordedRequest| step.clone()) as Arc<dyn Responder>
            }),
        }));
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "scripted server stopped with an error");
            }
        });
        Ok(Self {
            addr,
            shared,
            shutdown: Some(tx),
        })
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` — the Anthropic base URL (it appends `/v1/messages`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1` — the OpenAI base URL (it appends `/chat/completions`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Appends a step to the script.
    pub fn push(&self, step: ScriptStep) {
        lock(&self.shared).queue.push_back(step);
    }

    /// Appends several steps.
    pub fn push_all(&self, steps: impl IntoIterator<Item = ScriptStep>) {
        lock(&self.shared).queue.extend(steps);
    }

    /// Sets the responder used once the queued steps are used up.
    pub fn set_responder(&self, responder: impl Responder) {
        lock(&self.shared).responder = Some(Arc::new(responder));
    }

    /// Stops (or restarts) keeping requests for [`requests`](Self::requests): a benchmark
    /// sending many requests does not grow the server's memory.
    pub fn set_recording(&self, on: bool) {
        lock(&self.shared).no_recording = !on;
    }

    /// All requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared).requests.clone()
    }

    /// How many requests were received.
    pub fn request_count(&self) -> usize {
        lock(&self.shared).seen
    }

    /// How many queued steps are still unanswered.
    pub fn remaining(&self) -> usize {
        lock(&self.shared).queue.len()
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn estimate_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX).max(1)
}

async fn handle(
    State(shared): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let recorded = RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let wire = if recorded.is_anthropic() {
        Wire::Anthropic
    } else {
        Wire::OpenAi
    };
    let (step, seq) = {
        let mut inner = lock(&shared);
        if !inner.no_recording {
            inner.requests.push(recorded.clone());
        }
        inner.seen += 1;
        let seq = inner.seen;
        // The first queued step whose `when_system` (if any) the system prompt contains:
        // concurrent agents (a parent and its children) get their own scripts.
        let system = recorded.system_text();
        let step = inner
            .queue
            .iter()
            .position(|s| {
                s.when_system
                    .as_ref()
                    .is_none_or(|w| system.contains(w.as_str()))
            })
            .and_then(|i| inner.queue.remove(i));
        let responder = inner.responder.clone();
        (step.map(Ok).unwrap_or(Err(responder)), seq)
    };
    let step = match step {
        Ok(step) => step,
        Err(Some(responder)) => responder.respond(&recorded),
        Err(None) => ScriptStep::error(
            400,
            format!("hame-test-support: script exhausted at request {seq}"),
        ),
    };
    if step.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(step.delay_ms)).await;
    }
    render(wire, &recorded, step, seq, body.len())
}

fn render(
    wire: Wire,
    req: &RecordedRequest,
    step: ScriptStep,
    seq: usize,
    request_len: usize,
) -> Response {
    match step.reply {
        Reply::Error {
            status,
            message,
            body,
            headers,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let message = echo_credentials(&message, req);
            let (content_type, text) = match body {
                Some(Value::String(raw)) => ("text/plain", echo_credentials(&raw, req)),
                Some(v) => ("application/json", echo_credentials(&v.to_string(), req)),
                None => (
                    "application/json",
                    wire::error_body(wire, status.as_u16(), &message).to_string(),
                ),
            };
            let mut resp = (status, text).into_response();
            resp.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            );
            for (k, v) in headers {
                if let (Ok(k), Ok(v)) = (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(&v),
                ) {
                    resp.headers_mut().insert(k, v);
                }
            }
            resp
        }
        Reply::Message {
            reasoning,
            text,
            tool_calls,
            stop,
        } => {
            let out_chars = text.as_deref().map_or(0, str::len)
                + reasoning.as_ref().map_or(0, |r| r.text.len())
                + tool_calls
                    .iter()
                    .map(|c| c.arguments.len() + c.name.len())
                    .sum::<usize>();
            let usage = step.usage.unwrap_or(ScriptUsage {
                input_tokens: estimate_tokens(request_len),
                output_tokens: estimate_tokens(out_chars),
                cached_input_tokens: 0,
            });
            let model = req
                .body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or("scripted");
            let msg = Msg {
                reasoning: reasoning.as_ref(),
                text: text.as_deref(),
                calls: &tool_calls,
                stop: stop.unwrap_or(if tool_calls.is_empty() {
                    ScriptStop::EndTurn
                } else {
                    ScriptStop::ToolUse
                }),
                usage,
                model,
                seq,
            };
            let chunk_delay = Duration::from_millis(step.chunk_delay_ms);
            match (wire, req.is_stream()) {
                (Wire::OpenAi, false) => axum::Json(wire::openai_body(&msg)).into_response(),
                (Wire::Anthropic, false) => axum::Json(wire::anthropic_body(&msg)).into_response(),
                (Wire::OpenAi, true) => {
                    let include_usage = req
                        .body
                        .pointer("/stream_options/include_usage")
                        .and_then(Value::as_bool)
                        == Some(true);
                    let mut frames: Vec<String> = wire::openai_chunks(&msg, include_usage)
                        .into_iter()
                        .map(|c| format!("data: {c}\n\n"))
                        .collect();
                    frames.push("data: [DONE]\n\n".to_owned());
                    if let Some(fault) = &step.fault {
                        frames.truncate(fault.after_chunks);
                        if let Some(err) = &fault.error {
                            let err = echo_credentials(&err.to_string(), req);
                            frames.push(format!("data: {err}\n\n"));
                        }
                    }
                    sse(frames, chunk_delay)
                }
                (Wire::Anthropic, true) => {
                    let mut frames: Vec<String> = wire::anthropic_events(&msg)
                        .into_iter()
                        .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
                        .collect();
                    if let Some(fault) = &step.fault {
                        frames.truncate(fault.after_chunks);
                        if let Some(err) = &fault.error {
                            let err = echo_credentials(&err.to_string(), req);
                            frames.push(format!("event: error\ndata: {err}\n\n"));
                        }
                    }
                    sse(frames, chunk_delay)
                }
            }
        }
    }
}

/// `text` with `{api_key}` replaced by the key `req` carried (the bearer token, else
/// `x-api-key`) and `{authorization}` by its whole `Authorization` header.
fn echo_credentials(text: &str, req: &RecordedRequest) -> String {
    if !text.contains('{') {
        return text.to_owned();
    }
    let authorization = req.header("authorization").unwrap_or_default();
    let key = authorization
        .strip_prefix("Bearer ")
        .or_else(|| req.header("x-api-key"))
        .unwrap_or_default();
    text.replace("{api_key}", key)
        .replace("{authorization}", authorization)
}

fn sse(frames: Vec<String>, delay: Duration) -> Response {
    let stream = futures::stream::iter(frames).then(move |frame| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok::<_, Infallible>(Bytes::from(frame))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    resp
}
