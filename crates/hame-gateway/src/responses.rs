//! `POST /v1/responses`, OpenAI's Responses API (the Agents SDK's default): text and
//! function-call input and output items, `instructions`, function tools (a call is an
//! output `function_call` item; the next request's `function_call_output` resumes the
//! turn), `text.format` (JSON Schema replies), `previous_response_id` (the session travels
//! in the response id), and streaming events as the API names them. Every field is
//! honoured or refused (400 naming it); `docs/openai-compat.md` lists them.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use hame::{ContentBlock, Message, Role, ToolCall};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::oai_request::{
    Parsed, Refusal, client_tools, fields, hex_decode, hex_encode, json_schema_format, model,
    only_keys, push_result, reply_format, split_tail, temperature, text_of, token_limit,
    tool_choice, user_message,
};
use crate::openai::{
    OaiRequest, Prologue, approval_text, final_text, named_session, plan, spent_since,
    split_suspended, with_session,
};
use crate::routes::AppState;
use crate::turn::Outcome;

type R<T> = Result<T, Refusal>;

impl OaiRequest for Request {
    const ROUTE: &'static str = "responses";
    fn parse(body: &Value, taken: &[String]) -> R<Self> {
        parse(body, taken)
    }
}

/// A response id: `resp_<hex of the session>_<32 hex digits>`; `previous_response_id`
/// names the session again.
fn response_id(session: &str) -> String {
    format!(
        "resp_{}_{}",
        hex_encode(session),
        uuid::Uuid::new_v4().simple()
    )
}

/// The session of a response id.
fn session_of(id: &str) -> Option<String> {
    let (h, _) = id.strip_prefix("resp_")?.split_once('_')?;
    hex_decode(h)
}

/// The request, read, and what the response object echoes back.
#[derive(Debug)]
pub(crate) struct Request {
    parsed: Parsed,
    /// The request's tools in the Responses shape (echoed).
    tools: Value,
    tool_choice: Value,
    metadata: Value,
    text: Value,
}

fn parse(body: &Value, taken: &[String]) -> R<Request> {
    if !body.is_object() {
        return Err(Refusal::invalid("body", "must be a JSON object"));
    }
    let mut p = Parsed::new(true);
    let mut out = Request {
        parsed: p.clone(),
        tools: json!([]),
        tool_choice: json!("auto"),
        metadata: json!({}),
        text: json!({"format": {"type": "text"}}),
    };
    let mut input = None;
    let mut instructions = None;
    for (k, v) in fields(body) {
        match k.as_str() {
            "model" => p.model = model(&v)?,
            "input" => input = Some(v),
            "instructions" => instructions = Some(text_of("instructions", &v)?),
            "stream" => {
                p.stream = v
                    .as_bool()
                    .ok_or_else(|| Refusal::invalid("stream", "must be a boolean"))?;
            }
            "tools" => {
                p.tools = client_tools(&v, false, taken)?;
                out.tools = v.clone();
            }
            "tool_choice" => {
                p.no_tools = tool_choice(&v)?;
                out.tool_choice = v.clone();
            }
            "parallel_tool_calls" if v == Value::Bool(true) => {}
            "previous_response_id" => {
                let id = v.as_str().unwrap_or_default();
                p.previous_response = Some(session_of(id).ok_or_else(|| {
                    Refusal::invalid(
                        "previous_response_id",
                        "is not the id of a response of this server",
                    )
                })?);
            }
            "text" => {
                for (tk, tv) in fields(&v) {
                    match tk.as_str() {
                        "format" => p.reply_format = text_format(&tv)?,
                        _ => {
                            return Err(Refusal::unsupported(
                                format!("text.{tk}"),
                                "only `text.format` is honoured",
                            ));
                        }
                    }
                }
                out.text = v.clone();
            }
            "temperature" => p.temperature = Some(temperature(&v)?),
            "max_output_tokens" => p.max_tokens = Some(token_limit(&k, &v)?),
            "top_p" if v.as_f64() == Some(1.0) => {}
            "include" if v.as_array().is_some_and(Vec::is_empty) => {}
            "truncation" if v == "disabled" => {}
            "store" if v == Value::Bool(true) => {}
            "background" if v == Value::Bool(false) => {}
            "metadata" => {
                if !v.is_object() {
                    return Err(Refusal::invalid("metadata", "must be an object"));
                }
                out.metadata = v.clone();
            }
            "store" => {
                return Err(Refusal::unsupported(
                    k,
                    "hame records every turn in the session log; `store: false` cannot be honoured",
                ));
            }
            _ => {
                return Err(Refusal::unsupported(
                    k.as_str(),
                    "it is not among the fields docs/openai-compat.md lists (or not with this value)",
                ));
            }
        }
    }
    if p.model.is_empty() {
        return Err(Refusal::missing("model"));
    }
    let input = input.ok_or_else(|| Refusal::missing("input"))?;
    let (system, convo) = items(&input)?;
    let joined: Vec<String> = instructions
        .into_iter()
        .chain(system)
        .filter(|t| !t.trim().is_empty())
        .collect();
    p.instructions = (!joined.is_empty()).then(|| joined.join("\n\n"));
    let (history, tail) = split_tail(convo).map_err(|r| Refusal {
        param: "input".into(),
        ..r
    })?;
    p.history = history;
    p.tail = tail;
    out.parsed = p;
    Ok(out)
}

