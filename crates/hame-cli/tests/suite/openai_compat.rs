//! The OpenAI-compatible routes of `hame serve`, black-box: every field a client sends is
//! honoured (what reaches the scripted model is asserted) or refused with 400 naming it;
//! client tools suspend and resume the turn; `response_format` is checked with one repair;
//! errors keep OpenAI's shape everywhere. Then the real clients from PyPI: the `openai`
//! SDK, LangChain's `ChatOpenAI` and the OpenAI Agents SDK.

use std::path::PathBuf;

use hame_test_support::{ScriptStep, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::serve::{Serve, Served, Sse, client, parse_sse, texts, ws_log};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn post(url: &str, body: Value) -> Result<(u16, Value), Box<dyn std::error::Error>> {
    let r = client().post(url).json(&body).send().await?;
    let status = r.status().as_u16();
    Ok((status, r.json().await?))
}

/// [`post`] that must answer 200: the body.
async fn post_ok(url: &str, body: Value) -> Result<Value, Box<dyn std::error::Error>> {
    let (status, got) = post(url, body).await?;
    assert_eq!(status, 200, "{got}");
    Ok(got)
}

/// The body of a response that must have `status`.
async fn answered(r: reqwest::Response, status: u16) -> Result<Value, Box<dyn std::error::Error>> {
    assert_eq!(r.status(), status);
    Ok(r.json().await?)
}

/// The error message of an OpenAI-shaped error body contains `part`.
fn assert_message_has(body: &Value, part: &str) {
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(part),
        "{body}"
    );
}

/// The events of a streamed response of one output item: `item` (the item's own events)
/// between the item's `added` and `done`.
fn one_item(item: &[&'static str]) -> Vec<&'static str> {
    let mut all = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ];
    all.extend_from_slice(item);
    all.extend(["response.output_item.done", "response.completed"]);
    all
}

/// The JSON body of a GET of `url`.
async fn get_json(url: &str) -> Result<Value, Box<dyn std::error::Error>> {
    Ok(client().get(url).send().await?.json().await?)
}

/// POSTs `body` to `url` as `user` (`x-hame-user`).
async fn post_as(url: &str, user: &str, body: &Value) -> reqwest::Result<reqwest::Response> {
    client()
        .post(url)
        .header("x-hame-user", user)
        .json(body)
        .send()
        .await
}

/// The SSE events of a streamed POST of `body` to `url`.
async fn stream(url: &str, body: Value) -> Result<Vec<Sse>, Box<dyn std::error::Error>> {
    let r = client().post(url).json(&body).send().await?;
    Ok(parse_sse(&r.text().await?))
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false},
        "strict": true
    }})
}

/// The model's request messages as `role: text` lines (tool calls and results named).
fn seen(req: &hame_test_support::RecordedRequest) -> Vec<String> {
    req.body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter(|m| m["role"] != "system")
                .map(|m| {
                    let mut line = format!(
                        "{}: {}",
                        m["role"].as_str().unwrap_or(""),
                        m["content"].as_str().unwrap_or("")
                    );
                    for c in m["tool_calls"].as_array().into_iter().flatten() {
                        line.push_str(&format!(
                            "[call {} {}]",
                            c["function"]["name"].as_str().unwrap_or(""),
                            c["function"]["arguments"].as_str().unwrap_or("")
                        ));
                    }
                    line
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The names of the tools offered in a recorded request.
fn tool_names(req: &hame_test_support::RecordedRequest) -> Vec<String> {
    super::common::tool_names(&req.body)
}

#[tokio::test]
async fn chat_completions_honour_system_history_and_client_tools() -> TestResult {
    let t = Served::start([
        ScriptStep::tool_call("call_w1", "get_weather", json!({"city": "Oslo"})),
        ScriptStep::text("It is 5 C in Oslo."),
    ])
    .await?;
    let url = t.at("/v1/chat/completions");
    // A new session from the client's history, its system message and a client tool.
    let history = json!([
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "I live in Oslo."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Weather?"}
    ]);
    let body = post_ok(
        &url,
        json!({"model": "hame", "messages": history, "tools": [weather_tool()]}),
    )
    .await?;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["refusal"], Value::Null);
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Oslo\"}");
    let call_id = call["id"].as_str().ok_or("no call id")?.to_owned();
    let first = &t.model().requests()[0];
    assert!(
        first
            .system_text()
            .contains("## Caller instructions\n\nAnswer in one sentence."),
        "{}",
        first.system_text()
    );
    assert_eq!(
        seen(first),
        vec![
            "user: I live in Oslo.",
            "assistant: Noted.",
            "user: Weather?"
        ]
    );
    assert!(tool_names(first).contains(&"get_weather".to_owned()));
    assert!(
        tool_names(first).contains(&"read_file".to_owned()),
        "hame's tools stay"
    );
    // The client runs the tool and resends everything: the turn resumes, no header needed.
    let mut resent = history.as_array().cloned().unwrap_or_default();
    resent.extend([
        json!({"role": "assistant", "content": null, "tool_calls": [call]}),
        json!({"role": "tool", "tool_call_id": call_id, "content": "5 C, cloudy"}),
    ]);
    let body = post_ok(
        &url,
        json!({"model": "hame", "messages": resent, "tools": [weather_tool()]}),
    )
    .await?;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "It is 5 C in Oslo."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let second = &t.model().requests()[1];
    let lines = seen(second);
    assert_eq!(lines.last().map(String::as_str), Some("tool: 5 C, cloudy"));
    assert_eq!(t.model().requests().len(), 2);
    // The session's log has the whole conversation, recorded once.
    let sessions: Vec<_> = std::fs::read_dir(t.path().join("ws/agents/hame/sessions"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log.jsonl"))
        .collect();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let session = sessions[0].trim_end_matches(".log.jsonl");
    assert_eq!(
        texts(&ws_log(t.path(), None, session)),
        vec![
            "user: I live in Oslo.",
            "assistant: Noted.",
            "user: Weather?",
            "assistant: ",
            "tool: ",
            "assistant: It is 5 C in Oslo."
        ]
    );
    // A result for a call nobody made is a conflict, not a new turn.
    let (status, body) = post(&url, json!({
        "model": "hame",
        "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": call_id, "content": "again"}]
    })).await?;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["type"], "conflict_error");
    Ok(())
}

