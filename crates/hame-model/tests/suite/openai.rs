//! OpenAI Chat Completions over the wire.

use hame_core::{ContentBlock, Message, Model, ModelEvent, StopReason, ToolCall, ToolResult};
use hame_model::OpenAiModel;
use hame_test_support::{ScriptStep, ScriptToolCall, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[tokio::test]
async fn text_reply_streamed_and_whole() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("Hello there, friend.").with_usage(12, 5));
    server.push(ScriptStep::text("Second.").with_usage(20, 2));
    let model = OpenAiModel::new(openai_config(&server))?;

    let events = stream_events(&model, request("hi")).await?;
    let text_pieces = events
        .iter()
        .filter(|e| matches!(e, ModelEvent::TextDelta(_)))
        .count();
    assert!(text_pieces > 1, "text should arrive in several chunks");
    assert_text_reply(&events, "Hello there, friend.", (12, 5, 0));

    let whole = model.complete(request("again")).await?;
    assert_eq!(whole.message.text_content(), "Second.");
    assert_eq!(whole.usage.map(|u| u.total()), Some(22));

    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(reqs[0].body["stream"], json!(true));
    assert_eq!(
        reqs[0].body["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(reqs[1].body["stream"], json!(false));
    assert_eq!(
        reqs[0].body["messages"],
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}])
    );
    Ok(())
}

#[tokio::test]
async fn tool_loop_request_mapping() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::tool_call(
        "call_abc",
        "ls",
        json!({"path": "src"}),
    ));
    server.push(ScriptStep::text("src has main.rs"));
    let model = OpenAiModel::new(openai_config(&server))?;

    let mut req = request("what is in src?");
    let first = model.complete(req.clone()).await?;
    assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
    let calls: Vec<ToolCall> = first.message.tool_calls().cloned().collect();
    assert_eq!(
        calls,
        vec![ToolCall {
            id: "call_abc".into(),
            name: "ls".into(),
            arguments: r#"{"path":"src"}"#.into()
        }]
    );
    req.messages.push(first.message);
    req.messages.push(Message::tool_results(vec![ToolResult {
        id: "call_abc".into(),
        content: "main.rs".into(),
        is_error: false,
        code: None,
    }]));
    let second = stream_events(&model, req).await?;
    assert_eq!(assemble(&second).message.text_content(), "src has main.rs");

    let reqs = server.requests();
    assert_eq!(
        reqs[0].body["tools"],
        json!([{"type": "function", "function": {
            "name": "ls", "description": "List a directory",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
    );
    assert_eq!(
        reqs[1].body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "what is in src?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":\"src\"}"}}]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "main.rs"}
        ])
    );
    Ok(())
}

#[tokio::test]
async fn parallel_tool_calls_with_split_argument_deltas() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(
        ScriptStep::tool_calls(vec![
            ScriptToolCall::new("call_1", "ls", &json!({"path": "a/long/enough/path"})),
            ScriptToolCall::new("call_2", "ls", &json!({"path": "b"})),
            ScriptToolCall::new(
                "call_3",
                "read_file",
                &json!({"path": "c.txt", "limit": 10}),
            ),
        ])
        .with_text("Looking."),
    );
    let model = OpenAiModel::new(openai_config(&server))?;
    let events = stream_events(&model, request("look")).await?;
    let deltas_of_first = events
        .iter()
        .filter(|e| matches!(e, ModelEvent::ToolCallDelta { index: 0, .. }))
        .count();
    assert!(
        deltas_of_first >= 3,
        "arguments must arrive split: {events:?}"
    );
    let r = assemble(&events);
    assert_eq!(r.message.text_content(), "Looking.");
    let calls: Vec<(String, String, String)> = r
        .message
        .tool_calls()
        .map(|c| (c.id.clone(), c.name.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (
                "call_1".into(),
                "ls".into(),
                r#"{"path":"a/long/enough/path"}"#.into()
            ),
            ("call_2".into(), "ls".into(), r#"{"path":"b"}"#.into()),
            (
                "call_3".into(),
                "read_file".into(),
                r#"{"limit":10,"path":"c.txt"}"#.into()
            ),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn malformed_tool_arguments_pass_through_as_text() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::malformed_tool_call("call_bad", "read_file"));
    server.push(ScriptStep::malformed_tool_call("call_bad2", "read_file"));
    let model = OpenAiModel::new(openai_config(&server))?;
    let streamed = assemble(&stream_events(&model, request("x")).await?);
    let whole = model.complete(request("x")).await?;
    for r in [streamed, whole] {
        let call = r.message.tool_calls().next().cloned().ok_or("no call")?;
        assert_eq!(call.arguments, r#"{"path": "a.txt",,"#);
        assert!(call.parse_arguments().is_err());
    }
    Ok(())
}

#[tokio::test]
async fn reasoning_content_is_read() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::reasoning("Let me think.", None, "42"));
    let model = OpenAiModel::new(openai_config(&server))?;
    let r = assemble(&stream_events(&model, request("q")).await?);
    assert_eq!(
        *r.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Let me think.".into(),
                signature: None
            },
            ContentBlock::Text { text: "42".into() },
        ]
    );
    Ok(())
}

#[tokio::test]
async fn no_key_sends_no_authorization_header() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("local"));
    let model = OpenAiModel::new(hame_model::OpenAiConfig {
        api_key: None,
        ..openai_config(&server)
    })?;
    assert_eq!(
        model.complete(request("x")).await?.message.text_content(),
        "local"
    );
    assert_eq!(server.requests()[0].header("authorization"), None);
    Ok(())
}
