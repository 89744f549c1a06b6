//! The OpenAI-compatible routes: `POST /v1/chat/completions`, `GET /v1/models`,
//! `GET /v1/models/{id}`; what they share with `POST /v1/responses` (`crate::responses`):
//! the session a request continues ([`plan`]) and the answer's pieces. Every field is
//! honoured or refused (`crate::oai_request`); `docs/openai-compat.md` lists them.

use std::convert::Infallible;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hame::harness::caller::{
    CLIENT_TOOLS_LAYER, CallerRequest, ReplyFormat, strip_fence, user_turns,
};
use hame::{CallInput, HarnessAgent, Resolution};
use serde_json::{Value, json};

use crate::Shared;
use crate::error::ApiError;
use crate::oai_request::{Parsed, Refusal, Tail, client_call_id, parse_call_id, parse_chat};
use crate::routes::{AppState, Caller};
use crate::turn::{self, Outcome};

/// A refused field as an answer: 400 naming it.
pub(crate) fn refused(r: Refusal) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, r.code, r.message).with_param(r.param)
}

/// The served agent `model` names that `caller` may use, else 404 `model_not_found` (an
/// agent the caller's token may not use is not told apart from one that is not served).
pub(crate) fn served(
    shared: &Shared,
    caller: &Caller,
    model: &str,
) -> Result<HarnessAgent, ApiError> {
    let usable: Vec<&HarnessAgent> = shared
        .agents()
        .filter(|a| caller.may_use(a.name()))
        .collect();
    if let Some(a) = usable.iter().find(|a| a.name() == model) {
        return Ok((*a).clone());
    }
    let names: Vec<String> = usable.iter().map(|a| format!("`{}`", a.name())).collect();
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "model_not_found",
        format!(
            "the model `{}` does not exist; this server serves you the agent(s) {} (GET /v1/models lists them)",
            model.chars().take(64).collect::<String>(),
            names.join(", ")
        ),
    )
    .with_param("model"))
}

/// What both OpenAI handlers start with, as their extractor: the caller, the retry key of
/// the route, the JSON body, the agent `model` picks and the request parsed for it (with
/// the agent's own tool names, which a client tool may not take), and the headers.
pub(crate) struct Prologue<T> {
    pub(crate) user: Option<String>,
    pub(crate) key: Option<crate::replay::RequestKey>,
    pub(crate) body: Value,
    pub(crate) agent: HarnessAgent,
    pub(crate) req: T,
    pub(crate) headers: HeaderMap,
}

/// A request of an OpenAI route: its retry-key route and its parser.
pub(crate) trait OaiRequest: Sized {
    /// The route's name in retry keys.
    const ROUTE: &'static str;
    /// Reads the body; `taken`: the agent's tool names.
    fn parse(body: &Value, taken: &[String]) -> Result<Self, Refusal>;
}

impl OaiRequest for Parsed {
    const ROUTE: &'static str = "chat/completions";
    fn parse(body: &Value, taken: &[String]) -> Result<Self, Refusal> {
        parse_chat(body, taken)
    }
}

impl<T: OaiRequest + Send> axum::extract::FromRequest<AppState> for Prologue<T> {
    type Rejection = ApiError;

    /// A body without `model` is refused for its own fields first (a bad request says what
    /// is wrong with it rather than that `model` is missing).
    async fn from_request(
        req: axum::extract::Request,
        shared: &AppState,
    ) -> Result<Self, Self::Rejection> {
        use axum::extract::FromRequestParts;
        let (mut parts, body) = req.into_parts();
        let caller = Caller::from_request_parts(&mut parts, shared).await?;
        // Read whole already (`server::read_body_within`), within the body limit.
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .map_err(|_| ApiError::bad_request("the request body could not be read"))?;
        let key =
            shared
                .replays
                .key_of(&parts.headers, caller.user.as_deref(), T::ROUTE, &bytes)?;
        let body = json_body(&bytes)?;
        let model = body["model"].as_str().unwrap_or_default();
        let agent = served(shared, &caller, model).or_else(|e| match model {
            "" => T::parse(&body, &[])
                .map(|_| shared.agent.clone())
                .map_err(refused),
            _ => Err(e),
        })?;
        let req = T::parse(&body, &agent_tools(&agent)).map_err(refused)?;
        Ok(Prologue {
            user: caller.user,
            key,
            body,
            agent,
            req,
            headers: parts.headers,
        })
    }
}

