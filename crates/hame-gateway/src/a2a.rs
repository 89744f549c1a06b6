//! hame as an A2A server (the Agent2Agent protocol 0.3: JSON-RPC 2.0 over HTTP; ADR 0034,
//! `docs/a2a.md`), with [`GatewayOptions::a2a`](crate::GatewayOptions::a2a):
//!
//! - `GET /.well-known/agent-card.json`: the default agent's card (its skills are the
//!   caller's workspace skills), its JSON-RPC endpoint `POST /a2a`;
//! - `GET /a2a/{agent}/.well-known/agent-card.json` and `POST /a2a/{agent}`: every served
//!   agent's (the default one's too).
//!
//! Methods: `message/send`, `message/stream` (SSE of `Task`, `TaskStatusUpdateEvent`,
//! `TaskArtifactUpdateEvent`), `tasks/get`, `tasks/cancel`, `tasks/resubscribe`. A task is a
//! run of the run queue (the A2A task id is the run id, the context id the session), so it
//! is executed by a [`Worker`](crate::Worker) in this or another process and survives a
//! restart. The caller is the bearer token's user as on every other route; another user's
//! task is `TaskNotFound`. Every failure is a JSON-RPC error object, never a 5xx.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use hame::HarnessAgent;
use hame::state::runs::{CancelOutcome, NewRun, Run, RunInput, RunQueue, RunStatus};
use serde_json::{Value, json};

use crate::error::{ApiError, for_callers};
use crate::routes::{AppState, Caller};
use crate::runs::RUN_POLL;

/// The A2A protocol version served.
pub const PROTOCOL_VERSION: &str = "0.3.0";
/// The path of the default agent's card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The default agent's JSON-RPC endpoint (every agent's is `/a2a/{agent}`).
pub const RPC_PATH: &str = "/a2a";
/// How long `tasks/cancel` waits for a running task's worker to stop it before answering
/// with the task as it is (3 s; the worker reads the cancel at its next heartbeat, 1 s).
const CANCEL_WAIT: Duration = Duration::from_secs(3);

/// JSON-RPC and A2A error codes.
mod code {
    pub(super) const PARSE: i64 = -32700;
    pub(super) const INVALID_REQUEST: i64 = -32600;
    pub(super) const METHOD_NOT_FOUND: i64 = -32601;
    pub(super) const INVALID_PARAMS: i64 = -32602;
    pub(super) const INTERNAL: i64 = -32603;
    pub(super) const TASK_NOT_FOUND: i64 = -32001;
    pub(super) const TASK_NOT_CANCELABLE: i64 = -32002;
    pub(super) const PUSH_NOT_SUPPORTED: i64 = -32003;
    pub(super) const UNSUPPORTED: i64 = -32004;
    pub(super) const CONTENT_TYPE: i64 = -32005;
    pub(super) const NO_EXTENDED_CARD: i64 = -32007;
}

/// A JSON-RPC error.
#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    fn not_found(id: &str) -> Self {
        let shown: String = id.chars().take(80).collect();
        Self::new(code::TASK_NOT_FOUND, format!("task not found: {shown}"))
    }

    fn store(e: &hame::state::Error) -> Self {
        tracing::warn!(error = %e, "a2a: run queue failed");
        Self::new(
            code::INTERNAL,
            "the run queue cannot be reached; retry later",
        )
    }
}

/// A JSON-RPC error response body.
fn error_body(id: &Value, e: &RpcError) -> Value {
    let message = hame::secrets::redact_for_callers(&e.message).into_owned();
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": e.code, "message": message}})
}