#[tokio::test]
async fn chat_completions_keep_a_named_session_and_refuse_a_contradicting_history() -> TestResult {
    let t = Served::start([
        ScriptStep::text("one"),
        ScriptStep::text("two"),
        ScriptStep::text("three"),
    ])
    .await?;
    let url = t.at("/v1/chat/completions");
    let c = client();
    let send = |body: Value| {
        c.post(&url)
            .header("x-hame-session", "named")
            .json(&body)
            .send()
    };
    let r = send(json!({"model": "hame", "messages": [{"role": "user", "content": "a"}]})).await?;
    assert_eq!(r.status(), 200);
    // The whole history again: only the new message joins.
    let r = send(json!({"model": "hame", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "one"}, {"role": "user", "content": "b"}
    ]})).await?;
    assert_eq!(r.status(), 200);
    // Only the new message: fine too.
    let r = send(json!({"model": "hame", "messages": [{"role": "user", "content": "c"}]})).await?;
    assert_eq!(r.status(), 200);
    assert_eq!(
        texts(&ws_log(t.path(), None, "named")),
        vec![
            "user: a",
            "assistant: one",
            "user: b",
            "assistant: two",
            "user: c",
            "assistant: three"
        ]
    );
    // A history that says something else is refused; nothing joins the session.
    let body = answered(send(json!({"model": "hame", "messages": [
        {"role": "user", "content": "not a"}, {"role": "assistant", "content": "one"}, {"role": "user", "content": "d"}
    ]})).await?, 409).await?;
    assert_eq!(body["error"]["code"], "history_mismatch");
    assert_message_has(&body, "user message 1");
    assert_eq!(t.model().requests().len(), 3);
    Ok(())
}

#[tokio::test]
async fn chat_completions_check_the_reply_format_with_one_repair() -> TestResult {
    let t = Served::start([
        ScriptStep::text("Sure! The answer is 4."),
        ScriptStep::text("{\"answer\": 4}"),
        ScriptStep::text("nope"),
        ScriptStep::text("still nope"),
    ])
    .await?;
    let url = t.at("/v1/chat/completions");
    let format = json!({"type": "json_schema", "json_schema": {"name": "answer", "strict": true, "schema": {
        "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": false
    }}});
    let body = post_ok(&url, json!({
        "model": "hame", "response_format": format, "messages": [{"role": "user", "content": "2+2?"}]
    })).await?;
    assert_eq!(body["choices"][0]["message"]["content"], "{\"answer\": 4}");
    let reqs = t.model().requests();
    assert!(
        reqs[0].system_text().contains("## Reply format"),
        "{}",
        reqs[0].system_text()
    );
    assert!(reqs[0].system_text().contains("\"answer\""));
    // The repair request shows the model its bad reply and what is wrong.
    let repair = seen(&reqs[1]);
    assert_eq!(repair[1], "assistant: Sure! The answer is 4.");
    assert!(
        repair[2].starts_with("user: Your reply does not have the required format"),
        "{repair:?}"
    );
    // Twice wrong: an error in OpenAI's shape, streamed too.
    let r = client().post(&url).json(&json!({
        "model": "hame", "stream": true, "response_format": format, "messages": [{"role": "user", "content": "2+2?"}]
    })).send().await?;
    assert_eq!(r.status(), 200);
    let events = parse_sse(&r.text().await?);
    let err = events
        .iter()
        .find(|e| e.data.get("error").is_some())
        .ok_or("no error event")?;
    assert_eq!(err.data["error"]["code"], "reply_format_mismatch");
    assert_eq!(err.data["error"]["type"], "server_error");
    assert!(
        events
            .iter()
            .all(|e| e.data["choices"][0]["delta"]["content"] != "nope"),
        "a bad reply is never streamed"
    );
    // A schema keyword hame does not check is refused up front.
    let (status, body) = post(&url, json!({
        "model": "hame", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "patternProperties": {}}}}
    })).await?;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "response_format.json_schema.schema");
    Ok(())
}