/// The tool names of an agent itself (a client tool may not take one).
pub(crate) fn agent_tools(agent: &HarnessAgent) -> Vec<String> {
    agent.agent_loop().tools().names()
}

/// The body as JSON, else 400 `invalid_json`.
pub(crate) fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("bad JSON body: {e}"),
        )
    })
}

/// The `X-Hame-Session` header of the OpenAI routes (for the OpenAPI document).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct SessionHeader {
    /// The session to continue (docs/openai-compat.md).
    #[param(rename = "X-Hame-Session")]
    x_hame_session: Option<String>,
}

/// The `X-Hame-Session` header, when it names one.
pub(crate) fn named_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-hame-session")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// A turn ready to start: its session, its input and what the caller adds.
#[derive(Debug)]
pub(crate) struct Planned {
    pub(crate) session: String,
    pub(crate) input: CallInput,
    pub(crate) caller: CallerRequest,
    /// The tokens the suspended turn this request resumes had spent (an earlier answer
    /// reported them): a finished turn's usage minus these is this request's.
    pub(crate) before: hame::Usage,
}

impl Planned {
    /// Starts the planned turn ([`turn::start_once`] with the request's caller); with it,
    /// the tokens spent before ([`Planned::before`]).
    pub(crate) fn start(
        self,
        shared: &AppState,
        agent: &HarnessAgent,
        user: Option<String>,
        key: Option<crate::replay::RequestKey>,
    ) -> Result<(turn::Turn, hame::Usage), ApiError> {
        let turn = turn::start_once(
            shared,
            agent,
            user,
            self.session,
            self.input,
            key,
            Some(self.caller),
        )?;
        Ok((turn, self.before))
    }
}

