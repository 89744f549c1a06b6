//! Anthropic Messages over the wire.

use hame_core::{ContentBlock, Message, Model, ModelEvent, StopReason, ToolCall, ToolResult};
use hame_model::AnthropicModel;
use hame_test_support::{ScriptStep, ScriptToolCall, ScriptUsage, ScriptedServer};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

#[tokio::test]
async fn text_reply_streamed_and_whole() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(
        ScriptStep::text("Hello there, friend.").with_cached_usage(ScriptUsage {
            input_tokens: 30,
            output_tokens: 6,
            cached_input_tokens: 10,
        }),
    );
    server.push(ScriptStep::text("Second."));
    let model = AnthropicModel::new(anthropic_config(&server))?;

    let events = stream_events(&model, request("hi")).await?;
    assert_text_reply(&events, "Hello there, friend.", (30, 6, 10));
    let whole = model.complete(request("again")).await?;
    assert_eq!(whole.message.text_content(), "Second.");

    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/v1/messages");
    assert_eq!(reqs[0].header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(reqs[0].header("authorization"), None);
    assert_eq!(reqs[0].body["system"], json!("You are terse."));
    assert_eq!(reqs[0].body["max_tokens"], json!(8192));
    assert_eq!(reqs[0].body["stream"], json!(true));
    assert_eq!(reqs[1].body["stream"], json!(false));
    assert_eq!(
        reqs[0].body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    Ok(())
}

#[tokio::test]
async fn tool_loop_with_thinking_signature_sent_back() -> TestResult {
    let server = ScriptedServer::start().await?;
    let mut step = ScriptStep::tool_calls(vec![
        ScriptToolCall::new("toolu_1", "ls", &json!({"path": "src"})),
        ScriptToolCall::new("toolu_2", "ls", &json!({"path": "tests/some/deeper/dir"})),
    ]);
    if let hame_test_support::Reply::Message { reasoning, .. } = &mut step.reply {
        *reasoning = Some(hame_test_support::ScriptReasoning {
            text: "Two dirs to check.".into(),
            signature: Some("EqQBCgIYAhIM".into()),
        });
    }
    server.push(step);
    server.push(ScriptStep::text("done"));
    let model = AnthropicModel::new(anthropic_config(&server))?;

    let mut req = request("what is in src and tests?");
    let events = stream_events(&model, req.clone()).await?;
    let split = events
        .iter()
        .filter(|e| matches!(e, ModelEvent::ToolCallDelta { .. }))
        .count();
    assert!(split >= 4, "input_json_delta must arrive split: {events:?}");
    let first = assemble(&events);
    assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
    assert_eq!(
        *first.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Two dirs to check.".into(),
                signature: Some("EqQBCgIYAhIM".into())
            },
            ContentBlock::ToolCall(ToolCall {
                id: "toolu_1".into(),
                name: "ls".into(),
                arguments: r#"{"path":"src"}"#.into()
            }),
            ContentBlock::ToolCall(ToolCall {
                id: "toolu_2".into(),
                name: "ls".into(),
                arguments: r#"{"path":"tests/some/deeper/dir"}"#.into()
            }),
        ]
    );
    req.messages.push(first.message);
    req.messages.push(Message::tool_results(vec![
        ToolResult {
            id: "toolu_1".into(),
            content: "main.rs".into(),
            is_error: false,
            code: None,
        },
        ToolResult {
            id: "toolu_2".into(),
            content: "Error [file_not_found]: no such dir".into(),
            is_error: true,
            code: Some("file_not_found".into()),
        },
    ]));
    let second = model.complete(req).await?;
    assert_eq!(second.message.text_content(), "done");

    let reqs = server.requests();
    assert_eq!(
        reqs[0].body["tools"],
        json!([{"name": "ls", "description": "List a directory",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}])
    );
    assert_eq!(
        reqs[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "what is in src and tests?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two dirs to check.", "signature": "EqQBCgIYAhIM"},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "src"}},
                {"type": "tool_use", "id": "toolu_2", "name": "ls", "input": {"path": "tests/some/deeper/dir"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "main.rs"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Error [file_not_found]: no such dir", "is_error": true}
            ]}
        ])
    );
    Ok(())
}

#[tokio::test]
async fn malformed_tool_arguments_pass_through_as_text() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::malformed_tool_call("toolu_bad", "read_file"));
    let model = AnthropicModel::new(anthropic_config(&server))?;
    let r = assemble(&stream_events(&model, request("x")).await?);
    let call = r.message.tool_calls().next().cloned().ok_or("no call")?;
    assert_eq!(call.arguments, r#"{"path": "a.txt",,"#);
    assert!(call.parse_arguments().is_err());
    Ok(())
}

/// Prompt caching over the wire: every request of a tool loop carries the breakpoints,
/// and the cached figures of the response come back in the usage.
#[tokio::test]
async fn prompt_caching_marks_the_prefix_and_reads_cached_usage() -> TestResult {
    let server = ScriptedServer::start().await?;
    server.push(ScriptStep::text("cached").with_cached_usage(ScriptUsage {
        input_tokens: 3_000,
        output_tokens: 5,
        cached_input_tokens: 2_800,
    }));
    let model = AnthropicModel::new(AnthropicConfig {
        prompt_cache: true,
        ..anthropic_config(&server)
    })?;
    let mut req = request("hi");
    req.cache_key = Some("hame-00".into());
    let r = assemble(&stream_events(&model, req).await?);
    assert_eq!(
        r.usage.map(|u| (u.input_tokens, u.cached_input_tokens)),
        Some((3_000, 2_800))
    );
    let body = &server.requests()[0].body;
    let eph = json!({"type": "ephemeral"});
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "You are terse.", "cache_control": eph}])
    );
    assert_eq!(body["tools"][0]["cache_control"], eph);
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": eph}]}])
    );
    assert_eq!(body.get("prompt_cache_key"), None);
    Ok(())
}