#[tokio::test]
async fn chat_completions_refuse_what_they_cannot_honour_in_openai_error_shape() -> TestResult {
    let t = Served::start([ScriptStep::text("plain"), ScriptStep::text("usage")]).await?;
    let url = t.at("/v1/chat/completions");
    let msg = json!([{"role": "user", "content": "hi"}]);
    for (body, param, code) in [
        (
            json!({"model": "hame", "messages": msg, "stream": "true"}),
            "stream",
            "invalid_value",
        ),
        (
            json!({"model": "hame", "messages": msg, "n": 3}),
            "n",
            "unsupported_parameter",
        ),
        (
            json!({"model": "hame", "messages": msg, "seed": 7}),
            "seed",
            "unsupported_parameter",
        ),
        (
            json!({"model": "hame", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
            ]}]}),
            "messages[0].content[1].image_url.url",
            "unsupported_parameter",
        ),
        (
            json!({"model": "hame", "messages": msg, "tools": [{"type": "function", "function": {"name": "read_file"}}]}),
            "tools[0].function.name",
            "invalid_value",
        ),
    ] {
        let (status, got) = post(&url, body.clone()).await?;
        assert_eq!(status, 400, "{body}");
        let keys: Vec<&String> = got["error"]
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        assert_eq!(keys, vec!["code", "message", "param", "type"], "{got}");
        assert_eq!(
            (
                got["error"]["param"].as_str(),
                got["error"]["code"].as_str()
            ),
            (Some(param), Some(code)),
            "{got}"
        );
        assert_eq!(got["error"]["type"], "invalid_request_error");
    }
    assert_eq!(
        t.model().requests().len(),
        0,
        "nothing refused reached the model"
    );
    // Usage is streamed only when asked for; `refusal` is always there.
    let chunks = stream(
        &url,
        json!({"model": "hame", "messages": msg, "stream": true}),
    )
    .await?;
    assert!(
        chunks.iter().all(|c| c.data.get("usage").is_none()),
        "usage without include_usage"
    );
    assert_eq!(
        chunks[0].data["choices"][0]["delta"]["refusal"],
        Value::Null
    );
    let chunks = stream(&url, json!({"model": "hame", "messages": msg, "stream": true, "stream_options": {"include_usage": true}})).await?;
    let usage: Vec<&Value> = chunks.iter().filter_map(|c| c.data.get("usage")).collect();
    assert_eq!(usage.len(), 1);
    assert!(usage[0]["total_tokens"].as_u64().unwrap_or(0) > 0);
    // 405, 413, a bad query string, an unknown route: the same shape.
    let body = answered(client().get(&url).send().await?, 405).await?;
    assert_eq!(body["error"]["code"], "method_not_allowed");
    let big = "x".repeat(2 * 1024 * 1024);
    let body = answered(
        client()
            .post(&url)
            .header("content-type", "application/json")
            .body(big)
            .send()
            .await?,
        413,
    )
    .await?;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let body = answered(
        client()
            .get(t.at("/v1/sessions/s/events?after=notanumber"))
            .send()
            .await?,
        400,
    )
    .await?;
    assert_eq!(body["error"]["code"], "bad_request");
    assert_message_has(&body, "after");
    Ok(())
}

#[tokio::test]
async fn models_list_the_agent() -> TestResult {
    let t = Served::start([]).await?;
    let body = get_json(&t.at("/v1/models")).await?;
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], "hame");
    assert_eq!(body["data"][0]["object"], "model");
    assert_eq!(body["data"][0]["owned_by"], "hame");
    let r = client().get(t.at("/v1/models/hame")).send().await?;
    assert_eq!(r.status(), 200);
    let body = answered(client().get(t.at("/v1/models/gpt-4o")).send().await?, 404).await?;
    assert_eq!(body["error"]["code"], "model_not_found");
    Ok(())
}