/// The session a request continues and what its turn adds (see `docs/openai-compat.md`,
/// *Sessions and history*):
///
/// - the session is `named` (the `X-Hame-Session` header or a `previous_response_id`),
///   else the one a returned tool call id names (results of client tools), else a new one
///   (`prefix` and 32 hex digits);
/// - a session with messages is the record: the request's earlier user messages, when it
///   sends any, must be the session's (else 409 `history_mismatch`); only the new message
///   or the tool results join it;
/// - a new session starts from the request's earlier messages.
pub(crate) async fn plan(
    shared: &Shared,
    agent: &HarnessAgent,
    user: &Option<String>,
    named: Option<String>,
    req: &Parsed,
    prefix: &str,
) -> Result<Planned, ApiError> {
    let from_calls = match &req.tail {
        Tail::ToolResults(results) => results
            .first()
            .and_then(|(id, _)| parse_call_id(id))
            .map(|(s, _)| s),
        Tail::User(_) => None,
    };
    let session = named
        .or(from_calls)
        .unwrap_or_else(|| format!("{prefix}{}", uuid::Uuid::new_v4().simple()));
    crate::routes::valid_session(&session)?;
    let ctx = crate::routes::context(shared, user.clone(), &session);
    let state = agent.state(&ctx).await?.filter(|s| !s.messages.is_empty());
    let mut caller = CallerRequest::default()
        .with_instructions(req.instructions.clone())
        .with_tools(
            req.tools.iter().map(|t| t.spec.clone()).collect(),
            req.tools
                .iter()
                .filter(|t| t.strict)
                .map(|t| t.spec.name.clone())
                .collect(),
        )
        .with_no_tools(req.no_tools)
        .with_params(req.temperature, req.max_tokens)
        .with_reply_format(req.reply_format.clone());
    if let Some(state) = &state {
        let sent = user_turns(&req.history);
        if !sent.is_empty() {
            let known = user_turns(&state.messages);
            if sent != known {
                let at = sent
                    .iter()
                    .zip(known.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(sent.len().min(known.len()));
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "history_mismatch",
                    format!(
                        "the request's earlier user messages do not match session {session}: they differ at user message {} ({} sent, {} in the session); send only the new message, or omit X-Hame-Session and previous_response_id to start a new session from these messages",
                        at + 1,
                        sent.len(),
                        known.len()
                    ),
                ));
            }
        }
    }
    let mut before = hame::Usage::default();
    let input = match &req.tail {
        Tail::User(message) => {
            if state.is_none() {
                caller = caller.with_history(req.history.clone());
            }
            CallInput::Message(message.clone())
        }
        Tail::ToolResults(results) => {
            let step = state.as_ref().and_then(|s| s.pending.as_ref());
            before = step.map(|p| p.usage).unwrap_or_default();
            let pending = step.map(|p| p.to_suspended()).ok_or_else(|| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    "not_pending",
                    format!("no tool call of session {session} waits for a result"),
                )
            })?;
            let mut resolutions = Vec::new();
            for (id, output) in results {
                let raw = parse_call_id(id)
                    .map(|(_, c)| c)
                    .unwrap_or_else(|| id.clone());
                let waiting = pending
                    .calls
                    .iter()
                    .find(|c| c.suspension.layer == CLIENT_TOOLS_LAYER && c.call.id == raw)
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::CONFLICT,
                            "unknown_tool_call",
                            format!(
                                "the tool call {} does not wait for a result in session {session}",
                                id.chars().take(80).collect::<String>()
                            ),
                        )
                        .with_param("tool_call_id")
                    })?;
                resolutions.push(Resolution::new(
                    waiting.suspension.id.clone(),
                    json!({"output": output}),
                ));
            }
            CallInput::Resume(resolutions)
        }
    };
    Ok(Planned {
        session,
        input,
        caller,
        before,
    })
}

/// The calls of a suspended outcome: `(client tool calls, other approvals)`.
pub(crate) fn split_suspended(v: &Value) -> (Vec<Value>, Vec<Value>) {
    v["approvals"]
        .as_array()
        .map(|a| {
            a.iter()
                .cloned()
                .partition(|c| c["layer"] == CLIENT_TOOLS_LAYER)
        })
        .unwrap_or_default()
}

/// The final text of a finished turn, checked against the reply format: the JSON body of
/// a formatted reply, or 502 `reply_format_mismatch` (after the one repair request).
pub(crate) fn final_text(format: Option<&ReplyFormat>, reply: &str) -> Result<String, ApiError> {
    match format {
        None => Ok(reply.to_owned()),
        Some(f) => match f.check(reply) {
            Ok(_) => Ok(strip_fence(reply).to_owned()),
            Err(problem) => Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "reply_format_mismatch",
                format!(
                    "the model's reply does not have the requested format, after one repair request: {problem}"
                ),
            )),
        },
    }
}

/// The tokens of one answer: hame's `usage` of the turn minus what the turn had spent
/// `before` this request resumed it (a suspended turn's answer reports its own).
pub(crate) fn spent_since(v: &Value, before: &hame::Usage) -> Value {
    let less = |k: &str, b: u64| v[k].as_u64().unwrap_or(0).saturating_sub(b);
    json!({
        "input_tokens": less("input_tokens", before.input_tokens),
        "output_tokens": less("output_tokens", before.output_tokens),
        "cached_input_tokens": less("cached_input_tokens", before.cached_input_tokens),
    })
}