fn respond(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Whether `path` is a JSON-RPC endpoint of this module: its error answers (a body over
/// the limit, a timeout) are JSON-RPC error objects ([`crate::error::json_errors`]).
pub(crate) fn is_rpc_path(path: &str) -> bool {
    path == RPC_PATH
        || path
            .strip_prefix("/a2a/")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// The JSON-RPC error answer of an HTTP-level failure on an endpoint (`status` kept).
pub(crate) fn http_error(status: StatusCode, message: &str) -> Response {
    let code = if status == StatusCode::PAYLOAD_TOO_LARGE || status.is_client_error() {
        code::INVALID_REQUEST
    } else {
        code::INTERNAL
    };
    respond(
        status,
        error_body(&Value::Null, &RpcError::new(code, message)),
    )
}

pub(crate) fn router(shared: AppState) -> Router {
    Router::new()
        .route(CARD_PATH, get(card_default))
        .route(RPC_PATH, post(rpc_default))
        .route("/a2a/{agent}/.well-known/agent-card.json", get(card_named))
        .route("/a2a/{agent}", post(rpc_named))
        .with_state(shared)
}

/// The served agent `name`, if the caller's token may use it (an agent-scoped token sees
/// no other agent, as on the session routes).
fn agent_named<'a>(shared: &'a AppState, name: &str, caller: &Caller) -> Option<&'a HarnessAgent> {
    shared
        .agents()
        .find(|a| a.name() == name && caller.may_use(name))
}

/// Where the caller reached us: `http(s)://<Host>` (`X-Forwarded-Proto: https` gives
/// https).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or("localhost");
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    format!("{}://{host}", if https { "https" } else { "http" })
}

async fn card_default(
    State(shared): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if !caller.may_use(shared.agent.name()) {
        return Err(ApiError::not_found("no such agent"));
    }
    let agent = shared.agent.clone();
    Ok(card(&shared, &agent, caller, &headers, RPC_PATH).await)
}

async fn card_named(
    State(shared): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let agent = agent_named(&shared, &name, &caller)
        .cloned()
        .ok_or_else(|| ApiError::not_found("no such agent"))?;
    let path = format!("/a2a/{}", agent.name());
    Ok(card(&shared, &agent, caller, &headers, &path).await)
}

/// The agent card of `agent` as `caller` sees it (the skills of the caller's workspace).
async fn card(
    shared: &AppState,
    agent: &HarnessAgent,
    Caller { user, .. }: Caller,
    headers: &HeaderMap,
    rpc: &str,
) -> Response {
    let mut skills = Vec::new();
    if let Some(catalog) = agent.skills() {
        let ctx = crate::routes::context(shared, user, "a2a-card");
        match agent.workspace_for(&ctx) {
            Ok(ws) => {
                for s in catalog.catalog(&ws, None).await.visible() {
                    skills.push(json!({
                        "id": s.name,
                        "name": s.name,
                        "description": s.description,
                        "tags": ["skill", s.layer.as_str()],
                    }));
                }
            }
            Err(e) => tracing::warn!(error = %e, "a2a card: the caller's workspace cannot be made"),
        }
    }
    let mut card = json!({
        "protocolVersion": PROTOCOL_VERSION,
        "name": agent.name(),
        "description": format!(
            "The hame agent `{}`: it works on its own workspace with its own tools and answers with its final reply.",
            agent.name()
        ),
        "url": format!("{}{rpc}", base_url(headers)),
        "preferredTransport": "JSONRPC",
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false, "stateTransitionHistory": false},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    });
    if shared.options.auth.is_some()
        && let Some(o) = card.as_object_mut()
    {
        o.insert(
            "securitySchemes".into(),
            json!({"bearer": {"type": "http", "scheme": "bearer"}}),
        );
        o.insert("security".into(), json!([{"bearer": []}]));
    }
    respond(StatusCode::OK, for_callers(card))
}

async fn rpc_default(
    State(shared): State<AppState>,
    caller: Result<Caller, ApiError>,
    body: axum::body::Body,
) -> Response {
    let agent = shared.agent.clone();
    rpc(shared, agent, caller, body).await
}

async fn rpc_named(
    State(shared): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
    body: axum::body::Body,
) -> Response {
    // `rpc` checks that the caller may use it.
    let Some(agent) = shared.agents().find(|a| a.name() == name).cloned() else {
        return respond(
            StatusCode::NOT_FOUND,
            error_body(
                &Value::Null,
                &RpcError::new(code::INVALID_REQUEST, "no such agent"),
            ),
        );
    };
    rpc(shared, agent, caller, body).await
}

