use hame_core::{
    ContentBlock, Message, ModelEvent, ModelParams, ModelRequest, ResponseAssembler, Role,
    StopReason, ToolCall, ToolResult, ToolSpec, Usage,
};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;
use crate::http::SseParser;

#[test]
fn request_mapping() -> Result<(), serde_json::Error> {
    let req = ModelRequest {
        system: "be brief".into(),
        messages: vec![
            Message::user("list files"),
            Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::Reasoning {
                        text: "hmm".into(),
                        signature: Some("sig".into()),
                    },
                    ContentBlock::Text {
                        text: "checking".into(),
                    },
                    ContentBlock::ToolCall(ToolCall {
                        id: "toolu_1".into(),
                        name: "ls".into(),
                        arguments: String::new(),
                    }),
                    ContentBlock::ToolCall(ToolCall {
                        id: "toolu_2".into(),
                        name: "read_file".into(),
                        arguments: "{broken".into(),
                    }),
                ]
                .into(),
                usage: None,
            },
            Message::tool_results(vec![
                ToolResult {
                    id: "toolu_1".into(),
                    content: "a".into(),
                    is_error: false,
                    code: None,
                },
                ToolResult {
                    id: "toolu_2".into(),
                    content: "bad json".into(),
                    is_error: true,
                    code: Some("invalid_arguments".into()),
                },
            ]),
            Message::user("thanks"),
        ],
        tools: vec![ToolSpec {
            name: "ls".into(),
            description: "list".into(),
            parameters: json!({"type": "object"}).into(),
        }],
        params: ModelParams {
            temperature: Some(0.0),
            max_tokens: None,
        },
    };
    let config = AnthropicConfig::new("claude-x");
    let body = serde_json::to_value(request_body(&config, &req, true))?;
    assert_eq!(
        body,
        json!({
            "model": "claude-x",
            "max_tokens": 8192,
            "system": "be brief",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "list files"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}},
                    {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "bad json", "is_error": true},
                    {"type": "text", "text": "thanks"}
                ]}
            ],
            "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
            "temperature": 0.0,
            "stream": true
        })
    );
    let thinking = AnthropicConfig {
        thinking_budget: Some(2048),
        ..AnthropicConfig::new("claude-x")
    };
    let body = serde_json::to_value(request_body(&thinking, &req, false))?;
    assert_eq!(
        body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(body.get("temperature"), None);
    Ok(())
}

#[test]
fn bad_thinking_budget_is_config_error() {
    let c = AnthropicConfig {
        thinking_budget: Some(100),
        ..AnthropicConfig::new("claude-x")
    };
    assert!(matches!(AnthropicModel::new(c), Err(ModelError::Config(_))));
}

#[test]
fn stream_events() -> Result<(), ModelError> {
    let mut p = StreamParser::default();
    let mut events = Vec::new();
    for data in [
        r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":1}}}"#,
        r#"{"type":"ping"}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"ok"}}"#,
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"ls","input":{}}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}"#,
        r#"{"type":"message_stop"}"#,
    ] {
        events.extend(p.on_event("x", data)?);
    }
    assert!(p.is_done());
    events.extend(p.finish()?);
    let mut asm = ResponseAssembler::default();
    events.iter().for_each(|e| asm.push(e));
    let r = asm.finish();
    assert_eq!(
        *r.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "hm".into(),
                signature: Some("SIG".into())
            },
            ContentBlock::Text { text: "ok".into() },
            ContentBlock::ToolCall(ToolCall {
                id: "t1".into(),
                name: "ls".into(),
                arguments: r#"{"a":1}"#.into()
            }),
        ]
    );
    assert_eq!(
        r.usage,
        Some(Usage {
            input_tokens: 15,
            output_tokens: 7,
            cached_input_tokens: 5
        })
    );
    assert_eq!(r.stop_reason, Some(StopReason::ToolUse));
    Ok(())
}

#[test]
fn stream_error_event_and_truncation() {
    let mut p = StreamParser::default();
    let r = p.on_event(
        "error",
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    assert!(matches!(r, Err(ModelError::Provider { status: 529, .. })));
    let mut p = StreamParser::default();
    assert!(matches!(p.finish(), Err(ModelError::Transport { .. })));
}

#[test]
fn non_streamed_response() -> Result<(), ModelError> {
    let events = parse_response(&json!({
        "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "hi"},
                    {"type": "tool_use", "id": "t", "name": "ls", "input": {"p": 1}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 4, "output_tokens": 2}
    }))?;
    assert_eq!(
        events,
        vec![
            ModelEvent::TextDelta("hi".into()),
            ModelEvent::ToolCallStart {
                index: 1,
                id: "t".into(),
                name: "ls".into()
            },
            ModelEvent::ToolCallDelta {
                index: 1,
                arguments: r#"{"p":1}"#.into()
            },
            ModelEvent::Usage(Usage {
                input_tokens: 4,
                output_tokens: 2,
                cached_input_tokens: 0
            }),
            ModelEvent::Stop(StopReason::ToolUse),
        ]
    );
    Ok(())
}

proptest::proptest! {
    /// However the server splits `partial_json`, the assembled call is the same text.
    #[test]
    fn any_split_of_input_json_reassembles(args in "[ -~]{0,60}", cuts in proptest::collection::vec(0usize..60, 0..6)) {
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < args.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut p = StreamParser::default();
        let mut events = Vec::new();
        let err = |e: ModelError| proptest::test_runner::TestCaseError::fail(e.to_string());
        events.extend(p.on_event("", r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}"#).map_err(err)?);
        let mut start = 0;
        for c in cuts.into_iter().chain([args.len()]) {
            let d = json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":&args[start..c]}});
            events.extend(p.on_event("", &d.to_string()).map_err(err)?);
            start = c;
        }
        events.extend(p.on_event("", r#"{"type":"message_stop"}"#).map_err(err)?);
        events.extend(p.finish().map_err(err)?);
        let mut asm = ResponseAssembler::default();
        events.iter().for_each(|e| asm.push(e));
        let calls: Vec<ToolCall> = asm.finish().message.tool_calls().cloned().collect();
        proptest::prop_assert_eq!(calls, vec![ToolCall { id: "t".into(), name: "n".into(), arguments: args.clone() }]);
    }
}
