//! `POST /v1/chat/completions`, OpenAI-compatible: `model` is the agent id, the session is
//! the `X-Hame-Session` header (else a new one per request), the last user message is the
//! input; the rest of the conversation is the session's own.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hame::{CallInput, Message};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::routes::{AppState, Caller};
use crate::turn::{self, Outcome};

/// An error in OpenAI's shape: `{"error": {"message", "type", "code"}}`, with
/// `x-should-retry: false` unless a retry may help (`error::retry_may_help`).
fn oai_error(status: StatusCode, kind: &str, code: &str, message: impl Into<String>) -> Response {
    let mut resp = (
        status,
        Json(json!({"error": {"message": message.into(), "type": kind, "code": code, "param": null}})),
    )
        .into_response();
    crate::error::mark_retry(&mut resp, code);
    resp
}

fn from_api(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        _ => "api_error",
    };
    let mut resp = oai_error(e.status, kind, e.code, e.message.clone());
    if let Some(secs) = e.retry_after {
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, secs.into());
    }
    resp
}

/// The text of the last `user` message (a string, or text parts).
fn last_user_text(body: &Value) -> Option<String> {
    let messages = body.get("messages")?.as_array()?;
    let last = messages.iter().rev().find(|m| m["role"] == "user")?;
    match &last["content"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let text: Vec<&str> = parts
                .iter()
                .filter(|p| p["type"] == "text")
                .filter_map(|p| p["text"].as_str())
                .collect();
            Some(text.join("\n"))
        }
        _ => None,
    }
}

fn usage_of(v: &Value) -> Value {
    let input = v["input_tokens"].as_u64().unwrap_or(0);
    let output = v["output_tokens"].as_u64().unwrap_or(0);
    json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output})
}

pub(crate) async fn completions(
    State(shared): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Caller(user) = match caller {
        Ok(c) => c,
        Err(e) => return from_api(e),
    };
    let key = match shared
        .replays
        .key_of(&headers, user.as_deref(), "chat/completions", &body)
    {
        Ok(k) => k,
        Err(e) => return from_api(e),
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return oai_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                format!("bad JSON body: {e}"),
            );
        }
    };
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    if model != shared.agent.name() {
        return oai_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "the model `{}` does not exist; this server serves the agent `{}`",
                model.chars().take(64).collect::<String>(),
                shared.agent.name()
            ),
        );
    }
    let Some(text) = last_user_text(&body).filter(|t| !t.trim().is_empty()) else {
        return oai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "no_user_message",
            "`messages` needs a user message with text",
        );
    };
    let stream = body["stream"].as_bool().unwrap_or(false);
    let session = headers
        .get("x-hame-session")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()));
    let turn = match turn::start_once(
        &shared,
        user,
        session,
        CallInput::Message(Message::user(text)),
        key,
    ) {
        Ok(t) => t,
        Err(e) => return from_api(e),
    };
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    let created = chrono::Utc::now().timestamp();
    let session = turn.session.clone();
    if !stream {
        let outcome = turn.outcome.await;
        let (content, usage) = match outcome {
            Ok(Outcome::Finished(v)) => (
                v["reply"].as_str().unwrap_or_default().to_owned(),
                usage_of(&v["usage"]),
            ),
            Ok(Outcome::Suspended(v)) => (suspended_text(&v), usage_of(&Value::Null)),
            Ok(Outcome::Failed(e)) => return from_api(e),
            Err(_) => return from_api(ApiError::internal("the turn ended without an outcome")),
        };
        let mut resp = Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
                "logprobs": null,
            }],
            "usage": usage,
        }))
        .into_response();
        if let Ok(v) = session.parse() {
            resp.headers_mut().insert("x-hame-session", v);
        }
        return resp;
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
    let first = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    // A retry answered from its first attempt has no deltas: the reply comes whole.
    let replayed = turn.replayed;
    let deltas = {
        let chunk = chunk.clone();
        futures::stream::unfold(turn.events, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        })
        .filter_map(move |ev| {
            let out = (ev.name == "text_delta")
                .then(|| serde_json::from_str::<Value>(&ev.data).ok())
                .flatten()
                .map(|d| chunk(json!({"content": d["text"]}), Value::Null));
            async move { out }
        })
    };
    let tail = {
        let outcome = turn.outcome;
        let id = id.clone();
        let model = model.clone();
        futures::stream::once(async move {
            match outcome.await {
                Ok(Outcome::Finished(v)) if replayed => vec![
                    chunk(json!({"content": v["reply"]}), Value::Null),
                    chunk(json!({}), json!("stop")),
                    json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": [], "usage": usage_of(&v["usage"]),
                    }),
                ],
                Ok(Outcome::Finished(v)) => vec![
                    chunk(json!({}), json!("stop")),
                    json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "choices": [], "usage": usage_of(&v["usage"]),
                    }),
                ],
                Ok(Outcome::Suspended(v)) => vec![
                    chunk(json!({"content": suspended_text(&v)}), Value::Null),
                    chunk(json!({}), json!("stop")),
                ],
                Ok(Outcome::Failed(e)) => vec![e.body()],
                Err(_) => vec![ApiError::internal("the turn ended without an outcome").body()],
            }
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
    let mut resp = Sse::new(all)
        .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
        .into_response();
    if let Ok(v) = session.parse() {
        resp.headers_mut().insert("x-hame-session", v);
    }
    resp
}

/// What a chat-completions client sees when tool calls wait for a decision.
fn suspended_text(v: &Value) -> String {
    let session = v["session"].as_str().unwrap_or_default();
    let lines: Vec<String> = v["approvals"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    format!(
                        "approval needed: {} {} (POST /v1/sessions/{session}/approvals/{})",
                        c["id"].as_str().unwrap_or_default(),
                        c["tool"].as_str().unwrap_or_default(),
                        c["id"].as_str().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    lines.join("\n")
}