/// One JSON-RPC request to `agent`.
async fn rpc(
    shared: AppState,
    agent: HarnessAgent,
    caller: Result<Caller, ApiError>,
    body: axum::body::Body,
) -> Response {
    let user = match caller {
        Ok(caller) if caller.may_use(agent.name()) => caller.user,
        Ok(_) => {
            return respond(
                StatusCode::NOT_FOUND,
                error_body(
                    &Value::Null,
                    &RpcError::new(code::INVALID_REQUEST, "no such agent"),
                ),
            );
        }
        Err(e) => {
            return respond(
                e.status,
                error_body(
                    &Value::Null,
                    &RpcError::new(code::INVALID_REQUEST, e.message),
                ),
            );
        }
    };
    let bytes = match axum::body::to_bytes(body, shared.options.body_limit).await {
        Ok(b) => b,
        Err(_) => {
            return http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body is over the {}-byte limit",
                    shared.options.body_limit
                ),
            );
        }
    };
    let (id, method, params) = match parse_request(&bytes) {
        Ok(r) => r,
        Err((id, e)) => return respond(StatusCode::OK, error_body(&id, &e)),
    };
    let cx = Cx {
        shared,
        agent,
        user,
    };
    let result = match method.as_str() {
        "message/send" => cx.send(&params).await,
        "message/stream" => match cx.stream(&params).await {
            Ok(events) => return cx.sse(id, events),
            Err(e) => Err(e),
        },
        "tasks/resubscribe" => match cx.resubscribe(&params).await {
            Ok(events) => return cx.sse(id, events),
            Err(e) => Err(e),
        },
        "tasks/get" => cx.get(&params).await,
        "tasks/cancel" => cx.cancel(&params).await,
        "tasks/pushNotificationConfig/set"
        | "tasks/pushNotificationConfig/get"
        | "tasks/pushNotificationConfig/list"
        | "tasks/pushNotificationConfig/delete" => Err(RpcError::new(
            code::PUSH_NOT_SUPPORTED,
            "push notifications are not supported; use message/stream or tasks/get",
        )),
        "agent/getAuthenticatedExtendedCard" => Err(RpcError::new(
            code::NO_EXTENDED_CARD,
            "this agent has no authenticated extended card",
        )),
        other => {
            let shown: String = other.chars().take(80).collect();
            Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("method not found: {shown}"),
            ))
        }
    };
    let body = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": for_callers(result)}),
        Err(e) => error_body(&id, &e),
    };
    respond(StatusCode::OK, body)
}

/// `(id, method, params)` of a JSON-RPC 2.0 request, or the error answer (with the id
/// when it could be read).
fn parse_request(bytes: &[u8]) -> Result<(Value, String, Value), (Value, RpcError)> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        (
            Value::Null,
            RpcError::new(code::PARSE, format!("parse error: {e}")),
        )
    })?;
    let invalid = |id: Value, m: &str| (id, RpcError::new(code::INVALID_REQUEST, m));
    let Value::Object(mut obj) = value else {
        let what = if value.is_array() {
            "batch requests are not supported"
        } else {
            "a request is a JSON object"
        };
        return Err(invalid(Value::Null, what));
    };
    let id = match obj.remove("id") {
        None | Some(Value::Null) => Value::Null,
        Some(id @ (Value::String(_) | Value::Number(_))) => id,
        Some(_) => return Err(invalid(Value::Null, "`id` is a string, a number or null")),
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(id, "`jsonrpc` must be \"2.0\""));
    }
    let Some(Value::String(method)) = obj.remove("method") else {
        return Err(invalid(id, "`method` must be a string"));
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            return Err((id, RpcError::params("`params` must be an object")));
        }
    };
    Ok((id, method, params))
}

/// One request's context: the gateway, the agent addressed, the caller.
struct Cx {
    shared: AppState,
    agent: HarnessAgent,
    user: Option<String>,
}

/// What a stream sends: the first state of the task, then its changes.
type Events = futures::stream::BoxStream<'static, Value>;

impl Cx {
    fn queue(&self) -> Result<Arc<dyn RunQueue>, RpcError> {
        self.shared.options.runs.clone().ok_or_else(|| {
            RpcError::new(
                code::UNSUPPORTED,
                "this server has no run queue, so it takes no A2A tasks",
            )
        })
    }