#[tokio::test]
async fn responses_run_function_tools_and_continue_from_a_previous_response() -> TestResult {
    let t = Served::start([
        ScriptStep::tool_call("call_a", "add", json!({"a": 2, "b": 3})),
        ScriptStep::text("The sum is 5."),
        ScriptStep::text("Twice that is 10."),
        ScriptStep::text("streamed"),
    ])
    .await?;
    let url = t.at("/v1/responses");
    let tools = json!([{"type": "function", "name": "add", "description": "adds", "strict": true,
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false}}]);
    let body = post_ok(
        &url,
        json!({"model": "hame", "instructions": "Use the tools.", "input": "2+3?", "tools": tools}),
    )
    .await?;
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    let call = body["output"][0].clone();
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "add");
    let body = post_ok(
        &url,
        json!({"model": "hame", "tools": tools, "input": [
            {"role": "user", "content": "2+3?"},
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": "5"}
        ]}),
    )
    .await?;
    assert_eq!(body["output"][0]["content"][0]["text"], "The sum is 5.");
    assert!(body["usage"]["total_tokens"].as_u64().unwrap_or(0) > 0);
    assert!(
        t.model().requests()[0]
            .system_text()
            .contains("Use the tools.")
    );
    // previous_response_id: the same session, only the new input.
    let body = post_ok(
        &url,
        json!({"model": "hame", "input": "Double it.", "previous_response_id": body["id"]}),
    )
    .await?;
    assert_eq!(body["output"][0]["content"][0]["text"], "Twice that is 10.");
    let lines = seen(&t.model().requests()[2]);
    assert_eq!(lines.first().map(String::as_str), Some("user: 2+3?"));
    assert_eq!(lines.last().map(String::as_str), Some("user: Double it."));
    // Streamed: the events the Responses API names, in order.
    let events = stream(
        &url,
        json!({"model": "hame", "input": "go", "stream": true}),
    )
    .await?;
    let mut names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    names.dedup();
    assert_eq!(
        names,
        one_item(&[
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
        ])
    );
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|e| e.data["sequence_number"].as_u64())
        .collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<u64>>());
    let deltas: String = events
        .iter()
        .filter(|e| e.event == "response.output_text.delta")
        .filter_map(|e| e.data["delta"].as_str())
        .collect();
    assert_eq!(deltas, "streamed");
    let done = events.last().ok_or("no events")?;
    assert_eq!(
        done.data["response"]["output"][0]["content"][0]["text"],
        "streamed"
    );
    assert_eq!(done.data["response"]["status"], "completed");
    // A streamed function call: its item, its arguments, then the response.
    t.model().push(ScriptStep::tool_call(
        "call_s",
        "add",
        json!({"a": 1, "b": 1}),
    ));
    let events = stream(
        &url,
        json!({"model": "hame", "input": "1+1?", "stream": true, "tools": tools}),
    )
    .await?;
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        one_item(&[
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
        ])
    );
    assert_eq!(events[4].data["arguments"], "{\"a\":1,\"b\":1}");
    assert_eq!(
        events[6].data["response"]["output"][0]["type"],
        "function_call"
    );
    Ok(())
}

/// A Python venv with `requirement` (from PyPI), or `None` (loud SKIPPED; under CI a failure).
fn python(name: &str, requirement: &str, module: &str) -> Option<PathBuf> {
    super::common::python_venv(name, requirement, module)
}