fn text_format(v: &Value) -> R<Option<hame::harness::caller::ReplyFormat>> {
    let f = fields(v);
    reply_format("text.format", f.get("type").and_then(Value::as_str), || {
        json_schema_format(
            "text.format",
            &f,
            &["type", "name", "schema", "strict", "description"],
        )
    })
}

/// The input items: system/developer texts and the conversation.
fn items(input: &Value) -> R<(Vec<String>, Vec<Message>)> {
    let list = match input {
        Value::String(s) => return Ok((Vec::new(), vec![Message::user(s.clone())])),
        Value::Array(a) if !a.is_empty() => a,
        _ => {
            return Err(Refusal::invalid(
                "input",
                "must be a string or a non-empty list of items",
            ));
        }
    };
    let mut system = Vec::new();
    let mut convo: Vec<Message> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let here = format!("input[{i}]");
        let f = fields(item);
        let kind = f.get("type").and_then(Value::as_str).unwrap_or("message");
        let allowed: &[&str] = match kind {
            "message" => &["type", "role", "content", "id", "status"],
            "function_call" => &["type", "call_id", "name", "arguments", "id", "status"],
            "function_call_output" => &["type", "call_id", "output", "id", "status"],
            other => {
                return Err(Refusal::unsupported(
                    format!("{here}.type"),
                    format!(
                        "input items of type {other:?} are not accepted (message, function_call, function_call_output are)"
                    ),
                ));
            }
        };
        only_keys(&f, &here, &format!("{kind} item"), allowed)?;
        let content = f.get("content").cloned().unwrap_or(Value::Null);
        match kind {
            "message" => {
                let at = format!("{here}.content");
                match f.get("role").and_then(Value::as_str) {
                    Some("system" | "developer") => system.push(text_of(&at, &content)?),
                    Some("user") => convo.push(user_message(&at, &content)?),
                    Some("assistant") => {
                        let text = text_of(&at, &content)?;
                        if !text.is_empty() {
                            convo.push(Message::assistant(text));
                        }
                    }
                    _ => {
                        return Err(Refusal::invalid(
                            format!("{here}.role"),
                            "must be user, assistant, system or developer",
                        ));
                    }
                }
            }
            "function_call" => {
                let get = |k: &str| {
                    f.get(k)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| Refusal::missing(&format!("{here}.{k}")))
                };
                let call = ToolCall {
                    id: get("call_id")?,
                    name: get("name")?,
                    arguments: get("arguments")?,
                };
                match convo.last_mut() {
                    Some(last) if last.role == Role::Assistant => {
                        last.content.push(ContentBlock::ToolCall(call));
                    }
                    _ => convo.push(Message {
                        role: Role::Assistant,
                        content: vec![ContentBlock::ToolCall(call)].into(),
                        usage: None,
                    }),
                }
            }
            _ => {
                let id = f
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refusal::missing(&format!("{here}.call_id")))?;
                let output = text_of(
                    &format!("{here}.output"),
                    f.get("output").unwrap_or(&Value::Null),
                )?;
                push_result(&mut convo, id, output);
            }
        }
    }
    Ok((system, convo))
}