    /// The caller's run `id`; anything else (another user's, another agent's, a malformed
    /// id) is `TaskNotFound`.
    async fn owned(&self, id: &str) -> Result<Run, RpcError> {
        if hame::state::runs::validate_run_id(id).is_err() {
            return Err(RpcError::not_found(id));
        }
        match self
            .queue()?
            .get(id)
            .await
            .map_err(|e| RpcError::store(&e))?
        {
            Some(run) if run.is_owned_by(self.agent.name(), self.user.as_deref()) => Ok(run),
            _ => Err(RpcError::not_found(id)),
        }
    }

    /// Submits the run of a `message/send` or `message/stream`.
    async fn submit(&self, params: &Value) -> Result<Run, RpcError> {
        let q = self.queue()?;
        if self.shared.draining.is_cancelled() {
            return Err(RpcError::new(
                code::INTERNAL,
                "the server is shutting down; retry on another replica",
            ));
        }
        let message = params
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| RpcError::params("`params.message` (a Message) is required"))?;
        if let Some(c) = params.get("configuration").filter(|c| !c.is_null()) {
            if c.get("pushNotificationConfig")
                .is_some_and(|p| !p.is_null())
            {
                return Err(RpcError::new(
                    code::PUSH_NOT_SUPPORTED,
                    "push notifications are not supported; use message/stream or tasks/get",
                ));
            }
            if let Some(modes) = c.get("acceptedOutputModes").and_then(Value::as_array)
                && !modes.is_empty()
                && !modes.iter().filter_map(Value::as_str).any(|m| {
                    matches!(
                        m,
                        "text/plain" | "text" | "text/*" | "*/*" | "text/markdown"
                    )
                })
            {
                return Err(RpcError::new(
                    code::CONTENT_TYPE,
                    "this agent answers text/plain only",
                ));
            }
        }
        if message.get("role").and_then(Value::as_str) != Some("user") {
            return Err(RpcError::params("`message.role` must be \"user\""));
        }
        let message_id = message
            .get("messageId")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| RpcError::params("`message.messageId` is required"))?;
        if let Some(task) = message.get("taskId").and_then(Value::as_str) {
            let run = self.owned(task).await?;
            return Err(if run.status.is_finished() {
                RpcError::params(format!(
                    "task {} has ended ({}); send a new message with its contextId to continue the conversation",
                    run.id,
                    a2a_state(run.status)
                ))
            } else {
                RpcError::new(
                    code::UNSUPPORTED,
                    "a hame task runs to its end without more input; send a new message with its contextId after it ends",
                )
            });
        }
        let text = message_text(message)?;
        let session = match message.get("contextId") {
            None | Some(Value::Null) => format!("a2a-{}", uuid::Uuid::new_v4().simple()),
            Some(Value::String(s)) => {
                hame::harness::validate_id("contextId", s)
                    .map_err(|e| RpcError::params(e.to_string()))?;
                s.clone()
            }
            Some(_) => return Err(RpcError::params("`message.contextId` must be a string")),
        };
        // A retried message (the same messageId) is answered with the task it made.
        let idem = format!("a2a:{message_id}");
        let idem = hame::state::runs::validate_idempotency_key(&idem)
            .is_ok()
            .then_some(idem);
        let key = hame::state::StateKey::new(self.agent.name(), self.user.as_deref(), &session)
            .map_err(|e| RpcError::params(e.to_string()))?;
        let new = NewRun::message(key, text, idem).map_err(|e| RpcError::params(e.to_string()))?;
        let submitted = q.submit(new).await.map_err(|e| RpcError::store(&e))?;
        Ok(submitted.run)
    }

    async fn send(&self, params: &Value) -> Result<Value, RpcError> {
        let run = self.submit(params).await?;
        let history = history_length(params.get("configuration"))?;
        let blocking = params
            .pointer("/configuration/blocking")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        if !blocking || run.status.is_finished() {
            return Ok(task(&run, history));
        }
        // Blocking: until the task ends, within the request timeout (less a margin).
        let q = self.queue()?;
        let limit = self
            .shared
            .options
            .request_timeout
            .saturating_sub(Duration::from_secs(5))
            .max(Duration::from_secs(1));
        let deadline = tokio::time::Instant::now() + limit;
        let mut run = run;
        while !run.status.is_finished() && tokio::time::Instant::now() < deadline {
            tokio::select! {
                () = tokio::time::sleep(RUN_POLL) => {}
                () = self.shared.draining.cancelled() => break,
            }
            if let Some(r) = q.get(&run.id).await.map_err(|e| RpcError::store(&e))? {
                run = r;
            }
        }
        Ok(task(&run, history))
    }

    async fn get(&self, params: &Value) -> Result<Value, RpcError> {
        let id = task_id_param(params)?;
        let run = self.owned(id).await?;
        Ok(task(&run, history_length(Some(params))?))
    }

    async fn cancel(&self, params: &Value) -> Result<Value, RpcError> {
        let id = task_id_param(params)?;
        let run = self.owned(id).await?;
        let q = self.queue()?;
        match q.cancel(&run.id).await.map_err(|e| RpcError::store(&e))? {
            CancelOutcome::Cancelled(r) => Ok(task(&r, None)),
            CancelOutcome::Requested(r) => {
                // The worker stops it at its next heartbeat: answer with the end if it
                // comes soon.
                let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
                let mut run = r;
                while !run.status.is_finished() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(RUN_POLL).await;
                    if let Some(r) = q.get(&run.id).await.map_err(|e| RpcError::store(&e))? {
                        run = r;
                    }
                }
                Ok(task(&run, None))
            }
            CancelOutcome::Finished(r) => Err(RpcError::new(
                code::TASK_NOT_CANCELABLE,
                format!(
                    "task {} cannot be canceled: it has ended ({})",
                    r.id,
                    a2a_state(r.status)
                ),
            )),
            CancelOutcome::NotFound => Err(RpcError::not_found(id)),
        }
    }

    async fn stream(&self, params: &Value) -> Result<Events, RpcError> {
        let run = self.submit(params).await?;
        Ok(self.follow(run))
    }

    async fn resubscribe(&self, params: &Value) -> Result<Events, RpcError> {
        let id = task_id_param(params)?;
        let run = self.owned(id).await?;
        Ok(self.follow(run))
    }

    /// The task first (as it is now; the stream ends there when it has ended), then a
    /// `status-update` per change, the reply as an `artifact-update` before the final
    /// `status-update`; read from the queue every [`RUN_POLL`], so any replica serves it.
    fn follow(&self, first: Run) -> Events {
        let q = self.shared.options.runs.clone();
        let stop = self.shared.draining.clone();
        enum Step {
            Start(Run),
            Watch(Run),
            Done,
        }
        futures::stream::unfold(Step::Start(first), move |step| {
            let (q, stop) = (q.clone(), stop.clone());
            async move {
                let seen = match step {
                    Step::Done => return None,
                    Step::Start(run) => {
                        let next = if run.status.is_finished() {
                            Step::Done
                        } else {
                            Step::Watch(run.clone())
                        };
                        return Some((vec![task(&run, None)], next));
                    }
                    Step::Watch(seen) => seen,
                };
                let q = q?;
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(RUN_POLL) => {}
                        () = stop.cancelled() => return None,
                    }
                    let now = match q.get(&seen.id).await {
                        Ok(Some(r)) => r,
                        Ok(None) => return None,
                        Err(e) => {
                            tracing::warn!(error = %e, "a2a stream: reading the run failed");
                            continue;
                        }
                    };
                    if now.status == seen.status {
                        continue;
                    }
                    let mut out = Vec::new();
                    // Ended between two reads after a worker took it: it was working.
                    if seen.status == RunStatus::Queued
                        && now.status.is_finished()
                        && now.attempts > 0
                    {
                        out.push(json!({
                            "kind": "status-update",
                            "taskId": now.id,
                            "contextId": now.session,
                            "status": {"state": "working", "timestamp": now.updated.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)},
                            "final": false,
                        }));
                    }
                    if now.status == RunStatus::Completed {
                        out.push(json!({
                            "kind": "artifact-update",
                            "taskId": now.id,
                            "contextId": now.session,
                            "artifact": artifact(&now),
                            "lastChunk": true,
                        }));
                    }
                    let finished = now.status.is_finished();
                    out.push(json!({
                        "kind": "status-update",
                        "taskId": now.id,
                        "contextId": now.session,
                        "status": status(&now),
                        "final": finished,
                    }));
                    let next = if finished {
                        Step::Done
                    } else {
                        Step::Watch(now)
                    };
                    return Some((out, next));
                }
            }
        })
        .flat_map(futures::stream::iter)
        .boxed()
    }

    fn sse(&self, id: Value, events: Events) -> Response {
        let stream = events.map(move |result| {
            let body = json!({"jsonrpc": "2.0", "id": id, "result": for_callers(result)});
            Ok::<_, Infallible>(SseEvent::default().data(body.to_string()))
        });
        Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(self.shared.options.keep_alive))
            .into_response()
    }
}