/// OpenAI's `usage` of a chat completion from hame's usage.
fn chat_usage(v: &Value) -> Value {
    let input = v["input_tokens"].as_u64().unwrap_or(0);
    let output = v["output_tokens"].as_u64().unwrap_or(0);
    let cached = v["cached_input_tokens"].as_u64().unwrap_or(0);
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": input + output,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// The `tool_calls` of an assistant message for the client tool calls of a suspension.
fn tool_calls(session: &str, calls: &[Value], with_index: bool) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut call = json!({
                    "id": client_call_id(session, c["call_id"].as_str().unwrap_or_default()),
                    "type": "function",
                    "function": {
                        "name": c["tool"],
                        "arguments": c["arguments"].as_str().unwrap_or("{}"),
                    },
                });
                if with_index && let Some(o) = call.as_object_mut() {
                    o.insert("index".into(), json!(i));
                }
                call
            })
            .collect(),
    )
}

/// `resp` with the `X-Hame-Session` header naming `session`.
pub(crate) fn with_session(mut resp: Response, session: &str) -> Response {
    if let Ok(v) = session.parse() {
        resp.headers_mut().insert("x-hame-session", v);
    }
    resp
}

#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    params(crate::openai::SessionHeader),
    request_body(content = crate::schemas::ChatCompletionRequest, description = "An OpenAI chat completion request; every field honoured or refused (docs/openai-compat.md)"),
    responses((status = 200, description = "A `chat.completion`, or with `stream: true` SSE `chat.completion.chunk`s then `[DONE]`", content(
        (crate::schemas::ChatCompletion = "application/json"),
        (crate::schemas::ChatCompletionChunk = "text/event-stream"))),))]