fn usage(v: &Value) -> Value {
    let input = v["input_tokens"].as_u64().unwrap_or(0);
    let output = v["output_tokens"].as_u64().unwrap_or(0);
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": v["cached_input_tokens"].as_u64().unwrap_or(0)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

fn call_items(session: &str, calls: &[Value]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            json!({
                "type": "function_call",
                "id": format!("fc_{}", uuid::Uuid::new_v4().simple()),
                "call_id": crate::oai_request::client_call_id(session, c["call_id"].as_str().unwrap_or_default()),
                "name": c["tool"],
                "arguments": c["arguments"].as_str().unwrap_or("{}"),
                "status": "completed",
            })
        })
        .collect()
}

/// The response object.
struct Shape {
    /// What the resumed turn had spent before this request (`Planned::before`).
    before: hame::Usage,
    id: String,
    created: i64,
    model: String,
    req: Request,
    previous: Option<String>,
}

impl Shape {
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, error: Value) -> Value {
        let p = &self.req.parsed;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": null,
            "instructions": p.instructions,
            "max_output_tokens": p.max_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": self.previous,
            "reasoning": null,
            "store": true,
            "temperature": p.temperature,
            "text": self.req.text,
            "tool_choice": self.req.tool_choice,
            "tools": self.req.tools,
            "top_p": null,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": self.req.metadata,
        })
    }
}

/// What a turn's outcome makes: the output items and the usage, or an error.
fn outcome_output(
    shape: &Shape,
    session: &str,
    outcome: Result<Outcome, tokio::sync::oneshot::error::RecvError>,
) -> Result<(Vec<Value>, Value), ApiError> {
    let msg_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    match outcome {
        Ok(Outcome::Finished(v)) => {
            let text = final_text(
                shape.req.parsed.reply_format.as_ref(),
                v["reply"].as_str().unwrap_or_default(),
            )?;
            Ok((
                vec![message_item(&msg_id, &text, "completed")],
                usage(&spent_since(&v["usage"], &shape.before)),
            ))
        }
        Ok(Outcome::Suspended(v)) => {
            let (client, approvals) = split_suspended(&v);
            let text = approval_text(session, &approvals);
            let mut out = Vec::new();
            if !text.is_empty() {
                out.push(message_item(&msg_id, &text, "completed"));
            }
            out.extend(call_items(session, &client));
            Ok((out, usage(&v["usage"])))
        }
        Ok(Outcome::Failed(e)) => Err(e),
        Err(_) => Err(ApiError::internal("the turn ended without an outcome")),
    }
}

#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    params(crate::openai::SessionHeader),
    request_body(content = crate::schemas::ResponseRequest, description = "An OpenAI Responses request; every field honoured or refused (docs/openai-compat.md)"),
    responses((status = 200, description = "A `response`, or with `stream: true` SSE events `response.created` ... `response.completed` / `response.failed`", content(
        (crate::schemas::ResponseObject = "application/json"),
        (crate::schemas::ResponseStreamEvent = "text/event-stream"))),))]