fn task_id_param(params: &Value) -> Result<&str, RpcError> {
    params
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params("`params.id` (the task id) is required"))
}

fn history_length(holder: Option<&Value>) -> Result<Option<usize>, RpcError> {
    match holder.and_then(|h| h.get("historyLength")) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| RpcError::params("`historyLength` is a number of 0 or more")),
    }
}

/// The text of a user message: its text parts, and its data parts as JSON; a file part is
/// refused (`ContentTypeNotSupported`), an empty message is invalid.
fn message_text(message: &Value) -> Result<String, RpcError> {
    let parts = message
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| RpcError::params("`message.parts` must be an array"))?;
    let mut out = Vec::new();
    for p in parts {
        match p.get("kind").and_then(Value::as_str) {
            Some("text") => out.push(
                p.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| RpcError::params("a text part needs `text`"))?
                    .to_owned(),
            ),
            Some("data") => out.push(
                p.get("data")
                    .filter(|d| d.is_object())
                    .ok_or_else(|| RpcError::params("a data part needs an object `data`"))?
                    .to_string(),
            ),
            Some("file") => {
                return Err(RpcError::new(
                    code::CONTENT_TYPE,
                    "file parts are not supported; send text or data parts",
                ));
            }
            _ => return Err(RpcError::params("a part's `kind` is text, data or file")),
        }
    }
    let text = out.join("\n");
    if text.trim().is_empty() {
        return Err(RpcError::params("the message has no text"));
    }
    Ok(text)
}