/// Runs `script` with `py`, the server's `/v1` base URL as its argument; its stdout as JSON.
async fn run_py(
    py: PathBuf,
    dir: &std::path::Path,
    script: &str,
    base: String,
) -> Result<Value, Box<dyn std::error::Error>> {
    let path = dir.join(format!("client-{}.py", uuid_like()));
    std::fs::write(&path, script)?;
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(py).arg(path).arg(base).output()
    })
    .await??;
    if !out.status.success() {
        return Err(format!(
            "python failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

const OPENAI_SDK_PY: &str = r#"
import json, sys
from openai import OpenAI
from pydantic import BaseModel
client = OpenAI(base_url=sys.argv[1], api_key="unused")
out = {"models": [m.id for m in client.models.list()]}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
r = client.chat.completions.create(model="hame", messages=messages, tools=tools)
msg = r.choices[0].message
out["finish"] = r.choices[0].finish_reason
out["refusal"] = msg.refusal
call = msg.tool_calls[0]
out["call"] = [call.function.name, json.loads(call.function.arguments)]
messages.append(msg.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": "5 C"})
r = client.chat.completions.create(model="hame", messages=messages, tools=tools)
out["after_tool"] = r.choices[0].message.content
parts = []
for chunk in client.chat.completions.create(model="hame", messages=[{"role": "user", "content": "stream"}], stream=True):
    out.setdefault("chunk_usage", chunk.usage)
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
out["streamed"] = "".join(parts)
class Answer(BaseModel):
    answer: int
    unit: str
parsed = client.chat.completions.parse(model="hame", messages=[{"role": "user", "content": "2+2?"}], response_format=Answer)
out["parsed"] = parsed.choices[0].message.parsed.model_dump()
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_sdk_runs_tools_streams_and_parses_structured_output() -> TestResult {
    let Some(py) = python("openai-venv", "openai>=1.50,<3", "openai") else {
        return Ok(());
    };
    let t = Served::start([
        ScriptStep::tool_call("call_1", "get_weather", json!({"city": "Oslo"})),
        ScriptStep::text("5 C in Oslo."),
        ScriptStep::text("streamed text"),
        ScriptStep::text("{\"answer\": 4, \"unit\": \"none\"}"),
    ])
    .await?;
    let got = run_py(py, t.path(), OPENAI_SDK_PY, t.at("/v1")).await?;
    assert_eq!(got["models"], json!(["hame"]));
    assert_eq!(got["finish"], "tool_calls");
    assert_eq!(got["refusal"], Value::Null);
    assert_eq!(got["call"], json!(["get_weather", {"city": "Oslo"}]));
    assert_eq!(got["after_tool"], "5 C in Oslo.");
    assert_eq!(got["streamed"], "streamed text");
    assert_eq!(got["chunk_usage"], Value::Null);
    assert_eq!(got["parsed"], json!({"answer": 4, "unit": "none"}));
    let reqs = t.model().requests();
    assert!(reqs[0].system_text().contains("Be brief."));
    assert_eq!(seen(&reqs[1]).last().map(String::as_str), Some("tool: 5 C"));
    assert!(
        reqs[3].system_text().contains("\"unit\""),
        "the schema reached the model"
    );
    Ok(())
}

const LANGCHAIN_PY: &str = r#"
import json, sys
from langchain_openai import ChatOpenAI
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel
llm = ChatOpenAI(model="hame", base_url=sys.argv[1], api_key="unused", max_retries=0)
@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b
bound = llm.bind_tools([multiply])
messages = [HumanMessage("What is 6 times 7?")]
ai = bound.invoke(messages)
out = {"calls": [[c["name"], c["args"]] for c in ai.tool_calls]}
messages.append(ai)
for c in ai.tool_calls:
    messages.append(ToolMessage(str(multiply.invoke(c["args"])), tool_call_id=c["id"]))
out["final"] = bound.invoke(messages).content
class Person(BaseModel):
    name: str
    age: int
person = llm.with_structured_output(Person).invoke("Ann is 31.")
out["person"] = person.model_dump()
print(json.dumps(out))
"#;

#[tokio::test]
async fn langchain_binds_tools_and_gets_structured_output() -> TestResult {
    let Some(py) = python(
        "langchain-venv",
        "langchain-openai>=0.3,<2",
        "langchain_openai",
    ) else {
        return Ok(());
    };
    let t = Served::start([
        ScriptStep::tool_call("call_m", "multiply", json!({"a": 6, "b": 7})),
        ScriptStep::text("6 times 7 is 42."),
        ScriptStep::text("{\"name\": \"Ann\", \"age\": 31}"),
    ])
    .await?;
    let got = run_py(py, t.path(), LANGCHAIN_PY, t.at("/v1")).await?;
    assert_eq!(got["calls"], json!([["multiply", {"a": 6, "b": 7}]]));
    assert_eq!(got["final"], "6 times 7 is 42.");
    assert_eq!(got["person"], json!({"name": "Ann", "age": 31}));
    let reqs = t.model().requests();
    assert_eq!(seen(&reqs[1]).last().map(String::as_str), Some("tool: 42"));
    assert!(
        reqs[2].system_text().contains("\"age\""),
        "the schema reached the model"
    );
    Ok(())
}

const AGENTS_PY: &str = r#"
import asyncio, json, sys
from openai import AsyncOpenAI
from agents import Agent, Runner, function_tool, OpenAIResponsesModel, set_tracing_disabled
from pydantic import BaseModel
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=sys.argv[1], api_key="unused")
calls = []
@function_tool
def lookup_capital(country: str) -> str:
    """The capital of a country."""
    calls.append(country)
    return {"Norway": "Oslo"}.get(country, "unknown")
agent = Agent(name="helper", instructions="Answer briefly.", tools=[lookup_capital],
              model=OpenAIResponsesModel(model="hame", openai_client=client))
async def main():
    first = await Runner.run(agent, "Capital of Norway?")
    out = {"first": first.final_output, "calls": calls}
    second = await Runner.run(agent, first.to_input_list() + [{"role": "user", "content": "And its population?"}])
    out["second"] = second.final_output
    streamed = Runner.run_streamed(agent, "Say hi.")
    async for _ in streamed.stream_events():
        pass
    out["streamed"] = streamed.final_output
    class City(BaseModel):
        name: str
        population: int
    typed = Agent(name="typed", instructions="Answer with data.", output_type=City,
                  model=OpenAIResponsesModel(model="hame", openai_client=client))
    city = await Runner.run(typed, "Oslo?")
    out["city"] = city.final_output.model_dump()
    print(json.dumps(out))
asyncio.run(main())
"#;

#[tokio::test]
async fn the_agents_sdk_runs_a_function_tool_a_second_turn_and_structured_output() -> TestResult {
    let Some(py) = python("agents-venv", "openai-agents>=0.2,<1", "agents") else {
        return Ok(());
    };
    let t = Served::start([
        ScriptStep::tool_call("call_c", "lookup_capital", json!({"country": "Norway"})),
        ScriptStep::text("Oslo."),
        ScriptStep::text("About 700,000."),
        ScriptStep::text("Hi!"),
        ScriptStep::text("{\"name\": \"Oslo\", \"population\": 700000}"),
    ])
    .await?;
    let got = run_py(py, t.path(), AGENTS_PY, t.at("/v1")).await?;
    assert_eq!(got["calls"], json!(["Norway"]));
    assert_eq!(got["first"], "Oslo.");
    assert_eq!(got["second"], "About 700,000.");
    assert_eq!(got["streamed"], "Hi!");
    assert_eq!(got["city"], json!({"name": "Oslo", "population": 700000}));
    let reqs = t.model().requests();
    assert!(reqs[0].system_text().contains("Answer briefly."));
    assert_eq!(
        seen(&reqs[1]).last().map(String::as_str),
        Some("tool: Oslo")
    );
    // The second turn carries the first one's conversation.
    let second = seen(&reqs[2]);
    assert_eq!(
        second.first().map(String::as_str),
        Some("user: Capital of Norway?")
    );
    assert_eq!(
        second.last().map(String::as_str),
        Some("user: And its population?")
    );
    assert!(
        reqs[4].system_text().contains("\"population\""),
        "the output type's schema reached the model"
    );
    Ok(())
}

#[tokio::test]
async fn one_process_serves_two_agents_each_with_its_own_workspace_and_persona() -> TestResult {
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    // Each reply is given only to the agent whose prompt carries its persona.
    model.push_all([
        ScriptStep::text("Arr, a pirate answers.").when_system("You are a pirate."),
        ScriptStep::text("A poet answers, in verse.").when_system("You are a poet."),
    ]);
    let pirate = dir.path().join("ws");
    std::fs::create_dir_all(&pirate)?;
    std::fs::write(pirate.join("AGENTS.md"), "You are a pirate.\n")?;
    let poet = dir.path().join("poet-ws");
    std::fs::create_dir_all(&poet)?;
    std::fs::write(poet.join("AGENTS.md"), "You are a poet.\n")?;
    let spec = format!("poet={}", poet.display());
    let serve = Serve::start(dir.path(), &model.base_url(), &["--serve-agent", &spec])?;
    let body = get_json(&serve.at("/v1/models")).await?;
    let ids: Vec<&str> = body["data"]
        .as_array()
        .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec!["hame", "poet"]);
    let url = serve.at("/v1/chat/completions");
    let body = post_ok(
        &url,
        json!({"model": "poet", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await?;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "A poet answers, in verse."
    );
    assert_eq!(body["model"], "poet");
    let body = post_ok(
        &url,
        json!({"model": "hame", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await?;
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Arr, a pirate answers."
    );
    // Each agent's sessions live in its own workspace.
    let count = |ws: &std::path::Path, agent: &str| {
        std::fs::read_dir(ws.join(format!("agents/{agent}/sessions")))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".log.jsonl"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(
        (
            count(&poet, "poet"),
            count(&pirate, "hame"),
            count(&pirate, "poet")
        ),
        (1, 1, 0)
    );
    let (status, body) = post(
        &url,
        json!({"model": "sailor", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await?;
    assert_eq!(status, 404);
    assert_message_has(&body, "`poet`");
    Ok(())
}

const VALIDATE_OPENAPI_PY: &str = r#"
import json, sys, urllib.request
from openapi_spec_validator import validate
doc = json.load(urllib.request.urlopen(sys.argv[1] + "/openapi.json"))
validate(doc)
print(json.dumps({"openapi": doc["openapi"], "paths": sorted(doc["paths"])}))
"#;

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_validates() -> TestResult {
    let t = Served::start([]).await?;
    let doc = answered(client().get(t.at("/openapi.json")).send().await?, 200).await?;
    assert_eq!(doc["openapi"], "3.1.0");
    let post = &doc["paths"]["/v1/chat/completions"]["post"];
    assert!(
        post["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .is_some_and(|r| r.ends_with("/ErrorBody")),
        "{post}"
    );
    let Some(py) = python(
        "openapi-venv",
        "openapi-spec-validator>=0.7,<1",
        "openapi_spec_validator",
    ) else {
        return Ok(());
    };
    let base = t.at("");
    let got = run_py(py, t.path(), VALIDATE_OPENAPI_PY, base).await?;
    assert_eq!(got["openapi"], "3.1.0");
    let paths: Vec<&str> = got["paths"]
        .as_array()
        .map(|p| p.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(paths.len(), 42, "{paths:?}");
    assert!(
        paths.contains(&"/v1/responses") && paths.contains(&"/v1/models/{id}"),
        "{paths:?}"
    );
    Ok(())
}

/// Checks of the fuzz run: no 5xx, and every status, content type and body (JSON, and each
/// SSE event's data) as the document says.
const FUZZ_CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance";

#[tokio::test]
async fn a_bounded_schemathesis_run_finds_no_5xx_and_no_answer_outside_the_document() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    // Every model request is answered (text, or a tool call when a message asks for one).
    model.set_responder(hame_test_support::demo_reply);
    let other = dir.path().join("other-ws");
    std::fs::create_dir_all(&other)?;
    let spec = format!("other={}", other.display());
    let serve = Serve::start(dir.path(), &model.base_url(), &["--serve-agent", &spec])?;
    let Some(py) = python("schemathesis-venv", "schemathesis>=4.3,<5", "schemathesis") else {
        return Ok(());
    };
    let st = py.with_file_name("schemathesis");
    // The agent routes get a served agent (random ids would all be 404); an event stream
    // with `follow=true` stays open until the client goes away (each would wait for the
    // request timeout).
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        "[parameters]\n\"path.agent\" = \"other\"\n\"query.follow\" = false\n",
    )?;
    let started = std::time::Instant::now();
    let mut cmd = tokio::process::Command::new(st);
    cmd.arg("--config-file")
        .arg(&config)
        .args(["run", &serve.at("/openapi.json")])
        .args(["--checks", FUZZ_CHECKS])
        .args(["--phases", "coverage,fuzzing"])
        .args([
            "--max-examples",
            "10",
            "--max-time",
            "60",
            "--request-timeout",
            "20",
        ])
        .args([
            "--seed",
            "32",
            "--workers",
            "2",
            "--no-color",
            "--output-truncate",
            "false",
        ])
        .args(["-H", "X-Hame-User: fuzzer"])
        .current_dir(dir.path())
        .kill_on_drop(true);
    let out = tokio::time::timeout(std::time::Duration::from_secs(90), cmd.output())
        .await
        .map_err(|_| "schemathesis ran past 90 s")??;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems (exit {:?}):\n{text}\n{}\nserver: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        serve.stderr()
    );
    // Not a vacuous run: every operation tested, many cases, all passed.
    let tested = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Tested: "))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    // Every operation of the live document (at least the 39 of the session and OpenAI
    // routes; more as routes are added).
    let total = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Selected: "))
        .and_then(|n| n.split('/').nth(1))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    assert!(total >= 39, "{text}");
    assert_eq!(tested, total, "{text}");
    // "N generated, N passed" (or ", M skipped"): every generated case passed.
    let counts: Vec<usize> = text
        .lines()
        .find(|l| l.contains(" generated, "))
        .map(|l| {
            l.split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let cases = counts.first().copied().unwrap_or(0);
    assert!(cases >= 200, "only {cases} cases: {text}");
    assert_eq!(counts.get(1), Some(&cases), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(90));
    eprintln!(
        "schemathesis: {cases} cases over {tested} operations in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[tokio::test]
async fn each_answer_of_a_client_tool_round_trip_reports_its_own_usage() -> TestResult {
    let t = Served::start([
        ScriptStep::tool_call("call_1", "get_weather", json!({"city": "Oslo"})).with_usage(100, 7),
        ScriptStep::text("5 C in Oslo.").with_usage(130, 4),
    ])
    .await?;
    let url = t.at("/v1/chat/completions");
    let first = post_ok(
        &url,
        json!({"model": "hame", "tools": [weather_tool()], "messages": [{"role": "user", "content": "Weather?"}]}),
    ).await?;
    assert_eq!(first["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        first["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let id = first["choices"][0]["message"]["tool_calls"][0]["id"].clone();
    let second = post_ok(
        &url,
        json!({"model": "hame", "messages": [{"role": "tool", "tool_call_id": id, "content": "5 C"}]}),
    ).await?;
    // The second answer counts the second model call only: the two answers add up to the turn.
    assert_eq!(
        second["usage"],
        json!({"prompt_tokens": 130, "completion_tokens": 4, "total_tokens": 134, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    Ok(())
}

#[tokio::test]
async fn a_forged_or_foreign_tool_call_id_reaches_no_other_session() -> TestResult {
    let t = Served::start([ScriptStep::tool_call(
        "call_1",
        "get_weather",
        json!({"city": "Oslo"}),
    )])
    .await?;
    let url = t.at("/v1/chat/completions");
    let ask = json!({"model": "hame", "tools": [weather_tool()], "messages": [{"role": "user", "content": "Weather?"}]});
    let r = post_as(&url, "alice", &ask).await?;
    let body: Value = r.json().await?;
    let call_id = body["choices"][0]["message"]["tool_calls"][0]["id"]
        .as_str()
        .ok_or("no call")?
        .to_owned();
    let result = |id: &str| json!({"model": "hame", "messages": [{"role": "tool", "tool_call_id": id, "content": "5 C"}]});
    // Another user with alice's call id: the id names a session of *bob*, which waits for nothing.
    let body = answered(post_as(&url, "bob", &result(&call_id)).await?, 409).await?;
    assert_eq!(body["error"]["code"], "not_pending");
    // A forged id whose session is a path: refused as an id, nothing touched.
    let hex: String = "../alice".bytes().map(|b| format!("{b:02x}")).collect();
    let body = answered(
        post_as(&url, "bob", &result(&format!("hs_{hex}_call_1"))).await?,
        400,
    )
    .await?;
    assert_eq!(body["error"]["code"], "invalid_id");
    // Alice's call still waits, and her result resumes it.
    t.model().push(ScriptStep::text("5 C in Oslo."));
    let body = answered(post_as(&url, "alice", &result(&call_id)).await?, 200).await?;
    assert_eq!(body["choices"][0]["message"]["content"], "5 C in Oslo.");
    assert!(
        !t.path().join("ws/bob/agents/hame/sessions").exists()
            || std::fs::read_dir(t.path().join("ws/bob/agents/hame/sessions"))?.count() == 0
    );
    Ok(())
}

/// A 1x1 PNG, the bytes the clients attach.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

const IMAGES_PY: &str = r#"
import json, sys, openai
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1], api_key="unused")
png = "data:image/png;base64,PNG_B64"
out = {}
first = [{"role": "user", "content": [
    {"type": "text", "text": "What is in this image?"},
    {"type": "image_url", "image_url": {"url": png, "detail": "auto"}}]}]
r = client.chat.completions.create(model="hame", messages=first, extra_headers={"X-Hame-Session": "pics"})
out["first"] = r.choices[0].message.content
# The second turn resends the history, image included: recognised, not a conflict.
again = first + [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "And its colour?"}]
r = client.chat.completions.create(model="hame", messages=again, extra_headers={"X-Hame-Session": "pics"})
out["second"] = r.choices[0].message.content
# A history whose image differs from the session's is a conflict.
other = json.loads(json.dumps(again))
other[0]["content"][1]["image_url"]["url"] = "data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7"
try:
    client.chat.completions.create(model="hame", messages=other, extra_headers={"X-Hame-Session": "pics"})
    out["other"] = "accepted"
except openai.ConflictError as e:
    out["other"] = [e.status_code, e.body["code"]]
# A URL hame would have to fetch is refused, naming the field.
try:
    client.chat.completions.create(model="hame", messages=[{"role": "user", "content": [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}])
    out["http"] = "accepted"
except openai.BadRequestError as e:
    out["http"] = [e.status_code, e.body["code"], e.body["param"], e.body["message"]]
# The Responses route: an input_image part.
r = client.responses.create(model="hame", input=[{"role": "user", "content": [
    {"type": "input_text", "text": "Describe it."},
    {"type": "input_image", "image_url": png, "detail": "auto"}]}])
out["responses"] = r.output_text
print(json.dumps(out))
"#;

/// The official SDK sends an image as a data: URL: the scripted model's request carries it
/// with the exact bytes, the reply comes back, the session log holds the image block, a
/// resent history with the image is recognised (and one with another image is a conflict),
/// a URL to fetch is refused naming its field; the Responses route takes `input_image`.
#[tokio::test]
async fn the_openai_sdk_sends_images_inline_to_the_model() -> TestResult {
    let Some(py) = python("openai-venv", "openai>=1.50,<3", "openai") else {
        return Ok(());
    };
    let t = Served::start([
        ScriptStep::text("A single pixel."),
        ScriptStep::text("Red."),
        ScriptStep::text("A pixel, again."),
    ])
    .await?;
    let script = IMAGES_PY.replace("PNG_B64", PNG_B64);
    let got = run_py(py, t.path(), &script, t.at("/v1")).await?;
    assert_eq!(got["first"], "A single pixel.");
    assert_eq!(got["second"], "Red.");
    assert_eq!(got["other"], json!([409, "history_mismatch"]));
    assert_eq!(got["http"][0], 400);
    assert_eq!(got["http"][1], "unsupported_parameter");
    assert_eq!(got["http"][2], "messages[0].content[1].image_url.url");
    assert!(
        got["http"][3]
            .as_str()
            .is_some_and(|m| m.contains("send the image inline as a data: URL")),
        "{got}"
    );
    assert_eq!(got["responses"], "A pixel, again.");
    let image_part = json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{PNG_B64}")}});
    let reqs = t.model().requests();
    assert_eq!(reqs.len(), 3, "the refused requests reached no model");
    let user = |i: usize| -> Vec<Value> {
        reqs[i].body["messages"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["role"] == "user").cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(
        user(0),
        vec![json!({"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"}, image_part.clone()
        ]})]
    );
    // The second request: the image stays in the conversation, the new text follows.
    assert_eq!(user(1)[0], user(0)[0]);
    assert_eq!(
        user(1)[1],
        json!({"role": "user", "content": "And its colour?"})
    );
    assert_eq!(
        user(2),
        vec![json!({"role": "user", "content": [
            {"type": "text", "text": "Describe it."}, image_part
        ]})]
    );
    // The session log holds the image block as the model got it, once.
    let log = ws_log(t.path(), None, "pics");
    assert_eq!(
        texts(&log),
        vec![
            "user: What is in this image?",
            "assistant: A single pixel.",
            "user: And its colour?",
            "assistant: Red."
        ]
    );
    assert_eq!(
        log[0]["message"]["content"][1],
        json!({"type": "image", "media_type": "image/png", "data": PNG_B64})
    );
    Ok(())
}

/// A 1.2 MB image (1.6 MB of base64) is 413 under the default 1 MiB body limit and
/// reaches the model, bytes intact, with `--max-body` raised; past 5 MiB decoded it is
/// refused whatever the limit. (The scripted model server takes 2 MiB bodies.)
#[tokio::test]
async fn max_body_lets_a_larger_image_through_up_to_the_image_limit() -> TestResult {
    use base64::Engine as _;
    let image = |n: usize| {
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        bytes.resize(n, 7);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let body = |data: &str| {
        json!({"model": "hame", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "big?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}}
        ]}]})
    };
    let larger = image(1_200_000);
    let dir = tempfile::tempdir()?;
    let model = ScriptedServer::start().await?;
    model.push(ScriptStep::text("Big."));
    let small = Serve::start(dir.path(), &model.base_url(), &[])?;
    let (status, got) = post(&small.at("/v1/chat/completions"), body(&larger)).await?;
    assert_eq!(
        (status, &got["error"]["code"]),
        (413, &json!("body_too_large"))
    );
    drop(small);
    let other = tempfile::tempdir()?;
    let large = Serve::start(other.path(), &model.base_url(), &["--max-body", "16777216"])?;
    let url = large.at("/v1/chat/completions");
    let got = post_ok(&url, body(&larger)).await?;
    assert_eq!(got["choices"][0]["message"]["content"], "Big.");
    let sent = &model.requests()[0].body["messages"];
    let last = sent
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        last["content"][1]["image_url"]["url"],
        json!(format!("data:image/png;base64,{larger}"))
    );
    let (status, got) = post(&url, body(&image(5 * 1024 * 1024 + 1))).await?;
    assert_eq!(status, 400, "{got}");
    assert_eq!(
        got["error"]["param"],
        "messages[0].content[1].image_url.url"
    );
    assert_eq!(model.requests().len(), 1);
    Ok(())
}