pub(crate) async fn create(
    State(shared): State<AppState>,
    Prologue {
        user,
        key,
        body,
        agent,
        req,
        headers,
    }: Prologue<Request>,
) -> Result<Response, ApiError> {
    let named = named_session(&headers).or_else(|| req.parsed.previous_response.clone());
    let previous = body["previous_response_id"].as_str().map(str::to_owned);
    let planned = plan(&shared, &agent, &user, named, &req.parsed, "resp-").await?;
    let stream = req.parsed.stream;
    let (turn, before) = planned.start(&shared, &agent, user, key)?;
    let session = turn.session.clone();
    let shape = Shape {
        before,
        id: response_id(&session),
        created: chrono::Utc::now().timestamp(),
        model: req.parsed.model.clone(),
        req,
        previous,
    };
    if !stream {
        let (output, usage) = outcome_output(&shape, &session, turn.outcome.await)?;
        let resp = Json(shape.object("completed", output, usage, Value::Null)).into_response();
        return Ok(with_session(resp, &session));
    }
    // Events: created, in_progress, (the message item and its text deltas), then the
    // items of the end and `response.completed` (or `response.failed`).
    let whole = turn.replayed || shape.req.parsed.reply_format.is_some();
    let msg_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let shape = std::sync::Arc::new(shape);
    let seq = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ev = {
        let seq = seq.clone();
        move |name: &str, mut data: Value| {
            if let Some(o) = data.as_object_mut() {
                o.insert("type".into(), json!(name));
                o.insert(
                    "sequence_number".into(),
                    json!(seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                );
            }
            SseEvent::default().event(name).data(data.to_string())
        }
    };
    let head = {
        let ev = ev.clone();
        let shape = shape.clone();
        futures::stream::iter(vec![
            ev(
                "response.created",
                json!({"response": shape.object("in_progress", vec![], Value::Null, Value::Null)}),
            ),
            ev(
                "response.in_progress",
                json!({"response": shape.object("in_progress", vec![], Value::Null, Value::Null)}),
            ),
        ])
    };
    // The message item opens at the first text delta.
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deltas = {
        let ev = ev.clone();
        let opened = opened.clone();
        let msg_id = msg_id.clone();
        futures::stream::unfold(turn.events, |mut rx| async move {
            rx.recv().await.map(|e| (e, rx))
        })
        .filter_map(move |e| {
            let mut out = Vec::new();
            if !whole
                && e.name == "text_delta"
                && let Ok(d) = serde_json::from_str::<Value>(&e.data)
            {
                if !opened.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    out.push(ev("response.output_item.added", json!({"output_index": 0, "item": message_item(&msg_id, "", "in_progress")})));
                    out.push(ev("response.content_part.added", json!({"output_index": 0, "item_id": msg_id, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
                }
                out.push(ev("response.output_text.delta", json!({"output_index": 0, "item_id": msg_id, "content_index": 0, "delta": d["text"], "logprobs": []})));
            }
            async move { (!out.is_empty()).then(|| futures::stream::iter(out)) }
        })
        .flatten()
    };
    let tail = {
        let outcome = turn.outcome;
        let session = session.clone();
        futures::stream::once(async move {
            let mut out = Vec::new();
            match outcome_output(&shape, &session, outcome.await) {
                Ok((mut output, usage)) => {
                    let was_open = opened.load(std::sync::atomic::Ordering::Relaxed);
                    // The streamed message keeps its id; its text is the final one.
                    if let Some(first) = output.first_mut()
                        && first["type"] == "message"
                        && was_open
                        && let Some(o) = first.as_object_mut()
                    {
                        o.insert("id".into(), json!(msg_id));
                    }
                    if was_open && !output.first().is_some_and(|o| o["type"] == "message") {
                        output.insert(0, message_item(&msg_id, "", "completed"));
                    }
                    for (i, item) in output.iter().enumerate() {
                        let streamed = i == 0 && was_open;
                        if !streamed {
                            out.push(ev("response.output_item.added", json!({"output_index": i, "item": item})));
                        }
                        if item["type"] == "message" {
                            let text = item["content"][0]["text"].clone();
                            let id = item["id"].clone();
                            if !streamed {
                                out.push(ev("response.content_part.added", json!({"output_index": i, "item_id": id, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
                                out.push(ev("response.output_text.delta", json!({"output_index": i, "item_id": id, "content_index": 0, "delta": text, "logprobs": []})));
                            }
                            out.push(ev("response.output_text.done", json!({"output_index": i, "item_id": id, "content_index": 0, "text": text, "logprobs": []})));
                            out.push(ev("response.content_part.done", json!({"output_index": i, "item_id": id, "content_index": 0, "part": item["content"][0]})));
                        } else {
                            out.push(ev("response.function_call_arguments.delta", json!({"output_index": i, "item_id": item["id"], "delta": item["arguments"]})));
                            out.push(ev("response.function_call_arguments.done", json!({"output_index": i, "item_id": item["id"], "name": item["name"], "arguments": item["arguments"]})));
                        }
                        out.push(ev("response.output_item.done", json!({"output_index": i, "item": item})));
                    }
                    out.push(ev("response.completed", json!({"response": shape.object("completed", output, usage, Value::Null)})));
                }
                Err(e) => {
                    let error = json!({"code": e.code, "message": e.message});
                    out.push(ev("response.failed", json!({"response": shape.object("failed", vec![], Value::Null, error)})));
                }
            }
            futures::stream::iter(out)
        })
        .flatten()
    };
    let all = head.chain(deltas).chain(tail).map(Ok::<_, Infallible>);
    let mut resp = Sse::new(all)
        .keep_alive(KeepAlive::new().interval(shared.options.keep_alive))
        .into_response();
    if let Ok(v) = session.parse() {
        resp.headers_mut().insert("x-hame-session", v);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;
    use crate::oai_request::Tail;

    #[test]
    fn response_ids_carry_their_session() {
        let id = response_id("resp-abc.d");
        assert_eq!(session_of(&id).as_deref(), Some("resp-abc.d"));
        assert_eq!(session_of("resp_zz_1"), None);
        assert_eq!(session_of("chatcmpl_1"), None);
    }

    #[test]
    fn items_become_the_conversation_and_unknown_fields_are_refused() -> Result<(), Refusal> {
        let body = json!({
            "model": "hame",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use SI units."},
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": "{}", "status": "completed"},
                {"type": "function_call_output", "call_id": "c1", "output": "5 C"}
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}, "strict": true}],
            "include": [],
        });
        let r = parse(&body, &[])?;
        assert_eq!(
            r.parsed.instructions.as_deref(),
            Some("Be brief.\n\nUse SI units.")
        );
        assert_eq!(
            r.parsed.tail,
            Tail::ToolResults(vec![("c1".into(), "5 C".into())])
        );
        assert_eq!(r.parsed.history.len(), 2);
        for (extra, param) in [
            (json!({"reasoning": {"effort": "low"}}), "reasoning"),
            (json!({"store": false}), "store"),
            (json!({"include": ["file_search_call.results"]}), "include"),
            (json!({"text": {"verbosity": "low"}}), "text.verbosity"),
            (
                json!({"tool_choice": {"type": "function", "name": "x"}}),
                "tool_choice",
            ),
        ] {
            let mut b = json!({"model": "hame", "input": "hi"});
            if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            assert_eq!(
                parse(&b, &[]).map(|_| ()).map_err(|r| r.param),
                Err(param.to_owned()),
                "{extra}"
            );
        }
        let b = json!({"model": "hame", "input": [{"type": "input_image", "image_url": "x"}]});
        assert_eq!(
            parse(&b, &[]).map(|_| ()).map_err(|r| r.param),
            Err("input[0].type".to_owned())
        );
        Ok(())
    }

    /// A 1x1 GIF.
    const GIF: &str = "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7";

    #[test]
    fn an_input_image_joins_the_user_message_and_other_urls_are_refused() -> Result<(), Refusal> {
        let url = format!("data:image/gif;base64,{GIF}");
        let body = json!({"model": "hame", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": url, "detail": "auto"}
        ]}]});
        let r = parse(&body, &[])?;
        let expected = Message::user_with_images(
            "what is this?",
            vec![hame::ImageBlock {
                media_type: "image/gif".into(),
                data: GIF.into(),
            }],
        );
        assert_eq!(r.parsed.tail, Tail::User(expected));
        for (part, code, param) in [
            (
                json!({"type": "input_image", "image_url": "https://example.com/a.gif"}),
                "unsupported_parameter",
                "input[0].content[0].image_url",
            ),
            (
                json!({"type": "input_image", "image_url": "file:///etc/passwd", "detail": "auto"}),
                "unsupported_parameter",
                "input[0].content[0].image_url",
            ),
            (
                json!({"type": "input_image", "file_id": "file-1", "detail": "auto"}),
                "unsupported_parameter",
                "input[0].content[0].file_id",
            ),
            (
                json!({"type": "input_image", "image_url": url, "detail": "low"}),
                "unsupported_parameter",
                "input[0].content[0].detail",
            ),
            (
                json!({"type": "input_image", "detail": "auto"}),
                "missing_required_parameter",
                "input[0].content[0].image_url",
            ),
            (
                json!({"type": "input_image", "image_url": {"url": url}}),
                "invalid_value",
                "input[0].content[0].image_url",
            ),
        ] {
            let b =
                json!({"model": "hame", "input": [{"role": "user", "content": [part.clone()]}]});
            let refused = parse(&b, &[]).map(|_| ()).map_err(|r| (r.code, r.param));
            assert_eq!(refused, Err((code, param.to_owned())), "{part}");
        }
        // Not in an assistant or developer message.
        for role in ["assistant", "developer"] {
            let b = json!({"model": "hame", "input": [
                {"role": role, "content": [{"type": "input_image", "image_url": url}]},
                {"role": "user", "content": "hi"}
            ]});
            assert_eq!(
                parse(&b, &[]).map(|_| ()).map_err(|r| r.param),
                Err("input[0].content[0]".to_owned()),
                "{role}"
            );
        }
        Ok(())
    }
}