/// The A2A state of a run status.
fn a2a_state(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Queued => "submitted",
        RunStatus::Running => "working",
        RunStatus::WaitingApproval => "input-required",
        RunStatus::Completed => "completed",
        // The reply is not backed by its required checks: not a success (docs/a2a.md).
        RunStatus::Failed | RunStatus::Unverified => "failed",
        RunStatus::Cancelled => "canceled",
    }
}

fn agent_message(run: &Run, suffix: &str, parts: Value) -> Value {
    json!({
        "kind": "message",
        "role": "agent",
        "messageId": format!("{}-{suffix}", run.id),
        "taskId": run.id,
        "contextId": run.session,
        "parts": parts,
    })
}

/// A task's `status`: its state, when it changed, and for a failure or a wait for
/// approval a message saying why.
fn status(run: &Run) -> Value {
    let mut status = json!({
        "state": a2a_state(run.status),
        "timestamp": run.updated.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    });
    let message = match run.status {
        RunStatus::Failed | RunStatus::Cancelled => run.error.as_ref().map(|e| {
            agent_message(
                run,
                "status",
                json!([{"kind": "text", "text": format!("{}: {}", e.code, e.message)}]),
            )
        }),
        RunStatus::Unverified => Some(agent_message(
            run,
            "status",
            json!([
                {"kind": "text", "text": crate::runs::unverified_line(run)},
                {"kind": "data", "data": {
                    "reply": run.reply.clone().unwrap_or_default(),
                    "verification": run.verification.clone().unwrap_or(Value::Null),
                }}
            ]),
        )),
        RunStatus::WaitingApproval => Some(agent_message(
            run,
            "status",
            json!([
                {"kind": "text", "text": format!(
                    "tool calls wait for approval: decide them with POST /v1/sessions/{}/approvals/{{id}}",
                    run.session
                )},
                {"kind": "data", "data": {"approvals": run.approvals.clone().unwrap_or(Value::Null)}}
            ]),
        )),
        _ => None,
    };
    if let (Some(m), Some(o)) = (message, status.as_object_mut()) {
        o.insert("message".into(), m);
    }
    status
}