pub(crate) async fn completions(
    State(shared): State<AppState>,
    Prologue {
        user,
        key,
        agent,
        req,
        headers,
        ..
    }: Prologue<Parsed>,
) -> Result<Response, ApiError> {
    let planned = plan(
        &shared,
        &agent,
        &user,
        named_session(&headers),
        &req,
        "chatcmpl-",
    )
    .await?;
    let (turn, before) = planned.start(&shared, &agent, user, key)?;
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    let created = chrono::Utc::now().timestamp();
    let session = turn.session.clone();
    let model = req.model.clone();
    let format = req.reply_format.clone();
    if !req.stream {
        let (message, finish, usage) = match turn.outcome.await {
            Ok(Outcome::Finished(v)) => {
                let text = final_text(format.as_ref(), v["reply"].as_str().unwrap_or_default())?;
                (
                    json!({"role": "assistant", "content": text, "refusal": null}),
                    "stop",
                    chat_usage(&spent_since(&v["usage"], &before)),
                )
            }
            Ok(Outcome::Suspended(v)) => {
                let (client, approvals) = split_suspended(&v);
                let text = approval_text(&session, &approvals);
                if client.is_empty() {
                    (
                        json!({"role": "assistant", "content": text, "refusal": null}),
                        "stop",
                        chat_usage(&v["usage"]),
                    )
                } else {
                    (
                        json!({
                            "role": "assistant",
                            "content": (!text.is_empty()).then_some(text),
                            "refusal": null,
                            "tool_calls": tool_calls(&session, &client, false),
                        }),
                        "tool_calls",
                        chat_usage(&v["usage"]),
                    )
                }
            }
            Ok(Outcome::Failed(e)) => return Err(e),
            Err(_) => return Err(ApiError::internal("the turn ended without an outcome")),
        };
        let resp = Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": null,
            }],
            "usage": usage,
        }))
        .into_response();
        return Ok(with_session(resp, &session));
    }
    let chunk = {
        let id = id.clone();
        let model = model.clone();
        move |delta: Value, finish: Value| {
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
            })
        }
    };
    let first = chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    );
    // A retry answered from its first attempt has no deltas: the reply comes whole; so
    // does a formatted reply (checked before it is sent).
    let whole = turn.replayed || format.is_some();
    let deltas = {
        let chunk = chunk.clone();
        futures::stream::unfold(turn.events, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })
        .filter_map(move |ev| {
            let out = (!whole && ev.name == "text_delta")
                .then(|| serde_json::from_str::<Value>(&ev.data).ok())
                .flatten()
                .map(|d| chunk(json!({"content": d["text"]}), Value::Null));
            async move { out }
        })
    };
    let include_usage = req.include_usage;
    let tail = {
        let outcome = turn.outcome;
        let session = session.clone();
        futures::stream::once(async move {
            let usage_chunk = |usage: Value| {
                json!({
                    "id": id, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [], "usage": usage,
                })
            };
            let mut out = Vec::new();
            let usage = match outcome.await {
                Ok(Outcome::Finished(v)) => {
                    match final_text(format.as_ref(), v["reply"].as_str().unwrap_or_default()) {
                        Ok(text) => {
                            if whole {
                                out.push(chunk(json!({"content": text}), Value::Null));
                            }
                            out.push(chunk(json!({}), json!("stop")));
                        }
                        Err(e) => return vec![e.body()],
                    }
                    chat_usage(&spent_since(&v["usage"], &before))
                }
                Ok(Outcome::Suspended(v)) => {
                    let (client, approvals) = split_suspended(&v);
                    let text = approval_text(&session, &approvals);
                    if !text.is_empty() {
                        out.push(chunk(json!({"content": text}), Value::Null));
                    }
                    if client.is_empty() {
                        out.push(chunk(json!({}), json!("stop")));
                    } else {
                        out.push(chunk(
                            json!({"tool_calls": tool_calls(&session, &client, true)}),
                            Value::Null,
                        ));
                        out.push(chunk(json!({}), json!("tool_calls")));
                    }
                    chat_usage(&v["usage"])
                }
                Ok(Outcome::Failed(e)) => return vec![e.body()],
                Err(_) => {
                    return vec![ApiError::internal("the turn ended without an outcome").body()];
                }
            };
            if include_usage {
                out.push(usage_chunk(usage));
            }
            out
        })
        .flat_map(futures::stream::iter)
    };
    let all = futures::stream::once(async move { first })
        .chain(deltas)
        .chain(tail)
        .map(|v| Ok::<_, Infallible>(SseEvent::default().data(v.to_string())))
        .chain(futures::stream::once(async {
            Ok::<_, Infallible>(SseEvent::default().data("[DONE]"))
        }));
    let resp = Sse::new(all)
        .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
        .into_response();
    Ok(with_session(resp, &session))
}

/// What a client sees of tool calls that wait for a human decision: their ids and the
/// route to decide them.
pub(crate) fn approval_text(session: &str, approvals: &[Value]) -> String {
    approvals
        .iter()
        .map(|c| {
            format!(
                "approval needed: {} {} (POST /v1/sessions/{session}/approvals/{})",
                c["id"].as_str().unwrap_or_default(),
                c["tool"].as_str().unwrap_or_default(),
                c["id"].as_str().unwrap_or_default(),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The model object of a served agent.
fn model_object(shared: &Shared, agent: &HarnessAgent) -> Value {
    json!({
        "id": agent.name(),
        "object": "model",
        "created": shared.started,
        "owned_by": "hame",
    })
}

/// `GET /v1/models`: the served agents, the default first.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, description = "The agents the caller may use", body = crate::schemas::ModelList),))]
pub(crate) async fn list_models(State(shared): State<AppState>, caller: Caller) -> Json<Value> {
    let data: Vec<Value> = shared
        .agents()
        .filter(|a| caller.may_use(a.name()))
        .map(|a| model_object(&shared, a))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "openai",
    params(("id" = String, Path, description = "An agent id")),
    responses((status = 200, description = "The model object", body = crate::schemas::ModelObject),))]
pub(crate) async fn get_model(
    State(shared): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let agent = served(&shared, &caller, &id)?;
    Ok(Json(model_object(&shared, &agent)))
}