/// The reply of a completed run as an artifact.
fn artifact(run: &Run) -> Value {
    json!({
        "artifactId": format!("{}-reply", run.id),
        "name": "reply",
        "parts": [{"kind": "text", "text": run.reply.clone().unwrap_or_default()}],
    })
}

/// The A2A `Task` of a run: id = run id, contextId = session; the reply as the artifact
/// `reply` and, with the request, in the history (the last `history` messages).
fn task(run: &Run, history: Option<usize>) -> Value {
    let request = match &run.input {
        RunInput::Message { message, .. } => message.clone(),
        #[allow(unreachable_patterns)]
        _ => String::new(),
    };
    let mut messages = vec![json!({
        "kind": "message",
        "role": "user",
        "messageId": format!("{}-request", run.id),
        "taskId": run.id,
        "contextId": run.session,
        "parts": [{"kind": "text", "text": request}],
    })];
    if run.status == RunStatus::Completed {
        messages.push(agent_message(
            run,
            "reply",
            json!([{"kind": "text", "text": run.reply.clone().unwrap_or_default()}]),
        ));
    }
    if let Some(n) = history {
        let skip = messages.len().saturating_sub(n);
        messages.drain(..skip);
    }
    let mut t = json!({
        "kind": "task",
        "id": run.id,
        "contextId": run.session,
        "status": status(run),
        "history": messages,
    });
    if let Some(o) = t.as_object_mut() {
        if run.status == RunStatus::Completed {
            o.insert("artifacts".into(), json!([artifact(run)]));
        }
        if let Some(u) = &run.usage {
            o.insert("metadata".into(), json!({"usage": u}));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn err_code(bytes: &[u8]) -> i64 {
        match parse_request(bytes) {
            Ok(_) => 0,
            Err((_, e)) => e.code,
        }
    }

    #[test]
    fn malformed_requests_get_their_codes() {
        assert_eq!(err_code(b"{not json"), code::PARSE);
        assert_eq!(err_code(b"[]"), code::INVALID_REQUEST);
        assert_eq!(err_code(b"42"), code::INVALID_REQUEST);
        assert_eq!(
            err_code(br#"{"id": 1, "method": "tasks/get"}"#),
            code::INVALID_REQUEST
        );
        assert_eq!(
            err_code(br#"{"jsonrpc": "2.0", "id": {}, "method": "x"}"#),
            code::INVALID_REQUEST
        );
        assert_eq!(
            err_code(br#"{"jsonrpc": "2.0", "id": 1, "method": 7}"#),
            code::INVALID_REQUEST
        );
        assert_eq!(
            err_code(br#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": [1]}"#),
            code::INVALID_PARAMS
        );
        let ok = parse_request(br#"{"jsonrpc": "2.0", "id": "a", "method": "tasks/get"}"#);
        assert!(matches!(ok, Ok((Value::String(ref s), ref m, _)) if s == "a" && m == "tasks/get"));
        // The id comes back with an error it can be read for.
        let Err((id, _)) = parse_request(br#"{"jsonrpc": "1.0", "id": 9, "method": "x"}"#) else {
            panic!("accepted");
        };
        assert_eq!(id, json!(9));
    }

    #[test]
    fn rpc_paths() {
        assert!(is_rpc_path("/a2a"));
        assert!(is_rpc_path("/a2a/other"));
        assert!(!is_rpc_path("/a2a/other/.well-known/agent-card.json"));
        assert!(!is_rpc_path("/a2a/"));
        assert!(!is_rpc_path("/v1/runs"));
    }

    #[test]
    fn message_parts() {
        let m =
            json!({"parts": [{"kind": "text", "text": "a"}, {"kind": "data", "data": {"k": 1}}]});
        assert_eq!(message_text(&m).ok(), Some("a\n{\"k\":1}".to_owned()));
        let file = json!({"parts": [{"kind": "file", "file": {"uri": "http://x"}}]});
        assert_eq!(
            message_text(&file).err().map(|e| e.code),
            Some(code::CONTENT_TYPE)
        );
        let empty = json!({"parts": [{"kind": "text", "text": "  "}]});
        assert_eq!(
            message_text(&empty).err().map(|e| e.code),
            Some(code::INVALID_PARAMS)
        );
    }
}
